"""docs/tasks.md is executable: its example runs as a reader would run it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from test_docs import block

ROOT = Path(__file__).resolve().parents[2]
TASKS_DOC = ROOT / "docs" / "tasks.md"


def test_tasks_page_example_runs(tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(block(TASKS_DOC, "example: tasks", "python"), encoding="utf-8")
    res = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60, check=False,
                         env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.splitlines() == [
        "a.png@100 b.png@50", "failed ValueError no such mailbox: x@invalid"]
