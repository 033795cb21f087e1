"""Submits made in the same turn of the event loop, written by one unit.

Why: concurrent callers (coroutines submitting at once, an HTTP server's requests) each
paid for a write unit of their own: on PostgreSQL a pooled connection, a thread hop, a
transaction and a commit per submit; on SQLite two statements a row, where
:func:`~ledgerq.lifecycle.creation.create_entities` sends a few per run of rows. Here the
first caller of a turn opens a joint, every caller that runs later in the same turn adds
its item to it, and one unit writes them all, in order, in one transaction: the same
rows and facts as one unit each. Every caller returns once that transaction has
committed, with its own value.

A caller alone in its turn (nothing else ready to run) writes at once, as before: on
SQLite in its own step, with no task and no turn of the loop in between.

If the joint's unit raises, nothing it wrote remains (a unit's writes roll back
together). Unless the database itself failed (which every caller would meet again),
each caller then writes alone, so only the item at fault is refused, with its own error.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar
from weakref import WeakKeyDictionary

from ledgerq.queue.maintenance.stuck import is_database_failure

if TYPE_CHECKING:
    from ledgerq.lifecycle.store import Database
    from ledgerq.queue.submission.store import SubmissionTx

Item = TypeVar("Item")
Value = TypeVar("Value")

#: Items one joint takes at most: more wait for the next. Its unit stays short (it may
#: run in the event loop's thread), well under a bulk write's size.
MAX_JOINED = 100


@dataclass(eq=False)
class _Joint(Generic[Item, Value]):
    """The items of one turn's callers, and each caller's future of its value."""

    items: list[Item]
    #: One a caller, in the items' order: a caller cancelled while it waits cancels only
    #: its own (what ``asyncio.shield`` of one shared future gave, at a third of its cost).
    waiting: list[asyncio.Future[Value]]
    #: The task that writes them (held here: the loop keeps only a weak reference).
    task: asyncio.Task[None] | None = None


#: Per handle, the joint that callers can still join, per key.
_open: WeakKeyDictionary[Database[SubmissionTx],
                        dict[Hashable, _Joint[Any, Any]]] = WeakKeyDictionary()


def others_ready() -> bool:
    """Whether anything else is ready to run in this turn of the loop, so a write made
    now could be joined. A loop without asyncio's own ready queue (uvloop) says no, and
    every write there goes alone, as before."""
    return bool(getattr(asyncio.get_running_loop(), "_ready", None))


async def write_joined(db: Database[SubmissionTx], key: Hashable, item: Item,
                       write_all: Callable[[SubmissionTx, Sequence[Item], float], list[Value]],
                       *, limit: int = MAX_JOINED) -> Value:
    """``item``'s value of ``write_all(tx, items, now)`` run once for every item joined
    under ``key`` in this turn (``now``: when that unit began); returns after its commit.

    ``write_all`` must give one value per item, in order, and write for each item what
    it would write for that item alone; the unit of one item is written as a unit of
    one statement (``StateDB.write(alone=True)``).
    """
    joints = _open.get(db)
    if joints is None:
        joints = _open[db] = {}
    joint = joints.get(key)
    loop = asyncio.get_running_loop()
    if joint is None:
        joint = joints[key] = _Joint([], [])
        # Scheduled behind every caller already ready in this turn: they all join first.
        joint.task = loop.create_task(_write(db, joints, key, joint, write_all))
    mine: asyncio.Future[Value] = loop.create_future()
    joint.items.append(item)
    joint.waiting.append(mine)
    if len(joint.items) >= limit:
        _seal(joints, key, joint)
    try:
        return await mine
    except Exception as exc:
        if len(joint.items) == 1 or is_database_failure(exc):
            raise
        # One item (or more) was refused, and nothing of the joint was written: each
        # caller writes alone, so only what is at fault is refused again.
        def by_itself(tx: SubmissionTx) -> list[Value]:
            return write_all(tx, [item], time.time())

        return (await db.write(by_itself, alone=True))[0]


def _seal(joints: dict[Hashable, _Joint[Any, Any]], key: Hashable,
          joint: _Joint[Any, Any]) -> None:
    """Close ``joint`` to later callers (they open the next one)."""
    if joints.get(key) is joint:
        del joints[key]


async def _write(db: Database[SubmissionTx], joints: dict[Hashable, _Joint[Item, Value]],
                 key: Hashable,
                 joint: _Joint[Item, Value],
                 write_all: Callable[[SubmissionTx, Sequence[Item], float], list[Value]]) -> None:
    # Sealed on the loop's thread before the unit can run anywhere (on PostgreSQL, a pool
    # thread): the unit's items never change under it, whatever runs it or how often.
    _seal(joints, key, joint)
    items = tuple(joint.items)
    now = time.time()
    try:
        values = await db.write(lambda tx: write_all(tx, items, now), alone=len(items) == 1)
    except Exception as exc:
        for waiting in joint.waiting:
            if not waiting.done():  # (a cancelled caller's is)
                waiting.set_exception(exc)
                waiting.exception()  # (marked retrieved: its caller may be cancelled yet)
        return
    except BaseException:
        for waiting in joint.waiting:
            waiting.cancel()
        raise
    for i, waiting in enumerate(joint.waiting):
        if waiting.done():  # (a cancelled caller's)
            continue
        if i < len(values):
            waiting.set_result(values[i])
        else:  # write_all broke its contract: its caller is told, not left waiting
            waiting.set_exception(IndexError(f"the joint's unit gave no value for item {i}"))
