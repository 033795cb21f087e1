"""Runs that wait for other runs: releasing them, cancelling them, and the cycles that
would keep them waiting forever.

A waiting run (``waiting_dependency``) names the runs it waits for in ``depends_on``.
When those have ended it is released (each ended in a state whose outcome is
``succeeded``) or cancelled (one ended otherwise); cancelling it may end its own
dependents, and so on down the graph.

The cascade costs what it moves: after its first cancellation it reads every waiting run
once and follows the graph in memory (a lookup per cancelled run made cancelling the
head of a 10,000-run chain quadratic). And it is bounded: one call examines at most
``limit`` waiting runs and hands back those it did not reach, to be settled in another
transaction, so a cascade of any size never holds the write lock, nor a worker's event
loop, for long; other writers get in between its transactions.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ledgerq.codec import loads
from ledgerq.lifecycle.registry import SUCCEEDED, EntityPolicy
from ledgerq.queue import moves
from ledgerq.queue.runs import perform

if TYPE_CHECKING:
    from ledgerq.queue.store import SharedTx

#: Waiting runs one transaction examines: about 50 ms of moves, far below a lease's
#: renewal interval, however large the cascade.
CASCADE_CHUNK = 500


@dataclass
class Settled:
    """What one call of :func:`resolve_dependents` did."""

    released: int = 0
    cancelled: int = 0
    #: Waiting runs it did not reach (the call examined ``limit``): settle them in
    #: another transaction, ``resolve_dependents(..., left, waiting=True)``. The
    #: dependency sweep finds them too: each waits on a run that has ended.
    left: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return {"released": self.released, "cancelled": self.cancelled}


def depends_on(raw: Any) -> list[str] | None:
    """The ids a stored ``depends_on`` names; None when it is not a JSON list of ids (a
    hand-written row: ``verify()`` reports it, the queue leaves the row alone)."""
    try:
        deps = raw if isinstance(raw, list) else loads(raw)
    except Exception:
        return None
    if deps is None:
        return []
    if not isinstance(deps, list) or not all(isinstance(d, str) for d in deps):
        return None
    return deps


def dependents_index(waiting: Iterable[tuple[str, Any]]) -> dict[str, list[tuple[str, Any]]]:
    """run id -> the waiting runs (id, depends_on) that name it."""
    index: dict[str, list[tuple[str, Any]]] = {}
    for rid, raw in waiting:
        for dep in dict.fromkeys(depends_on(raw) or ()):
            index.setdefault(dep, []).append((rid, raw))
    return index


def resolve_dependents(tx: SharedTx, policy: EntityPolicy, run_ids: list[str], *,
                       waiting: bool = False, now: float | None = None,
                       limit: int | None = None) -> Settled:
    """Release or cancel waiting runs whose dependencies have all ended (in-transaction).

    ``run_ids`` are runs that just ended (their dependents are checked) or, with
    ``waiting=True``, waiting runs to check themselves. Cancelling a dependent ends it,
    so its own dependents are checked next, until nothing more resolves or ``limit``
    waiting runs were examined (default :data:`CASCADE_CHUNK`); the rest is in
    :attr:`Settled.left`.
    """
    bound = CASCADE_CHUNK if limit is None else limit
    met = policy.states_with_outcome(SUCCEEDED)
    ts = time.time() if now is None else now
    out = Settled()
    todo = tx.list_waiting_runs(policy, run_ids) if waiting else tx.list_dependents(policy, run_ids)
    below: dict[str, list[tuple[str, Any]]] | None = None
    seen: set[str] = set()
    while todo:
        rid, raw = todo.pop()
        if rid in seen:
            continue
        if len(seen) >= bound:
            out.left = list(dict.fromkeys(r for r, _ in [(rid, raw), *todo] if r not in seen))
            break
        seen.add(rid)
        deps = depends_on(raw)
        if deps is None:
            continue
        statuses = tx.read_statuses(policy, deps) if deps else {}
        ended_badly = [d for d in deps
                       if statuses.get(d) in policy.terminal and statuses[d] not in met]
        if ended_badly:
            d = ended_badly[0]
            why = f"dependency {d} ended {statuses[d]}"
            if perform(tx, policy, rid, moves.DEPENDENCY_FAILED, summary=why,
                       patch={"ended_at": ts, "error_detail": why}, now=ts).applied:
                out.cancelled += 1
                if below is None:  # the graph, read once however deep the cascade goes
                    below = dependents_index(tx.list_all_waiting(policy))
                todo += below.get(rid, ())
        elif all(statuses.get(d) in met for d in deps):
            out.released += int(perform(tx, policy, rid, moves.DEPENDENCIES_MET,
                                        patch={"queued_at": ts}, now=ts).applied)
    return out


def waiting_on_cycles(waiting: Iterable[tuple[str, Any]]) -> dict[str, list[str]]:
    """Waiting runs that can never settle because a cycle of waiting runs lies on their
    way (they are on it, or wait on a run that is): id -> the cycle, as ids.

    Submission cannot make a cycle (a run may depend only on runs that exist, and its
    own id is new), but rows written otherwise can (a generic ``create()`` with chosen
    ids); ``stats`` counts them as stuck, and cancelling any run of the cycle ends it.
    """
    edges: dict[str, list[str]] = {}
    for rid, raw in waiting:
        edges[rid] = [d for d in dict.fromkeys(depends_on(raw) or ())]
    cycle_of: dict[str, list[str]] = {}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in edges:
        if start in state:
            continue
        path: list[str] = []
        stack: list[tuple[str, int]] = [(start, 0)]
        while stack:
            node, i = stack.pop()
            if i == 0:
                state[node] = 1
                path.append(node)
            nexts = [d for d in edges.get(node, ()) if d in edges]
            if i < len(nexts):
                stack.append((node, i + 1))
                nxt = nexts[i]
                if state.get(nxt) == 1:  # a cycle: the path from nxt back to it
                    loop = path[path.index(nxt):]
                    for member in loop:
                        cycle_of.setdefault(member, loop)
                elif nxt in cycle_of:
                    cycle_of.setdefault(node, cycle_of[nxt])
                elif nxt not in state:
                    stack.append((nxt, 0))
                continue
            state[node] = 2
            path.pop()
            for d in nexts:
                if d in cycle_of:
                    cycle_of.setdefault(node, cycle_of[d])
                    break
    return cycle_of
