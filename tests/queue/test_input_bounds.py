"""Times, durations, retry policies, worker settings and reason texts are bounded where
they come in: a value past a documented limit is refused with a message naming it, and
nothing is written, instead of overflowing later inside a pass, a renderer or a clock.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from ledgerq import StateDB
from ledgerq.durations import MAX_DURATION, MAX_EPOCH
from ledgerq.errors import InvalidInput
from ledgerq.lifecycle import Actor
from ledgerq.lifecycle.models import (
    MAX_ACTOR_ID_LENGTH,
    MAX_EVIDENCE_REFS,
    MAX_SUMMARY_LENGTH,
    StateReason,
)
from ledgerq.queue import RetryPolicy, TaskApplication, Worker, cancel_task, submit_task
from ledgerq.queue.submission.application import MAX_RETRY_ATTEMPTS, MAX_RETRY_FACTOR

OPERATOR = Actor(type="operator", id="ops")


def app(**kw: object) -> TaskApplication:
    return TaskApplication("command", {"argv": ["true"]}, "host", **kw)  # type: ignore[arg-type]


async def facts(db: StateDB) -> int:
    row = await db.fetch_one("SELECT COUNT(*) AS n FROM status_transitions", ())
    assert row is not None
    return int(row["n"])


@pytest.mark.parametrize("kw", [
    {"factor": 1e200}, {"factor": MAX_RETRY_FACTOR * 2},
    {"max_attempts": MAX_RETRY_ATTEMPTS + 1},
    {"base_delay": 1e300}, {"max_delay": MAX_DURATION * 2}, {"max_delay": math.inf},
])
def test_a_retry_policy_past_its_bounds_is_refused(kw: dict[str, float]) -> None:
    fields: dict[str, float] = {"max_attempts": 3, "base_delay": 1.0, **kw}
    with pytest.raises(InvalidInput, match="RetryPolicy"):
        RetryPolicy(**fields)  # type: ignore[arg-type]


def test_a_retry_delay_never_overflows() -> None:
    """Doubling a second a thousand times is far past any float: the delay is capped at
    max_delay rather than raising inside the supervisor."""
    policy = RetryPolicy(MAX_RETRY_ATTEMPTS, 1.0, factor=MAX_RETRY_FACTOR, jitter=0)
    assert policy.delay(MAX_RETRY_ATTEMPTS) == policy.max_delay
    assert RetryPolicy(MAX_RETRY_ATTEMPTS, 1.0, jitter=0).delay(1030) == 3600.0


@pytest.mark.parametrize(("kw", "named"), [
    ({"not_before": 1e300}, "not_before"),
    ({"not_before": -1e15}, "not_before"),
    ({"not_before": MAX_EPOCH + 1}, "not_before"),
    ({"timeout_seconds": 1e308}, "timeout_seconds"),
    ({"timeout_seconds": MAX_DURATION * 2}, "timeout_seconds"),
])
async def test_times_past_their_bounds_are_refused_at_submit(
        tmp_path: Path, kw: dict[str, float], named: str) -> None:
    async with StateDB(str(tmp_path / "b.db")) as db:
        with pytest.raises(InvalidInput, match=named):
            await submit_task(db, app(**kw))
        assert await facts(db) == 0


@pytest.mark.parametrize("now", [1e300, -1.0, math.nan, MAX_EPOCH * 2])
async def test_a_submit_time_past_its_bounds_is_refused(tmp_path: Path, now: float) -> None:
    async with StateDB(str(tmp_path / "n.db")) as db:
        with pytest.raises(InvalidInput, match="now"):
            await submit_task(db, app(), now=now)
        assert await facts(db) == 0
        await submit_task(db, app(), now=MAX_EPOCH)  # the bound itself is a time


@pytest.mark.parametrize("kw", [
    {"lease_ttl": math.nan}, {"lease_ttl": math.inf}, {"lease_ttl": 1e308},
    {"heartbeat_ttl": math.nan}, {"poll_interval": math.nan}, {"poll_interval": 0},
    {"claim_cooldown": math.inf}, {"shutdown_grace": -1}, {"check_interval": math.nan},
    {"capacity": 1.5}, {"capacity": True}, {"claim_limit": -1},
])
async def test_worker_settings_are_checked_when_it_is_made(tmp_path: Path,
                                                           kw: dict[str, float]) -> None:
    async with StateDB(str(tmp_path / "w.db")) as db:
        with pytest.raises(ValueError, match=next(iter(kw))):
            Worker(db, handle_signals=False, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("reason", [
    {"summary": "x" * (MAX_SUMMARY_LENGTH + 1)},
    {"evidence_refs": [{"n": i} for i in range(MAX_EVIDENCE_REFS + 1)]},
    {"metadata": {"blob": "x" * 70_000}},
])
def test_reasons_are_bounded(reason: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=next(iter(reason))):
        StateReason(code="run.cancelled.operator", **reason)  # type: ignore[arg-type]


async def test_a_huge_cancel_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    async with StateDB(str(tmp_path / "c.db")) as db:
        run_id = await submit_task(db, app())
        before = await facts(db)
        with pytest.raises(ValueError, match="summary"):
            await cancel_task(db, run_id, actor=OPERATOR, summary="x" * 20_000_000)
        with pytest.raises(ValueError, match="id"):
            await cancel_task(db, run_id, actor=Actor(type="operator",
                                                      id="a" * (MAX_ACTOR_ID_LENGTH + 1)))
        assert await facts(db) == before
        assert await cancel_task(db, run_id, actor=OPERATOR, summary="ok")
