"""The API's JSON shapes, as pydantic models: they generate the OpenAPI document.

Request bodies are described here but validated by the library: ``POST /api/tasks``
reads its body itself and builds a :class:`~ledgerq.queue.TaskApplication`, so a refusal
carries ``submit_task()``'s own message (the HTTP binding adds no second, different set
of rules). Responses are validated against these models on the way out.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ledgerq.queue.moves import DEFAULT_QUEUE
from ledgerq.queue.submission.application import (
    MAX_PRIORITY,
    MAX_QUEUE_NAME_LENGTH,
    MIN_PRIORITY,
    QUEUE_NAME,
)

Row = dict[str, Any]


class Error(BaseModel):
    """Every refusal: one line saying what is wrong."""

    detail: str


class RetryBody(BaseModel):
    max_attempts: int = Field(ge=1)
    base_delay: float = Field(ge=0)
    factor: float = Field(default=2.0, ge=1)
    max_delay: float = Field(default=3600.0, ge=0)
    jitter: float = Field(default=0.1, ge=0, le=1)


class TaskApplicationBody(BaseModel):
    """A TaskApplication as JSON (docs/queue.md, "Submitting")."""

    model_config = ConfigDict(extra="forbid")
    action_kind: str = Field(description="command, agent, flow, ... (see docs/queue.md)")
    args: dict[str, Any] = Field(description='For command: {"argv": [...], "cwd": ...}')
    execution_target: str = Field(description="host, process, local_worktree, ...")
    required_capabilities: list[str] = Field(default_factory=list)
    library_ref: str | None = None
    library_content_hash: str | None = None
    idempotency_key: str | None = Field(
        default=None, description="Or the Idempotency-Key header (they must agree).")
    retry: RetryBody | None = None
    timeout_seconds: float | None = Field(default=None, gt=0)
    depends_on: list[str] = Field(default_factory=list)
    not_before: float | None = Field(
        default=None, description="Epoch seconds: start no sooner (the run waits in "
        "`delayed`). Not with depends_on.")
    priority: int = Field(default=0, ge=MIN_PRIORITY, le=MAX_PRIORITY,
                          description="Claimed before lower priorities; ties oldest first.")
    queue: str = Field(default=DEFAULT_QUEUE, max_length=MAX_QUEUE_NAME_LENGTH,
                       pattern=f"^{QUEUE_NAME.pattern}$",
                       description="The named queue; a worker claims only from its queues.")


class Created(BaseModel):
    id: str


class Cancelled(BaseModel):
    id: str
    cancelled: bool
    status: str


class TaskPage(BaseModel):
    items: list[Row] = Field(description="Run summaries, newest first.")
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next page.")


class Fact(BaseModel):
    """One fact of the log, keyed by its column names (JSON columns decoded)."""

    model_config = ConfigDict(extra="allow")
    id: str
    entity_type: str
    entity_id: str
    previous_status: str | None
    status: str
    reason_code: str
    entity_version: int
    created_at: float


class TaskDetail(BaseModel):
    run: Row
    history: list[Fact]


class EntityPageOut(BaseModel):
    items: list[Row] = Field(description="Rows, newest first, JSON columns decoded.")
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next page.")


class EntitySummaryOut(BaseModel):
    entity: str
    table: str
    description: str
    counts: dict[str, int] = Field(description="Rows per state: every declared state, in "
                                   "spec order.")
    terminal: list[str]


class EntityDetail(BaseModel):
    row: Row
    history: list[Fact]


class MoveBody(BaseModel):
    """A move of one row: to ``state``, or along the edge ``event`` names."""

    model_config = ConfigDict(extra="forbid")
    state: str | None = Field(default=None, max_length=256)
    event: str | None = Field(default=None, max_length=256)
    reason: str | None = Field(default=None, max_length=256,
                               description="A reason code (default: the edge's).")
    patch: dict[str, Any] | None = None
    expect: str | None = Field(default=None, max_length=256,
                               description="Refuse (409) unless the row is in this state.")


class Moved(BaseModel):
    applied: bool
    previous_state: str | None
    current_state: str
    transition_id: str


class WorkerOut(BaseModel):
    worker_id: str
    hostname: str | None
    pid: int | None
    last_heartbeat_at: float
    heartbeat_age_seconds: float
    running: int


class StuckOut(BaseModel):
    id: str
    status: str
    why: str


class Stats(BaseModel):
    now: float
    counts: dict[str, int]
    total: int
    oldest_queued_at: float | None
    oldest_queued_age_seconds: float | None
    running_by_worker: dict[str, int]
    workers: list[WorkerOut]
    stuck: int
    stuck_runs: list[StuckOut]
    unserved_kinds: list[str] = Field(
        default_factory=list,
        description="Kinds of queued runs no live worker claims (none has their code).")
    as_of: float | None = Field(
        default=None,
        description="When the read replica these figures come from was current (now "
                    "while it has replayed all it received, else its last replayed "
                    "commit's time); null when they come from the primary.")


class Edge(BaseModel):
    source: str
    target: str
    label: str


class SpecSummary(BaseModel):
    entity: str
    table: str
    description: str
    states: list[str]
    terminal: list[str]


class SpecDetail(SpecSummary):
    initial: list[str]
    state_descriptions: dict[str, str]
    edges: list[Edge]
    reason_codes: dict[str, str]
    mermaid: str


class DriftOut(BaseModel):
    entity_type: str
    entity_id: str
    problem: str
    column: str | None
    expected: Any = None
    actual: Any = None
    text: str


class VerifyOut(BaseModel):
    ok: bool
    rows: int
    facts: int
    drift: list[DriftOut]


class Health(BaseModel):
    ok: bool
    dialect: str
