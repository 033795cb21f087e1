"""The request and result shapes of a transition (the ADR-0071 queue's), validated by pydantic."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ledgerq.codec import dumps

#: What one fact may carry (every fact is kept forever, and shown by every reader: a 20 MB
#: summary made each cancel 64 MB and the dashboard fetch it every second).
MAX_ACTOR_ID_LENGTH = 256
MAX_SUMMARY_LENGTH = 4096
MAX_EVIDENCE_REFS = 100
#: Encoded JSON, evidence references and metadata each.
MAX_REASON_JSON_BYTES = 64 * 1024

#: The ADR-0071 queue's actor types: every entity's, unless its spec names its own.
ActorType = Literal["scheduler", "operator", "system", "webhook", "agent"]
#: An actor type's shape (an entity's spec may declare its own: ``customer``, ``user``).
ACTOR_TYPE_PATTERN = r"^[a-z][a-z0-9_]{0,63}$"


class Actor(BaseModel):
    """Who asks for a change; ``type`` is what the entity's and its edges' actor
    restrictions match on (one of the entity's ``actors``)."""

    model_config = ConfigDict(frozen=True)
    type: str = Field(pattern=ACTOR_TYPE_PATTERN)
    id: str = Field(max_length=MAX_ACTOR_ID_LENGTH)


class StateReason(BaseModel):
    """Why a change happens; ``code`` must be one of the entity's declared reason codes."""

    model_config = ConfigDict(frozen=True)
    code: str
    summary: str = Field(default="", max_length=MAX_SUMMARY_LENGTH)
    evidence_refs: list[dict[str, Any]] = Field(default_factory=list,
                                                max_length=MAX_EVIDENCE_REFS)
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("evidence_refs", "metadata")
    @classmethod
    def _bounded(cls, value: Any) -> Any:
        # Most reasons carry neither: nothing to encode then.
        if not value:
            return value
        try:
            size = len(dumps(value))
        except Exception:  # not JSON at all: the engine's value checks say why
            return value
        if size > MAX_REASON_JSON_BYTES:
            raise ValueError(f"at most {MAX_REASON_JSON_BYTES:,} bytes of JSON")
        return value


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
