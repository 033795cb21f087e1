"""The entities and states code acts on, by the names code gives them: how they reach
SQL.

A dialect's queries select rows by state (a claim reads the runs waiting to be claimed,
the reaper the ones whose lease may have expired). The spec declares the states; the
code that acts on them names each once (the queue, in :mod:`ledgerq.queue.moves`) and
registers those names here. A query writes ``status = {queued}`` and the store renders
the state the name stands for, as it renders ``{table}``: a spec whose states are
renamed changes the names in one place, and no SQL. An entity is named the same way
(``runs``: the entity whose rows workers lease, which the ``workers`` table references).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import MappingProxyType

#: Entity -> {name code gives a state: the state}.
_named: dict[str, Mapping[str, str]] = {}
#: Name code gives an entity -> the entity.
_entities: dict[str, str] = {}
#: The modules that register names (imported on the first lookup of an entity not yet
#: named: ledgerq's imports are lazy, so the queue may not have been loaded yet).
PROVIDERS = ("ledgerq.queue.moves",)


def name_states(entity: str, names: Mapping[str, str]) -> None:
    """Register what each name stands for among ``entity``'s states (replacing what was)."""
    _named[entity] = MappingProxyType(dict(names))


def name_entity(name: str, entity: str) -> None:
    """Register the entity ``name`` stands for."""
    _entities[name] = entity


def named_entity(name: str) -> str | None:
    """The entity ``name`` stands for, if code named one so."""
    if name not in _entities:
        _load()
    return _entities.get(name)


def _load() -> None:
    for provider in PROVIDERS:
        importlib.import_module(provider)


def named_states(entity: str) -> Mapping[str, str]:
    """The states of ``entity`` code names, by name ({} for an entity none are named of)."""
    found = _named.get(entity)
    if found is None:
        _load()
        found = _named.get(entity, MappingProxyType({}))
    return found


__all__ = ["PROVIDERS", "name_entity", "name_states", "named_entity", "named_states"]
