"""``ledgerq stats``: the queue at a glance, per status and per worker."""

from __future__ import annotations

from typing import Any

import typer
from rich.table import Table
from rich.text import Text

from ledgerq.cli.app import app
from ledgerq.cli.db import DbOption, db_path, open_db, run
from ledgerq.cli.render import JsonOption, cell, emit_json, fmt_age, fmt_ts, out, styled_status


@app.command()
def stats(ctx: typer.Context, db: DbOption = None, json_out: JsonOption = False) -> None:
    """Counts per status, the oldest queued run's age, and what each worker is running."""
    from ledgerq.queue.reads import RUN_ENTITY, queue_stats

    path = db_path(ctx, db)

    async def go() -> Any:
        async with open_db(ctx, path, readonly=True) as handle:
            return await queue_stats(handle), handle.registry.entity(RUN_ENTITY)

    s, policy = run(go())
    if json_out:
        emit_json(s.to_dict())
        return
    counts = Table(box=None, header_style="bold", pad_edge=False)
    counts.add_column("STATUS")
    counts.add_column("RUNS", justify="right")
    for status, n in s.counts.items():
        counts.add_row(styled_status(policy, status), cell(n))
    counts.add_row(Text("total", style="bold"), Text(str(s.total), style="bold"))
    out.print(counts)
    out.print(f"\noldest queued: {fmt_age(s.oldest_queued_age_seconds)}"
              + (f" (since {fmt_ts(s.oldest_queued_at)})" if s.oldest_queued_at else ""))
    out.print(cell(f"stuck: {s.stuck}"))
    if s.unserved_kinds:
        out.print(cell("queued kinds no live worker serves (they wait for one that has "
                       f"their code): {', '.join(s.unserved_kinds)}"))
    for r in s.stuck_runs:
        out.print(cell(f"  {r.id} {r.status}: {r.why}"))
    if s.workers or s.running_by_worker:
        wt = Table(box=None, header_style="bold", pad_edge=False, title="workers",
                   title_justify="left")
        for name in ("WORKER", "HOST", "PID", "HEARTBEAT", "RUNNING"):
            wt.add_column(name)
        seen = set()
        for w in s.workers:
            seen.add(w.worker_id)
            wt.add_row(cell(w.worker_id), cell(w.hostname or ""), cell(w.pid or ""),
                       f"{fmt_age(w.heartbeat_age_seconds)} ago", cell(w.running))
        for wid, n in s.running_by_worker.items():
            if wid not in seen:
                wt.add_row(cell(wid), "", "", "never", cell(n))
        out.print()
        out.print(wt)
