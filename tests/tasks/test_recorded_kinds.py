"""Task kinds a database records: submissions of a task checked without its app's code,
from Python, the command line and the HTTP API, on both backends."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from ledgerq import App, StateDB
from ledgerq.errors import InvalidInput
from ledgerq.queue import TaskApplication, get_run, list_runs, submit_task
from ledgerq.queue.submission import task_kinds


def declare(target: str) -> App:
    app = App(target)

    @app.task(name="email.send", queue="emails")
    def send(to: str, subject: str, retries: int = 0, when: datetime | None = None) -> str:
        return f"{to}:{subject}"

    return app


async def test_an_app_records_its_tasks_and_other_programs_submit_them(db_target: str) -> None:
    app = declare(db_target)
    async with app:
        pass
    # Another program: no App, no code of the task; the database says what it takes.
    async with StateDB(db_target) as db:
        (kind,) = (await task_kinds.recorded(db)).values()
        assert kind.name == "email.send" and kind.queue == "emails"
        assert kind.parameters["required"] == ["to", "subject"]
        run_id = await submit_task(db, TaskApplication(
            "email.send", {"to": "a@b", "subject": "hi", "when": "2026-01-01T10:00:00"},
            queue="emails"))
        assert (await get_run(db, run_id))["action_kind"] == "email.send"
        for args, problem in (({"to": "a@b"}, "missing argument 'subject'"),
                              ({"to": "a@b", "subject": "x", "cc": 1},
                               "unexpected argument 'cc'"),
                              ({"to": "a@b", "subject": "x", "retries": "3"},
                               "argument 'retries': must be integer")):
            with pytest.raises(InvalidInput, match=problem):
                await submit_task(db, TaskApplication("email.send", args))
        with pytest.raises(InvalidInput, match=r"unknown action_kind 'email\.sen'"):
            await submit_task(db, TaskApplication("email.sen", {}))
        assert (await list_runs(db)).total == 1
    # The app's worker runs what the other program submitted.
    async with app:
        assert await app.drain() == 1
        assert (await get_run(app.db, run_id))["result"] == "a@b:hi"


async def test_recording_an_unchanged_app_writes_nothing(tmp_path: Path) -> None:
    target = str(tmp_path / "k.db")
    async with declare(target) as app:
        first = (await task_kinds.recorded(app.db))["email.send"].recorded_at
    async with declare(target) as app:
        assert (await task_kinds.recorded(app.db))["email.send"].recorded_at == first


async def test_the_command_line_submits_a_recorded_task_with_typed_arguments(
        tmp_path: Path) -> None:
    target = str(tmp_path / "cli.db")
    async with declare(target):
        pass

    def ledgerq(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "ledgerq", *args, "--db", target],
                              capture_output=True, text=True, timeout=60, check=False)

    done = ledgerq("submit", "email.send", "--queue", "emails", "--arg", "to=a@b",
                   "--arg", "subject=hi", "--arg", "retries=3", "--json")
    assert done.returncode == 0, done.stderr
    run_id = json.loads(done.stdout)["id"]
    refused = ledgerq("submit", "email.send", "--arg", "to=a@b")
    assert refused.returncode != 0 and "missing argument 'subject'" in refused.stderr
    unknown = ledgerq("submit", "email.sned", "--arg", "to=a@b")
    assert unknown.returncode != 0 and "tasks: email.send" in unknown.stderr
    async with StateDB(target) as db:
        row = await get_run(db, run_id)
        assert row["action_args"] == {"to": "a@b", "subject": "hi", "retries": 3}
        assert (await list_runs(db)).total == 1


def test_the_http_api_submits_a_recorded_task(tmp_path: Path) -> None:
    import asyncio

    import httpx

    from helpers.server import serve

    target = str(tmp_path / "http.db")

    async def record() -> None:
        async with declare(target):
            pass

    asyncio.run(record())
    with serve(target) as server, server.client() as api:
        def post(body: dict[str, Any]) -> httpx.Response:
            return api.post("/api/tasks", content=json.dumps(body),
                            headers={"Content-Type": "application/json"})

        created = post({"action_kind": "email.send", "args": {"to": "a@b", "subject": "x"},
                        "queue": "emails"})
        assert created.status_code == 201, created.text
        refused = post({"action_kind": "email.send", "args": {"to": "a@b"}})
        assert refused.status_code == 422 and "missing argument 'subject'" in refused.text
        # The OpenAPI document shows what the recorded task takes.
        doc = api.get("/openapi.json").json()
        args = doc["components"]["schemas"]["TaskArgs.email.send"]
        assert args["required"] == ["to", "subject"]
        assert doc["paths"]["/api/tasks"]["post"]["x-ledgerq-tasks"] == {
            "email.send": {"$ref": "#/components/schemas/TaskArgs.email.send"}}


async def test_a_result_wakes_on_another_processes_end_through_notify(
        pg_target: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """PostgreSQL: a worker in another process ends the run; the waiting result wakes on
    the NOTIFY at its commit, not at a poll (polling is switched off here)."""
    import os

    from ledgerq.tasks import runs

    monkeypatch.setattr(runs, "POLL_SECONDS", 60.0)
    module = tmp_path / "remote_tasks.py"
    module.write_text(
        "import os\nfrom ledgerq import App\n"
        "app = App(os.environ['REMOTE_TARGET'])\n\n"
        "@app.task(name='remote.add')\n"
        "def add(a: int, b: int) -> int:\n    return a + b\n", encoding="utf-8")
    app = App(pg_target)

    @app.task(name="remote.add")
    def add(a: int, b: int) -> int:
        return a + b

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "REMOTE_TARGET": pg_target,
           "PYTHONPATH": os.pathsep.join([str(root / "src"), str(tmp_path)])}
    async with app:
        run = await add.defer_async(a=2, b=3)
        worker = subprocess.Popen(
            [sys.executable, "-m", "ledgerq", "worker", "--app", "remote_tasks:app",
             "--poll-interval", "0.05", "--no-scheduler"], env=env, cwd=tmp_path,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            assert await run.result(timeout=20) == 5
        finally:
            worker.terminate()
            worker.communicate(timeout=30)
