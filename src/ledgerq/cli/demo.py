"""``ledgerq demo``: the command wrapper around :mod:`ledgerq.demo`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ledgerq.cli.app import app
from ledgerq.cli.db import run
from ledgerq.cli.failures import die
from ledgerq.cli.render import out


@app.command()
def demo(
    db: Annotated[Path | None, typer.Option(
        "--db", help="Where the demo database goes; must not exist yet. Worker logs go to "
                     "<db>.demo/ beside it (default: a new temporary directory for both).",
        show_default=False, dir_okay=False)] = None,
) -> None:
    """Run a two-worker demonstration on a fresh SQLite file, killing one worker mid-run.

    Submits real command tasks (successes, a failure, a dependency, a cancel, a retry,
    a timeout), runs two worker processes, SIGKILLs one while it runs a long task, and
    shows the lease recovery, the per-status counts and a clean verify().
    """
    from ledgerq.demo import run_demo

    if db is not None and db.exists():
        die(f"{db} already exists; the demo needs a fresh database")
    raise typer.Exit(run(run_demo(db, out)))
