"""The commands about the fact log itself: ``verify`` checks the rows against it,
``rebuild`` recreates the rows from it."""

from __future__ import annotations

import sys
from typing import Any

import typer

from ledgerq.cli.app import app
from ledgerq.cli.db import DbOption, db_path, open_db, run
from ledgerq.cli.failures import DOMAIN_FAILURE
from ledgerq.cli.render import JsonOption, emit_json, err_console, out, printable
from ledgerq.queue.reads import fact_count


def drift_dict(d: Any) -> dict[str, Any]:
    return {"entity_type": d.entity_type, "entity_id": d.entity_id, "problem": d.problem,
            "column": d.column, "expected": d.expected, "actual": d.actual,
            "message": str(d)}


@app.command()
def verify(ctx: typer.Context, db: DbOption = None, json_out: JsonOption = False) -> None:
    """Fold every entity's facts and compare with its row; exit 1 on any drift."""
    from ledgerq.projections.log import verify as verify_db

    path = db_path(ctx, db)

    async def go() -> Any:
        async with open_db(ctx, path, readonly=True) as handle:
            if json_out or not err_console.is_terminal:
                return await verify_db(handle)
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            facts = await fact_count(handle)
            with Progress(TextColumn("verifying"), BarColumn(),
                          TextColumn("{task.completed}/{task.total} facts"),
                          TimeElapsedColumn(), console=err_console, transient=True) as bar:
                task = bar.add_task("verify", total=facts)
                return await verify_db(handle, progress=lambda n: bar.update(
                    task, completed=n))

    report = run(go())
    if json_out:
        emit_json({"ok": report.ok, "rows": report.rows, "facts": report.facts,
                   "drift": [drift_dict(d) for d in report.drift]})
    elif report.ok:
        out.print(f"[green]ok[/green]: {report.rows} rows agree with {report.facts} facts; "
                  "no drift")
    else:
        for d in report.drift:
            typer.echo(printable(f"drift: {d}"))
    if not report.ok:
        if not json_out:
            sys.stderr.write(f"ledgerq: error: {len(report.drift)} drift finding(s) in "
                             f"{path}; `ledgerq rebuild` recreates rows from the log\n")
        raise typer.Exit(DOMAIN_FAILURE)


@app.command()
def rebuild(ctx: typer.Context, db: DbOption = None, json_out: JsonOption = False) -> None:
    """Recreate every projection row from the fact log alone (one transaction), then verify."""
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from ledgerq.projections.log import rebuild as rebuild_db
    from ledgerq.projections.log import verify as verify_db

    path = db_path(ctx, db)

    async def go() -> tuple[Any, Any]:
        async with open_db(ctx, path) as handle:
            facts = await fact_count(handle)
            with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                          TextColumn("{task.completed}/{task.total} facts"),
                          TimeElapsedColumn(), console=err_console,
                          # A bar only for a person watching: piped or captured stderr
                          # would otherwise get its last frame as a stray line.
                          disable=json_out or not err_console.is_terminal) as progress:
                task = progress.add_task("folding the log into projections", total=facts)
                report = await rebuild_db(handle, progress=lambda n: progress.update(
                    task, completed=n))
                progress.update(task, completed=report.facts,
                                description="rebuilt (one transaction)")
                check = progress.add_task("verifying", total=report.facts)
                checked = await verify_db(handle, progress=lambda n: progress.update(
                    check, completed=n))
                progress.update(check, completed=report.facts, description="verified")
            return report, checked

    report, checked = run(go())
    if json_out:
        emit_json({"rows": report.rows, "facts": report.facts, "tables": report.tables,
                   "verify_ok": checked.ok})
    else:
        tables = ", ".join(f"{t} {n}" for t, n in report.tables.items())
        out.print(f"rebuilt {report.rows} rows from {report.facts} facts ({tables}); "
                  f"verify: {'[green]clean[/green]' if checked.ok else '[red]drift[/red]'}")
    if not checked.ok:
        raise typer.Exit(DOMAIN_FAILURE)
