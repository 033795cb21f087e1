"""Submission and cancellation: validation, the row, and enforced idempotency."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import math
import socket
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.raw import RAW_ERRORS, raw, refusal
from ledgerq import StateDB
from ledgerq.codec import dumps, loads
from ledgerq.errors import IntegrityViolation, InvalidInput
from ledgerq.lifecycle import Actor
from ledgerq.projections import history, verify
from ledgerq.queue import (
    CAPABILITY_CLASSES,
    DEFAULT_CAPABILITY_CLASS,
    RetryPolicy,
    TaskApplication,
    cancel_task,
    submit_many,
    submit_task,
    worker_tick,
)
from ledgerq.queue.submission.application import digest, validate, validate_encoded

NOW = 1_000.0
HOST = "node-a"
CANONICAL_KINDS = ("agent", "flow", "fanout", "play", "flow_yaml", "engine", "workflow")
TARGETS = ("host", "local_worktree", "daytona", "remote_agent", "process")
OPERATOR = Actor(type="operator", id="alice")


@pytest.fixture
async def qdb(db_target: str) -> AsyncIterator[StateDB]:
    async with StateDB(db_target) as handle:
        yield handle


def app(**kw: Any) -> TaskApplication:
    fields: dict[str, Any] = {"action_kind": "agent", "args": {"prompt": "hi"},
                              "execution_target": "host"}
    fields.update(kw)
    return TaskApplication(**fields)


async def counts(db: StateDB) -> tuple[int, int]:
    got = await db.fetch_one(
        "SELECT (SELECT count(*) FROM schedule_runs) AS runs, "
        "(SELECT count(*) FROM status_transitions) AS facts")
    assert got is not None
    return int(got["runs"]), int(got["facts"])


async def get_row(db: StateDB, run_id: str) -> dict[str, Any]:
    row = await db.fetch_one("SELECT * FROM schedule_runs WHERE id = ?", (run_id,))
    assert row is not None, run_id
    return row


def expected_key(host: str, caps: list[str]) -> str | None:
    serial = sorted({c for c in caps
                     if CAPABILITY_CLASSES.get(c, DEFAULT_CAPABILITY_CLASS) == "serialization"})
    return f"{host}:{'+'.join(serial)}" if serial else None


# ----------------------------------------------------------------- validation


def test_task_application_is_frozen() -> None:
    a = app()
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.action_kind = "flow"  # type: ignore[misc]
    assert a.required_capabilities == []
    assert a.library_ref is None and a.library_content_hash is None
    assert a.idempotency_key is None


_NAN = float("nan")


@pytest.mark.parametrize(("field", "value"), [
    ("action_kind", "bogus"),
    ("action_kind", ""),
    ("action_kind", "Play"),
    ("action_kind", 7),
    ("action_kind", None),
    ("execution_target", "mars"),
    ("execution_target", ""),
    ("execution_target", "HOST"),
    ("execution_target", None),
    ("args", []),
    ("args", "prompt=hi"),
    ("args", None),
    ("args", {"x": object()}),
    ("args", {"x": _NAN}),
    ("args", {"x": float("inf")}),
    ("args", {"x": {1, 2}}),
    ("required_capabilities", "gpu"),
    ("required_capabilities", ("gpu",)),
    ("required_capabilities", None),
    ("required_capabilities", [""]),
    ("required_capabilities", ["gpu", ""]),
    ("required_capabilities", [5]),
    ("required_capabilities", ["gpu", None]),
    ("library_ref", 5),
    ("library_ref", b"ref"),
    ("library_content_hash", 5),
    ("library_content_hash", b"\x00"),
    ("idempotency_key", ""),
    ("idempotency_key", 5),
    ("timeout_seconds", 0),
    ("timeout_seconds", -1.0),
    ("timeout_seconds", _NAN),
    ("timeout_seconds", True),
    ("retry", "3 times"),
    ("depends_on", "some-run-id"),
    ("depends_on", [""]),
    ("depends_on", None),
])
async def test_each_invalid_field_raises_naming_it_and_writes_nothing(
        qdb: StateDB, field: str, value: Any) -> None:
    await submit_task(qdb, app(), now=NOW)  # a non-empty database
    before = await counts(qdb)
    bad = dataclasses.replace(app(), **{field: value})
    with pytest.raises(ValueError, match=field):
        await submit_task(qdb, bad, now=NOW)
    with pytest.raises(ValueError, match=field):
        await submit_many(qdb, [app(), bad, app()], now=NOW)
    assert await counts(qdb) == before


async def test_command_kind_needs_an_argv_list(qdb: StateDB) -> None:
    bad_args: list[dict[str, Any]] = [{}, {"argv": []}, {"argv": "echo hi"},
                                      {"argv": ["", "x"]}, {"argv": ["echo", 1]}]
    for args in bad_args:
        with pytest.raises(ValueError, match="argv"):
            await submit_task(qdb, app(action_kind="command", args=args), now=NOW)
    assert await counts(qdb) == (0, 0)
    rid = await submit_task(qdb, app(action_kind="command", args={"argv": ["echo", "hi"]}))
    assert loads((await get_row(qdb, rid))["action_args"]) == {"argv": ["echo", "hi"]}


async def test_unknown_kind_lists_canonical_kinds_and_alias(qdb: StateDB) -> None:
    with pytest.raises(ValueError) as info:
        await submit_task(qdb, app(action_kind="shell"))
    message = str(info.value)
    assert "'shell'" in message and "action_kind" in message
    for kind in (*CANONICAL_KINDS, "command", "playbook"):
        assert kind in message, kind
    assert await counts(qdb) == (0, 0)


async def test_unknown_target_lists_the_closed_set(qdb: StateDB) -> None:
    with pytest.raises(ValueError) as info:
        await submit_task(qdb, app(execution_target="kubernetes"))
    message = str(info.value)
    assert "'kubernetes'" in message and "execution_target" in message
    for target in TARGETS:
        assert target in message, target
    assert await counts(qdb) == (0, 0)


@pytest.mark.parametrize("kind", [*CANONICAL_KINDS, "command"])
@pytest.mark.parametrize("target", TARGETS)
async def test_every_kind_and_target_is_accepted(qdb: StateDB, kind: str, target: str) -> None:
    args = {"argv": ["true"]} if kind == "command" else {}
    rid = await submit_task(qdb, app(action_kind=kind, args=args, execution_target=target))
    row = await get_row(qdb, rid)
    assert (row["action_kind"], row["execution_target"]) == (kind, target)


async def test_empty_args_are_valid(qdb: StateDB) -> None:
    rid = await submit_task(qdb, app(args={}), now=NOW)
    assert loads((await get_row(qdb, rid))["action_args"]) == {}


async def test_capabilities_are_stored_verbatim_duplicates_kept(qdb: StateDB) -> None:
    caps = ["b", "a", "b", "warmed-cache", "warmed-cache", "gpu-exclusive", " spaced "]
    rid = await submit_task(qdb, app(required_capabilities=caps), now=NOW, host=HOST)
    row = await get_row(qdb, rid)
    assert loads(row["required_capabilities"]) == caps
    assert row["concurrency_key"] == f"{HOST}:gpu-exclusive"
    rid = await submit_task(qdb, app(), now=NOW)
    assert loads((await get_row(qdb, rid))["required_capabilities"]) == []


async def test_provenance_is_stored_verbatim_and_not_resolved(qdb: StateDB) -> None:
    ref = "  ./does/not/exist@v0 "
    digest = "sha256:NOT-A-REAL-HASH"
    rid = await submit_task(qdb, app(library_ref=ref, library_content_hash=digest), now=NOW)
    row = await get_row(qdb, rid)
    assert (row["library_ref"], row["library_content_hash"]) == (ref, digest)
    rid = await submit_task(qdb, app(library_ref="", library_content_hash=None), now=NOW)
    row = await get_row(qdb, rid)
    assert (row["library_ref"], row["library_content_hash"]) == ("", None)


async def test_playbook_is_stored_as_play_without_mutating_the_application(
        qdb: StateDB) -> None:
    a = app(action_kind="playbook", args={"name": "deploy"})
    rid = await submit_task(qdb, a, now=NOW)
    assert a.action_kind == "playbook"
    assert a.args == {"name": "deploy"}
    assert (await get_row(qdb, rid))["action_kind"] == "play"
    (fact,) = await history(qdb, "schedule_run", rid)
    assert loads(fact["patch"])["action_kind"] == "play"


async def test_empty_idempotency_key_raises_and_writes_nothing(qdb: StateDB) -> None:
    with pytest.raises(ValueError, match="idempotency_key"):
        await submit_task(qdb, app(idempotency_key=""), now=NOW)
    assert await counts(qdb) == (0, 0)


async def test_unknown_dependency_raises_and_writes_nothing(qdb: StateDB) -> None:
    real = await submit_task(qdb, app(), now=NOW)
    before = await counts(qdb)
    with pytest.raises(ValueError, match="no-such-run"):
        await submit_task(qdb, app(depends_on=[real, "no-such-run"]), now=NOW)
    assert await counts(qdb) == before


# ----------------------------------------------------------------- the row


async def test_submitted_row_is_the_records_row_plus_a_creation_fact(qdb: StateDB) -> None:
    a = app(args={"prompt": "hi", "n": 2, "nested": {"x": [1, 2.5, None]}},
            required_capabilities=["gpu-exclusive", "warmed-cache", "x"],
            library_ref="lib/x@1", library_content_hash="sha256:abc")
    rid = await submit_task(qdb, a, now=NOW, host="node-7")
    assert isinstance(rid, str) and len(rid) == 36
    assert str(uuid.UUID(rid)) == rid
    row = await get_row(qdb, rid)
    assert row["id"] == rid
    assert row["status"] == "queued"
    assert row["schedule_id"] is None
    assert row["invocation_id"] is None
    assert loads(row["trigger_context"]) == {}
    assert row["chain_depth"] == 0
    assert row["chain_parent_id"] is None
    assert row["fired_at"] == row["created_at"] == row["queued_at"] == NOW
    assert row["action_kind"] == "agent"
    assert loads(row["action_args"]) == a.args
    assert loads(row["required_capabilities"]) == a.required_capabilities
    assert row["execution_target"] == "host"
    assert (row["library_ref"], row["library_content_hash"]) == ("lib/x@1", "sha256:abc")
    assert row["concurrency_key"] == "node-7:gpu-exclusive"
    assert row["leased_by"] is None and row["lease_expires_at"] is None
    assert row["lease_attempts"] == 0
    assert row["ended_at"] is None and row["exit_code"] is None and row["error_detail"] is None

    facts = await history(qdb, "schedule_run", rid)
    assert len(facts) == 1
    (fact,) = facts
    assert fact["previous_status"] is None
    assert fact["status"] == "queued"
    assert fact["reason_code"] == "run.queued.submitted"
    assert fact["created_at"] == NOW
    assert fact["entity_version"] == 1
    assert (await verify(qdb)).ok


async def test_no_serialization_token_means_no_concurrency_key(qdb: StateDB) -> None:
    rid = await submit_task(qdb, app(required_capabilities=["warmed-cache", "cuda"]),
                            now=NOW, host=HOST)
    assert (await get_row(qdb, rid))["concurrency_key"] is None


async def test_concurrency_key_defaults_to_this_host(qdb: StateDB) -> None:
    rid = await submit_task(qdb, app(required_capabilities=["gpu-exclusive"]), now=NOW)
    row = await get_row(qdb, rid)
    assert row["concurrency_key"] == f"{socket.gethostname()}:gpu-exclusive"


async def test_ids_are_unique(qdb: StateDB) -> None:
    ids = await submit_many(qdb, [app() for _ in range(50)], now=NOW)
    assert len(set(ids)) == 50


async def test_row_and_creation_fact_commit_together(qdb: StateDB) -> None:
    """If the fact cannot be written, the row is not written either."""
    conn = raw(qdb.path)
    create, undo = refusal(qdb.path, "refuse_facts", event="INSERT", message="no facts today",
                           table="status_transitions")
    try:
        for statement in create:
            conn.execute(statement)
        with pytest.raises(IntegrityViolation, match="no facts today"):
            await submit_task(qdb, app(), now=NOW)
        assert await counts(qdb) == (0, 0)
        for statement in undo:
            conn.execute(statement)
    finally:
        conn.close()
    await submit_task(qdb, app(), now=NOW)
    assert await counts(qdb) == (1, 1)


# ----------------------------------------------------------------- idempotency


async def test_same_key_and_equal_application_returns_the_original_id(qdb: StateDB) -> None:
    first = await submit_task(qdb, app(idempotency_key="k-1"), now=NOW)
    before = await counts(qdb)
    again = await submit_task(qdb, app(idempotency_key="k-1"), now=NOW + 50)
    assert again == first
    assert await counts(qdb) == before
    row = await get_row(qdb, first)
    assert row["idempotency_key"] == "k-1"
    assert row["queued_at"] == NOW  # the original row, untouched


async def test_equal_means_after_normalization(qdb: StateDB) -> None:
    first = await submit_task(qdb, app(action_kind="playbook", idempotency_key="k"), now=NOW)
    assert await submit_task(qdb, app(action_kind="play", idempotency_key="k")) == first
    assert await counts(qdb) == (1, 1)


@pytest.mark.parametrize("change", [
    {"args": {"prompt": "bye"}},
    {"action_kind": "flow"},
    {"execution_target": "process"},
    {"required_capabilities": ["a"]},
    {"library_ref": "lib@2"},
    {"library_content_hash": "sha256:other"},
    {"timeout_seconds": 5.0},
    {"retry": RetryPolicy(max_attempts=2, base_delay=1.0)},
])
async def test_same_key_with_a_different_application_raises(qdb: StateDB,
                                                            change: dict[str, Any]) -> None:
    first = await submit_task(qdb, app(idempotency_key="k-1"), now=NOW)
    before = await counts(qdb)
    with pytest.raises(ValueError, match="idempotency_key") as info:
        await submit_task(qdb, app(idempotency_key="k-1", **change), now=NOW)
    assert first in str(info.value)
    assert await counts(qdb) == before


async def test_different_keys_insert_different_rows(qdb: StateDB) -> None:
    a = await submit_task(qdb, app(idempotency_key="k-1"), now=NOW)
    b = await submit_task(qdb, app(idempotency_key="k-2"), now=NOW)
    c = await submit_task(qdb, app(), now=NOW)
    d = await submit_task(qdb, app(), now=NOW)  # no key: no deduplication
    assert len({a, b, c, d}) == 4


async def test_key_is_unique_in_the_database_itself(qdb: StateDB) -> None:
    rid = await submit_task(qdb, app(idempotency_key="k-1"), now=NOW)
    conn = raw(qdb.path)
    try:
        values = dict(await qdb.fetch_one("SELECT * FROM schedule_runs WHERE id = ?", (rid,))
                      or {})
        values["id"] = str(uuid.uuid4())
        with pytest.raises(RAW_ERRORS, match=r"(?i)unique|duplicate"):
            conn.execute(f"INSERT INTO schedule_runs ({', '.join(values)}) "
                         f"VALUES ({', '.join('?' * len(values))})", tuple(values.values()))
    finally:
        conn.close()


async def test_concurrent_submitters_on_one_connection_make_one_row(qdb: StateDB) -> None:
    ids = await asyncio.gather(*(submit_task(qdb, app(idempotency_key="same"), now=NOW)
                                 for _ in range(10)))
    assert len(set(ids)) == 1
    assert await counts(qdb) == (1, 1)


async def test_concurrent_submitters_on_two_connections_make_one_row(db_target: str) -> None:
    path = db_target
    async with StateDB(path) as one, StateDB(path) as two:
        for i in range(10):
            key = f"race-{i}"
            ids = await asyncio.gather(
                submit_task(one, app(idempotency_key=key), now=NOW),
                submit_task(two, app(idempotency_key=key), now=NOW),
                submit_task(one, app(idempotency_key=key), now=NOW),
                submit_task(two, app(idempotency_key=key), now=NOW),
            )
            assert len(set(ids)) == 1, ids
            rows = await one.fetch_all("SELECT id FROM schedule_runs WHERE idempotency_key = ?",
                                       (key,))
            assert [r["id"] for r in rows] == [ids[0]]
        assert await counts(one) == (10, 10)
        assert (await verify(one)).ok


# ----------------------------------------------------------------- submit_many


async def test_submit_many_returns_ids_in_order(qdb: StateDB) -> None:
    apps = [app(args={"i": i}) for i in range(5)]
    ids = await submit_many(qdb, apps, now=NOW)
    assert len(ids) == 5
    for i, rid in enumerate(ids):
        row = await get_row(qdb, rid)
        assert loads(row["action_args"]) == {"i": i}
        assert row["queued_at"] == NOW
        assert len(await history(qdb, "schedule_run", rid)) == 1
    assert await submit_many(qdb, [], now=NOW) == []
    assert await counts(qdb) == (5, 5)


async def test_submit_many_is_all_or_nothing_on_an_invalid_application(qdb: StateDB) -> None:
    await submit_task(qdb, app(), now=NOW)
    before = await counts(qdb)
    with pytest.raises(ValueError, match="execution_target"):
        await submit_many(qdb, [app(), app(), app(execution_target="moon")], now=NOW)
    assert await counts(qdb) == before


async def test_submit_many_is_all_or_nothing_on_an_unknown_dependency(qdb: StateDB) -> None:
    real = await submit_task(qdb, app(), now=NOW)
    before = await counts(qdb)
    with pytest.raises(ValueError, match="missing-run"):
        await submit_many(qdb, [app(), app(depends_on=[real]), app(depends_on=["missing-run"])],
                          now=NOW)
    assert await counts(qdb) == before


async def test_submit_many_is_all_or_nothing_on_a_key_clash(qdb: StateDB) -> None:
    await submit_task(qdb, app(idempotency_key="k"), now=NOW)
    before = await counts(qdb)
    with pytest.raises(ValueError, match="idempotency_key"):
        await submit_many(qdb, [app(), app(idempotency_key="k", args={"other": 1})], now=NOW)
    assert await counts(qdb) == before


async def test_submit_many_deduplicates_a_key_repeated_inside_the_batch(qdb: StateDB) -> None:
    ids = await submit_many(qdb, [app(idempotency_key="k"), app(), app(idempotency_key="k")],
                            now=NOW)
    assert ids[0] == ids[2] != ids[1]
    assert await counts(qdb) == (2, 2)
    with pytest.raises(ValueError, match="idempotency_key"):
        await submit_many(qdb, [app(idempotency_key="j"), app(idempotency_key="j", args={})])
    assert await counts(qdb) == (2, 2)


async def test_a_long_batch_keeps_its_order_its_facts_and_all_or_nothing(
        qdb: StateDB) -> None:
    """A long batch (on PostgreSQL, runs of plain rows go as COPYs) writes every row in
    order with its fact, a keyed application between two runs included; a refusal after
    rows were sent writes none of them."""
    n, mid = 407, 203
    apps = [app(args={"i": i}) for i in range(n)]
    apps[mid] = app(args={"i": mid}, idempotency_key="mid")
    ids = await submit_many(qdb, apps, now=NOW)
    stored = {r["id"]: loads(r["action_args"])["i"]
              for r in await qdb.fetch_all("SELECT id, action_args FROM schedule_runs")}
    assert [stored[rid] for rid in ids] == list(range(n))
    assert await counts(qdb) == (n, n)
    with pytest.raises(ValueError, match="idempotency_key"):
        await submit_many(qdb, [*(app(args={"j": i}) for i in range(n)),
                                app(idempotency_key="mid", args={"other": 1})], now=NOW)
    assert await counts(qdb) == (n, n)
    # An application refused late in a long batch: named by its index, and nothing of
    # the batch written.
    late = [app(args={"k": i}) for i in range(n)]
    late[n - 2] = app(execution_target="moon")
    with pytest.raises(InvalidInput, match=rf"^apps\[{n - 2}\]: unknown execution_target"):
        await submit_many(qdb, late, now=NOW)
    assert await counts(qdb) == (n, n)
    report = await verify(qdb)
    assert report.ok, report.drift


# ----------------------------------------------------------------- cancel_task


async def test_cancel_a_queued_run(qdb: StateDB) -> None:
    rid = await submit_task(qdb, app(), now=NOW)
    assert await cancel_task(qdb, rid, actor=OPERATOR, now=NOW + 5) is True
    row = await get_row(qdb, rid)
    assert row["status"] == "cancelled"
    assert row["ended_at"] == NOW + 5
    facts = await history(qdb, "schedule_run", rid)
    assert [(f["previous_status"], f["status"]) for f in facts] == [
        (None, "queued"), ("queued", "cancelled")]
    last = facts[-1]
    assert last["reason_code"] == "run.cancelled.operator"
    assert (last["source"], last["actor"]) == ("operator", "alice")
    assert (await verify(qdb)).ok


async def test_second_cancel_returns_false_and_writes_nothing(qdb: StateDB) -> None:
    rid = await submit_task(qdb, app(), now=NOW)
    assert await cancel_task(qdb, rid, actor=OPERATOR, now=NOW)
    before = await counts(qdb)
    assert await cancel_task(qdb, rid, actor=Actor(type="agent", id="bob"), now=NOW) is False
    assert await counts(qdb) == before
    assert (await get_row(qdb, rid))["status"] == "cancelled"


async def test_cancel_unknown_id_raises_lookup_error_naming_it(qdb: StateDB) -> None:
    missing = str(uuid.uuid4())
    with pytest.raises(LookupError, match=missing):
        await cancel_task(qdb, missing, actor=OPERATOR)
    assert await counts(qdb) == (0, 0)


async def test_cancel_before_claim_means_never_leased(qdb: StateDB) -> None:
    rid = await submit_task(qdb, app(action_kind="command", args={"argv": ["true"]}), now=NOW)
    assert await cancel_task(qdb, rid, actor=OPERATOR, now=NOW)
    ran: list[str] = []

    async def execute(run: dict[str, Any]) -> tuple[int, str]:
        ran.append(run["id"])
        return 0, ""

    for i in range(3):
        got = await worker_tick(qdb, worker_id="w1", execute=execute, now=NOW + 1 + i)
        assert got["claimed"] == 0
    assert ran == []
    row = await get_row(qdb, rid)
    assert row["status"] == "cancelled"
    assert row["leased_by"] is None and row["lease_expires_at"] is None
    assert row["lease_attempts"] == 0
    assert "running" not in {f["status"] for f in await history(qdb, "schedule_run", rid)}


# ----------------------------------------------------------------- property: stored or rejected

_FRESH = object()  # placeholder: a new idempotency key per example
_DEP = object()  # placeholder: the id of a run that exists

_json_scalars = (st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1)
                 | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=6))
_json = st.recursive(_json_scalars, lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=6)
_valid_dict = st.dictionaries(st.text(max_size=5), _json, max_size=3)
_argv = st.lists(st.text(max_size=4), max_size=3) | st.just("echo hi") | st.just([""]) \
    | st.lists(st.integers(), min_size=1, max_size=2)


_OK: dict[str, st.SearchStrategy[Any]] = {
    "action_kind": st.sampled_from([*CANONICAL_KINDS, "command", "playbook"]),
    "args": _valid_dict | st.builds(lambda d, argv: {**d, "argv": argv}, _valid_dict, _argv),
    "execution_target": st.sampled_from(TARGETS),
    "required_capabilities": st.lists(
        st.sampled_from(["gpu-exclusive", "warmed-cache", "a"]) | st.text(min_size=1, max_size=4),
        max_size=4),
    "library_ref": st.none() | st.text(max_size=8),
    "library_content_hash": st.none() | st.text(max_size=8),
    "idempotency_key": st.none() | st.just(_FRESH),
    "retry": st.none() | st.builds(RetryPolicy, max_attempts=st.integers(1, 5),
                                   base_delay=st.floats(0, 10)),
    "timeout_seconds": st.none() | st.floats(1e-3, 1e6) | st.integers(1, 1000),
    "depends_on": st.sampled_from([(), [_DEP], (_DEP, _DEP)]),
}
_BAD: dict[str, st.SearchStrategy[Any]] = {
    "action_kind": st.sampled_from(["bogus", "", "Play", "PLAYBOOK", " agent", "shell"])
    | st.integers() | st.none(),
    # not a dict, or a dict that would not survive storage unchanged
    "args": st.sampled_from([[], [1], "x=1", None, {"x": float("nan")}, {"x": float("inf")},
                             {"x": [float("-inf")]}, {"x": {1}}, {"x": object()},
                             {"x": (1, 2)}, {1: "int key"}, {"x": b"bytes"}]),
    "execution_target": st.sampled_from(["", "Host", "mars"]) | st.none(),
    "required_capabilities": st.lists(st.just("") | st.integers() | st.none(), min_size=1,
                                      max_size=2)
    .flatmap(lambda bad: st.lists(st.just("a"), max_size=2).map(lambda ok: ok + bad))
    | st.sampled_from([("a",), "a", None, {"a"}]),
    "library_ref": st.integers() | st.binary(max_size=2),
    "library_content_hash": st.integers(),
    "idempotency_key": st.just("") | st.integers(),
    "retry": st.just("3") | st.integers(1, 3),
    "timeout_seconds": st.floats(max_value=0)
    | st.sampled_from([float("nan"), float("inf"), True, "5"]),
    "depends_on": st.sampled_from([["no-such-run"], "abc", [""], [5], None]),
}


@st.composite
def _applications(draw: st.DrawFn) -> dict[str, tuple[Any, bool]]:
    """Mostly valid fields with zero, one or two corrupted: each rule gets exercised alone."""
    n_bad = draw(st.sampled_from([0, 0, 1, 1, 1, 2]))
    bad = set(draw(st.lists(st.sampled_from(sorted(_OK)), min_size=n_bad, max_size=n_bad,
                            unique=True)))
    return {name: ((draw(_BAD[name]), False) if name in bad else (draw(_OK[name]), True))
            for name in _OK}


def _expected_valid(drawn: dict[str, tuple[Any, bool]]) -> bool:
    """An independent statement of the submit validation for the values the strategy draws."""
    if not all(ok for _, ok in drawn.values()):
        return False
    def texts(value: Any) -> Iterator[str]:
        if isinstance(value, str):
            yield value
        elif isinstance(value, dict):
            for k, v in value.items():
                yield from texts(k)
                yield from texts(v)
        elif isinstance(value, list | tuple):
            for v in value:
                yield from texts(v)

    if any("\x00" in t for v, _ in drawn.values() for t in texts(v)):
        return False  # no text column (nor jsonb) holds NUL, on either backend
    if drawn["action_kind"][0] == "command":
        argv = drawn["args"][0].get("argv")
        return (isinstance(argv, list) and bool(argv) and all(isinstance(a, str) for a in argv)
                and bool(argv[0]))
    return True


class _NeverEqual(dict[str, Any]):
    """A dict whose JSON reads back as a plain dict that it never equals."""

    def __eq__(self, other: object) -> bool:
        return False

    __hash__ = None  # type: ignore[assignment]


class _Items(list[Any]):
    """A list subclass: JSON has no such type, but it reads back as the items it holds."""


async def test_args_that_would_not_read_back_as_given_are_refused(qdb: StateDB) -> None:
    # The walk passes subclasses of JSON's containers to the encoder, then checks that the
    # text reads back equal: JSON's own exact types always do, so only these are checked.
    before = await counts(qdb)
    with pytest.raises(InvalidInput, match="would not be stored exactly"):
        await submit_task(qdb, app(args={"n": _NeverEqual(a=1)}), now=NOW, host=HOST)
    assert await counts(qdb) == before
    rid = await submit_task(qdb, app(args={"k": _Items(["v", 1.5])}), now=NOW, host=HOST)
    assert loads((await get_row(qdb, rid))["action_args"]) == {"k": ["v", 1.5]}


def test_a_digest_of_args_encoded_once_is_the_digest_of_the_whole() -> None:
    args = {"b": [1, {"z": None, "a": -0.0}], "a": "é\u2028", "n": 2**70}
    checked, text = validate_encoded(TaskApplication("agent", args, "host"))
    assert text == dumps(args)
    assert digest(checked, text) == digest(checked) == digest(validate(checked))


def test_random_applications_are_stored_exactly_or_rejected(tmp_path: Path) -> None:
    with asyncio.Runner() as runner:
        db = StateDB(tmp_path / "h.db")
        runner.run(db.open())
        dep = runner.run(submit_task(db, app(), now=NOW))
        try:
            @settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
            @given(_applications())
            def check(drawn: dict[str, tuple[Any, bool]]) -> None:
                runner.run(_check_application(db, dep, drawn))

            check()
        finally:
            runner.run(db.close())


async def _check_application(db: StateDB, dep: str, drawn: dict[str, tuple[Any, bool]]) -> None:
    fields = {name: value for name, (value, _) in drawn.items()}
    if fields["idempotency_key"] is _FRESH:
        fields["idempotency_key"] = f"key-{uuid.uuid4()}"
    deps = fields["depends_on"]
    if isinstance(deps, list | tuple):
        fields["depends_on"] = type(deps)(dep if d is _DEP else d for d in deps)
    valid = _expected_valid(drawn)
    submitted = TaskApplication(**fields)
    snapshot = copy.deepcopy(fields)
    before = await counts(db)
    if not valid:
        with pytest.raises(ValueError):
            await submit_task(db, submitted, now=NOW, host=HOST)
        assert await counts(db) == before
        return
    rid = await submit_task(db, submitted, now=NOW, host=HOST)
    # the application object is never mutated
    assert submitted.action_kind == snapshot["action_kind"]
    assert submitted.args == snapshot["args"]
    assert submitted.required_capabilities == snapshot["required_capabilities"]
    assert await counts(db) == (before[0] + 1, before[1] + 1)
    row = await get_row(db, rid)
    kind = "play" if fields["action_kind"] == "playbook" else fields["action_kind"]
    deps_stored = list(dict.fromkeys(fields["depends_on"]))
    assert row["action_kind"] == kind
    assert loads(row["action_args"]) == fields["args"]
    assert row["execution_target"] == fields["execution_target"]
    assert loads(row["required_capabilities"]) == fields["required_capabilities"]
    assert row["library_ref"] == fields["library_ref"]
    assert row["library_content_hash"] == fields["library_content_hash"]
    assert row["idempotency_key"] == fields["idempotency_key"]
    retry = fields["retry"]
    assert (loads(row["retry_policy"]) if row["retry_policy"] else None) == \
        (retry.to_dict() if retry else None)
    timeout = fields["timeout_seconds"]
    if timeout is None:
        assert row["timeout_seconds"] is None
    else:
        assert math.isclose(row["timeout_seconds"], timeout, rel_tol=0, abs_tol=0)
    assert (loads(row["depends_on"]) if row["depends_on"] else []) == deps_stored
    assert row["status"] == ("waiting_dependency" if deps_stored else "queued")
    assert row["schedule_id"] is None and row["invocation_id"] is None
    assert loads(row["trigger_context"]) == {}
    assert row["chain_depth"] == 0
    assert row["fired_at"] == row["created_at"] == row["queued_at"] == NOW
    assert row["concurrency_key"] == expected_key(HOST, fields["required_capabilities"])
    assert row["leased_by"] is None and row["lease_expires_at"] is None
    assert row["lease_attempts"] == 0
    (fact,) = await history(db, "schedule_run", rid)
    assert (fact["previous_status"], fact["status"]) == (None, row["status"])
    assert fact["reason_code"] == f"run.{row['status']}.submitted"
    # The submit hashed its args' JSON text as it was encoded once (validate_encoded): the
    # digest of the application encoded whole, as before.
    assert row["application_digest"] == digest(validate(submitted))
