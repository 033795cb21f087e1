"""What the engine works out once per entity policy and then keeps: which value types of
each column need no further look, the plans of its moves and those of its creations.

Kept by the policy's identity (a frozen dataclass of mappings cannot be hashed); the
cache holds the policy itself, so its id cannot be reused by another policy (a process
that loads many spec versions) while the cache exists.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ledgerq.lifecycle.registry import EntityPolicy

#: Shapes remembered per policy, of moves and of creations each; past this many (a caller
#: with ever-new column sets) the policy's plans of that kind start over.
PLAN_LIMIT = 4096


class PolicyCache:
    """One policy's cache. Its maps are filled on first use by the modules that own
    what they hold (values, plans, creation)."""

    __slots__ = ("plain_types", "plans", "policy", "sent_plans")

    def __init__(self, policy: EntityPolicy) -> None:
        self.policy = policy
        #: Per ``json_text`` (see ``check_values``): per column, the exact types whose
        #: values need no further look.
        self.plain_types: dict[bool, dict[str, frozenset[type]]] = {}
        #: Move plans (``plans.Plan``) by the move's shape and dialect (see
        #: ``plans.move_plan``). Typed by their owners where they are read, so this module
        #: imports nothing of the engine's.
        self.plans: dict[tuple[Any, ...], Any] = {}
        #: Creation plans (``creation.SentPlan`` or None) by dialect and the columns sent
        #: (see ``creation.sent_plan``).
        self.sent_plans: dict[tuple[Any, ...], Any] = {}


#: Every policy's cache, by the policy's id. Hot paths read it as
#: ``CACHES.get(id(policy)) or cache_of(policy)``: a lookup, no call, once the cache exists.
CACHES: dict[int, PolicyCache] = {}


def cache_of(policy: EntityPolicy) -> PolicyCache:
    cache = CACHES.get(id(policy))
    if cache is None:
        cache = CACHES[id(policy)] = PolicyCache(policy)
    return cache
