"""The HTTP API through a real ``ledgerq serve`` process on a loopback port, both backends.

Every route, its status codes, idempotency, auth refusals, bad, oversized and deeply
nested bodies; "nothing written" is checked by comparing the run and fact counts of the
database itself before and after.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from helpers.server import (
    TOKEN,
    Server,
    command,
    counts,
    serve,
    serve_backend,
    start_worker,
    stop,
    token_env,
    wait_status,
)
from ledgerq.queue.submission.application import TaskApplication, validate


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[Server]:
    """One server per backend for the module (starting one costs a second)."""
    with serve_backend(request, tmp_path_factory, "http_api") as s:
        yield s


@pytest.fixture
def api(server: Server) -> Iterator[httpx.Client]:
    with server.client() as c:
        yield c


def post(api: httpx.Client, body: object, **headers: str) -> httpx.Response:
    return api.post("/api/tasks", content=json.dumps(body),
                    headers={"Content-Type": "application/json", **headers})


def library_message(**fields: object) -> str:
    """What submit_task() says about this application."""
    with pytest.raises(ValueError) as refused:
        validate(TaskApplication(**fields))  # type: ignore[arg-type]
    return str(refused.value)


def test_submit_is_idempotent_and_conflicts_are_409(server: Server, api: httpx.Client) -> None:
    first = post(api, command("true"), **{"Idempotency-Key": "same-key"})
    assert first.status_code == 201, first.text
    run_id = first.json()["id"]
    before = counts(server.db)
    again = post(api, command("true"), **{"Idempotency-Key": "same-key"})
    assert (again.status_code, again.json()) == (200, {"id": run_id})
    in_body = post(api, command("true", idempotency_key="same-key"))
    assert (in_body.status_code, in_body.json()) == (200, {"id": run_id})
    other = post(api, command("false"), **{"Idempotency-Key": "same-key"})
    assert other.status_code == 409 and run_id in other.json()["detail"]
    disagree = post(api, command("true", idempotency_key="a"), **{"Idempotency-Key": "b"})
    assert disagree.status_code == 422
    assert counts(server.db) == before
    fresh = post(api, command("true"))
    assert fresh.status_code == 201 and fresh.json()["id"] != run_id


@pytest.mark.parametrize(("body", "expected"), [
    (command("true", execution_target="mars"),
     library_message(action_kind="command", args={"argv": ["true"]}, execution_target="mars")),
    ({"action_kind": "nope", "args": {}, "execution_target": "host"},
     library_message(action_kind="nope", args={}, execution_target="host")),
    ({"action_kind": "command", "args": {"argv": []}, "execution_target": "host"},
     library_message(action_kind="command", args={"argv": []}, execution_target="host")),
    ({"action_kind": "command", "args": [1], "execution_target": "host"},
     library_message(action_kind="command", args=[1], execution_target="host")),
    (command("true", timeout_seconds=-1),
     library_message(action_kind="command", args={"argv": ["true"]}, execution_target="host",
                     timeout_seconds=-1)),
    (command("true", depends_on=["no-such-run"]), "no-such-run"),
    (command("true", retry={"max_attempts": 0, "base_delay": 1}), "max_attempts"),
    (command("true", retry={"max_attempts": 2, "base_delay": 1, "x": 1}),
     "unknown retry field"),
    (command("true", colour="red"), "unknown field 'colour'"),
    (command("true", priority=1001),
     library_message(action_kind="command", args={"argv": ["true"]}, execution_target="host",
                     priority=1001)),
    (command("true", priority=2.5), "priority must be an integer"),
    (command("true", queue="no spaces"),
     library_message(action_kind="command", args={"argv": ["true"]}, execution_target="host",
                     queue="no spaces")),
    ({"action_kind": "command", "execution_target": "host"}, "missing field 'args'"),
    ([1, 2], "must be a JSON object"),
])
def test_refusals_are_422_with_the_librarys_message(
        server: Server, api: httpx.Client, body: object, expected: str) -> None:
    before = counts(server.db)
    got = post(api, body)
    assert got.status_code == 422, got.text
    assert expected in got.json()["detail"]
    assert counts(server.db) == before


@pytest.mark.parametrize("raw", [b"{", b"not json", b'{"a": NaN}', b"\xff\xfe",
                                 b'{"a": 1e999}', b""])
def test_bad_json_is_422_and_writes_nothing(server: Server, api: httpx.Client,
                                            raw: bytes) -> None:
    before = counts(server.db)
    got = api.post("/api/tasks", content=raw, headers={"Content-Type": "application/json"})
    assert got.status_code == 422 and got.json()["detail"]
    assert counts(server.db) == before


def test_wrong_media_type_is_415(server: Server, api: httpx.Client) -> None:
    """A form post (what another site's page can send without a preflight) is refused."""
    before = counts(server.db)
    got = api.post("/api/tasks", content=json.dumps(command("true")),
                   headers={"Content-Type": "text/plain"})
    assert got.status_code == 415
    assert counts(server.db) == before


def test_oversized_bodies_are_413_and_write_nothing(server: Server, api: httpx.Client) -> None:
    before = counts(server.db)
    big = json.dumps(command("echo", "x" * (1024 * 1024)))
    got = post(api, json.loads(big))
    assert got.status_code == 413

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit counts what arrives
        for i in range(0, len(big), 65536):
            yield big[i:i + 65536].encode()

    streamed = api.post("/api/tasks", content=chunks(),
                        headers={"Content-Type": "application/json"})
    assert streamed.status_code == 413
    assert counts(server.db) == before


def test_deeply_nested_bodies_are_422_and_write_nothing(server: Server,
                                                        api: httpx.Client) -> None:
    before = counts(server.db)
    deep = api.post("/api/tasks", content=b"[" * 100_000 + b"]" * 100_000,
                    headers={"Content-Type": "application/json"})
    assert deep.status_code == 422 and "deeper than" in deep.json()["detail"]
    nested: object = 1
    for _ in range(80):  # under the server's limit, over the library's args limit
        nested = {"k": nested}
    args = {"argv": ["true"], "x": nested}
    got = post(api, {"action_kind": "command", "args": args, "execution_target": "host"})
    assert got.status_code == 422
    assert got.json()["detail"] == library_message(action_kind="command", args=args,
                                                   execution_target="host")
    assert counts(server.db) == before


def test_list_filters_and_cursor_pages(server: Server, api: httpx.Client) -> None:
    mine = [post(api, command("true", required_capabilities=[], library_ref=f"page-{i}"))
            .json()["id"] for i in range(5)]
    other = post(api, {"action_kind": "agent", "args": {}, "execution_target": "process"})
    assert other.status_code == 201
    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, object] = {"limit": 2, "kind": "command", "target": "host"}
        if cursor:
            params["cursor"] = cursor
        page = api.get("/api/tasks", params=params)
        assert page.status_code == 200
        body = page.json()
        assert len(body["items"]) <= 2
        seen += [item["id"] for item in body["items"]]
        assert all(item["action_kind"] == "command" for item in body["items"])
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert len(seen) == len(set(seen))  # no repeats across pages
    assert seen[:5] == mine[::-1]  # newest first
    assert other.json()["id"] not in seen
    agents = api.get("/api/tasks", params={"kind": "agent", "status": "queued"}).json()
    assert [i["id"] for i in agents["items"]][:1] == [other.json()["id"]]
    assert api.get("/api/tasks", params={"cursor": "bogus"}).status_code == 422
    assert api.get("/api/tasks", params={"limit": 0}).status_code == 422
    assert api.get("/api/tasks", params={"limit": "x"}).status_code == 422


def test_concurrent_submits_each_get_their_own_run(server: Server) -> None:
    """Requests submitting at once may share a transaction (ledgerq.queue.submission.joined): each
    still gets 201 and the id of the run made from its own body; with a key, a repeat
    still gets 200 and the first run's id."""
    def one(i: int) -> httpx.Response:
        with server.client() as c:
            extra = {"Idempotency-Key": "conc-key"} if i % 10 == 0 else {}
            return post(c, command("echo", "keyed" if extra else f"concurrent {i}"), **extra)

    with ThreadPoolExecutor(max_workers=16) as pool:
        got = list(pool.map(one, range(40)))
    keyed = [g for i, g in enumerate(got) if i % 10 == 0]
    plain = [(i, g) for i, g in enumerate(got) if i % 10]
    assert all(g.status_code == 201 for _, g in plain), [g.text for _, g in plain]
    assert len({g.json()["id"] for _, g in plain}) == len(plain)
    with server.client() as c:
        for i, g in plain:
            run = c.get(f"/api/tasks/{g.json()['id']}").json()["run"]
            assert run["action_args"]["argv"] == ["echo", f"concurrent {i}"]
    # Four requests under one key with the same body: one made the run, three found it.
    assert sorted(g.status_code for g in keyed) == [200, 200, 200, 201]
    assert len({g.json()["id"] for g in keyed}) == 1


def test_priority_and_queue_are_submitted_shown_and_filtered(server: Server,
                                                             api: httpx.Client) -> None:
    made = post(api, command("true", priority=7, queue="http-ops"))
    assert made.status_code == 201, made.text
    run_id = made.json()["id"]
    run = api.get(f"/api/tasks/{run_id}").json()["run"]
    assert (run["priority"], run["queue"]) == (7, "http-ops")
    plain = post(api, command("true")).json()["id"]
    assert api.get(f"/api/tasks/{plain}").json()["run"]["queue"] == "default"
    listed = api.get("/api/tasks", params={"queue": "http-ops"}).json()["items"]
    assert [(i["id"], i["priority"], i["queue"]) for i in listed] == [(run_id, 7, "http-ops")]
    both = api.get("/api/tasks", params=[("queue", "http-ops"), ("queue", "default")]).json()
    assert {run_id, plain} <= {i["id"] for i in both["items"]}
    schema = api.get("/openapi.json").json()["components"]["schemas"]["TaskApplicationBody"]
    assert {"priority", "queue"} <= set(schema["properties"])


def test_show_and_cancel(server: Server, api: httpx.Client) -> None:
    run_id = post(api, command("true", depends_on=[])).json()["id"]
    shown = api.get(f"/api/tasks/{run_id}")
    assert shown.status_code == 200
    detail = shown.json()
    assert detail["run"]["id"] == run_id and detail["run"]["action_args"] == {"argv": ["true"]}
    assert [f["reason_code"] for f in detail["history"]] == ["run.queued.submitted"]
    assert api.get("/api/tasks/nope").status_code == 404
    done = api.post(f"/api/tasks/{run_id}/cancel")
    assert done.status_code == 200
    assert done.json() == {"id": run_id, "cancelled": True, "status": "cancelled"}
    before = counts(server.db)
    again = api.post(f"/api/tasks/{run_id}/cancel")
    assert again.status_code == 409 and "already ended" in again.json()["detail"]
    assert counts(server.db) == before
    assert api.post("/api/tasks/nope/cancel").status_code == 404
    history = api.get(f"/api/tasks/{run_id}").json()["history"]
    assert [f["reason_code"] for f in history] == ["run.queued.submitted",
                                                   "run.cancelled.operator"]


def test_specs_verify_health(server: Server, api: httpx.Client) -> None:
    specs = api.get("/api/specs").json()
    assert {s["entity"] for s in specs} >= {"schedule_run", "schedule"}
    run = api.get("/api/specs/schedule_run").json()
    assert "completed" in run["terminal"] and "run.completed.ok" in run["reason_codes"]
    assert {"source": "queued", "target": "running",
            "label": "patch lease_expires_at,leased_by / token lease_token"} in run["edges"]
    assert run["mermaid"].startswith("stateDiagram-v2")
    svg = api.get("/api/specs/schedule_run/diagram.svg")
    assert svg.headers["content-type"].startswith("image/svg+xml")
    assert "<svg" in svg.text and ">retry_wait<" in svg.text
    assert api.get("/api/specs/nope").status_code == 404
    assert api.get("/api/specs/nope/diagram.svg").status_code == 404
    assert api.get("/api/verify").json()["ok"] is True
    health = httpx.get(server.url + "/healthz")  # no token needed
    assert health.status_code == 200 and health.json()["ok"] is True


def test_a_worker_shows_in_workers_stats_and_metrics(server: Server, api: httpx.Client) -> None:
    """A real worker runs a task; the API and both metrics endpoints see it."""
    from helpers.server import free_port

    port = free_port()
    worker = start_worker(server.db, "--worker-id", "metrics-w", "--metrics-port", str(port))
    try:
        run_id = post(api, command(sys.executable, "-c", "print(1)")).json()["id"]
        assert wait_status(api, run_id, {"completed"})["run"]["status"] == "completed"
        workers = api.get("/api/workers").json()
        assert "metrics-w" in [w["worker_id"] for w in workers]
        stats = api.get("/api/stats").json()
        assert stats["counts"]["completed"] >= 1 and "metrics-w" in \
            [w["worker_id"] for w in stats["workers"]]
        text = api.get("/metrics").text
        deadline = time.monotonic() + 60
        while True:  # the worker's exporter refreshes its snapshot on its own schedule
            from_worker = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
            if "metrics-w" in from_worker or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    finally:
        stop(worker)
    for body in (text, from_worker):
        assert 'ledgerq_runs{status="queued"}' in body
        assert 'ledgerq_worker_heartbeat_age_seconds{worker_id="metrics-w"}' in body
        assert "ledgerq_lease_renewals_total" in body and "ledgerq_lease_expiries_total" in body
        assert "# TYPE ledgerq_claim_wait_seconds histogram" in body
    completed = [ln for ln in text.splitlines() if ln.startswith(
        'ledgerq_transitions_total{entity="schedule_run",reason_code="run.completed.ok"}')]
    assert completed and float(completed[0].split()[-1]) >= 1
    count = [ln for ln in text.splitlines() if ln.startswith("ledgerq_claim_wait_seconds_count")]
    assert count and float(count[0].split()[-1]) >= 1


READS = ["/api/tasks", "/api/tasks/x", "/api/workers", "/api/schedules", "/api/stats",
         "/api/specs",
         "/api/specs/schedule_run", "/api/specs/schedule_run/diagram.svg", "/api/verify",
         "/metrics"]
WRITES = ["/api/tasks", "/api/tasks/x/cancel"]


def test_every_route_refuses_a_missing_or_wrong_token(server: Server) -> None:
    before = counts(server.db)
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic eDp5"},
                    {"Authorization": f"Bearer {TOKEN}x"}):
        with httpx.Client(base_url=server.url, headers=headers) as anon:
            for path in READS:
                got = anon.get(path)
                assert got.status_code == 401, (path, headers)
                assert got.headers["www-authenticate"].startswith("Bearer")
            for path in WRITES:
                got = anon.post(path, content=json.dumps(command("true")),
                                headers={"Content-Type": "application/json"})
                assert got.status_code == 401, (path, headers)
    assert counts(server.db) == before


def test_the_db_location_and_sql_never_appear(server: Server, api: httpx.Client) -> None:
    location = server.db.split("?")[0]
    for path in [*READS, "/openapi.json", "/healthz", "/"]:
        body = api.get(path).text
        assert location not in body, path
        assert "SELECT " not in body and "status_transitions" not in body, path


def test_security_headers_and_no_inline_script(server: Server, api: httpx.Client) -> None:
    page = httpx.get(server.url + "/")
    assert page.status_code == 200
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    assert "frame-ancestors 'none'" in csp
    assert page.headers["x-content-type-options"] == "nosniff"
    assert page.headers["x-frame-options"] == "DENY"
    import re

    for tag in re.findall(r"<script[^>]*>(.*?)</script>", page.text, re.S):
        assert tag.strip() == ""  # every script is a src= file
    assert not re.search(r"\son[a-z]+=", page.text)  # no inline event handlers
    js = httpx.get(server.url + "/static/app.js").text
    assert "innerHTML" not in js and "eval(" not in js
    api_headers = api.get("/api/stats").headers
    assert api_headers["cache-control"] == "no-store"
    # CORS is off: a preflight from another origin gets no allowance.
    pre = httpx.options(server.url + "/api/tasks", headers={
        "Origin": "http://evil.example", "Access-Control-Request-Method": "POST"})
    assert "access-control-allow-origin" not in pre.headers
    # DNS rebinding: a loopback server answers loopback host names only.
    assert httpx.get(server.url + "/healthz", headers={"Host": "evil.example"}
                     ).status_code == 400


def test_openapi_is_complete(server: Server) -> None:
    doc = httpx.get(server.url + "/openapi.json").json()
    paths = doc["paths"]
    expected = {
        ("post", "/api/tasks"): {"200", "201", "401", "403", "409", "413", "415", "422"},
        ("get", "/api/tasks"): {"200", "401", "422"},
        ("get", "/api/tasks/{task_id}"): {"200", "401", "404"},
        ("post", "/api/tasks/{task_id}/cancel"): {"200", "401", "403", "404", "409"},
        ("get", "/api/workers"): {"200", "401"}, ("get", "/api/stats"): {"200", "401"},
        ("get", "/api/schedules"): {"200", "401"},
        ("get", "/api/specs"): {"200", "401"}, ("get", "/api/specs/{entity}"): {"200", "404"},
        ("get", "/api/specs/{entity}/diagram.svg"): {"200", "404"},
        ("get", "/api/verify"): {"200", "401"}, ("get", "/healthz"): {"200"},
        ("get", "/metrics"): {"200", "401"},
    }
    for (method, path), codes in expected.items():
        responses = paths[path][method]["responses"]
        assert codes <= set(responses), (method, path, sorted(responses))
    refs = {m for m in json.dumps(doc).split('"$ref": "')[1:]}
    for ref in refs:
        name = ref.split('"')[0].rsplit("/", 1)[-1]
        assert name in doc["components"]["schemas"], name
    body = paths["/api/tasks"]["post"]["requestBody"]["content"]["application/json"]
    assert body["schema"]["$ref"].endswith("/TaskApplicationBody")
    assert "bearer" in json.dumps(doc["components"]["securitySchemes"]).lower()


def test_a_foreign_host_is_refused_on_every_operation_as_documented(server: Server) -> None:
    """The DNS-rebinding guard answers before any route: 400, on every operation, and
    every operation's document says so (the fuzz test found /metrics did not)."""
    doc = httpx.get(server.url + "/openapi.json").json()
    for path, operations in doc["paths"].items():
        url = server.url + path.replace("{task_id}", "x").replace("{entity}", "schedule_run")
        for method, operation in operations.items():
            got = httpx.request(method, url, headers={"Host": "nil"})
            assert got.status_code == 400, (method, path, got.status_code)
            assert "400" in operation["responses"], (method, path)


def test_public_read_and_tokenless_servers(tmp_path: Path) -> None:
    db = str(tmp_path / "p.db")
    with serve(db, args=["--public-read"]) as s, httpx.Client(base_url=s.url) as anon:
        for path in READS:
            # Folding the whole log is not for anyone who asks: verify keeps the token.
            expected = (401,) if path == "/api/verify" else (200, 404)
            assert anon.get(path).status_code in expected, path
        with s.client() as authed:
            assert authed.get("/api/verify").json()["ok"] is True
        assert anon.post("/api/tasks", content=json.dumps(command("true")),
                         headers={"Content-Type": "application/json"}).status_code == 401
    with serve(db, token=None) as s, httpx.Client(base_url=s.url) as anon:
        assert anon.get("/api/stats").status_code == 200
        got = anon.post("/api/tasks", content=json.dumps(command("true")),
                        headers={"Content-Type": "application/json"})
        assert got.status_code == 403 and "read-only" in got.json()["detail"]
    assert counts(db) == (0, 0)


def test_no_token_off_loopback_refuses_to_start(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = subprocess.run([sys.executable, "-m", "ledgerq", "serve", "--db",
                          str(tmp_path / "x.db"), "--host", "0.0.0.0", "--port", str(port)],
                         env=token_env(None), capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "without a token" in lines[0]
    assert not (tmp_path / "x.db").exists()


def test_tokens_are_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison goes through hmac.compare_digest (over bytes), never ``==``."""
    import hmac

    from ledgerq.web import auth

    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    assert auth.token_matches(TOKEN, TOKEN) and not auth.token_matches(TOKEN, "x")
    assert calls == [(TOKEN.encode(), TOKEN.encode()), (TOKEN.encode(), b"x")]


def test_schedules_are_listed_with_their_next_fire(server: Server, api: httpx.Client) -> None:
    """A schedule added through the library appears, with its next fire time."""
    import asyncio

    from ledgerq import StateDB
    from ledgerq.queue import TaskApplication
    from ledgerq.queue.scheduling.schedules import add_schedule

    async def add() -> str:
        async with StateDB(server.db) as db:
            return str(await add_schedule(db, f"nightly-{uuid.uuid4().hex[:6]}",
                                          cron="0 2 * * *",
                                          application=TaskApplication("flow", {}, "host")))

    sid = asyncio.run(add())
    listed = {s["id"]: s for s in api.get("/api/schedules").json()}
    assert sid in listed and listed[sid]["next_fire_at"] > 0
    assert listed[sid]["last_fire"] is None
