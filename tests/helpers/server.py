"""A real ``ledgerq serve`` process on a loopback port, for API and browser tests."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx

TOKEN = "s3cret-token-9f2c"
#: How long a server may take to answer its first /healthz (a wait, not an assertion).
START_WAIT = 60.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    url: str
    token: str | None
    proc: subprocess.Popen[str]
    db: str

    def client(self, *, auth: bool = True) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.token}"} if auth and self.token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)


def token_env(token: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("LEDGERQ_API_TOKEN", None)
    if token is not None:
        env["LEDGERQ_API_TOKEN"] = token
    return env


@contextmanager
def serve(db: str, *, token: str | None = TOKEN, args: Sequence[str] = (),
          root: Sequence[str] = (), host: str = "127.0.0.1") -> Iterator[Server]:
    """Start ``ledgerq [ROOT...] serve`` on a free loopback port; stop it (SIGTERM) after.

    ``root`` are options before the command (``--specs DIR``); ``host`` a loopback
    address to bind (any of 127.0.0.0/8)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ledgerq", *root, "serve", "--db", db, "--host", host,
         "--port", str(port), *args],
        env=token_env(token), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://{host}:{port}"
    deadline = time.monotonic() + START_WAIT
    try:
        while True:
            if proc.poll() is not None:
                out, err = proc.communicate()
                raise RuntimeError(f"ledgerq serve exited {proc.returncode}: {err}{out}")
            try:
                if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("ledgerq serve did not answer /healthz")
            time.sleep(0.1)
        yield Server(url, token, proc, db)
    finally:
        proc.terminate()
        try:
            proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def counts(db: str) -> tuple[int, int]:
    """(runs, facts) in the database: what "nothing written" compares."""
    from ledgerq import StateDB
    from ledgerq.queue.reads import fact_count, list_runs

    async def read() -> tuple[int, int]:
        async with StateDB(db) as handle:
            return (await list_runs(handle, limit=0)).total, await fact_count(handle)

    return asyncio.run(read())


def command(*argv: str, **extra: Any) -> dict[str, Any]:
    """A command TaskApplication as JSON."""
    return {"action_kind": "command", "args": {"argv": list(argv)},
            "execution_target": "host", **extra}


def start_worker(db: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "ledgerq", "worker", "--db", db, "--poll-interval", "0.05",
         "--quiet", *args], env=token_env(None), stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True)


def stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    try:
        proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()


def wait_status(client: httpx.Client, run_id: str, statuses: set[str],
                wait: float = 60.0) -> dict[str, Any]:
    """Poll the API until the run is in one of ``statuses`` (a wait, not an assertion)."""
    deadline = time.monotonic() + wait
    while True:
        detail: dict[str, Any] = client.get(f"/api/tasks/{run_id}").json()
        if detail["run"]["status"] in statuses or time.monotonic() > deadline:
            return detail
        time.sleep(0.05)


@contextmanager
def serve_backend(request: Any, tmp_path_factory: Any, name: str) -> Iterator[Server]:
    """A server on the backend ``request.param`` names (``sqlite`` or ``postgresql``: a
    schema of its own, dropped after), for module-scoped fixtures parametrized by both."""
    if request.param == "sqlite":
        with serve(str(tmp_path_factory.mktemp(name) / f"{name}.db")) as s:
            yield s
        return
    from helpers import pg

    base = request.getfixturevalue("pg_database")
    target = pg.create_schema(base, name)
    try:
        with serve(target) as s:
            yield s
    finally:
        pg.drop_schema(base, name)
