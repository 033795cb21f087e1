"""The request and result shapes of a transition (the ADR-0071 queue's), validated by pydantic."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

ActorType = Literal["scheduler", "operator", "system", "webhook", "agent"]


class Actor(BaseModel):
    """Who asks for a change; ``type`` is what edge actor restrictions match on."""

    model_config = ConfigDict(frozen=True)
    type: ActorType
    id: str


class StateReason(BaseModel):
    """Why a change happens; ``code`` must be one of the entity's declared reason codes."""

    model_config = ConfigDict(frozen=True)
    code: str
    summary: str = ""
    evidence_refs: list[dict[str, Any]] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)


class TransitionRequest(BaseModel):
    """One requested move; ``from_state=None`` means no expectation about the current status."""

    model_config = ConfigDict(frozen=True)
    entity_type: str
    entity_id: str
    from_state: str | None
    to_state: str
    reason: StateReason
    actor: Actor
    idempotency_key: str


class TransitionResult(BaseModel):
    """The outcome: applied, or a conflict that wrote nothing."""

    model_config = ConfigDict(frozen=True)
    applied: bool
    conflict: bool = False
    previous_state: str | None = None
    current_state: str
    transition_id: str
    event_id: str | None = None
