"""``isolation="process"``: the function runs in a child process that a timeout kills."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import isolated_tasks
from ledgerq import App, TaskFailed
from ledgerq.errors import InvalidInput
from ledgerq.queue import get_run


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped) counts as gone.
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split()[2] == "Z")


async def test_a_process_task_runs_in_a_child_and_a_timeout_kills_it(tmp_path: Path) -> None:
    app = isolated_tasks.app
    marker = tmp_path / "pid"
    async with app:
        pid_run = await isolated_tasks.child_pid.defer_async()
        stuck = await isolated_tasks.stuck.defer_async(marker=str(marker))
        raising = await isolated_tasks.raises.defer_async()
        await app.drain()
        child = await pid_run.result()
        assert child != os.getpid()
        with pytest.raises(TaskFailed) as timed_out:
            await stuck.result()
        assert timed_out.value.status == "timed_out"
        assert not _alive(int(marker.read_text()))
        row = await get_run(app.db, stuck.id)
        assert "killed" in row["error_detail"]
        with pytest.raises(TaskFailed, match="from the child") as failed:
            await raising.result()
        assert failed.value.error_type == "LookupError"
        assert "raise LookupError" in (failed.value.traceback or "")


def test_process_isolation_needs_an_importable_function() -> None:
    app = App(":memory:")

    def local() -> None: ...

    with pytest.raises(InvalidInput, match="module level"):
        app.task(name="local", isolation="process")(local)

    async def coro() -> None: ...

    with pytest.raises(InvalidInput, match="async"):
        app.task(name="coro", isolation="process")(coro)
