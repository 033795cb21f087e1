"""Entity ids and fact ids are UUID version 7.

Why it matters: ids are the primary keys of append-mostly tables; a time-ordered key
lands on the index's last page, and the worker relies on ids minted in different
milliseconds sorting in minting order. A regression to uuid4 (or a timestamp in the
wrong unit or position) would keep every other test green, so these pin the format:
RFC 9562 version and variant bits, canonical text, the embedded Unix millisecond
timestamp, and the ordering at millisecond granularity. Ids minted within one
millisecond carry random bits after the timestamp and have no order: nothing here
asserts one.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import Callable
from typing import Any

from ledgerq import StateDB
from ledgerq.lifecycle import Actor, StateReason, TransitionRequest, create, transition
from ledgerq.lifecycle.engine import new_id
from ledgerq.queue import TaskApplication, cancel_task, submit_many, submit_task
from ledgerq.queue.submission.submit import record_scheduled_fire

#: How far an id's embedded timestamp may be from the clock read around its minting.
#: Generous: the assertion is about the unit and the position of the timestamp (seconds
#: instead of milliseconds is off by decades, uuid4's random bits by centuries).
SLACK_MS = 5_000
OPERATOR = Actor(type="operator", id="ids-test")


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def id_ms(text: str) -> int:
    """The Unix millisecond timestamp in a version 7 UUID's first 48 bits."""
    return uuid.UUID(text).int >> 80


def assert_uuid7(text: object, since_ms: int, until_ms: int) -> None:
    assert isinstance(text, str), f"{text!r} is not a string"
    parsed = uuid.UUID(text)
    assert str(parsed) == text, f"{text!r} is not the canonical lowercase hyphenated form"
    assert parsed.version == 7, f"{text} is version {parsed.version}, not 7"
    assert parsed.variant == uuid.RFC_4122, f"{text} has variant {parsed.variant}"
    stamp = id_ms(text)
    assert since_ms - SLACK_MS <= stamp <= until_ms + SLACK_MS, (
        f"{text} embeds {stamp} ms, the clock read {since_ms}..{until_ms}")


def assert_sorted_by_millisecond(ids: list[str]) -> None:
    """Ids listed in minting order: their timestamps never go back, and any two minted in
    different milliseconds compare (as text, the way an index orders them) in that order."""
    stamps = [id_ms(i) for i in ids]
    assert stamps == sorted(stamps), "an id embeds an earlier millisecond than its predecessor"
    for (a, ma), (b, mb) in itertools.pairwise(zip(ids, stamps, strict=True)):
        if ma < mb:
            assert a < b, f"{a} ({ma} ms) sorts after {b} ({mb} ms)"
    # Group by millisecond: every id of an earlier group sorts before every later one.
    groups: dict[int, list[str]] = {}
    for i, m in zip(ids, stamps, strict=True):
        groups.setdefault(m, []).append(i)
    ordered = [groups[m] for m in sorted(groups)]
    for earlier, later in itertools.pairwise(ordered):
        assert max(earlier) < min(later)
    assert sorted(ids) == [i for group in ordered for i in sorted(group)]


def past_millisecond_of(last_id: str) -> bool:
    """Whether the clock has moved past the millisecond ``last_id`` embeds.

    Refuses a timestamp beyond the slack first: waiting for a clock to pass the random
    bits of a uuid4 would never end.
    """
    stamp = id_ms(last_id)
    assert stamp <= now_ms() + SLACK_MS, f"{last_id} embeds {stamp} ms, in the future"
    return now_ms() > stamp


def mint_across_milliseconds(mint: Callable[[], str], per_ms: int = 50,
                             spans: int = 5) -> list[str]:
    """Ids from ``mint`` in order, several per millisecond, across at least ``spans``
    distinct milliseconds (it waits for the clock to move on between bursts)."""
    ids: list[str] = []
    for _ in range(spans):
        ids += [mint() for _ in range(per_ms)]
        # Past the millisecond of the burst's last id, not of its start: a burst may
        # cross into the next millisecond, and the next burst would then share it.
        while not past_millisecond_of(ids[-1]):
            time.sleep(0.0005)
    return ids


# ------------------------------------------------------------ new_id itself


def test_new_id_is_a_canonical_version_7_uuid_with_the_current_millisecond() -> None:
    since = now_ms()
    ids = [new_id() for _ in range(2_000)]
    until = now_ms()
    for i in ids:
        assert_uuid7(i, since, until)
    assert len(set(ids)) == len(ids)


def test_new_id_random_bits_differ_within_one_millisecond() -> None:
    ids = [new_id() for _ in range(2_000)]
    by_ms: dict[int, set[str]] = {}
    for i in ids:
        by_ms.setdefault(id_ms(i), set()).add(i[14:])  # everything after the timestamp
    # 2,000 ids span a few milliseconds at most: some millisecond holds many of them,
    # and each must still be unique in its 74 random bits.
    crowded = max(by_ms.values(), key=len)
    assert len(crowded) > 1
    assert sum(len(v) for v in by_ms.values()) == len(ids)


def test_new_ids_sort_in_minting_order_at_millisecond_granularity() -> None:
    ids = mint_across_milliseconds(new_id)
    assert len({id_ms(i) for i in ids}) >= 5
    assert_sorted_by_millisecond(ids)


# ------------------------------------------------------------ ids the library writes


async def test_every_entity_and_fact_id_the_library_writes_is_uuid7(db: StateDB) -> None:
    since = now_ms()
    app = TaskApplication("agent", {"prompt": "hi"}, "host")
    run_ids = [await submit_task(db, app)]
    run_ids += await submit_many(db, [app, app, app])              # create_entities
    run_ids.append(await submit_task(db, TaskApplication(          # waiting_dependency
        "agent", {}, "host", depends_on=[run_ids[0]])))
    run_ids.append(await record_scheduled_fire(db, schedule_id="sched-1",
                                               action_kind="agent", args={}))
    dispatch_id = await create(db, "dispatch", {"status": "pending", "channel": "email",
                                                "payload": {"to": "x"}},
                               reason=StateReason(code="dispatch.pending.created"),
                               actor=OPERATOR)
    moved = await transition(db, TransitionRequest(
        entity_type="schedule_run", entity_id=run_ids[1], from_state="queued",
        to_state="skipped", reason=StateReason(code="run.skipped.scheduled"),
        actor=OPERATOR, idempotency_key="k-1"))
    conflict = await transition(db, TransitionRequest(
        entity_type="schedule_run", entity_id=run_ids[2], from_state="running",
        to_state="completed", reason=StateReason(code="run.completed.ok"),
        actor=OPERATOR, idempotency_key="k-2"))
    assert await cancel_task(db, run_ids[3], actor=OPERATOR)
    until = now_ms()

    assert moved.applied and conflict.conflict
    returned: list[Any] = [*run_ids, dispatch_id, moved.transition_id, conflict.transition_id]
    rows = await db.fetch_all("SELECT id FROM schedule_runs UNION ALL "
                              "SELECT id FROM dispatch_outbox")
    facts = await db.fetch_all("SELECT id, entity_id FROM status_transitions")
    stored = [r["id"] for r in rows] + [f["id"] for f in facts]
    assert len(rows) == len(run_ids) + 1
    # creations, the skip, the cancel (the conflict wrote none)
    assert len(facts) == len(run_ids) + 1 + 2
    for i in returned + stored:
        assert_uuid7(i, since, until)
    assert {f["entity_id"] for f in facts} == {*run_ids, dispatch_id}
    assert moved.transition_id in {f["id"] for f in facts}
    assert conflict.transition_id not in {f["id"] for f in facts}


async def test_run_ids_submitted_in_sequence_sort_in_submission_order(db: StateDB) -> None:
    app = TaskApplication("agent", {"prompt": "hi"}, "host")
    ids: list[str] = []
    for _ in range(6):
        ids += await submit_many(db, [app] * 5)
        ids.append(await submit_task(db, app))
        while not past_millisecond_of(ids[-1]):
            await asyncio.sleep(0.001)
    assert len({id_ms(i) for i in ids}) >= 6
    assert_sorted_by_millisecond(ids)
    # The log's fact ids, in the order the facts were appended, sort the same way. SQLite's
    # rowid is that order. On PostgreSQL, the order of the transactions that wrote them
    # (these ran one after another, so their ids rise), then within one transaction the
    # heap's: one connection fills its pages in insertion order, but two connections (a
    # plain submit goes on an asyncio one, submit_many in a pool thread) fill pages of
    # their own, so ctid alone is no longer the order of the appends.
    order = "rowid" if db.dialect == "sqlite" else "xmin::text::bigint, ctid"
    facts = await db.fetch_all(f"SELECT id FROM status_transitions ORDER BY {order}")
    assert_sorted_by_millisecond([f["id"] for f in facts])
