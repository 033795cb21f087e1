"""``on_enter``: the tasks a state defers when a row enters it, in the same transaction.

A state that declares ``on_enter = ["shop.send_receipt"]`` gets one run of each task per
entry, written in the transaction of the move (or the creation) that enters it: the
move and its consequences commit together or not at all, and a move that is replayed
(its idempotency key seen before) or lost (a conflict) enters nothing and defers
nothing. That is a declarative outbox: no second table to poll, no "moved but the email
was never queued" window.

The engine knows which facts enter such a state; what deferring a task is (a run in the
queue's table, with its own creation fact) belongs to the queue, which installs it
here (:func:`defer_with`) when it is imported (:data:`PROVIDER`, imported on the first
entry if nothing has yet). A move from a state to itself enters
nothing.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Sequence

from typing_extensions import TypedDict  # (pydantic, on Python 3.11, validates only this one)

from ledgerq.lifecycle.facts import Fact
from ledgerq.lifecycle.registry import EntityPolicy
from ledgerq.lifecycle.store import EventStore

#: What a state's entries become: called in the moving transaction with each fact that
#: entered a state declaring tasks, and those tasks.
Deferral = Callable[[EventStore, EntityPolicy, Sequence[tuple[Fact, tuple[str, ...]]]], None]

_deferral: list[Deferral] = []
#: The module that installs the deferral: the queue's submission, a layer above the engine.
PROVIDER = "ledgerq.queue.submission.entering"


class Entry(TypedDict):
    """The fact an ``on_enter`` task is given (its ``fact`` argument): which row entered
    which state, from where, why, by whom and when. The row's values are the entity's
    ``get``; the whole fact (its patch too) is its ``history``."""

    id: str
    entity_type: str
    entity_id: str
    previous_status: str | None
    status: str
    reason_code: str
    reason_summary: str | None
    source: str
    actor: str | None
    created_at: float
    entity_version: int


def defer_with(deferral: Deferral) -> None:
    """Install how entries are deferred (the queue does, once, when it is imported)."""
    _deferral[:] = [deferral]


def entry(fact: Fact) -> Entry:
    """The fact as its ``on_enter`` tasks are given it."""
    return Entry(id=fact.id, entity_type=fact.entity_type, entity_id=fact.entity_id,
                 previous_status=fact.previous_status, status=fact.status,
                 reason_code=fact.reason_code, reason_summary=fact.reason_summary,
                 source=fact.source, actor=fact.actor, created_at=fact.created_at,
                 entity_version=fact.entity_version)


def entered(tx: EventStore, policy: EntityPolicy, facts: Iterable[Fact]) -> None:
    """Defer the ``on_enter`` tasks of the states ``facts`` entered (each fact as written,
    its ``entity_version`` the row's new one), in ``tx``."""
    tasks = policy.on_enter
    due = [(f, tasks[f.status]) for f in facts
           if f.status in tasks and f.previous_status != f.status]
    if not due:
        return
    if not _deferral:
        importlib.import_module(PROVIDER)  # installs it (ledgerq's lazy imports may not have)
    _deferral[0](tx, policy, due)


__all__ = ["Deferral", "Entry", "defer_with", "entered", "entry"]
