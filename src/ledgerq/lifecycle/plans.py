"""Move plans: what every move of one shape shares, worked out once, so that a move does
only the work its values need.

A shape is a policy, the states from and to, the reason code, the actor type, the guard
and patch columns, whether the reason has evidence, what the move returns and whether
it skips a row another writer holds. Its plan holds the spec's verdict on it (the checks
after the read) and the dialect's statements for it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ledgerq.errors import ActorNotAllowed, IllegalTransition, InvalidInput, MissingColumns
from ledgerq.lifecycle.facts import reason_json
from ledgerq.lifecycle.models import Actor, StateReason
from ledgerq.lifecycle.policy_cache import CACHES, PLAN_LIMIT, cache_of
from ledgerq.lifecycle.registry import EntityPolicy
from ledgerq.lifecycle.store import EventStore
from ledgerq.lifecycle.values import check_allowed, check_reason

VOCABULARY_ERROR = "not in the declared transition vocabulary"


class Plan(NamedTuple):
    """The plan of one shape of move (see the module docstring)."""

    #: Why the spec forbids the move (the checks after the read); None: it may run, and
    #: the fields after ``skip_locked`` are set.
    refusal: str | None
    #: The status the move expects (read, or named by the caller) and the one it asks for.
    observed: str
    to_state: str
    #: The status the swap sets: None for a same-state move, which leaves it as it is.
    moved_to: str | None
    #: The move returns the whole row as the swap left it.
    whole_row: bool
    #: A row another writer holds is a conflict at once, where the swap is the read.
    skip_locked: bool
    #: Columns the edge wants a fresh token in that the patch does not give.
    fresh: tuple[str, ...] = ()
    guard_cols: tuple[str, ...] = ()
    #: The patched columns whose stored value the fact records.
    patched: tuple[str, ...] = ()
    #: The swap without a read (the WHERE holds status and guards), and with one.
    unread: Any = None
    read: Any = None
    #: The exception a refusal raises (a subclass of InvalidInput, itself a ValueError).
    refused_as: type[InvalidInput] = InvalidInput
    #: Columns the edge clears (sets to NULL) that the patch does not give.
    cleared: tuple[str, ...] = ()


def move_plan(tx: EventStore, policy: EntityPolicy, observed: str, to_state: str,
              reason: StateReason, actor: Actor, guard: dict[str, Any],
              patch: dict[str, Any], whole_row: bool, skip_locked: bool) -> Plan:
    """The plan of a move of this shape from ``observed``, kept in the policy's cache by
    the shape and the dialect, whose statements it holds."""
    plans: dict[tuple[Any, ...], Plan] = (CACHES.get(id(policy)) or cache_of(policy)).plans
    key = (type(tx), observed, to_state, reason.code, actor.type, tuple(guard), tuple(patch),
           not reason.evidence_refs, whole_row, skip_locked)
    found = plans.get(key)
    if found is None:
        if len(plans) >= PLAN_LIMIT:
            plans.clear()
        found = plans[key] = _make_plan(tx, policy, observed, to_state, reason, actor, guard,
                                        patch, whole_row, skip_locked)
    return found


def _make_plan(tx: EventStore, policy: EntityPolicy, observed: str, to_state: str,
               reason: StateReason, actor: Actor, guard: dict[str, Any],
               patch: dict[str, Any], whole_row: bool, skip_locked: bool) -> Plan:
    check_reason(policy, reason)  # (raised, never kept: a plan is made only past these)
    check_allowed(policy, guard, patch)
    same = observed == to_state
    moved_to = None if same else to_state
    refused = _refusal(policy, observed, to_state, actor, guard, patch)
    if refused is not None:
        return Plan(refused[0], observed, to_state, moved_to, whole_row, skip_locked,
                    refused_as=refused[1])
    rule = policy.rule(observed, to_state)
    fresh = tuple(sorted(rule.fresh_tokens - patch.keys()))
    cleared = tuple(sorted(rule.clears - patch.keys() - set(fresh)))
    # Read back what the database stored of every column whose stored form may differ
    # from what was sent (type affinity; PostgreSQL normalizes jsonb), so the fact records
    # exactly what the row holds. Empty evidence is "[]" everywhere: not worth a column.
    patched = (*fresh, *patch, *cleared,
               *(("status_evidence_refs",) if reason.evidence_refs else ()))
    guard_cols = tuple(sorted(guard))
    # The order in which a swap fills a move's changes (a patch may name a stamped column).
    change_cols = tuple(dict.fromkeys((*STAMPED, *fresh, *patch, *cleared)))

    def statement(read: bool, returning: tuple[str, ...]) -> Any:
        return tx.prepare_swap(policy, same_state=same, change_cols=change_cols,
                               guard_cols=guard_cols, read=read,
                               skip_locked=skip_locked and not read,
                               returning=None if whole_row else returning)

    return Plan(None, observed, to_state, moved_to, whole_row, skip_locked, fresh,
                guard_cols, patched, statement(False, ("version", *patched)),
                statement(True, patched), cleared=cleared)


def _refusal(policy: EntityPolicy, observed: str, to_state: str, actor: Actor,
             guard: dict[str, Any], patch: dict[str, Any]
             ) -> tuple[str, type[InvalidInput]] | None:
    """Why the spec forbids this move from ``observed`` (the checks after the read) and
    the exception that says so, or None: the edge, its actor types, the guard and patch
    columns it requires."""
    if not policy.allows(observed, to_state):
        allowed = ", ".join(policy.targets(observed)) or "none (terminal)"
        return (f"{policy.name} {observed} -> {to_state} is {VOCABULARY_ERROR}; "
                f"allowed from {observed}: {allowed}"), IllegalTransition
    if actor.type not in policy.actors:
        return (f"{policy.name} is moved by actor types {', '.join(sorted(policy.actors))}; "
                f"got {actor.type!r}"), ActorNotAllowed
    rule = policy.rule(observed, to_state)
    if rule.actors is not None and actor.type not in rule.actors:
        return (f"{policy.name} {observed} -> {to_state} is restricted to actor type(s) "
                f"{', '.join(sorted(rule.actors))}; got {actor.type!r}"), ActorNotAllowed
    for kind, need, given in (("guard", rule.requires_guard, guard),
                              ("patch", rule.requires_patch, patch)):
        if need and not need.issubset(given):
            return (f"{policy.name} {observed} -> {to_state} requires {kind} column(s) "
                    f"{', '.join(sorted(need - set(given)))}"), MissingColumns
    return None


def stamp(reason: StateReason, ts: float) -> dict[str, Any]:
    """The columns every move sets besides its patch: when, and why."""
    return {"updated_at": ts, "status_reason_code": reason.code,
            "status_reason_summary": reason.summary,
            "status_evidence_refs": reason_json(reason.evidence_refs)}


#: The columns every move sets besides its patch, in :func:`stamp`'s order.
STAMPED = tuple(stamp(StateReason.model_construct(code="", summary="", evidence_refs=[],
                                                  metadata={}), 0.0))
