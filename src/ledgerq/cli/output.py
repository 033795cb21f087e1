"""``ledgerq logs``: what a run wrote, as its terminal fact recorded it.

The tails are kept by the worker (``--output-tail``, default the last 4 KiB of each
stream) and written with the move that ends the run, so they are in the log as well as
on the row: ``show`` prints them too, and a rebuild keeps them.
"""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from ledgerq.cli.app import app
from ledgerq.cli.db import DbOption, db_path, open_db, run
from ledgerq.cli.render import JsonOption, emit_json, err_console, out, printable, printable_text

#: The run columns that hold output, in the order they are shown.
OUTPUT_COLUMNS = ("stdout_tail", "stderr_tail")


def print_output(row: dict[str, Any], *, streams: tuple[str, ...] = OUTPUT_COLUMNS,
                 headers: bool = True) -> bool:
    """Print the recorded tails of ``row`` (escaped, newlines kept); whether any was."""
    shown = False
    for col in streams:
        text = row.get(col)
        if not text:
            continue
        if headers:
            out.print(f"[bold]{col.removesuffix('_tail')}[/bold] [dim](tail)[/dim]")
        body = printable_text(text)
        sys.stdout.write(body if body.endswith("\n") else body + "\n")
        sys.stdout.flush()
        shown = True
    return shown


@app.command()
def logs(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(help="Run id, or a unique prefix or suffix of 4+ "
                                          "characters.", show_default=False, metavar="ID")],
    stdout_only: Annotated[bool, typer.Option("--stdout", help="Only the stdout tail, "
                                              "without a header.")] = False,
    stderr_only: Annotated[bool, typer.Option("--stderr", help="Only the stderr tail, "
                                              "without a header.")] = False,
    db: DbOption = None,
    json_out: JsonOption = False,
) -> None:
    """Print the tail of a run's stdout and stderr, recorded when it ended (read-only)."""
    from ledgerq.cli.db import resolve_run
    from ledgerq.queue.reads import get_run

    path = db_path(ctx, db)

    async def go() -> dict[str, Any]:
        async with open_db(ctx, path, readonly=True) as handle:
            return await get_run(handle, await resolve_run(handle, run_id))

    row = run(go())
    if json_out:
        emit_json({"id": row["id"], "status": row["status"],
                   **{c: row.get(c) for c in OUTPUT_COLUMNS}})
        return
    streams = tuple(c for c, only in zip(OUTPUT_COLUMNS, (stdout_only, stderr_only),
                                         strict=True) if only) or OUTPUT_COLUMNS
    if not print_output(row, streams=streams, headers=not (stdout_only or stderr_only)):
        err_console.print(printable(f"no output recorded for run {row['id']} (status "
                                    f"{row['status']}); output is recorded when a run ends"),
                          markup=False)
