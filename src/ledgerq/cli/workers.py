"""``ledgerq workers`` (who serves the queue, and what each runs) and ``ledgerq worker
stop ID`` (ask one to drain and exit, through the database)."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from ledgerq.cli.app import app
from ledgerq.cli.db import DbOption, db_path, open_db, run
from ledgerq.cli.failures import DOMAIN_FAILURE, die, text_option
from ledgerq.cli.render import JsonOption, cell, emit_json, err_console, fmt_age, out, printable
from ledgerq.cli.worker import worker_app


@app.command("workers")
def workers(ctx: typer.Context, db: DbOption = None, json_out: JsonOption = False) -> None:
    """Every worker: id, host, capabilities, heartbeat age, what it runs (read-only)."""
    from ledgerq.queue.reads import worker_statuses

    path = db_path(ctx, db)

    async def go() -> Any:
        async with open_db(ctx, path, readonly=True) as handle:
            return await worker_statuses(handle)

    found = run(go())
    if json_out:
        emit_json({"workers": [w.to_dict() for w in found]})
        return
    table = Table(box=None, header_style="bold", pad_edge=False)
    for name in ("WORKER", "HOST", "PID", "QUEUES", "KINDS", "CAPABILITIES", "TARGETS",
                 "HEARTBEAT", "STOP", "RUNNING"):
        table.add_column(name)
    for w in found:
        stop = "" if w.stop_requested_age_seconds is None else \
            f"requested {fmt_age(w.stop_requested_age_seconds)} ago"
        table.add_row(cell(w.worker_id), cell(w.hostname or ""), cell(w.pid or ""),
                      cell("(all)" if w.queues is None else ",".join(w.queues)),
                      cell("(all)" if w.kinds is None else ",".join(w.kinds)),
                      cell(",".join(w.advertised_capabilities) or "-"),
                      cell(",".join(w.execution_targets) or "-"),
                      f"{fmt_age(w.heartbeat_age_seconds)} ago", cell(stop),
                      cell(" ".join(w.running) or "-"))
    out.print(table)
    err_console.print(f"[dim]{len(found)} worker(s)[/dim]")


@worker_app.command("stop")
def stop(
    ctx: typer.Context,
    worker_id: Annotated[str, typer.Argument(help="The worker's id (see `ledgerq workers`).",
                                             show_default=False, metavar="ID")],
    db: DbOption = None,
    json_out: JsonOption = False,
) -> None:
    """Ask a worker to drain: it stops claiming and exits once its runs have finished.

    The request is written to the database, so it reaches a worker on any host; the
    worker notices it within a second. Exit 1 when no worker has that id.
    """
    from ledgerq.errors import NotFound
    from ledgerq.queue.worker.recycling import request_worker_stop

    text_option(worker_id, "ID")
    path = db_path(ctx, db)

    async def go() -> None:
        async with open_db(ctx, path) as handle:
            try:
                await request_worker_stop(handle, worker_id)
            except NotFound as exc:
                die(str(exc), DOMAIN_FAILURE)

    run(go())
    if json_out:
        emit_json({"worker_id": worker_id, "stop_requested": True})
    else:
        typer.echo(printable(f"asked worker {worker_id} to stop; it exits once idle"))
