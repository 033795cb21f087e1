"""The HTTP server against careless and hostile input: every refusal is the client's
status (4xx) with one line saying why, never a 500 or a 503 that reads as an outage, and
configurations that would expose the queue are refused before the server binds.

Through real ``ledgerq serve`` processes on loopback ports, on both backends.
"""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from helpers.server import (
    TOKEN,
    Server,
    command,
    counts,
    free_port,
    serve,
    serve_backend,
    token_env,
)
from ledgerq.errors import InvalidInput
from ledgerq.web.config import ServeConfig


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[Server]:
    """One server per backend for the module (starting one costs a second)."""
    with serve_backend(request, tmp_path_factory, "http_hardening") as s:
        yield s


@pytest.fixture
def api(server: Server) -> Iterator[httpx.Client]:
    with server.client() as c:
        yield c


def cursor_of(value: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


@pytest.mark.parametrize("params", [
    {"cursor": cursor_of([int("9" * 370), "x"])},  # overflows a float
    {"cursor": cursor_of([1.0, "a\x00b"])},  # a forged id no run can have
    {"cursor": "not-a-cursor"},
    {"kind": "a\x00b"},
    {"status": "queued\x00"},
    {"queue": "\x00"},
    {"target": "host\x00"},
])
def test_bad_list_parameters_are_422_not_an_outage(api: httpx.Client,
                                                   params: dict[str, str]) -> None:
    res = api.get("/api/tasks", params=params)
    assert res.status_code == 422, res.text
    assert res.json()["detail"]


@pytest.mark.parametrize("task_id", ["abc%00def", "%00", "%C3%28"])
def test_an_id_no_run_can_have_is_404(api: httpx.Client, task_id: str) -> None:
    assert api.get(f"/api/tasks/{task_id}").status_code == 404
    res = api.post(f"/api/tasks/{task_id}/cancel")
    assert res.status_code == 404, res.text


def test_idempotency_key_header_is_read_as_utf8(server: Server, api: httpx.Client) -> None:
    body = json.dumps(command("true", idempotency_key="café")).encode()
    headers = [(b"Content-Type", b"application/json"),
               (b"Idempotency-Key", "café".encode())]
    first = api.post("/api/tasks", content=body, headers=headers)
    assert first.status_code == 201, first.text
    again = api.post("/api/tasks", content=json.dumps(command("true")).encode(),
                     headers=headers)
    assert (again.status_code, again.json()) == (200, first.json())
    before = counts(server.db)
    latin = api.post("/api/tasks", content=body,
                     headers=[(b"Content-Type", b"application/json"),
                              (b"Idempotency-Key", b"caf\xe9")])  # Latin-1: not UTF-8
    assert latin.status_code == 422 and "UTF-8" in latin.json()["detail"]
    assert counts(server.db) == before


@pytest.mark.parametrize("origin", ["", "not a url", "https://ops.example.com/path",
                                    "ftp://ops.example.com", "http://ops.example.com:x"])
def test_cors_origins_that_are_not_origins_are_refused(origin: str) -> None:
    with pytest.raises(InvalidInput, match="is not an origin"):
        ServeConfig(db="x.db", token=TOKEN, cors_origins=(origin,)).check()


def test_a_cors_wildcard_needs_every_read_to_need_the_token() -> None:
    ServeConfig(db="x.db", token=TOKEN, cors_origins=("*",)).check()
    for open_reads in (ServeConfig(db="x.db", cors_origins=("*",)),
                       ServeConfig(db="x.db", token=TOKEN, public_read=True,
                                   cors_origins=("*",))):
        with pytest.raises(InvalidInput, match="any web page"):
            open_reads.check()


def test_serve_refuses_a_wildcard_origin_without_a_token(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, "-m", "ledgerq", "serve", "--db",
                          str(tmp_path / "c.db"), "--port", str(free_port()),
                          "--cors-origin", "*"], env=token_env(None), capture_output=True,
                         text=True, timeout=60, check=False)
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith("ledgerq: error:") and "any web page" in res.stderr


def test_a_loopback_server_answers_only_its_own_names(tmp_path: Path) -> None:
    """Bound to 127.0.0.2 (loopback too), it answers to that address; a name that is not
    one of its own (``testserver``, a rebinding attacker's domain) is refused."""
    with serve(str(tmp_path / "h.db"), token=None, host="127.0.0.2") as s:
        assert httpx.get(s.url + "/api/stats", timeout=10).status_code == 200
        for host in ("testserver", "evil.example.com", "127.0.0.3"):
            refused = httpx.get(s.url + "/api/stats", headers={"Host": host}, timeout=10)
            assert refused.status_code == 400, (host, refused.text)
        port = s.url.rsplit(":", 1)[1]
        assert httpx.get(s.url + "/api/stats", headers={"Host": f"localhost:{port}"},
                         timeout=10).status_code == 200


def serve_with_token_file(tmp_path: Path, token_file: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ledgerq", "serve", "--db",
                           str(tmp_path / "t.db"), "--port", str(free_port()),
                           "--token-file", token_file], env=token_env(None),
                          capture_output=True, text=True, timeout=60, check=False)


def test_a_token_file_is_read_bounded(tmp_path: Path) -> None:
    res = serve_with_token_file(tmp_path, "/dev/zero")
    assert res.returncode == 2 and "larger than" in res.stderr, res.stderr
    empty = tmp_path / "empty"
    empty.write_text("\n\nsecret\n")
    res = serve_with_token_file(tmp_path, str(empty))
    assert res.returncode == 2 and "first line" in res.stderr, res.stderr


def test_a_token_files_first_line_is_the_token(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(f"{TOKEN}\n# issued by ops; rotate monthly\n")
    with serve(str(tmp_path / "t.db"), token=None, args=["--token-file", str(token_file)]) as s:
        authed = httpx.get(s.url + "/api/stats", headers={"Authorization": f"Bearer {TOKEN}"},
                           timeout=10)
        assert authed.status_code == 200, authed.text
        assert httpx.get(s.url + "/api/stats", timeout=10).status_code == 401


def test_a_worker_whose_metrics_port_is_taken_refuses_to_start(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        res = subprocess.run([sys.executable, "-m", "ledgerq", "worker", "--db",
                              str(tmp_path / "m.db"), "--metrics-port", str(port),
                              "--max-runtime", "30s"], env=token_env(None),
                             capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 2, res.stderr
    assert f"--metrics-port {port}: cannot serve metrics" in res.stderr


def test_tasks_filter_by_outcome_in_whichever_states_the_spec_gives_it(
        api: httpx.Client) -> None:
    """``?outcome=failed`` means every state whose spec outcome is failed (``failed`` and
    ``timed_out`` in the packaged spec), so the dashboard names no state itself."""
    run_id = api.post("/api/tasks", json=command("true")).json()["id"]
    assert api.post(f"/api/tasks/{run_id}/cancel").status_code == 200
    cancelled = api.get("/api/tasks", params={"outcome": "cancelled", "limit": 500}).json()
    assert run_id in [t["id"] for t in cancelled["items"]]
    failed = api.get("/api/tasks", params={"outcome": "failed", "limit": 500})
    assert run_id not in [t["id"] for t in failed.json()["items"]]
    assert failed.status_code == 200, failed.text
    by_status = api.get("/api/tasks", params=[("status", "failed"), ("status", "timed_out"),
                                              ("limit", "500")])
    assert [t["id"] for t in failed.json()["items"]] == \
        [t["id"] for t in by_status.json()["items"]]
    only = api.get("/api/tasks", params=[("outcome", "failed"), ("status", "queued")])
    assert only.json()["items"] == []
    bad = api.get("/api/tasks", params={"outcome": "exploded"})
    assert bad.status_code == 422 and "unknown outcome" in bad.json()["detail"]
