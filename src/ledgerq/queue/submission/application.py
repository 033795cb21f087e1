"""TaskApplication: the one submit shape, validated once before any transaction."""

from __future__ import annotations

import hashlib
import math
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import msgspec

from ledgerq.codec import dumpb, dumps, loads
from ledgerq.durations import check_instant, check_span
from ledgerq.errors import InvalidInput
from ledgerq.queue.moves import DEFAULT_QUEUE

#: Kinds the subprocess launcher knows, plus ``workflow`` (run only through an adapter)
#: and ``command`` (its ``args["argv"]`` is executed directly).
ACTION_KINDS: tuple[str, ...] = (
    "agent", "flow", "fanout", "play", "flow_yaml", "engine", "workflow", "command",
)
ACTION_ALIASES: Mapping[str, str] = {"playbook": "play"}
EXECUTION_TARGETS: frozenset[str] = frozenset(
    {"host", "local_worktree", "daytona", "remote_agent", "process"}
)
#: Where a run executes when its application names no target: a worker's own host.
DEFAULT_TARGET = "host"
#: A Python task's name, which its runs carry as their action kind: a module path and a
#: function name make one (``app.emails.send``). At most MAX_TASK_NAME_LENGTH characters.
TASK_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:[.:-][A-Za-z0-9_]+)*")
MAX_TASK_NAME_LENGTH = 200


#: Bounds of a RetryPolicy: past them a policy means "forever" and overflows its delays.
MAX_RETRY_ATTEMPTS = 1000
MAX_RETRY_FACTOR = 100.0


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
            raise InvalidInput(f"RetryPolicy.max_attempts must be an int >= 1, "
                               f"not {self.max_attempts!r}")
        if self.max_attempts > MAX_RETRY_ATTEMPTS:
            raise InvalidInput(f"RetryPolicy.max_attempts must be at most "
                               f"{MAX_RETRY_ATTEMPTS:,}, not {self.max_attempts!r}")
        for name in ("base_delay", "factor", "max_delay", "jitter"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise InvalidInput(f"RetryPolicy.{name} must be a finite number >= 0, "
                                   f"not {value!r}")
        check_span(self.base_delay, "RetryPolicy.base_delay")
        check_span(self.max_delay, "RetryPolicy.max_delay")
        if not 1 <= self.factor <= MAX_RETRY_FACTOR:
            raise InvalidInput(f"RetryPolicy.factor must be between 1 and "
                               f"{MAX_RETRY_FACTOR:g}, not {self.factor!r}")
        if self.jitter > 1:
            raise InvalidInput(f"RetryPolicy.jitter is a fraction in [0, 1], not {self.jitter!r}")

    def delay(self, failed_runs: int, rng: random.Random | None = None) -> float:
        try:
            grown = self.base_delay * self.factor ** max(0, failed_runs - 1)
        except OverflowError:  # (a thousand doublings: capped, never a supervisor's crash)
            grown = math.inf
        base = min(self.max_delay, grown)
        if self.jitter:
            base *= 1 + (rng or random).uniform(-self.jitter, self.jitter)
        return max(0.0, base)

    def to_dict(self) -> dict[str, Any]:
        return {"max_attempts": self.max_attempts, "base_delay": self.base_delay,
                "factor": self.factor, "max_delay": self.max_delay, "jitter": self.jitter}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RetryPolicy:
        return cls(**data)


#: Priorities are small integers: enough levels for any policy (a scheduler's own scale
#: maps into them), and a typo such as 10000000 is refused rather than stored.
MIN_PRIORITY = -1000
MAX_PRIORITY = 1000
#: A queue name: a letter or digit, then letters, digits and ``_ . : -``; at most 64.
#: Names appear in URLs, shell arguments, metrics labels and log lines unquoted.
MAX_QUEUE_NAME_LENGTH = 64
QUEUE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]*")


def queue_name_problem(name: object) -> str | None:
    """Why ``name`` cannot name a queue, or None; shared by submission and workers."""
    if not isinstance(name, str):
        return f"must be a string, got {type(name).__name__}"
    if not name:
        return "must not be empty"
    if len(name) > MAX_QUEUE_NAME_LENGTH:
        return (f"is {len(name):,} characters long; the limit is "
                f"{MAX_QUEUE_NAME_LENGTH}")
    if QUEUE_NAME.fullmatch(name) is None:
        return (f"{shown(name)} is not a queue name: a letter or digit, then letters, "
                "digits, '_', '.', ':' or '-'")
    return None


def task_name_problem(name: object) -> str | None:
    """Why ``name`` cannot name a task, or None. The ADR-0071 queue's kinds are taken: a
    task named ``command`` would be run by the launcher."""
    if not isinstance(name, str):
        return f"must be a string, got {type(name).__name__}"
    if len(name) > MAX_TASK_NAME_LENGTH:
        return f"is {len(name):,} characters long; the limit is {MAX_TASK_NAME_LENGTH}"
    if TASK_NAME.fullmatch(name) is None:
        return (f"{shown(name)} is not a task name: identifiers joined by '.', ':' or '-' "
                "(e.g. 'emails.send')")
    if name in ACTION_KINDS or name in ACTION_ALIASES:
        return f"{shown(name)} is one of the ADR-0071 queue's action kinds"
    return None


def check_priority(value: object, field_name: str = "priority") -> int:
    """``value`` as a priority, or InvalidInput naming ``field_name``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"{field_name} must be an integer from {MIN_PRIORITY} to "
                           f"{MAX_PRIORITY}, got {shown(value)}")
    if not MIN_PRIORITY <= value <= MAX_PRIORITY:
        raise InvalidInput(f"{field_name} must be from {MIN_PRIORITY} to {MAX_PRIORITY} "
                           f"(higher is claimed first), got {value}")
    return value


def check_queue(value: object, field_name: str = "queue") -> str:
    """``value`` as a queue name, or InvalidInput naming ``field_name``."""
    if type(value) is str and value == DEFAULT_QUEUE:  # most runs: no pattern to match
        return value
    problem = queue_name_problem(value)
    if problem is not None:
        raise InvalidInput(f"{field_name} {problem}")
    assert isinstance(value, str)
    return value


@dataclass(frozen=True)
class TaskApplication:
    """What a caller asks the queue to run. Frozen: normalization returns a new object."""

    action_kind: str
    args: dict[str, Any]
    execution_target: str = DEFAULT_TARGET
    required_capabilities: list[str] = field(default_factory=list)
    library_ref: str | None = None
    library_content_hash: str | None = None
    idempotency_key: str | None = None
    retry: RetryPolicy | None = None
    timeout_seconds: float | None = None
    depends_on: Sequence[str] = ()
    #: The earliest time (epoch seconds) the run may start; None or a past time: now.
    not_before: float | None = None
    #: Claim order within a queue: higher first, ties oldest first
    #: (:data:`MIN_PRIORITY` .. :data:`MAX_PRIORITY`).
    priority: int = 0
    #: The named queue it waits in; a worker claims only from the queues it serves.
    queue: str = DEFAULT_QUEUE
    #: What triggered the run, as text pairs (the caller's W3C trace context,
    #: ``traceparent``/``tracestate``, so the run's span continues the caller's trace);
    #: stored in the run's ``trigger_context``. Not part of the idempotency comparison:
    #: a retried request from another trace is the same application.
    trigger_context: Mapping[str, str] | None = None


#: Documented defaults of :class:`SubmitLimits` (docs/queue.md, "Limits"). The walk over
#: ``args`` is iterative, but encoding, decoding and comparing JSON recurse: an unbounded
#: depth reached Python's recursion limit as a bare RecursionError.
MAX_ARGS_DEPTH = 64
#: ``args`` as stored: its JSON text encoded as UTF-8 (1 MiB). The row is read by every
#: claim pass that selects it, and its creation fact carries a second copy.
MAX_ARGS_BYTES = 1024 * 1024
#: Characters of an idempotency key: long enough for a UUID, a hash or a composite key.
MAX_IDEMPOTENCY_KEY_LENGTH = 256
#: Ids in ``depends_on``; each is looked up inside the submit transaction.
MAX_DEPENDS_ON = 1000
#: Tokens in ``required_capabilities``, and characters in one: every claim pass of every
#: worker reads a queued run's list to judge whether it can serve it, so a run no worker
#: serves costs each idle worker its list's size, every poll.
MAX_CAPABILITIES = 64
MAX_CAPABILITY_LENGTH = 200
#: The deepest ``max_args_depth`` a SubmitLimits accepts: deeper JSON can exhaust the
#: interpreter's recursion limit while it is encoded, decoded or compared.
ARGS_DEPTH_CEILING = 256
#: How many offending items one error message lists, and how long a quoted value may get:
#: a message names what is wrong, it does not echo the whole input back.
MESSAGE_ITEMS = 10
MESSAGE_VALUE_CHARS = 80


@dataclass(frozen=True)
class SubmitLimits:
    """Size limits every submission is checked against before any transaction.

    Pass one to ``submit_task``/``submit_many``/``validate`` (``limits=``) to raise or lower
    them; the defaults are the module's ``MAX_*`` constants. Each limit exists because the
    input without it failed badly instead of being refused: a RecursionError, a row too big
    for every read that selects it, a multi-megabyte error message.
    """

    max_args_depth: int = MAX_ARGS_DEPTH
    max_args_bytes: int = MAX_ARGS_BYTES
    max_idempotency_key_length: int = MAX_IDEMPOTENCY_KEY_LENGTH
    max_depends_on: int = MAX_DEPENDS_ON
    max_capabilities: int = MAX_CAPABILITIES

    def __post_init__(self) -> None:
        for name in ("max_args_depth", "max_args_bytes", "max_idempotency_key_length",
                     "max_depends_on", "max_capabilities"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidInput(f"SubmitLimits.{name} must be an int >= 1, not {value!r}")
        if self.max_args_depth > ARGS_DEPTH_CEILING:
            raise InvalidInput(f"SubmitLimits.max_args_depth must be at most "
                               f"{ARGS_DEPTH_CEILING} (deeper JSON can exhaust the "
                               f"interpreter's recursion limit), not {self.max_args_depth}")


DEFAULT_LIMITS = SubmitLimits()


def shown(value: object, limit: int = MESSAGE_VALUE_CHARS) -> str:
    """``repr(value)`` cut to ``limit`` characters, for quoting user input in a message.

    repr escapes control characters and lone surrogates, so the quote is safe to print;
    the cut keeps a 10 MB bad value from becoming a 10 MB message.
    """
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text):,} characters)"


def _path(parts: Sequence[str | int]) -> str:
    """``args['a'][0]``: where in ``args`` a value sits (long paths shortened in the middle)."""
    steps = [f"[{shown(p, 40)}]" for p in parts]
    if len(steps) > 8:
        steps = [*steps[:4], f"[...{len(steps) - 7} more...]", *steps[-3:]]
    return "args" + "".join(steps)


_SURROGATE = re.compile("[\ud800-\udfff]")


def check_text(value: str, field_name: str) -> None:
    """Refuse a string that cannot be stored as UTF-8, naming the field it came in.

    Python turns bytes that are not UTF-8 (from argv, the environment, a file name) into
    lone surrogates (``surrogateescape``); SQLite and the JSON encoder cannot store them
    and failed with a UnicodeEncodeError traceback deep inside a transaction.
    """
    if "\x00" in value:
        # PostgreSQL text cannot hold NUL, so the engine refuses it on both backends;
        # refused here, it is named as the field the caller gave, before any write.
        raise InvalidInput(f"{field_name} contains a NUL character at position "
                           f"{value.index(chr(0))}, which a text column cannot store")
    match = _SURROGATE.search(value)
    if match is None:
        return
    code = ord(match.group())
    if 0xDC80 <= code <= 0xDCFF:
        why = f"byte 0x{code - 0xDC00:02x} at position {match.start()} is not valid UTF-8"
    else:
        why = (f"it holds a lone surrogate U+{code:04X} at position {match.start()}, "
               "which UTF-8 cannot encode")
    raise InvalidInput(f"{field_name} is not valid UTF-8 text: {why}")


_SCALARS = (str, int, float, bool, type(None))


def _where(args: dict[str, Any], node: object) -> tuple[str | int, ...]:
    """The path from ``args`` to the container ``node`` (found by identity).

    Only a refusal needs a path, so the walk in :func:`_check_args` does not build one
    per value (that tripled the cost of validating ordinary args); this second walk runs
    once, on the way to an error, and stops at the depth the first one reached.
    """
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(args, ())]
    while stack:
        value, where = stack.pop()
        if value is node:
            return where
        if isinstance(value, dict):
            stack.extend((v, (*where, k)) for k, v in value.items() if isinstance(v, dict | list))
        elif isinstance(value, list):
            stack.extend((v, (*where, i)) for i, v in enumerate(value)
                         if isinstance(v, dict | list))
    return ()  # pragma: no cover - node always comes from args


def _check_args(args: dict[str, Any], limits: SubmitLimits) -> bool:
    """One iterative walk over ``args``: depth, key types, value types, text encoding;
    whether every value was of JSON's own exact types (no subclass, nothing the walk had
    to look at more closely), which the encoder writes and reads back exactly.

    Iterative, so a 5,000-level input is refused at level ``max_args_depth + 1`` instead
    of overflowing the stack; every refusal names the path of the offending value.
    """
    exact = True
    stack: list[tuple[dict[str, Any] | list[Any], int]] = [(args, 1)]
    while stack:
        node, level = stack.pop()
        if level > limits.max_args_depth:
            raise InvalidInput(
                f"args is nested too deeply: {_path(_where(args, node))} is level {level}, "
                f"the limit is {limits.max_args_depth} (SubmitLimits.max_args_depth)")
        is_dict = isinstance(node, dict)
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, item in items:
            if is_dict:
                if type(key) is not str:
                    if not isinstance(key, str):
                        raise InvalidInput(f"{_path(_where(args, node))} has a key that is "
                                           f"not a string: {shown(key)} ({type(key).__name__})")
                    exact = False
                if not key.isascii() or "\x00" in key:
                    check_text(key, f"a key of {_path(_where(args, node))} ({shown(key)})")
            kind = type(item)
            if kind is str:
                # ASCII is valid UTF-8: only NUL (which PostgreSQL's jsonb refuses as
                # \u0000) needs a look.
                if not item.isascii() or "\x00" in item:
                    check_text(item, _path((*_where(args, node), key)))
            elif kind is dict or kind is list:
                stack.append((item, level + 1))
            elif not (kind is int or kind is bool or item is None
                      or (kind is float and math.isfinite(item))):
                # subclasses and everything JSON cannot hold: the slow, exact checks
                _check_other(args, node, key, item, stack, level)
                exact = False
    return exact


def _check_other(args: dict[str, Any], node: object, key: str | int, item: object,
                 stack: list[tuple[dict[str, Any] | list[Any], int]], level: int) -> None:
    """The value of :func:`_check_args` whose exact type is none of JSON's own."""
    if isinstance(item, dict | list):
        stack.append((item, level + 1))
    elif isinstance(item, str):
        check_text(item, _path((*_where(args, node), key)))
    elif isinstance(item, float) and not math.isfinite(item):
        raise InvalidInput(f"{_path((*_where(args, node), key))} is {item!r}: JSON has no "
                           "such number")
    elif not isinstance(item, _SCALARS):
        raise InvalidInput(f"{_path((*_where(args, node), key))} is a {type(item).__name__}, "
                           "not plain JSON (dict, list, str, finite number, bool or None)")


def _check_command(args: dict[str, Any]) -> None:
    """A command's argv and cwd go to exec as they are: refuse what exec cannot take."""
    argv = args.get("argv")
    if not isinstance(argv, list) or not argv:
        raise InvalidInput('command tasks need args["argv"]: a non-empty list of strings, '
                           f"got {shown(argv)}")
    for i, item in enumerate(argv):
        if not isinstance(item, str):
            raise InvalidInput(f"args['argv'][{i}] must be a string, got "
                               f"{type(item).__name__} {shown(item)}")
        if "\0" in item:
            raise InvalidInput(f"args['argv'][{i}] contains a NUL character, which no "
                               f"program can receive: {shown(item)}")
    if not argv[0]:
        raise InvalidInput("args['argv'][0] (the program) must not be empty")
    if "cwd" in args:
        cwd = args["cwd"]
        if not isinstance(cwd, str) or not cwd:
            raise InvalidInput("args['cwd'] (the working directory) must be a non-empty "
                               f"string, got {type(cwd).__name__} {shown(cwd)}")
        if "\0" in cwd:
            raise InvalidInput(f"args['cwd'] contains a NUL character: {shown(cwd)}")


def _kinds_message() -> str:
    aliases = ", ".join(f"{a} -> {c}" for a, c in ACTION_ALIASES.items())
    return f"expected one of {', '.join(ACTION_KINDS)} (aliases: {aliases})"


def validate(app: TaskApplication, *, limits: SubmitLimits = DEFAULT_LIMITS,
             vocabulary: Vocabulary | None = None) -> TaskApplication:
    """Check every field and return the normalized application; raise InvalidInput (a
    ValueError) naming the field.

    Runs before any transaction, so a rejected application writes nothing. The checks
    that bound size (``limits``) run before the work they bound: depth before encoding,
    the id count before any lookup.
    """
    return validate_encoded(app, limits=limits, vocabulary=vocabulary)[0]


@dataclass(frozen=True)
class Vocabulary:
    """The action kinds and execution targets a submission may name.

    The ADR-0071 queue's closed lists are the default; an app adds its tasks' names
    (each a kind its workers run in-process) and may replace the targets.
    """

    task_kinds: frozenset[str] = frozenset()
    targets: frozenset[str] = EXECUTION_TARGETS

    def kinds_message(self) -> str:
        tasks = sorted(self.task_kinds)
        shown_tasks = ", ".join(tasks[:MESSAGE_ITEMS]) + (", ..." if len(tasks) > MESSAGE_ITEMS
                                                          else "")
        return _kinds_message() + (f"; or a task: {shown_tasks}" if tasks else
                                   "; or the name of a task an app declares")


#: The ADR-0071 queue's vocabulary: its kinds and targets, no tasks.
RECORD_VOCABULARY = Vocabulary()


def validate_encoded(app: TaskApplication, *, limits: SubmitLimits = DEFAULT_LIMITS,
                     vocabulary: Vocabulary | None = None) -> tuple[TaskApplication, str]:
    """:func:`validate`, and the application's ``args`` as JSON text: what its row stores
    and its :func:`digest` hashes, which the checks encode anyway (a submit then encodes
    its args once, not three times)."""
    if not isinstance(app, TaskApplication):
        raise TypeError(f"expected a TaskApplication, got {type(app).__name__}")
    if not isinstance(limits, SubmitLimits):
        raise TypeError(f"limits must be a SubmitLimits, got {type(limits).__name__}")
    key = app.idempotency_key
    if key is not None:
        if not isinstance(key, str) or not key:
            raise InvalidInput("idempotency_key must be a non-empty string or None; "
                               f"got {shown(key)} (an empty key would dedupe nothing)")
        if len(key) > limits.max_idempotency_key_length:
            raise InvalidInput(f"idempotency_key is {len(key):,} characters long; the limit "
                               f"is {limits.max_idempotency_key_length:,} "
                               "(SubmitLimits.max_idempotency_key_length)")
        check_text(key, "idempotency_key")
    words = RECORD_VOCABULARY if vocabulary is None else vocabulary
    kind = app.action_kind
    if not isinstance(kind, str):
        raise InvalidInput(f"action_kind must be a string; {words.kinds_message()}")
    kind = ACTION_ALIASES.get(kind, kind)
    if kind not in ACTION_KINDS and kind not in words.task_kinds:
        raise InvalidInput(f"unknown action_kind {shown(app.action_kind)}; "
                           f"{words.kinds_message()}")
    if not isinstance(app.execution_target, str) \
            or app.execution_target not in words.targets:
        raise InvalidInput(f"unknown execution_target {shown(app.execution_target)}; expected "
                           f"one of {', '.join(sorted(words.targets))}")
    if not isinstance(app.args, dict):
        raise InvalidInput(f"args must be a dict, got {type(app.args).__name__}")
    exact = _check_args(app.args, limits)
    try:
        encoded = dumps(app.args)
    except (TypeError, ValueError, msgspec.EncodeError) as exc:
        raise InvalidInput(f"args must be JSON-serializable: {exc}") from None
    # Characters first: a str of n characters is at most 4n bytes of UTF-8.
    if len(encoded) * 4 > limits.max_args_bytes:
        size = len(encoded.encode())
        if size > limits.max_args_bytes:
            raise InvalidInput(f"args is {size:,} bytes as JSON; the limit is "
                               f"{limits.max_args_bytes:,} (SubmitLimits.max_args_bytes)")
    # The encoder is lenient (sets and tuples become lists, bytes become base64): accept
    # only args that read back exactly as given. The walk above names most such values;
    # this catches whatever it does not know (JSON's own exact types read back as they
    # are: for them, the usual args, there is nothing to catch).
    if not exact and loads(encoded) != app.args:
        raise InvalidInput("args must be plain JSON (str keys; dict, list, str, finite "
                           "number, bool, None): these would not be stored exactly as given")
    if kind == "command":
        _check_command(app.args)
    caps = app.required_capabilities
    if not isinstance(caps, list):
        raise InvalidInput(f"required_capabilities must be a list, got {type(caps).__name__}")
    if len(caps) > limits.max_capabilities:
        raise InvalidInput(f"required_capabilities holds {len(caps):,} tokens; the limit is "
                           f"{limits.max_capabilities:,} (SubmitLimits.max_capabilities)")
    for i, token in enumerate(caps):
        if not isinstance(token, str) or not token:
            raise InvalidInput(f"required_capabilities[{i}] must be a non-empty string, "
                               f"got {shown(token)}")
        if len(token) > MAX_CAPABILITY_LENGTH:
            raise InvalidInput(f"required_capabilities[{i}] is {len(token):,} characters; "
                               f"the limit is {MAX_CAPABILITY_LENGTH}")
        check_text(token, f"required_capabilities[{i}]")
    for name in ("library_ref", "library_content_hash"):
        value = getattr(app, name)
        if value is not None:
            if not isinstance(value, str):
                raise InvalidInput(f"{name} must be a string or None, "
                                   f"got {type(value).__name__}")
            check_text(value, name)
    if app.retry is not None and not isinstance(app.retry, RetryPolicy):
        raise InvalidInput(f"retry must be a RetryPolicy or None, "
                           f"got {type(app.retry).__name__}")
    t = app.timeout_seconds
    if t is not None and (isinstance(t, bool) or not isinstance(t, int | float)
                          or not math.isfinite(t) or t <= 0):
        raise InvalidInput(f"timeout_seconds must be a positive number or None, "
                           f"got {shown(t)}")
    if t is not None:
        check_span(t, "timeout_seconds", positive=True)
    deps = app.depends_on
    # A tuple or list first: the Sequence check is an ABC's, a few times slower.
    if type(deps) not in (tuple, list) and (isinstance(deps, str)
                                            or not isinstance(deps, Sequence)):
        raise InvalidInput("depends_on must be a list of run ids")
    if len(deps) > limits.max_depends_on:
        raise InvalidInput(f"depends_on lists {len(deps):,} run ids; the limit is "
                           f"{limits.max_depends_on:,} (SubmitLimits.max_depends_on)")
    for i, dep in enumerate(deps):
        if not isinstance(dep, str) or not dep:
            raise InvalidInput(f"depends_on[{i}] must be a non-empty run id string, "
                               f"got {shown(dep)}")
        check_text(dep, f"depends_on[{i}]")
    nb = app.not_before
    if nb is not None:
        if isinstance(nb, bool) or not isinstance(nb, int | float) or not math.isfinite(nb):
            raise InvalidInput(f"not_before must be epoch seconds (a finite number) or None, "
                               f"got {shown(nb)}")
        check_instant(nb, "not_before")
        if deps:
            # A dependent starts when its dependencies succeed; a start time on top of
            # that would need a second wait after the release. Refused, not ignored.
            raise InvalidInput("not_before and depends_on cannot be combined: a run with "
                               "dependencies starts when they succeed")
    check_priority(app.priority)
    check_queue(app.queue)
    _check_trigger_context(app.trigger_context)
    changes: dict[str, Any] = {}
    if kind != app.action_kind:
        changes["action_kind"] = kind
    if not isinstance(deps, tuple):
        changes["depends_on"] = tuple(deps)
    return (replace(app, **changes) if changes else app), encoded


#: A trigger context's bounds: a trace context is two short headers.
MAX_TRIGGER_ITEMS = 16
MAX_TRIGGER_TEXT = 1024


def _check_trigger_context(context: object) -> None:
    if context is None:
        return
    if not isinstance(context, Mapping):
        raise InvalidInput(f"trigger_context must be a mapping of text to text, got "
                           f"{type(context).__name__}")
    if len(context) > MAX_TRIGGER_ITEMS:
        raise InvalidInput(f"trigger_context has {len(context)} items; the limit is "
                           f"{MAX_TRIGGER_ITEMS}")
    for key, value in context.items():
        if not isinstance(key, str) or not isinstance(value, str) \
                or len(key) > MAX_TRIGGER_TEXT or len(value) > MAX_TRIGGER_TEXT:
            raise InvalidInput(f"trigger_context[{shown(key)}] must be text to text, each "
                               f"at most {MAX_TRIGGER_TEXT} characters")
        check_text(key, "trigger_context key")
        check_text(value, f"trigger_context[{shown(key)}]")


def digest(app: TaskApplication, args_json: str | None = None) -> str:
    """A fingerprint of everything but the idempotency key, to tell a retry from a clash.

    ``args_json``: the args as :func:`~ledgerq.codec.dumps` encodes them (from
    :func:`validate_encoded`), spliced in as they are: the same bytes, not encoded again.
    """
    args: Any = app.args if args_json is None else msgspec.Raw(args_json.encode())
    body = {
        "action_kind": app.action_kind, "args": args,
        "execution_target": app.execution_target,
        "required_capabilities": app.required_capabilities,
        "library_ref": app.library_ref, "library_content_hash": app.library_content_hash,
        "retry": app.retry.to_dict() if app.retry else None,
        "timeout_seconds": app.timeout_seconds, "depends_on": list(app.depends_on),
    }
    # Each absent at its default: existing runs' digests still match.
    if app.not_before is not None:
        body["not_before"] = app.not_before
    if app.priority != 0:
        body["priority"] = app.priority
    if app.queue != DEFAULT_QUEUE:
        body["queue"] = app.queue
    return hashlib.sha256(dumpb(body)).hexdigest()
