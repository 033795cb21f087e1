"""A spec as a ``transitions.Machine``: the lifecycle simulated in memory, no database.

The machine is built from the policy alone, by a package that shares no code with the
engine, so it serves as an independent model: ``ledgerq.testing`` checks every move the
engine makes against it. Each edge is a trigger named by its target state (``paid``)
and, when the spec names one, by its event too (``pay``). A trigger takes the move's
``actor`` (an :class:`~ledgerq.lifecycle.Actor` or an actor type), ``patch`` and
``guard`` as keyword arguments; the edge's conditions check the actor type and the
columns it requires, so a trigger answers as the engine would:

* an edge the spec does not declare from the current state raises
  ``transitions.MachineError`` (the engine raises IllegalTransition);
* a declared edge whose actor or required columns do not match returns False and stays
  put (the engine raises ActorNotAllowed or MissingColumns);
* otherwise it returns True and the model is in the target state.

Guard *values* and the reason code are the database's business, not the model's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ledgerq.extras import require

if TYPE_CHECKING:
    from transitions import EventData, Machine

    from ledgerq.lifecycle.registry import EdgeRule, EntityPolicy


def _actor_type(event: EventData) -> str | None:
    actor = event.kwargs.get("actor")
    return actor if isinstance(actor, str) or actor is None else str(actor.type)


def _conditions(policy: EntityPolicy, rule: EdgeRule) -> list[Callable[[EventData], bool]]:
    """The edge's checks beyond being declared, in the engine's order."""

    def actor_allowed(event: EventData) -> bool:
        kind = _actor_type(event)
        return kind is not None and kind in policy.actors and (
            rule.actors is None or kind in rule.actors)

    def columns_given(event: EventData) -> bool:
        guard: Mapping[str, Any] = event.kwargs.get("guard") or {}
        patch: Mapping[str, Any] = event.kwargs.get("patch") or {}
        return rule.requires_guard <= set(guard) and rule.requires_patch <= set(patch)

    return [actor_allowed, columns_given]


def to_machine(policy: EntityPolicy, model: Any = None, *,
               machine_class: type[Machine] | None = None, **options: Any) -> Machine:
    """The ``transitions.Machine`` of ``policy``: see the module docstring.

    ``model`` None makes the machine its own model, in the spec's first initial state;
    give an object (or a list) to drive those instead, and add more later with
    ``machine.add_model(obj, initial=state)``. ``machine_class`` picks a transitions
    extension (``GraphMachine`` draws it: ``graph_engine="mermaid"`` needs nothing else
    installed); ``options`` go to its constructor.
    """
    require("testing")
    from transitions import Machine

    transitions: list[dict[str, Any]] = []
    for (src, dst), rule in policy.edge_rules.items():
        conditions = _conditions(policy, rule)
        names = [dst] if rule.event is None or rule.event == dst else [dst, rule.event]
        transitions += [{"trigger": name, "source": src, "dest": dst,
                         "conditions": conditions} for name in names]
    initial = next(s for s in policy.states if s in policy.initial)
    cls = machine_class or Machine
    return cls(model="self" if model is None else model, states=list(policy.states),
               transitions=transitions, initial=initial, auto_transitions=False,
               ignore_invalid_triggers=False, send_event=True, **options)


__all__ = ["to_machine"]
