"""Submission, cancellation and scheduled fires: how rows enter and leave the queue."""

from __future__ import annotations

import functools
import socket
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ledgerq.codec import dumps
from ledgerq.durations import check_instant
from ledgerq.errors import IdempotencyConflict, InvalidInput, NotFound
from ledgerq.lifecycle.creation import create_entities, create_entity
from ledgerq.lifecycle.ids import new_id
from ledgerq.lifecycle.models import MAX_SUMMARY_LENGTH, Actor, StateReason
from ledgerq.lifecycle.registry import EntityPolicy
from ledgerq.queue import moves
from ledgerq.queue.capabilities import host_scoped_concurrency_key
from ledgerq.queue.dependencies import resolve_dependents
from ledgerq.queue.moves import DEFAULT_QUEUE, PRIORITY_COLUMN, QUEUE_COLUMN
from ledgerq.queue.runs import perform, run_policy
from ledgerq.queue.submission import joined, task_kinds
from ledgerq.queue.submission.application import (
    ACTION_ALIASES,
    ACTION_KINDS,
    DEFAULT_LIMITS,
    MESSAGE_ITEMS,
    RECORD_VOCABULARY,
    SubmitLimits,
    TaskApplication,
    Vocabulary,
    check_text,
    digest,
    shown,
    validate_encoded,
)
from ledgerq.queue.worker import wakeup

if TYPE_CHECKING:
    from ledgerq.lifecycle.store import Database
    from ledgerq.lifecycle.transactions import Pending, Transaction
    from ledgerq.queue.submission.store import SubmissionTx

SUBMITTER = Actor(type="system", id="ledgerq.submit")
#: How run ids are made (a module attribute so a test can make them deterministic).
new_run_id = new_id


#: A submit_many of more rows than this is a bulk write (~0.1 ms a row): on SQLite it runs
#: in the connection's thread, so it does not hold the event loop for long.
BULK_ROWS = 100


def _insert(tx: SubmissionTx, policy: EntityPolicy, app: TaskApplication, now: float,
            host: str, actor: Actor, args_json: str | None = None) -> str:
    fingerprint = digest(app, args_json)
    if app.idempotency_key is not None:
        # Concurrent submits of one key (other connections, other hosts) wait here for
        # each other, so the second sees the first's row instead of colliding with it.
        tx.lock_key(f"idempotency:{app.idempotency_key}")
        existing = tx.find_run_by_idempotency_key(policy, app.idempotency_key)
        if existing is not None:
            if existing["application_digest"] != fingerprint:
                raise IdempotencyConflict(
                    f"idempotency_key {app.idempotency_key!r} was already used by run "
                    f"{existing['id']} with a different application"
                )
            return str(existing["id"])
    deps = list(dict.fromkeys(app.depends_on)) if app.depends_on else []
    if deps:
        found = tx.read_statuses(policy, deps)
        unknown = [d for d in deps if d not in found]
        if unknown:
            raise InvalidInput(_unknown_deps_message(unknown))
    created = moves.SUBMITTED_WAITING if deps else _start(app, now, policy)
    run_id = create_entity(tx, policy,
                           run_row(app, now, host, created.target, deps, fingerprint,
                                   policy=policy, args_json=args_json),
                           reason=_reasons[created], actor=actor, now=now)
    if deps:
        resolve_dependents(tx, policy, [run_id], waiting=True, now=now)
    return run_id


def _start(app: TaskApplication, now: float, policy: EntityPolicy) -> moves.Move:
    """Where a run without dependencies starts: delayed while its start time is ahead."""
    if app.not_before is None or app.not_before <= now:
        return moves.SUBMITTED
    if not moves.SUBMITTED_DELAYED.offered_by(policy):
        raise InvalidInput("not_before is in the future, but the loaded specs declare no "
                           f"{moves.SUBMITTED_DELAYED.target!r} state to wait in")
    return moves.SUBMITTED_DELAYED


def _unknown_deps_message(unknown: list[str]) -> str:
    """Name the first few unknown ids and count the rest: 100,000 unknown ids once made
    an 888,924-character message."""
    listed = ", ".join(shown(d) if len(d) > 40 or not d.isprintable() else d
                       for d in unknown[:MESSAGE_ITEMS])
    more = f" and {len(unknown) - MESSAGE_ITEMS:,} more" if len(unknown) > MESSAGE_ITEMS else ""
    return f"depends_on names {len(unknown):,} unknown run id(s): {listed}{more}"


def placement(app: TaskApplication, policy: EntityPolicy) -> dict[str, Any]:
    """The row's ``priority`` and ``queue``: where and in what order workers claim it.

    Specs that predate them (a custom spec directory) still take applications that
    leave both at their defaults; asking for more than such specs can store is refused.
    """
    out: dict[str, Any] = {}
    for column, value, default in ((PRIORITY_COLUMN, app.priority, 0),
                                   (QUEUE_COLUMN, app.queue, DEFAULT_QUEUE)):
        if column in policy.columns:
            out[column] = value
        elif value != default:
            raise InvalidInput(f"{column} is {shown(value)}, but the loaded specs declare no "
                               f"{column!r} column on {policy.table} to keep it in")
    return out


def run_row(app: TaskApplication, now: float, host: str, status: str, deps: list[str],
            fingerprint: str, *, policy: EntityPolicy, args_json: str | None = None
            ) -> dict[str, Any]:
    """The ``schedule_runs`` row for a validated application (a full string UUID as its id);
    ``args_json``, the args as JSON text if the caller has them (:func:`validate_encoded`).

    The id is a version 7 UUID (time-ordered): consecutive submissions land on the
    same pages of every index keyed by run id, so a commit writes a few tail pages
    instead of one random page per index, and a claim pass's rows sit together.
    """
    caps = app.required_capabilities  # most runs ask for none: nothing to encode or scope
    row = {
        "id": new_run_id(),
        "schedule_id": None, "invocation_id": None,
        "trigger_context": dumps(dict(app.trigger_context)) if app.trigger_context else "{}",
        "action_kind": app.action_kind,
        "action_args": dumps(app.args) if args_json is None else args_json,
        "status": status, "chain_depth": 0,
        "fired_at": now, "created_at": now, "queued_at": now,
        "concurrency_key": host_scoped_concurrency_key(host, caps) if caps else None,
        "required_capabilities": dumps(caps) if caps else "[]",
        "execution_target": app.execution_target,
        "library_ref": app.library_ref, "library_content_hash": app.library_content_hash,
        "idempotency_key": app.idempotency_key, "application_digest": fingerprint,
        "retry_policy": dumps(app.retry.to_dict()) if app.retry else None,
        "timeout_seconds": app.timeout_seconds,
        "depends_on": dumps(deps) if deps else None,
    }
    # Only a delayed run keeps its start time: any other starts now.
    if status == moves.SUBMITTED_DELAYED.target:
        row["not_before"] = app.not_before
    row.update(placement(app, policy))
    return row


#: The creation facts' reasons, built (and validated) once.
_reasons = {m: StateReason(code=m.code) for m in (moves.SUBMITTED, moves.SUBMITTED_WAITING,
                                                  moves.SUBMITTED_DELAYED)}


def insert_all(tx: SubmissionTx, policy: EntityPolicy, apps: list[TaskApplication],
               now: float, host: str, actor: Actor,
               args_json: Sequence[str | None] | None = None) -> list[str]:
    """Insert ``apps`` in order (in-transaction); ids in the same order. ``args_json``:
    each application's args as JSON text, where the caller has them.

    An application with an idempotency key or dependencies reads the table first, so it
    goes alone through :func:`_insert`; runs of the others (nothing to look up) go through
    :func:`create_entities`: the same rows and creation facts, with fewer statements.
    """
    ids: list[str] = []
    plain: list[tuple[TaskApplication, str | None]] = []

    def flush() -> None:
        if len(plain) == 1:
            ids.append(_insert(tx, policy, plain[0][0], now, host, actor, plain[0][1]))
        elif plain:
            ids.extend(create_entities(
                tx, policy, [run_row(a, now, host, moves.SUBMITTED.target, [], digest(a, j),
                                     policy=policy, args_json=j) for a, j in plain],
                reason=_reasons[moves.SUBMITTED], actor=actor, now=now))
        plain.clear()

    texts = [None] * len(apps) if args_json is None else args_json
    for app, text in zip(apps, texts, strict=True):
        if app.idempotency_key is None and not app.depends_on and \
                _start(app, now, policy) is moves.SUBMITTED:
            plain.append((app, text))
        else:
            flush()
            ids.append(_insert(tx, policy, app, now, host, actor, text))
    flush()
    return ids


async def submit_task(db: Database[SubmissionTx], app: TaskApplication, *, now: float | None = None,
                      host: str | None = None, actor: Actor = SUBMITTER,
                      limits: SubmitLimits | None = None,
                      vocabulary: Vocabulary | None = None) -> str:
    """Validate, then insert one queued row and its creation fact; returns the run id.

    A repeated non-empty idempotency key with an equal application returns the first
    run's id and writes nothing; with a different application it raises ValueError.
    ``limits`` replaces the default size limits (see :class:`SubmitLimits`);
    ``vocabulary`` the kinds and targets it may name (default: the ADR-0071 queue's).
    """
    return (await submit_many(db, [app], now=now, host=host, actor=actor, limits=limits,
                              vocabulary=vocabulary))[0]


async def submit_many(db: Database[SubmissionTx], apps: Sequence[TaskApplication], *,
                      now: float | None = None,
                      host: str | None = None, actor: Actor = SUBMITTER,
                      limits: SubmitLimits | None = None,
                      vocabulary: Vocabulary | None = None) -> list[str]:
    """Submit a batch in one transaction: all rows are written, or (on any error) none.

    Every application is validated (against ``limits``, default :data:`DEFAULT_LIMITS`)
    before the transaction starts; a refusal raises InvalidInput, a ValueError, whose
    message starts with the application's index when the batch holds more than one.
    """
    checked = DEFAULT_LIMITS if limits is None else limits
    if _unknown_kinds(apps, vocabulary):  # (most submits name a kind already known)
        vocabulary = await _with_recorded_kinds(db, apps, vocabulary)
    normalized: list[TaskApplication] = []
    texts: list[str | None] = []
    for i, a in enumerate(apps):
        try:
            valid, text = validate_encoded(a, limits=checked, vocabulary=vocabulary)
        except InvalidInput as exc:
            if len(apps) == 1:
                raise
            raise InvalidInput(f"apps[{i}]: {exc}") from exc
        normalized.append(valid)
        texts.append(text)
    policy = run_policy(db)
    ts = time.time() if now is None else check_instant(now, "now")
    # The host scopes serialization tokens' concurrency keys (run_row): a batch that asks
    # for no capability at all needs no system call to name it.
    needs_host = not host and any(a.required_capabilities for a in normalized)
    hostname = socket.gethostname() if needs_host else host or ""

    plain = all(_joinable(a) for a in normalized)
    if len(normalized) == 1 and now is None and plain and joined.others_ready():
        # Other callers are ready in this turn: the submits made in it share one unit.
        ids = [await joined.write_joined(
            db, (actor, hostname), (normalized[0], texts[0]),
            functools.partial(_insert_joined, policy=policy, host=hostname, actor=actor))]
    else:
        def unit(tx: SubmissionTx) -> list[str]:
            return insert_all(tx, policy, normalized, ts, hostname, actor, texts)

        # A plain submit takes no lock and reads nothing: its unit is one statement.
        ids = await db.write(unit, bulk=len(normalized) > BULK_ROWS,
                             alone=plain and len(normalized) == 1)
    wakeup.notify(db.path)
    return ids


def _unknown_kinds(apps: Sequence[TaskApplication], vocabulary: Vocabulary | None
                   ) -> set[str]:
    """The kinds the applications name that neither the ADR-0071 queue's list nor
    ``vocabulary`` holds (a recorded task's, or a mistake)."""
    tasks = () if vocabulary is None else vocabulary.task_kinds
    return {k for a in apps if type(k := a.action_kind) is str and k not in ACTION_KINDS
            and k not in ACTION_ALIASES and k not in tasks}


async def _with_recorded_kinds(db: Database[SubmissionTx], apps: Sequence[TaskApplication],
                               vocabulary: Vocabulary | None) -> Vocabulary | None:
    """``vocabulary`` plus the recorded task kinds the applications name, each
    application's args checked against its kind's recorded parameters (InvalidInput
    naming the argument). Kinds the vocabulary knows cost no read."""
    words = RECORD_VOCABULARY if vocabulary is None else vocabulary
    unknown = _unknown_kinds(apps, vocabulary)
    if not unknown:
        return vocabulary
    kinds = await task_kinds.recorded(db, sorted(unknown))
    if not kinds:
        return vocabulary
    for i, a in enumerate(apps):
        kind = kinds.get(a.action_kind)
        if kind is not None and isinstance(a.args, dict):
            try:
                kind.check(a.args)
            except InvalidInput as exc:
                if len(apps) == 1:
                    raise
                raise InvalidInput(f"apps[{i}]: {exc}") from exc
    return replace(words, task_kinds=words.task_kinds | frozenset(kinds))


async def submit_in(tx: Transaction, app: TaskApplication, *, host: str | None = None,
                    actor: Actor = SUBMITTER, limits: SubmitLimits | None = None,
                    vocabulary: Vocabulary | None = None) -> Pending[str]:
    """:func:`submit_task` as one of a transaction's writes (``db.transaction()``): the
    application is checked now (a refusal raises here and queues nothing); the row and
    its creation fact are written when the transaction commits, with its other writes.
    The run id is the returned value's, once committed."""
    db: Database[SubmissionTx] = tx.db
    words = await _with_recorded_kinds(db, [app], vocabulary)
    valid, text = validate_encoded(app, limits=DEFAULT_LIMITS if limits is None else limits,
                                   vocabulary=words)
    policy = run_policy(db)
    hostname = socket.gethostname() if not host and valid.required_capabilities \
        else host or ""
    pending = tx.add(lambda t: insert_all(t, policy, [valid], time.time(), hostname, actor,
                                          [text])[0], what="the run's id")
    tx.after_commit(lambda: wakeup.notify(db.path))
    return pending


def _joinable(app: TaskApplication) -> bool:
    """Whether a submit may share its unit with others (:mod:`ledgerq.queue.submission.joined`): not
    one that takes a lock (its idempotency key's, on PostgreSQL) or reads other runs (its
    dependencies). A joint then holds no lock that a concurrent one, in this process or
    another, could wait for while holding one it waits for."""
    return app.idempotency_key is None and not app.depends_on


def _insert_joined(tx: SubmissionTx, items: Sequence[tuple[TaskApplication, str]], now: float, *,
                   policy: EntityPolicy, host: str, actor: Actor) -> list[str]:
    """:func:`insert_all` of submits joined in one turn (see
    :mod:`ledgerq.queue.submission.joined`)."""
    return insert_all(tx, policy, [app for app, _ in items], now, host, actor,
                      [text for _, text in items])


async def cancel_task(db: Database[SubmissionTx], run_id: str, *, actor: Actor, summary: str = "",
                      now: float | None = None) -> bool:
    """Cancel a run that has not ended; False when it already has (a conflict, not an error).

    A running run is cancelled too: its worker notices at its next lease check, stops
    the child, and its own terminal write then conflicts harmlessly.
    """
    policy = run_policy(db)
    ts = time.time() if now is None else check_instant(now, "now")
    if len(summary) > MAX_SUMMARY_LENGTH:
        # Facts are kept forever and shown by every reader: bounded where they come in.
        raise InvalidInput(f"summary is {len(summary):,} characters; the limit is "
                           f"{MAX_SUMMARY_LENGTH:,}")
    check_text(summary, "summary")

    def unit(tx: SubmissionTx) -> tuple[bool, list[str]]:
        # Read as a move reads (under the row's lock where writers run at once), so a
        # claim committing meanwhile is seen, and a running run is cancelled as such.
        found = tx.read_for_move(policy, run_id, ())
        if found is None:
            raise NotFound(f"run {run_id!r} not found")
        status = found[0]
        if not policy.allows(status, moves.CANCELLED.target):
            return False, []
        res = perform(tx, policy, run_id, moves.CANCELLED, from_state=status, actor=actor,
                      summary=summary or f"cancelled by {actor.type} {actor.id}",
                      patch={"ended_at": ts}, now=ts)
        if not res.applied:
            return False, []
        tx.notify_claimable()
        return True, resolve_dependents(tx, policy, [run_id], now=ts).left

    def settle(tx: SubmissionTx, waiting: list[str]) -> list[str]:
        return resolve_dependents(tx, policy, waiting, waiting=True, now=ts).left

    applied, left = await db.write(unit)
    # A cascade larger than one chunk goes on in transactions of its own, other writers
    # in between; each dependent still moves with its own fact.
    while left:
        left = await db.write(functools.partial(settle, waiting=left))
    return applied


def _external_fires(policy: EntityPolicy) -> dict[str, str]:
    """state -> reason code of each external fire the specs offer: an initial state with
    its declared code (:data:`moves.EXTERNAL_FIRES`)."""
    return {m.target: m.code for m in moves.EXTERNAL_FIRES
            if m.target in policy.initial and m.code in policy.reason_codes}


async def record_scheduled_fire(db: Database[SubmissionTx], *, schedule_id: str, action_kind: str,
                                args: dict[str, Any], status: str = "running",
                                now: float | None = None, schedule_name: str | None = None,
                                actor: Actor | None = None) -> str:
    """Record an external scheduler's fire through the guarded API: a row with
    schedule_id set and no slot.

    Such rows enter ``running`` (or ``skipped``/``failed``) directly and are never
    claimed by queue workers (the ADR-0071 queue's rule, kept for rows that carry no slot); the
    scheduler ends them with :func:`transition`. ledgerq's own schedules
    (:func:`~ledgerq.queue.add_schedule`) fire queued runs that workers do claim.
    """
    policy = run_policy(db)
    fires = _external_fires(policy)
    if status not in fires:
        raise ValueError(f"a scheduled fire starts in one of {', '.join(sorted(fires))}, "
                         f"not {status!r}")
    code = fires[status]
    if not isinstance(args, dict):
        raise ValueError(f"args must be a dict, got {type(args).__name__}")
    ts = time.time() if now is None else now
    who = actor or Actor(type="scheduler", id=schedule_id)

    def unit(tx: SubmissionTx) -> str:
        tx.ensure_schedule(schedule_id, schedule_name, ts)
        return create_entity(tx, policy, {
            "schedule_id": schedule_id, "trigger_context": "{}", "action_kind": action_kind,
            "action_args": dumps(args), "status": status, "chain_depth": 0,
            "fired_at": ts, "created_at": ts,
            "ended_at": ts if status in policy.terminal else None,
        }, reason=StateReason(code=code), actor=who, now=ts)

    return await db.write(unit)
