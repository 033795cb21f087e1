"""TaskApplication: the one submit shape, validated once before any transaction (record D1)."""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import msgspec

from ledgerq.store.codec import dumps, loads

#: Kinds the subprocess launcher knows, plus ``workflow`` (run only through an adapter)
#: and ``command`` (its ``args["argv"]`` is executed directly).
ACTION_KINDS: tuple[str, ...] = (
    "agent", "flow", "fanout", "play", "flow_yaml", "engine", "workflow", "command",
)
ACTION_ALIASES: Mapping[str, str] = {"playbook": "play"}
EXECUTION_TARGETS: frozenset[str] = frozenset(
    {"host", "local_worktree", "daytona", "remote_agent", "process"}
)


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how soon a failed run is tried again; attempts include the first run.

    The delay before attempt ``n + 1`` (after ``n`` failed runs) is
    ``min(max_delay, base_delay * factor ** (n - 1))``, then spread by ``±jitter`` (a
    fraction) so a burst of failures does not retry in lockstep.
    """

    max_attempts: int
    base_delay: float
    factor: float = 2.0
    max_delay: float = 3600.0
    jitter: float = 0.1

    def __post_init__(self) -> None:
        if (isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int)
                or self.max_attempts < 1):
            raise ValueError(f"RetryPolicy.max_attempts must be an int >= 1, "
                             f"not {self.max_attempts!r}")
        for name in ("base_delay", "factor", "max_delay", "jitter"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise ValueError(f"RetryPolicy.{name} must be a finite number >= 0, "
                                 f"not {value!r}")
        if self.factor < 1:
            raise ValueError(f"RetryPolicy.factor must be >= 1, not {self.factor!r}")
        if self.jitter > 1:
            raise ValueError(f"RetryPolicy.jitter is a fraction in [0, 1], not {self.jitter!r}")

    def delay(self, failed_runs: int, rng: random.Random | None = None) -> float:
        base = min(self.max_delay, self.base_delay * self.factor ** max(0, failed_runs - 1))
        if self.jitter:
            base *= 1 + (rng or random).uniform(-self.jitter, self.jitter)
        return max(0.0, base)

    def to_dict(self) -> dict[str, Any]:
        return {"max_attempts": self.max_attempts, "base_delay": self.base_delay,
                "factor": self.factor, "max_delay": self.max_delay, "jitter": self.jitter}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RetryPolicy:
        return cls(**data)


@dataclass(frozen=True)
class TaskApplication:
    """What a caller asks the queue to run. Frozen: normalization returns a new object."""

    action_kind: str
    args: dict[str, Any]
    execution_target: str
    required_capabilities: list[str] = field(default_factory=list)
    library_ref: str | None = None
    library_content_hash: str | None = None
    idempotency_key: str | None = None
    retry: RetryPolicy | None = None
    timeout_seconds: float | None = None
    depends_on: Sequence[str] = ()


def _kinds_message() -> str:
    aliases = ", ".join(f"{a} -> {c}" for a, c in ACTION_ALIASES.items())
    return f"expected one of {', '.join(ACTION_KINDS)} (aliases: {aliases})"


def validate(app: TaskApplication) -> TaskApplication:
    """Check every field and return the normalized application; raise ValueError naming the field.

    Runs before any transaction, so a rejected application writes nothing.
    """
    if not isinstance(app, TaskApplication):
        raise TypeError(f"expected a TaskApplication, got {type(app).__name__}")
    key = app.idempotency_key
    if key is not None and (not isinstance(key, str) or not key):
        raise ValueError("idempotency_key must be a non-empty string or None; "
                         f"got {key!r} (an empty key would dedupe nothing)")
    kind = app.action_kind
    if not isinstance(kind, str):
        raise ValueError(f"action_kind must be a string; {_kinds_message()}")
    kind = ACTION_ALIASES.get(kind, kind)
    if kind not in ACTION_KINDS:
        raise ValueError(f"unknown action_kind {app.action_kind!r}; {_kinds_message()}")
    if not isinstance(app.execution_target, str) or app.execution_target not in EXECUTION_TARGETS:
        raise ValueError(f"unknown execution_target {app.execution_target!r}; expected one of "
                         f"{', '.join(sorted(EXECUTION_TARGETS))}")
    if not isinstance(app.args, dict):
        raise ValueError(f"args must be a dict, got {type(app.args).__name__}")
    try:
        encoded = dumps(app.args)
    except (TypeError, msgspec.EncodeError) as exc:
        raise ValueError(f"args must be JSON-serializable: {exc}") from None
    # The encoder is lenient (NaN/inf become null, sets and tuples become lists, bytes
    # become base64): accept only args that read back exactly as given.
    if loads(encoded) != app.args:
        raise ValueError("args must be plain JSON (str keys; dict, list, str, finite number, "
                         "bool, None): these would not be stored exactly as given")
    if kind == "command":
        argv = app.args.get("argv")
        if (not isinstance(argv, list) or not argv
                or not all(isinstance(a, str) for a in argv) or not argv[0]):
            raise ValueError('command tasks need args["argv"]: a non-empty list of strings')
    caps = app.required_capabilities
    if not isinstance(caps, list):
        raise ValueError(f"required_capabilities must be a list, got {type(caps).__name__}")
    for i, token in enumerate(caps):
        if not isinstance(token, str) or not token:
            raise ValueError(f"required_capabilities[{i}] must be a non-empty string, "
                             f"got {token!r}")
    for name in ("library_ref", "library_content_hash"):
        value = getattr(app, name)
        if value is not None and not isinstance(value, str):
            raise ValueError(f"{name} must be a string or None, got {type(value).__name__}")
    if app.retry is not None and not isinstance(app.retry, RetryPolicy):
        raise ValueError(f"retry must be a RetryPolicy or None, got {type(app.retry).__name__}")
    t = app.timeout_seconds
    if t is not None and (isinstance(t, bool) or not isinstance(t, int | float)
                          or not math.isfinite(t) or t <= 0):
        raise ValueError(f"timeout_seconds must be a positive number or None, got {t!r}")
    deps = app.depends_on
    if isinstance(deps, str) or not isinstance(deps, Sequence):
        raise ValueError("depends_on must be a list of run ids")
    for i, dep in enumerate(deps):
        if not isinstance(dep, str) or not dep:
            raise ValueError(f"depends_on[{i}] must be a non-empty run id string, got {dep!r}")
    changes: dict[str, Any] = {}
    if kind != app.action_kind:
        changes["action_kind"] = kind
    if not isinstance(deps, tuple):
        changes["depends_on"] = tuple(deps)
    return replace(app, **changes) if changes else app


def digest(app: TaskApplication) -> str:
    """A fingerprint of everything but the idempotency key, to tell a retry from a clash."""
    body = {
        "action_kind": app.action_kind, "args": app.args,
        "execution_target": app.execution_target,
        "required_capabilities": app.required_capabilities,
        "library_ref": app.library_ref, "library_content_hash": app.library_content_hash,
        "retry": app.retry.to_dict() if app.retry else None,
        "timeout_seconds": app.timeout_seconds, "depends_on": list(app.depends_on),
    }
    return hashlib.sha256(dumps(body).encode()).hexdigest()
