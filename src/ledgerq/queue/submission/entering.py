"""A state's ``on_enter`` tasks as runs: the queue's half of the declarative outbox.

The engine calls :func:`defer_entries` inside the transaction of a move (or creation)
whose fact entered a state that declares tasks (:mod:`ledgerq.lifecycle.entering`).
Each task gets one run, written there with its creation fact, so the entry and its runs
commit together. A run takes what its task's app recorded for it (queue, priority,
retry policy, timeout, capabilities, target; the queue's defaults for a task no app has
recorded yet: ``ledgerq stats`` lists it as unserved until a worker serves it) and is
given two arguments: ``entity_id``, and ``fact``, the entry
(:class:`~ledgerq.lifecycle.entering.Entry`). Its trigger context names the entity, the
row, the state and the fact, so ``ledgerq show RUN`` says what deferred it.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from ledgerq.errors import InvalidInput
from ledgerq.lifecycle.entering import defer_with, entry
from ledgerq.lifecycle.facts import Fact
from ledgerq.lifecycle.models import Actor
from ledgerq.queue import moves
from ledgerq.queue.moves import DEFAULT_QUEUE, ENTITY
from ledgerq.queue.submission.application import DEFAULT_TARGET, RetryPolicy, TaskApplication
from ledgerq.queue.submission.submit import insert_all
from ledgerq.queue.submission.task_kinds import TaskKind, kind_of

if TYPE_CHECKING:
    from ledgerq.lifecycle.registry import EntityPolicy
    from ledgerq.lifecycle.store import EventStore
    from ledgerq.queue.submission.store import SubmissionTx

#: Who creates an entry's runs (the move's own actor may be a type runs do not admit).
ENTERED = Actor(type="system", id="ledgerq.on_enter")


def defer_entries(tx: EventStore, policy: EntityPolicy,
                  due: Sequence[tuple[Fact, tuple[str, ...]]]) -> None:
    """One run of each task of each entry in ``due``, in ``tx``, in order."""
    if policy.peers is None:
        raise InvalidInput(f"{policy.name}: state {due[0][0].status!r} defers tasks "
                           "(on_enter), but its policy belongs to no registry to find the "
                           "queue in")
    # (check refuses specs without the run entity, naming the state that defers.)
    runs = moves.check(policy.peers).entity(ENTITY)
    sub = cast("SubmissionTx", tx)
    names = sorted({task for _, tasks in due for task in tasks})
    kinds = {row["name"]: kind_of(row) for row in sub.read_task_kinds(names)}
    apps: list[TaskApplication] = []
    for fact, tasks in due:
        args = {"entity_id": fact.entity_id, "fact": dict(entry(fact))}
        trigger = {"entity": fact.entity_type, "entity_id": fact.entity_id,
                   "state": fact.status, "fact_id": fact.id}
        apps.extend(_application(task, kinds.get(task), args, trigger) for task in tasks)
    host = socket.gethostname() if any(a.required_capabilities for a in apps) else ""
    insert_all(sub, runs, apps, due[0][0].created_at, host, ENTERED)


def _application(task: str, kind: TaskKind | None, args: dict[str, Any],
                 trigger: dict[str, str]) -> TaskApplication:
    """A run of ``task`` as its app declared it (queue, priority, retry policy, timeout,
    capabilities, target), or with the queue's defaults while no app has recorded it."""
    given = (kind.defaults if kind is not None else None) or {}
    retry = given.get("retry")
    return TaskApplication(
        action_kind=task, args=args, trigger_context=trigger,
        queue=(kind.queue if kind is not None else None) or DEFAULT_QUEUE,
        priority=given.get("priority") or 0,
        retry=RetryPolicy.from_dict(retry) if retry else None,
        timeout_seconds=given.get("timeout"),
        required_capabilities=list(given.get("capabilities") or []),
        execution_target=given.get("target") or DEFAULT_TARGET)


defer_with(defer_entries)

__all__ = ["ENTERED", "defer_entries"]
