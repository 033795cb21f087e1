"""Declared lifecycles: spec files, the policy registry and the guarded transition engine."""

from ledgerq.lifecycle.engine import VOCABULARY_ERROR, create, transition
from ledgerq.lifecycle.entering import Entry
from ledgerq.lifecycle.models import Actor, StateReason, TransitionRequest, TransitionResult
from ledgerq.lifecycle.registry import (
    EntityPolicy,
    Registry,
    default_registry,
    load_registry,
)
from ledgerq.lifecycle.spec import SpecError, SpecProblem

__all__ = [
    "VOCABULARY_ERROR",
    "Actor",
    "EntityPolicy",
    "Entry",
    "Registry",
    "SpecError",
    "SpecProblem",
    "StateReason",
    "TransitionRequest",
    "TransitionResult",
    "create",
    "default_registry",
    "load_registry",
    "transition",
]
