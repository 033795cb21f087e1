"""transition(): every rule, in the order docs/specs.md states it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from helpers import trace
from ledgerq import StateDB
from ledgerq.errors import InvalidInput
from ledgerq.lifecycle import (
    VOCABULARY_ERROR,
    Actor,
    StateReason,
    TransitionRequest,
    create,
    transition,
)
from ledgerq.lifecycle.registry import default_registry
from lifecycle_support import (
    OPERATOR,
    SYSTEM,
    fact_count,
    move,
    new_dispatch,
    new_run,
    request,
    row,
    run_values,
    snapshot,
    with_dispatch,
)

RUN = "schedule_run"
DISPATCH = "dispatch"


async def traced(db: StateDB) -> list[str]:
    """Start recording every statement the named operations run (either backend)."""
    return trace.start()


async def untrace(db: StateDB) -> None:
    trace.stop()


# ---------------------------------------------------------------- 1. validation before any read


@pytest.mark.parametrize("case", ["unknown_entity", "unknown_reason", "foreign_reason",
                                  "guard_column", "patch_column", "engine_column"])
async def test_validation_errors_come_before_any_read(db: StateDB, case: str) -> None:
    rid = await new_run(db)
    before = await snapshot(db)
    entity, code = RUN, "run.started.ok"
    guard: dict[str, Any] | None = None
    patch: dict[str, Any] | None = None
    match = ""
    if case == "unknown_entity":
        entity, match = "widget", "unknown entity"
    elif case == "unknown_reason":
        code, match = "run.started.because", "unknown reason code"
    elif case == "foreign_reason":
        code, match = "dispatch.acked.ok", "unknown reason code"
    elif case == "guard_column":
        guard, match = {"action_kind": "shell"}, "guard column"
    elif case == "patch_column":
        patch, match = {"action_kind": "evil"}, "patch column"
    elif case == "engine_column":
        patch, match = {"status": "completed"}, "patch column"

    statements = await traced(db)
    for target in (rid, "no-such-row"):
        # A missing row still gives ValueError, not LookupError: nothing was read.
        with pytest.raises(ValueError, match=match) as info:
            await move(db, entity, target, "queued", "running", code, guard=guard, patch=patch)
        assert not isinstance(info.value, LookupError)
    assert statements == [], f"validation touched the database: {statements}"
    assert await snapshot(db) == before
    # Control: the trace does see a transition that reaches the database.
    await move(db, RUN, rid, "queued", "running", "run.started.ok")
    await untrace(db)
    assert any("UPDATE \"schedule_runs\"" in s for s in statements)
    assert (await row(db, "schedule_runs", rid))["version"] == 2  # type: ignore[index]


async def test_allowlist_error_lists_the_allowed_columns(db: StateDB) -> None:
    with pytest.raises(ValueError) as info:
        await move(db, RUN, "x", None, "running", "run.started.ok", guard={"exit_code": 0})
    message = str(info.value)
    assert "exit_code" in message
    for col in default_registry().entity(RUN).guard_columns:
        assert col in message


async def test_guard_columns_are_checked_against_guard_allowlist_not_patch(db: StateDB) -> None:
    # ended_at may be patched but not guarded on.
    rid = await new_run(db, "running")
    with pytest.raises(ValueError, match="guard column"):
        await move(db, RUN, rid, "running", "completed", "run.completed.ok",
                   guard={"ended_at": None})
    assert (await row(db, "schedule_runs", rid))["status"] == "running"  # type: ignore[index]


# ---------------------------------------------------------------- 2. missing row


async def test_missing_row_is_lookup_error(db: StateDB) -> None:
    before = await snapshot(db)
    for from_state in ("queued", None):
        with pytest.raises(LookupError, match="not found"):
            await move(db, RUN, "no-such-run", from_state, "running", "run.started.ok")
    with pytest.raises(LookupError):
        await move(db, DISPATCH, "no-such-dispatch", "pending", "delivering",
                   "dispatch.delivering.attempt")
    assert await snapshot(db) == before


async def test_lookup_error_comes_before_edge_check(db: StateDB) -> None:
    # An undeclared edge on a missing row: the row is looked up first.
    with pytest.raises(LookupError):
        await move(db, RUN, "no-such-run", "queued", "completed", "run.completed.ok")


# ---------------------------------------------------------------- 3. from_state mismatch


async def test_from_state_mismatch_is_a_conflict(db: StateDB) -> None:
    rid = await new_run(db, "running")
    before = await snapshot(db)
    res = await move(db, RUN, rid, "queued", "running", "run.started.ok")
    assert res.applied is False and res.conflict is True
    assert res.previous_state == res.current_state == "running"
    assert res.event_id is None
    assert await snapshot(db) == before


async def test_conflict_comes_before_the_edge_check(db: StateDB) -> None:
    rid = await new_run(db)
    first = await move(db, RUN, rid, "queued", "cancelled", "run.cancelled.operator",
                       actor=OPERATOR)
    assert first.applied
    before = await snapshot(db)
    # cancelled -> cancelled is undeclared, but the stale from_state is seen first.
    again = await move(db, RUN, rid, "queued", "cancelled", "run.cancelled.operator",
                       actor=OPERATOR)
    assert again.applied is False and again.conflict is True
    assert again.previous_state == again.current_state == "cancelled"
    # Also for a from_state that is not even a state of the entity.
    odd = await move(db, RUN, rid, "no_such_state", "queued", "run.queued.retry_due")
    assert odd.conflict and odd.current_state == "cancelled"
    assert await snapshot(db) == before


async def test_conflict_comes_before_actor_and_required_columns(db: StateDB) -> None:
    did = await new_dispatch(db)
    await move(db, DISPATCH, did, "pending", "expired", "dispatch.expired.ttl")
    # Stale from_state with a non-operator actor and no patch: conflict, not ValueError.
    res = await move(db, DISPATCH, did, "dead_letter", "pending", "dispatch.pending.resurrected")
    assert res.conflict and res.current_state == "expired"


# ---------------------------------------------------------------- 4. undeclared edges


async def test_undeclared_edge_is_value_error_listing_allowed_targets(db: StateDB) -> None:
    rid = await new_run(db)
    before = await snapshot(db)
    with pytest.raises(ValueError, match=VOCABULARY_ERROR) as info:
        await move(db, RUN, rid, "queued", "completed", "run.completed.ok")
    message = str(info.value)
    assert VOCABULARY_ERROR == "not in the declared transition vocabulary"
    for target in ("waiting_dependency", "running", "skipped", "cancelled"):
        assert target in message
    assert "retry_wait" not in message
    with pytest.raises(ValueError, match=VOCABULARY_ERROR):
        await move(db, RUN, rid, "queued", "no_such_state", "run.completed.ok")
    assert await snapshot(db) == before


async def test_undeclared_edge_comes_before_guard_mismatch(db: StateDB) -> None:
    rid = await new_run(db)
    with pytest.raises(ValueError, match=VOCABULARY_ERROR):
        await move(db, RUN, rid, "queued", "completed", "run.completed.ok",
                   guard={"leased_by": "somebody-else"})


async def test_same_state_move_only_where_declared(db: StateDB) -> None:
    rid = await new_run(db)
    with pytest.raises(ValueError, match=VOCABULARY_ERROR):
        await move(db, RUN, rid, "queued", "queued", "run.queued.retry_due")
    await move(db, RUN, rid, "queued", "running", "run.started.ok",
               patch={"leased_by": "w1", "lease_expires_at": 10.0})
    renew = await move(db, RUN, rid, "running", "running", "run.running.lease_renewed",
                       guard={"leased_by": "w1"}, patch={"lease_expires_at": 20.0})
    assert renew.applied and renew.previous_state == renew.current_state == "running"
    got = await row(db, "schedule_runs", rid)
    assert got is not None
    assert got["lease_expires_at"] == 20.0 and got["version"] == 3
    facts = await db.fetch_all("SELECT previous_status, status FROM status_transitions "
                               "WHERE entity_id = ? ORDER BY entity_version", (rid,))
    assert facts[-1] == {"previous_status": "running", "status": "running"}
    did = await new_dispatch(db)
    with pytest.raises(ValueError, match=VOCABULARY_ERROR):
        await move(db, DISPATCH, did, "pending", "pending", "dispatch.pending.retry")


async def test_from_state_none_checks_the_edge_from_the_observed_status(db: StateDB) -> None:
    rid = await new_run(db)
    with pytest.raises(ValueError, match=VOCABULARY_ERROR) as info:
        await move(db, RUN, rid, None, "completed", "run.completed.ok")
    assert "from queued" in str(info.value)
    res = await move(db, RUN, rid, None, "running", "run.started.ok")
    assert res.applied and res.previous_state == "queued" and res.current_state == "running"
    res = await move(db, RUN, rid, None, "completed", "run.completed.ok")
    assert res.applied and res.previous_state == "running"


@pytest.mark.parametrize("entity", [RUN, DISPATCH])
async def test_terminal_rows_never_move(db: StateDB, entity: str) -> None:
    policy = with_dispatch().entity(entity)
    for terminal in sorted(policy.terminal):
        if entity == RUN:
            rid = await new_run(db)
            path = {"completed": ["running", "completed"], "failed": ["running", "failed"],
                    "timed_out": ["running", "timed_out"], "skipped": ["skipped"],
                    "cancelled": ["cancelled"]}[terminal]
            code = "run.queued.retry_due"
            codes = {"running": "run.started.ok", "completed": "run.completed.ok",
                     "failed": "run.failed.exception", "timed_out": "run.timed_out.deadline",
                     "skipped": "run.skipped.scheduled", "cancelled": "run.cancelled.operator"}
        else:
            rid = await new_dispatch(db)
            path = {"delivered": ["delivering", "delivered"], "acked": ["acked"]}[terminal]
            code = "dispatch.pending.retry"
            codes = {"delivering": "dispatch.delivering.attempt",
                     "delivered": "dispatch.delivered.ok", "acked": "dispatch.acked.ok"}
        for step in path:
            assert (await move(db, entity, rid, None, step, codes[step])).applied
        before = await snapshot(db)
        for target in policy.states:
            for from_state in (terminal, None):
                with pytest.raises(ValueError, match=VOCABULARY_ERROR) as info:
                    await move(db, entity, rid, from_state, target, code, actor=OPERATOR)
                assert "none (terminal)" in str(info.value)
        assert await snapshot(db) == before


# ---------------------------------------------------------------- 5. per-edge rules (dispatch)


async def dead_letter(db: StateDB) -> str:
    did = await new_dispatch(db)
    await move(db, DISPATCH, did, "pending", "delivering", "dispatch.delivering.attempt")
    await move(db, DISPATCH, did, "delivering", "dead_letter", "dispatch.dead_letter.exhausted")
    return did


RESURRECT_PATCH = {"attempt": 0, "next_attempt_at": 50.0, "last_error": None}


@pytest.mark.parametrize("actor_type", ["scheduler", "system", "webhook", "agent"])
async def test_resurrection_is_operator_only(db: StateDB, actor_type: str) -> None:
    did = await dead_letter(db)
    before = await snapshot(db)
    with pytest.raises(ValueError, match="restricted to actor type") as info:
        await move(db, DISPATCH, did, "dead_letter", "pending", "dispatch.pending.resurrected",
                   actor=Actor(type=actor_type, id="x"),  # type: ignore[arg-type]
                   patch=RESURRECT_PATCH)
    assert "operator" in str(info.value)
    assert await snapshot(db) == before


@pytest.mark.parametrize("missing", sorted(RESURRECT_PATCH))
async def test_resurrection_requires_its_patch_columns(db: StateDB, missing: str) -> None:
    did = await dead_letter(db)
    before = await snapshot(db)
    patch = {k: v for k, v in RESURRECT_PATCH.items() if k != missing}
    with pytest.raises(ValueError, match=f"requires patch column.*{missing}"):
        await move(db, DISPATCH, did, "dead_letter", "pending", "dispatch.pending.resurrected",
                   actor=OPERATOR, patch=patch)
    assert await snapshot(db) == before


async def test_resurrection_by_operator_with_patch_applies(db: StateDB) -> None:
    did = await dead_letter(db)
    res = await move(db, DISPATCH, did, "dead_letter", "pending", "dispatch.pending.resurrected",
                     actor=OPERATOR, patch={**RESURRECT_PATCH, "last_error": "retry by hand"})
    assert res.applied
    got = await row(db, "dispatch_outbox", did)
    assert got is not None
    assert (got["status"], got["attempt"], got["next_attempt_at"], got["last_error"]) == (
        "pending", 0, 50.0, "retry by hand")
    # expired -> pending has the same rule.
    await move(db, DISPATCH, did, "pending", "expired", "dispatch.expired.ttl")
    with pytest.raises(ValueError, match="restricted to actor type"):
        await move(db, DISPATCH, did, "expired", "pending", "dispatch.pending.resurrected",
                   patch=RESURRECT_PATCH)
    assert (await move(db, DISPATCH, did, "expired", "pending", "dispatch.pending.resurrected",
                       actor=OPERATOR, patch=RESURRECT_PATCH)).applied


async def test_redelivery_requires_guard_and_patch_then_checks_guard(db: StateDB) -> None:
    did = await new_dispatch(db)
    await move(db, DISPATCH, did, "pending", "delivering", "dispatch.delivering.attempt",
               patch={"attempt": 1})
    before = await snapshot(db)
    code = "dispatch.delivering.attempt"
    with pytest.raises(ValueError, match=r"requires guard column.*attempt"):
        await move(db, DISPATCH, did, "delivering", "delivering", code, patch={"attempt": 2})
    # Required columns are checked before the guard: a wrong guard without the patch
    # is still a ValueError, not a conflict.
    with pytest.raises(ValueError, match=r"requires patch column.*attempt"):
        await move(db, DISPATCH, did, "delivering", "delivering", code, guard={"attempt": 7})
    assert await snapshot(db) == before
    stale = await move(db, DISPATCH, did, "delivering", "delivering", code,
                       guard={"attempt": 0}, patch={"attempt": 1})
    assert stale.conflict and not stale.applied
    assert stale.previous_state == stale.current_state == "delivering"
    assert await snapshot(db) == before
    ok = await move(db, DISPATCH, did, "delivering", "delivering", code,
                    guard={"attempt": 1}, patch={"attempt": 2})
    assert ok.applied
    assert (await row(db, "dispatch_outbox", did))["attempt"] == 2  # type: ignore[index]
    # The other delivering edges demand nothing.
    assert (await move(db, DISPATCH, did, "delivering", "delivered", "dispatch.delivered.ok",
                       actor=Actor(type="webhook", id="hook"))).applied


# ---------------------------------------------------------------- 6. guards


async def test_guard_mismatch_is_a_conflict_and_writes_nothing(db: StateDB) -> None:
    rid = await new_run(db, "running", leased_by="w1", lease_attempts=1)
    before = await snapshot(db)
    for guard in ({"leased_by": "w2"}, {"leased_by": None}, {"lease_attempts": 2},
                  {"leased_by": "w1", "lease_attempts": 0}):
        res = await move(db, RUN, rid, "running", "completed", "run.completed.ok", guard=guard)
        assert res.conflict and not res.applied, guard
        assert res.previous_state == res.current_state == "running"
    assert await snapshot(db) == before
    res = await move(db, RUN, rid, "running", "completed", "run.completed.ok",
                     guard={"leased_by": "w1", "lease_attempts": 1})
    assert res.applied


async def test_guards_are_null_safe(db: StateDB) -> None:
    rid = await new_run(db)
    assert (await row(db, "schedule_runs", rid))["leased_by"] is None  # type: ignore[index]
    res = await move(db, RUN, rid, "queued", "running", "run.started.ok",
                     guard={"leased_by": None, "lease_expires_at": None},
                     patch={"leased_by": "w1", "lease_expires_at": 5.0})
    assert res.applied
    # A None guard does not match a non-NULL value, and a value does not match NULL.
    res = await move(db, RUN, rid, "running", "queued", "run.queued.lease_expired",
                     guard={"leased_by": None})
    assert res.conflict
    other = await new_run(db)
    res = await move(db, RUN, other, "queued", "running", "run.started.ok",
                     guard={"leased_by": "w1"})
    assert res.conflict
    res = await move(db, RUN, rid, "running", "queued", "run.queued.lease_expired",
                     guard={"leased_by": "w1", "lease_expires_at": 5.0},
                     patch={"leased_by": None, "lease_expires_at": None})
    assert res.applied
    got = await row(db, "schedule_runs", rid)
    assert got is not None and got["leased_by"] is None and got["lease_expires_at"] is None


# ---------------------------------------------------------------- 7. an applied move


async def test_applied_move_updates_row_and_appends_one_fact(db: StateDB) -> None:
    rid = await new_run(db, queued_at=900.0)
    before = await row(db, "schedule_runs", rid)
    assert before is not None
    facts_before = await fact_count(db)
    actor = Actor(type="scheduler", id="sched-7")
    req = request(RUN, rid, "queued", "running", "run.started.ok", actor=actor, key="k-start",
                  summary="claimed", metadata={"attempt": 1, "host": "h1"},
                  evidence=[{"kind": "lease", "ref": "L1"}])
    res = await transition(db, req, guard={"leased_by": None},
                           patch={"leased_by": "w1", "lease_expires_at": 1234.5,
                                  "lease_attempts": 1},
                           now=2000.0)
    assert res.applied and not res.conflict
    assert (res.previous_state, res.current_state) == ("queued", "running")
    assert res.event_id is None

    after = await row(db, "schedule_runs", rid)
    assert after is not None
    # A caller written against the ADR-0071 queue sets no fencing token: the engine mints one.
    token = after["lease_token"]
    assert isinstance(token, str) and len(token) == 32 and int(token, 16) >= 0
    expected = dict(before)
    expected.update(status="running", version=2, updated_at=2000.0, leased_by="w1",
                    lease_token=token,
                    lease_expires_at=1234.5, lease_attempts=1,
                    status_reason_code="run.started.ok", status_reason_summary="claimed",
                    status_evidence_refs=after["status_evidence_refs"])
    # JSON as the backend stores it (PostgreSQL's jsonb keeps its own spacing and order).
    assert json.loads(after["status_evidence_refs"]) == [{"kind": "lease", "ref": "L1"}]
    assert after == expected

    assert await fact_count(db) == facts_before + 1
    fact = await db.fetch_one("SELECT * FROM status_transitions WHERE id = ?",
                              (res.transition_id,))
    assert fact is not None
    assert fact["entity_type"] == RUN and fact["entity_id"] == rid
    assert (fact["previous_status"], fact["status"]) == ("queued", "running")
    assert fact["reason_code"] == "run.started.ok" and fact["reason_summary"] == "claimed"
    assert json.loads(fact["evidence_refs"]) == [{"kind": "lease", "ref": "L1"}]
    assert fact["source"] == "scheduler" and fact["actor"] == "sched-7"
    assert json.loads(fact["metadata"]) == {"attempt": 1, "host": "h1"}
    assert fact["created_at"] == 2000.0
    assert fact["entity_version"] == 2
    assert fact["idempotency_key"] == "k-start"
    patch = json.loads(fact["patch"])
    assert {k: patch[k] for k in ("leased_by", "lease_expires_at", "lease_attempts",
                                  "lease_token")} == {
        "leased_by": "w1", "lease_expires_at": 1234.5, "lease_attempts": 1, "lease_token": token}
    assert patch["updated_at"] == 2000.0
    assert "status" not in patch and "version" not in patch


async def test_version_counts_facts(db: StateDB) -> None:
    rid = await new_run(db)
    steps = [("running", "run.started.ok"), ("running", "run.running.lease_renewed"),
             ("retry_wait", "run.retry_wait.backoff"), ("queued", "run.queued.retry_due"),
             ("running", "run.started.ok"), ("completed", "run.completed.ok")]
    for i, (to, code) in enumerate(steps, start=2):
        assert (await move(db, RUN, rid, None, to, code)).applied
        got = await row(db, "schedule_runs", rid)
        assert got is not None and got["version"] == i == await fact_count(db, rid)


async def test_patch_is_stored_as_the_row_holds_it(db: StateDB) -> None:
    """An integer patched into a timestamp column is logged as stored (a float), so the
    fold matches the row on either backend."""
    from ledgerq.projections import rebuild, verify

    rid = await new_run(db)
    await move(db, RUN, rid, "queued", "running", "run.started.ok",
               patch={"leased_by": "123", "lease_attempts": 2, "lease_expires_at": 7})
    got = await row(db, "schedule_runs", rid)
    assert got is not None
    assert (got["leased_by"], got["lease_attempts"], got["lease_expires_at"]) == ("123", 2, 7.0)
    assert isinstance(got["lease_expires_at"], float)
    assert (await verify(db)).ok
    await rebuild(db)
    assert await row(db, "schedule_runs", rid) == got


@pytest.mark.parametrize(("column", "value"), [
    ("leased_by", 123), ("lease_attempts", "2"), ("lease_attempts", True),
    ("lease_expires_at", "7"), ("lease_attempts", 2.0)])
async def test_a_value_of_another_logical_type_is_refused(db: StateDB, column: str,
                                                          value: Any) -> None:
    """SQLite would coerce it by column affinity and PostgreSQL refuse it: the engine
    refuses it first, naming the column, the same on both, and writes nothing."""
    rid = await new_run(db, "running")
    before = await snapshot(db)
    with pytest.raises(InvalidInput, match=f"{column} of schedule_run is "):
        await move(db, RUN, rid, "running", "running", "run.running.lease_renewed",
                   patch={column: value})
    assert await snapshot(db) == before


# ---------------------------------------------------------------- 8. idempotency


async def test_repeating_a_key_returns_the_original_result_and_writes_nothing(
        db: StateDB) -> None:
    rid = await new_run(db)
    first = await move(db, RUN, rid, "queued", "running", "run.started.ok", key="claim-1",
                       patch={"leased_by": "w1"}, now=10.0)
    before = await snapshot(db)
    again = await move(db, RUN, rid, "queued", "running", "run.started.ok", key="claim-1",
                       patch={"leased_by": "w2"}, now=20.0)
    assert again == first
    assert await snapshot(db) == before
    # Still the original result after the row has moved on.
    await move(db, RUN, rid, "running", "completed", "run.completed.ok", key="done-1")
    before = await snapshot(db)
    late = await move(db, RUN, rid, "queued", "running", "run.started.ok", key="claim-1")
    assert late.transition_id == first.transition_id
    assert (late.applied, late.previous_state, late.current_state) == (True, "queued", "running")
    assert await snapshot(db) == before


async def test_same_key_different_target_is_value_error(db: StateDB) -> None:
    rid = await new_run(db)
    await move(db, RUN, rid, "queued", "running", "run.started.ok", key="k")
    before = await snapshot(db)
    with pytest.raises(ValueError, match="idempotency key"):
        await move(db, RUN, rid, "running", "completed", "run.completed.ok", key="k")
    assert await snapshot(db) == before


async def test_keys_are_per_entity_and_conflicts_do_not_consume_them(db: StateDB) -> None:
    a, b = await new_run(db), await new_run(db)
    ra = await move(db, RUN, a, "queued", "running", "run.started.ok", key="shared")
    rb = await move(db, RUN, b, "queued", "running", "run.started.ok", key="shared")
    assert ra.applied and rb.applied and ra.transition_id != rb.transition_id
    c = await new_run(db)
    lost = await move(db, RUN, c, "running", "completed", "run.completed.ok", key="retry-me")
    assert lost.conflict
    won = await move(db, RUN, c, "queued", "cancelled", "run.cancelled.operator", key="retry-me")
    assert won.applied and won.current_state == "cancelled"


async def test_empty_key_means_no_idempotency(db: StateDB) -> None:
    rid = await new_run(db, "running")
    one = await move(db, RUN, rid, "running", "running", "run.running.lease_renewed", key="")
    two = await move(db, RUN, rid, "running", "running", "run.running.lease_renewed", key="")
    assert one.applied and two.applied and one.transition_id != two.transition_id
    keys = await db.fetch_all("SELECT idempotency_key FROM status_transitions "
                              "WHERE entity_id = ?", (rid,))
    assert all(k["idempotency_key"] is None for k in keys)


# ---------------------------------------------------------------- models


def test_request_requires_a_well_formed_actor_type() -> None:
    """An actor type is a name (an entity's spec says which it admits: the queue's runs
    admit the ADR-0071 queue's five, see test_entities.py)."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        Actor(type="Robot!", id="r")
    assert Actor(type="robot", id="r").type == "robot"
    with pytest.raises(ValidationError):
        TransitionRequest(entity_type=RUN, entity_id="x", from_state=None,  # type: ignore[call-arg]
                          to_state="running", reason={"code": "run.started.ok"}, actor=SYSTEM)


async def test_create_refuses_non_initial_state(db: StateDB) -> None:
    before = await snapshot(db)
    for status in ("completed", "retry_wait", "cancelled"):
        with pytest.raises(ValueError, match="initial state"):
            await create(db, RUN, run_values(status),
                         reason=StateReason(code="run.queued.submitted"), actor=SYSTEM)
    assert await snapshot(db) == before


async def test_an_actor_type_the_entity_does_not_admit_is_refused(db: StateDB) -> None:
    from ledgerq.errors import ActorNotAllowed

    rid = await new_run(db)
    with pytest.raises(ActorNotAllowed, match="robot"):
        await transition(db, TransitionRequest(
            entity_type=RUN, entity_id=rid, from_state="queued", to_state="cancelled",
            reason=StateReason(code="run.cancelled.operator"),
            actor=Actor(type="robot", id="r"), idempotency_key=""))
