"""Tasks declared at module level, as ``isolation="process"`` needs (the child imports them)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from ledgerq import App

app = App(os.environ.get("LEDGERQ_TEST_ISOLATED_DB", ":memory:"))


@app.task(name="isolated.pid", isolation="process")
def child_pid() -> int:
    return os.getpid()


@app.task(name="isolated.stuck", isolation="process", timeout=1)
def stuck(marker: str) -> None:
    """Writes its pid, then blocks past its timeout (a C call no thread could interrupt)."""
    Path(marker).write_text(str(os.getpid()))
    time.sleep(60)


@app.task(name="isolated.raises", isolation="process")
def raises() -> None:
    raise LookupError("from the child")
