"""A real streaming replica serves reads; writes stay with the primary.

The module starts its own primary (``initdb``) and a standby made from it by
``pg_basebackup -R`` (tests/helpers/pgcluster.py), each a ``postgres`` on its own
loopback port, streaming WAL. Against the standby: the read commands (``ls``, ``show``,
``stats``, ``verify``) answer; a handle that could write is refused at open with a
message that says why and what to do, and so is a command that writes; a read-only
handle refuses writes before sending any. ``ledgerq serve --db PRIMARY --read-db
REPLICA`` reads from the standby, writes to the primary, and says in ``/api/stats`` as of
when its figures are (the dashboard shows it beside the live dot).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from helpers import pgcluster
from helpers.server import TOKEN
from ledgerq import StateDB
from ledgerq.errors import DatabaseError
from ledgerq.lifecycle import Actor
from ledgerq.queue import TaskApplication, cancel_task, submit_many
from test_http_dashboard import WAIT_MS, browser, signed_in

__all__ = ["browser"]  # (the dashboard's module fixture, used here too)

LEDGERQ = str(Path(sys.executable).with_name("ledgerq"))
OPERATOR = Actor(type="operator", id="replica-test")


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[str, str]]:
    """(the primary's URL, the standby's URL) of a database ``jobs``."""
    problem = pgcluster.unavailable()
    if problem is not None:
        if os.environ.get("LEDGERQ_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"private PostgreSQL servers are required: {problem}")
        pytest.skip(problem)
    with pgcluster.clusters("ledgerq-replica-") as made:
        primary = made.initdb()
        primary.start()
        with psycopg.connect(primary.url(), autocommit=True) as conn:
            conn.execute("CREATE DATABASE jobs")
        standby = made.basebackup(primary)
        standby.start()
        yield primary.url("jobs"), standby.url("jobs")


def caught_up(primary: str, standby: str, timeout: float = 30) -> None:
    """Wait until the standby has replayed everything the primary has written."""
    with psycopg.connect(primary, autocommit=True) as p:
        lsn = p.execute("SELECT pg_current_wal_lsn()").fetchone()
    assert lsn is not None
    deadline = time.monotonic() + timeout
    with psycopg.connect(standby, autocommit=True) as s:
        while time.monotonic() < deadline:
            done = s.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn",
                             (lsn[0],)).fetchone()
            if done is not None and done[0]:
                return
            time.sleep(0.05)
    raise AssertionError("the standby did not catch up")


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([LEDGERQ, *args], capture_output=True, text=True, timeout=60,
                          check=False, env={**os.environ})


@pytest.fixture(scope="module")
def runs(pair: tuple[str, str]) -> list[str]:
    """Three runs written on the primary (one cancelled), replayed on the standby."""
    primary, standby = pair

    async def write() -> list[str]:
        async with StateDB(primary) as db:
            ids = await submit_many(db, [TaskApplication("agent", {"n": i}, "host")
                                         for i in range(3)])
            await cancel_task(db, ids[0], actor=OPERATOR)
            return ids

    import asyncio

    ids = asyncio.run(write())
    caught_up(primary, standby)
    return ids


def test_the_read_commands_answer_from_the_standby(pair: tuple[str, str],
                                                   runs: list[str]) -> None:
    _, standby = pair
    listed = cli("ls", "--db", standby, "--json")
    assert listed.returncode == 0, listed.stderr
    assert {r["id"] for r in json.loads(listed.stdout)["runs"]} >= set(runs)
    shown = cli("show", runs[0], "--db", standby)
    assert shown.returncode == 0, shown.stderr
    assert "cancelled" in shown.stdout
    stats = cli("stats", "--db", standby, "--json")
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout)["counts"].get("queued") == 2
    verified = cli("verify", "--db", standby)
    assert verified.returncode == 0, verified.stdout + verified.stderr


async def test_a_handle_that_could_write_is_refused_at_open(pair: tuple[str, str],
                                                            runs: list[str]) -> None:
    _, standby = pair
    with pytest.raises(DatabaseError, match=r"is a read replica .*open it with readonly=True"):
        async with StateDB(standby):
            pass
    async with StateDB(standby, readonly=True) as db:
        with pytest.raises(DatabaseError, match="open read-only"):
            await cancel_task(db, runs[1], actor=OPERATOR)
        as_of = await db.replica_as_of()
        assert as_of is not None and abs(time.time() - as_of) < 60
    cancelled = cli("cancel", runs[1], "--db", standby)
    assert cancelled.returncode != 0
    assert "read replica" in cancelled.stderr and "Traceback" not in cancelled.stderr


async def test_a_primary_reads_as_of_now(pair: tuple[str, str]) -> None:
    async with StateDB(pair[0], readonly=True) as db:
        assert await db.replica_as_of() is None


def _get(url: str, **headers: str) -> Any:
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def test_serve_reads_from_the_replica_and_writes_to_the_primary(
        pair: tuple[str, str], runs: list[str], browser: Any) -> None:
    primary, standby = pair
    port = pgcluster.free_port()
    server = subprocess.Popen(
        [LEDGERQ, "serve", "--db", primary, "--read-db", standby, "--port", str(port)],
        env={**os.environ, "LEDGERQ_API_TOKEN": TOKEN}, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                stats = _get(base + "/api/stats", **auth)
                break
            except OSError:
                assert server.poll() is None, server.stderr.read() if server.stderr else ""
                assert time.monotonic() < deadline, "the server did not answer"
                time.sleep(0.1)
        assert stats["as_of"] is not None and stats["now"] - stats["as_of"] < 60
        body = json.dumps({"action_kind": "agent", "args": {"n": 9},
                           "execution_target": "host"}).encode()
        request = urllib.request.Request(base + "/api/tasks", data=body, method="POST",
                                         headers={**auth, "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            created = json.loads(response.read())["id"]
        with psycopg.connect(primary) as conn:  # written to the primary
            row = conn.execute("SELECT status FROM schedule_runs WHERE id = %s",
                               (created,)).fetchone()
        assert row == ("queued",)
        caught_up(primary, standby)
        shown = _get(base + f"/api/tasks/{created}", **auth)  # read from the replica
        assert shown["run"]["status"] == "queued"
        # The dashboard says its figures are a replica's, and as of when.
        errors: list[str] = []
        ctx, page = signed_in(browser, base, errors)
        try:
            page.wait_for_selector("#as-of:not([hidden])", timeout=WAIT_MS)
            assert page.inner_text("#as-of").startswith("replica as of ")
        finally:
            ctx.close()
    finally:
        server.terminate()
        server.wait(timeout=20)
        if server.stderr is not None:
            server.stderr.close()
