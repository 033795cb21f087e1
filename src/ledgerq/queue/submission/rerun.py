"""Run again: a new run from an ended run's application, linked to the original.

An ended run is a fact of history (its terminal state is terminal), so "retry it" cannot
move it. It creates a new run instead, as a submission would, with ``chain_parent_id``
naming the original (``chain_depth`` one more) and a creation fact of its own
(``run.queued.retried``) whose metadata and evidence name the original: ``history`` of
either run tells the story.

What is copied is the application (kind, args, target, capabilities, provenance, retry
policy, timeout) and the original's concurrency key (the same resource on the same host).
Not copied: the idempotency key (it belongs to the first submission), dependencies (they
ended already; a run again is the operator's decision to run it now), and a scheduled
fire's schedule (the new run is an ad-hoc run that workers claim).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ledgerq.codec import loads
from ledgerq.errors import InvalidInput, NotFound
from ledgerq.lifecycle.creation import create_entity
from ledgerq.lifecycle.models import Actor, StateReason
from ledgerq.lifecycle.registry import EntityPolicy
from ledgerq.queue import moves
from ledgerq.queue.moves import DEFAULT_QUEUE
from ledgerq.queue.runs import run_policy
from ledgerq.queue.submission.application import (
    RetryPolicy,
    TaskApplication,
    digest,
    validate,
)
from ledgerq.queue.submission.submit import run_row
from ledgerq.queue.worker import wakeup

if TYPE_CHECKING:
    from ledgerq.lifecycle.store import Database
    from ledgerq.queue.submission.store import SubmissionTx

RETRIER = Actor(type="operator", id="ledgerq.retry")


class RunNotEnded(InvalidInput):
    """The run named has not ended: there is nothing to run again (yet)."""


def application_of(row: dict[str, Any]) -> TaskApplication:
    """The application a stored run was made from (JSON columns as stored or decoded)."""

    def js(col: str) -> Any:
        value = row.get(col)
        return loads(value) if isinstance(value, str | bytes) else value

    retry = js("retry_policy")
    return TaskApplication(
        action_kind=row["action_kind"], args=js("action_args") or {},
        execution_target=row["execution_target"] or "host",
        required_capabilities=list(js("required_capabilities") or []),
        library_ref=row.get("library_ref"), library_content_hash=row.get("library_content_hash"),
        retry=RetryPolicy.from_dict(retry) if retry else None,
        timeout_seconds=row.get("timeout_seconds"),
        # Absent from rows of specs that predate them: the defaults they meant.
        priority=row.get("priority", 0), queue=row.get("queue", DEFAULT_QUEUE))


def _rerun(tx: SubmissionTx, policy: EntityPolicy, run_id: str, actor: Actor, summary: str,
           now: float) -> str:
    found = tx.read_entity(policy, run_id)
    if found is None:
        raise NotFound(f"no run {run_id}")
    if found["status"] not in policy.terminal:
        raise RunNotEnded(f"run {run_id} has not ended ({found['status']}); only an ended run "
                          "can be run again")
    try:
        app = validate(application_of(found))
    except (ValueError, TypeError) as exc:
        raise InvalidInput(f"run {run_id} cannot be run again: {exc}") from exc
    row = run_row(app, now, "", moves.RETRIED.target, [], digest(app), policy=policy)
    row.update(chain_parent_id=run_id, chain_depth=int(found["chain_depth"] or 0) + 1,
               concurrency_key=found["concurrency_key"])
    reason = StateReason(
        code=moves.RETRIED.code, summary=summary or f"run again of {run_id} ({found['status']})",
        evidence_refs=[{"entity_type": policy.name, "entity_id": run_id}],
        metadata={"retry_of": run_id, "retry_of_status": found["status"]})
    return create_entity(tx, policy, row, reason=reason, actor=actor, now=now)


async def retry_runs(db: Database[SubmissionTx], run_ids: Iterable[str], *, actor: Actor = RETRIER,
                     summary: str = "", now: float | None = None) -> list[str]:
    """Run each ended run again (see the module docstring), all in one transaction: every
    new run is created, or (an unknown id, a run that has not ended) none. Returns the
    new runs' ids in the order given."""
    policy = run_policy(db)
    if not moves.RETRIED.offered_by(policy):
        raise InvalidInput(f"the loaded specs do not declare {moves.RETRIED.code!r}: they "
                           "predate running an ended run again")
    ids = list(run_ids)
    ts = time.time() if now is None else now

    def unit(tx: SubmissionTx) -> list[str]:
        return [_rerun(tx, policy, rid, actor, summary, ts) for rid in ids]

    created = await db.write(unit, bulk=len(ids) > 1) if ids else []
    wakeup.notify(db.path)
    return created


async def retry_run(db: Database[SubmissionTx], run_id: str, *, actor: Actor = RETRIER,
                    summary: str = "",
                    now: float | None = None) -> str:
    """Run one ended run again; returns the new run's id. NotFound for an unknown id,
    RunNotEnded (an InvalidInput) for a run that has not ended."""
    return (await retry_runs(db, [run_id], actor=actor, summary=summary, now=now))[0]
