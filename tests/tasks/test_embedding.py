"""The FastAPI lifespan example of docs/tasks.md, served by a real uvicorn process that
is sent SIGINT: the request's task runs on the embedded worker, and the server and the
worker shut down cleanly."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from test_docs import block

ROOT = Path(__file__).resolve().parents[2]
TASKS_DOC = ROOT / "docs" / "tasks.md"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_fastapi_lifespan_example_serves_and_stops_on_sigint(tmp_path: Path) -> None:
    (tmp_path / "service.py").write_text(block(TASKS_DOC, "example: fastapi", "python"),
                                         encoding="utf-8")
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "service:api", "--port", str(port)],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}/signup?email=a@example.com"
        deadline = time.monotonic() + 30
        while True:
            try:
                request = urllib.request.Request(url, method="POST")
                with urllib.request.urlopen(request, timeout=15) as response:
                    body = json.loads(response.read())
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise
                time.sleep(0.1)
        assert body["result"] == "welcome sent to a@example.com"
    finally:
        server.send_signal(signal.SIGINT)
        _, err = server.communicate(timeout=30)
    assert server.returncode == 0, err
    assert "Application shutdown complete" in err
    # The worker drained: its one run completed, nothing left running.
    import sqlite3

    with sqlite3.connect(tmp_path / "service.db") as conn:
        assert conn.execute("SELECT status FROM schedule_runs").fetchall() == [("completed",)]
