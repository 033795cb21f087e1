"""``ledgerq archive``: move ended runs and their facts out of the live tables into a file."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer

from ledgerq.cli.app import app
from ledgerq.cli.db import DbOption, db_path, open_db, run
from ledgerq.cli.failures import die, text_option
from ledgerq.cli.render import JsonOption, emit_json, fmt_ts, printable
from ledgerq.durations import parse_duration
from ledgerq.errors import InvalidInput


@app.command()
def archive(
    ctx: typer.Context,
    before: Annotated[str | None, typer.Option(
        "--before", metavar="DATE", help="Archive runs that ended before this: an ISO 8601 "
        "time (2026-11-01, 2026-11-01T00:00:00+00:00) or a span back from now (30d, 12h).",
        show_default=False)] = None,
    to: Annotated[Path | None, typer.Option(
        "--to", metavar="FILE", help="The archive file to create (SQLite; never "
        "overwritten). Default: ledgerq-archive-<UTC time>.sqlite beside the database.",
        show_default=False)] = None,
    limit: Annotated[int | None, typer.Option(
        "--limit", min=1, metavar="N", help="Archive only the oldest N of them (the "
        "archive holds SQLite's write lock while it copies: archive a large backlog in "
        "several calls).", show_default=False)] = None,
    keys_expire_after: Annotated[str | None, typer.Option(
        "--keys-expire-after", metavar="SPAN", help="Archive runs submitted with an "
        "idempotency key too, once created this long ago (e.g. 90d); their keys then no "
        "longer deduplicate. Default: such runs stay live, so their keys always answer.",
        show_default=False)] = None,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Count what would be archived; write nothing.")] = False,
    list_them: Annotated[bool, typer.Option(
        "--list", help="List the archives this database recorded, and exit.")] = False,
    db: DbOption = None,
    json_out: JsonOption = False,
) -> None:
    """Move ended runs older than DATE, with every fact of each, into an archive file.

    One transaction: the file is written and fsynced first, then the runs and facts are
    deleted and the step recorded (``ledgerq archive --list``); ``verify`` stays clean.
    Runs a staying run still refers to (a retry's chain, a dependency, a worker's lease)
    are kept and counted as skipped, and so are runs submitted with an idempotency key
    (see --keys-expire-after). Look an archived run up with
    ``ledgerq show --archive FILE ID``.
    """
    from ledgerq.queue.maintenance.archive import archive_runs, list_archives, parse_before

    path = db_path(ctx, db)
    if list_them:
        if before is not None or to is not None or dry_run or limit is not None \
                or keys_expire_after is not None:
            die("--list takes no --before, --to, --limit, --keys-expire-after or --dry-run")

        async def listed() -> list[dict[str, Any]]:
            async with open_db(ctx, path, readonly=True) as handle:
                return await list_archives(handle)

        _print_list(run(listed()), json_out)
        return
    if before is None:
        die("give --before DATE (e.g. --before 30d or --before 2026-11-01)")
    try:
        cutoff = parse_before(text_option(before, "--before"), now=time.time())
    except InvalidInput as exc:
        die(str(exc))
    if to is not None:
        text_option(str(to), "--to")
    window = None
    if keys_expire_after is not None:
        try:
            window = parse_duration(text_option(keys_expire_after, "--keys-expire-after"),
                                    "--keys-expire-after")
        except InvalidInput as exc:
            die(str(exc))

    async def go() -> Any:
        async with open_db(ctx, path) as handle:
            try:
                return await archive_runs(handle, before=cutoff, to=to, dry_run=dry_run,
                                          limit=limit, keys_expire_after=window)
            except InvalidInput as exc:
                die(str(exc))

    summary = run(go())
    if json_out:
        emit_json(summary.as_dict())
        return
    when = fmt_ts(summary.before)
    why = "still referenced"
    if summary.keyed:
        why += f", or their idempotency key still answers: {summary.keyed}"
    kept = f"; {summary.skipped} kept ({why})" if summary.skipped else ""
    if dry_run:
        typer.echo(printable(f"would archive {summary.runs} run(s) and {summary.facts} "
                             f"fact(s) ended before {when}{kept}"))
    elif summary.file is None:
        typer.echo(printable(f"nothing to archive: no run ended before {when} that nothing "
                             f"refers to{kept}; no file written"))
    else:
        typer.echo(printable(f"archived {summary.runs} run(s) and {summary.facts} fact(s) "
                             f"ended before {when} to {summary.file}{kept}"))


def _print_list(rows: list[dict[str, Any]], json_out: bool) -> None:
    if json_out:
        emit_json({"archives": rows})
        return
    if not rows:
        typer.echo("no archives recorded")
        return
    # One line per archive, the file last and whole (a table would cut a long path).
    for r in rows:
        typer.echo(printable(
            f"{r['id']}  at {fmt_ts(r['created_at'])}  before {fmt_ts(r['ended_before'])}  "
            f"{r['runs']} run(s)  {r['facts']} fact(s)  {r['skipped']} kept  {r['file']}"))
