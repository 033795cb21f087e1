"""How a run's end is written: one guarded move off ``running``, on the lease it ran under.

A write that finds the lease gone writes nothing (whoever took the row owns it now);
the run then counts as ``cancelled`` or ``lost`` in the worker's outcomes.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from ledgerq.codec import loads
from ledgerq.errors import DatabaseUnavailable
from ledgerq.lifecycle.moves import MoveTerms, apply_moves
from ledgerq.lifecycle.registry import EntityPolicy
from ledgerq.queue import moves
from ledgerq.queue.maintenance.promotion import settle_dependents
from ledgerq.queue.maintenance.stuck import is_database_failure
from ledgerq.queue.moves import ERROR_COLUMN, RESULT_COLUMN, Move, lease_columns
from ledgerq.queue.runs import no_lease, run_policy, terms, worker_actor
from ledgerq.queue.submission.application import RetryPolicy
from ledgerq.queue.worker import durations, wakeup
from ledgerq.queue.worker.starvation import GIVE_BACKS

if TYPE_CHECKING:
    from ledgerq.lifecycle.store import Database
    from ledgerq.queue.worker.config import RunContext
    from ledgerq.queue.worker.store import WorkerTx

log = logging.getLogger("ledgerq.worker")

T = TypeVar("T")

#: Longest error_detail kept on a row.
DETAIL_LIMIT = 4096


#: No output recorded (a run that launched nothing, or never ran).
NO_OUTPUT: Mapping[str, str | None] = MappingProxyType({})


class Outcome(NamedTuple):
    """How a run ended, as its write records it: one of the queue's moves off ``running``.

    Its target need not be terminal: a run given back on shutdown goes to ``queued``. A
    plain tuple: every run makes one, and a frozen dataclass costs four times as much.
    """

    move: Move
    exit_code: int | None = None
    detail: str | None = None
    #: The task itself failed (it exited non-zero or raised), so its retry policy may
    #: send it to ``retry_wait`` instead; a refusal before it ran is never retried.
    retryable: bool = False
    #: The fact's summary; None: the detail.
    summary: str | None = None
    #: The output tails to record (``stdout_tail``/``stderr_tail``), written with the
    #: fact that ends the run or sends it to retry_wait; empty when nothing ran.
    output: Mapping[str, str | None] = NO_OUTPUT
    #: A Python task's return value as JSON (the ``result`` column); None: none.
    result: Any = None
    #: A Python task's exception (the ``error`` column): type, message, traceback.
    error: dict[str, Any] | None = None
    #: Seconds until the retry the task asked for; None: its policy's backoff.
    retry_delay: float | None = None
    #: The worker, not the task, ran out of a resource: the run is given back (see
    #: :mod:`ledgerq.queue.worker.starvation`).
    starved: bool = False

    @property
    def to_state(self) -> str:
        return self.move.target


def lost_outcome(row: dict[str, Any] | None, lease: dict[str, Any]) -> str:
    """What a run whose lease went away counts as in a worker's outcomes.

    A cancel of the run under our lease (a cancel keeps the lease columns, so the token
    tells) ends it where it stands: that is its real outcome. Anything else (reaped,
    reclaimed, deleted; or cancelled under a later lease) is ``lost``: whatever the row
    says now was not done to this run.
    """
    cancelled = moves.CANCELLED.target
    if row is not None and row["status"] == cancelled \
            and row["lease_token"] == lease["lease_token"]:
        return cancelled
    return "lost"


def output_patch(policy: EntityPolicy, outcome: Outcome) -> dict[str, Any]:
    """The output columns of ``outcome`` the loaded specs let a move patch (its output
    tails, a task's result or error): specs of a release before those columns (a rolling
    upgrade) record none. A column with nothing to say is left out, so a command's fact
    carries no empty result."""
    patch: dict[str, Any] = {c: v for c, v in outcome.output.items()
                             if c in policy.patch_columns}
    if outcome.result is not None and RESULT_COLUMN in policy.patch_columns:
        patch[RESULT_COLUMN] = outcome.result
    if outcome.error is not None and ERROR_COLUMN in policy.patch_columns:
        patch[ERROR_COLUMN] = outcome.error
    return patch


def finish_all(tx: WorkerTx, policy: EntityPolicy, writes: Sequence[MoveTerms], now: float, *,
               alone: bool = False) -> list[bool | Exception]:
    """The outcome ``writes`` in order (their swaps sent together where the dialect can:
    :func:`~ledgerq.lifecycle.moves.apply_moves`), then the dependents of the runs they
    ended, settled together (one lookup, however many ended); whether each applied.
    ``alone``: each in its own savepoint, and what one raised is its result (its writes
    rolled back)."""
    done: list[bool | Exception] = [
        _alone(tx, functools.partial(_one, policy=policy, write=w)) for w in writes
    ] if alone else [m.applied for m in apply_moves(tx, policy, writes)]
    ended = [w.entity_id for w, applied in zip(writes, done, strict=True)
             if applied is True and w.to_state in policy.terminal]
    if ended:
        settle_dependents(tx, policy, ended, now)
    return done


def _one(tx: WorkerTx, *, policy: EntityPolicy, write: MoveTerms) -> bool:
    """One outcome's write on its own (in its savepoint: see :func:`finish_all`)."""
    (moved,) = apply_moves(tx, policy, [write])
    return moved.applied


class Ended(NamedTuple):
    """A claimed run whose outcome is known without waiting: its executor finished in its
    first step, or the run was refused before it ran. Its write can go with others'."""

    run: dict[str, Any]
    #: The lease the claim gave this worker, as the write's guard.
    lease: dict[str, Any]
    outcome: Outcome


async def record_outcome(db: Database[WorkerTx], policy: EntityPolicy, run: dict[str, Any],
                         lease: dict[str, Any], ctx: RunContext, outcome: Outcome) -> str:
    """Write ``outcome`` guarded on ``lease``; returns the state written, or how the run
    counts when the lease was gone (see :func:`lost_outcome`)."""
    (got,) = await record_outcomes(db, policy, [Ended(run, lease, outcome)], ctx)
    if isinstance(got, Exception):
        raise got
    return got


async def record_outcomes(db: Database[WorkerTx], policy: EntityPolicy, ended: Sequence[Ended],
                          ctx: RunContext) -> list[str | Exception]:
    """Write each run's outcome guarded on its lease, all in one transaction; per run, the
    state written, how it counts when its lease was gone (see :func:`lost_outcome`), or
    the exception its write raised.

    Each write is still its own guarded move with its own fact: one that raises is
    rolled back alone and the others commit. A failure of the database itself (after
    :func:`_write_outcome`'s retries) fails them all: it raises here.
    """
    if ctx.keeper is not None:  # a renewal in flight would move the lease from under us
        await ctx.keeper.release(end.run["id"] for end in ended)
    planned: list[MoveTerms | Exception] = []
    for end in ended:
        try:
            planned.append(_planned(policy, end, ctx))
        except Exception as exc:  # a hand-edited row: this run's failure alone
            planned.append(exc)
    writes = [p for p in planned if not isinstance(p, Exception)]
    written = iter(await _write_outcomes(db, policy, writes, ctx.clock()) if writes else [])
    if writes:
        wakeup.notify(db.path, wakeup.ENDED)
    out: list[str | Exception] = []
    _report_ends(ended, planned, ctx)
    for end, plan in zip(ended, planned, strict=True):
        if isinstance(plan, Exception):
            out.append(plan)
            continue
        applied = next(written)
        if isinstance(applied, Exception):
            out.append(applied)
        elif applied:
            out.append(plan.to_state)
        else:
            out.append(await _conflicted(db, end.run, end.lease, plan.to_state))
    return await _fail_unwritten(db, policy, ended, out, ctx)


async def _fail_unwritten(db: Database[WorkerTx], policy: EntityPolicy, ended: Sequence[Ended],
                          out: list[str | Exception], ctx: RunContext
                          ) -> list[str | Exception]:
    """Runs whose outcome could not be planned or written (a result the log refuses, a
    value no policy can use): each ends ``failed`` once, saying why, on the same lease.

    Left as they were, they would stay running until their leases expired, and the
    reaper would run them again: the worker's own failure is no reason to execute a task
    twice. What cannot even be failed (a trigger refusing every write of the row) stays
    the exception it was.
    """
    broken = [i for i, got in enumerate(out) if isinstance(got, Exception)]
    if not broken:
        return out
    now = ctx.clock()
    writes = [_failed_plainly(policy, ended[i], out[i], ctx, now)  # type: ignore[arg-type]
              for i in broken]
    done = await _write_outcomes(db, policy, writes, now)
    for i, write, applied in zip(broken, writes, done, strict=True):
        run_id = ended[i].run["id"]
        if isinstance(applied, Exception):
            continue
        if applied:
            log.error("run %s: %s", run_id, write.reason.summary)
            out[i] = write.to_state
        else:
            out[i] = await _conflicted(db, ended[i].run, ended[i].lease, write.to_state)
    return out


def _failed_plainly(policy: EntityPolicy, end: Ended, exc: Exception, ctx: RunContext,
                    now: float) -> MoveTerms:
    """``end``'s run failed with the reason its outcome could not be recorded: only the
    columns every failure writes, none of the executor's values (one of them may be what
    the log refused)."""
    why = _storable_text(f"the worker could not record this run's outcome "
                         f"({end.outcome.to_state}): {type(exc).__name__}: {exc}")
    patch = {"ended_at": now, "exit_code": None, "error_detail": why[-DETAIL_LIMIT:],
             "run_attempts": int(end.run.get("run_attempts") or 0) + 1}
    return terms(end.run["id"], moves.RAISED, actor=worker_actor(ctx.worker_id),
                 summary=why[:DETAIL_LIMIT], guard=dict(end.lease), patch=patch, now=now)


def _report_ends(ended: Sequence[Ended], planned: Sequence[MoveTerms | Exception],
                 ctx: RunContext) -> None:
    """Each run's duration in the process's histogram; one line per run's end (INFO),
    and a failure's traceback (WARNING): what a worker embedded in an application
    reports through its logging."""
    now, info = ctx.clock(), log.isEnabledFor(logging.INFO)
    warn = info or log.isEnabledFor(logging.WARNING)
    for end, plan in zip(ended, planned, strict=True):
        run, outcome = end.run, end.outcome
        if outcome.starved:
            ctx.claim_pause.starved()
        else:
            ctx.claim_pause.fed()
        claimed = run.get("lease_expires_at")
        took = now - (claimed - ctx.lease_ttl) if isinstance(claimed, float) else 0.0
        state = plan.to_state if isinstance(plan, MoveTerms) else "error"
        durations.observe(str(run.get("queue", "default")), str(run.get("action_kind")),
                          state, took)
        error = outcome.error
        if not info and (error is None or not warn):
            continue
        line = (f"run {run['id']} end task={run.get('action_kind')} "
                f"queue={run.get('queue', 'default')} "
                f"attempt={int(run.get('run_attempts') or 0) + 1} duration={took:.3f}s "
                f"outcome={state}")
        if error is not None:
            log.warning("%s: %s: %s\n%s", line, error.get("type"), error.get("message"),
                        error.get("traceback", ""))
        else:
            log.info("%s%s", line, f": {outcome.detail}" if outcome.detail else "")


def _planned(policy: EntityPolicy, end: Ended, ctx: RunContext) -> MoveTerms:
    """``end``'s write: its move off ``running``, guarded on the lease it ran under."""
    outcome, patch, now = _terms(policy, end.run, ctx, end.outcome)
    summary = outcome.summary if outcome.summary is not None else outcome.detail or ""
    return terms(end.run["id"], outcome.move, actor=worker_actor(ctx.worker_id),
                 summary=summary, guard=dict(end.lease), patch=patch, now=now)


def _terms(policy: EntityPolicy, run: dict[str, Any], ctx: RunContext, outcome: Outcome
           ) -> tuple[Outcome, dict[str, Any], float]:
    """The outcome written for ``outcome``, its patch and its time.

    A failed run goes to retry_wait while its retry policy has attempts left (and the
    loaded specs have retries at all: older ones fail it plainly). A run given back on
    shutdown is not a failed attempt.
    """
    outcome = _storable(outcome)
    if outcome.starved:
        claims = int(run.get("lease_attempts") or 0)
        if claims < GIVE_BACKS:
            # Given back with its claim still counted (so a task that starves every
            # worker ends after GIVE_BACKS claims) and no run attempt spent.
            move = moves.STARVED if moves.STARVED.offered_by(policy) else moves.SHUTDOWN
            return outcome._replace(move=move), no_lease(policy), ctx.clock()
        outcome = outcome._replace(move=moves.RAISED, detail=f"{outcome.detail} (given back "
                                   f"{claims} times in a row; failed)")
    if outcome.retryable:
        raw = run.get("retry_policy")
        detail = outcome.detail or ""
        try:
            retry = RetryPolicy.from_dict(loads(raw)) if raw else None
        except Exception as exc:  # a hand-edited row: fail it plainly rather than strand it
            retry = None
            detail = _storable_text(f"{detail} (retry_policy unreadable: {exc})")
            outcome = outcome._replace(detail=detail)
        runs_done = int(run.get("run_attempts") or 0) + 1
        if retry is not None and runs_done < retry.max_attempts \
                and moves.BACKOFF.offered_by(policy):
            now = ctx.clock()
            wait = outcome.retry_delay if outcome.retry_delay is not None \
                else retry.delay(runs_done)
            backoff = {**no_lease(policy), "retry_due_at": now + wait,
                       "run_attempts": runs_done, "exit_code": outcome.exit_code,
                       "error_detail": detail[-DETAIL_LIMIT:], **output_patch(policy, outcome)}
            return Outcome(moves.BACKOFF, outcome.exit_code, detail,
                           summary=f"attempt {runs_done} of {retry.max_attempts} failed"
                           ), backoff, now
    now = ctx.clock()
    if outcome.to_state not in policy.terminal:
        # graceful shutdown: not a failed attempt, give it back
        patch: dict[str, Any] = {**no_lease(policy),
                                 "lease_attempts": max(0, int(run["lease_attempts"]) - 1)}
    else:
        why = outcome.detail
        patch = {"ended_at": now, "exit_code": outcome.exit_code,
                 "error_detail": why[-DETAIL_LIMIT:] if why else None,
                 "run_attempts": int(run.get("run_attempts") or 0) + 1,
                 **output_patch(policy, outcome)}
    return outcome, patch, now


#: What no backend's text stores: NUL, and lone surrogates (no UTF-8 encodes them).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def _storable(outcome: Outcome) -> Outcome:
    """``outcome`` with a detail the log can store on every backend: an executor's text
    (its detail, an exception's message) may hold a NUL or a lone surrogate, which
    PostgreSQL's text refuses and so the engine does on both; they become U+FFFD, as in
    a run's output tails. Refused, the write would leave the run running until its lease
    expired, and it would then run again."""
    text = outcome.detail
    if text is None or (text.isascii() and "\x00" not in text):
        return outcome
    return outcome._replace(detail=_storable_text(text))


def _storable_text(text: str) -> str:
    return _UNSTORABLE.sub("\ufffd", text)


async def _write_outcomes(db: Database[WorkerTx], policy: EntityPolicy, writes: list[MoveTerms],
                          now: float) -> list[bool | Exception]:
    """The outcome ``writes`` in one transaction (:func:`finish_all`); whether each
    applied, or the exception it raised.

    They rarely raise, so they first run together; when one does, nothing was written,
    and they run again, each in its own savepoint, so that one fails alone.
    """
    try:
        return await _write_outcome(db, lambda tx: finish_all(tx, policy, writes, now))
    except Exception as exc:
        if is_database_failure(exc):
            raise
        if len(writes) == 1:
            return [exc]
    return await _write_outcome(db, lambda tx: finish_all(tx, policy, writes, now,
                                                          alone=True))


def _alone(tx: WorkerTx, unit: Callable[[WorkerTx], bool]) -> bool | Exception:
    """``unit`` in its own savepoint: whether it applied, or what it raised (its writes
    rolled back); a failure of the database itself fails the whole transaction."""
    try:
        with tx.savepoint():
            return unit(tx)
    except Exception as exc:
        if tx.is_database_failure(exc):
            raise
        return exc


async def _write_outcome(db: Database[WorkerTx], unit: Callable[[WorkerTx], T],
                         attempts: int = 3) -> T:
    """Write runs' outcomes, retrying a transient database error a few times.

    Giving up leaves the rows running until their leases expire and the reaper requeues
    them, i.e. the tasks run again: worth a short wait here. The writes are guarded, so
    a retry after a commit that did land simply conflicts.
    """
    for attempt in range(attempts):
        try:
            # Terminal writes of concurrent runs share a commit (PostgreSQL's group
            # commit; SQLite groups every write): each is still its own guarded move.
            return await db.write_together(unit)
        except DatabaseUnavailable as exc:
            if attempt == attempts - 1:
                raise
            log.warning("outcome write failed (%s); retrying", exc)
            await asyncio.sleep(0.2 * 2 ** attempt)
    raise AssertionError("unreachable")


async def _conflicted(db: Database[WorkerTx], run: dict[str, Any], lease: dict[str, Any],
                      to_state: str) -> str:
    """The outcome of a run whose final write found the lease gone (see lost_outcome)."""
    # A warning: the run may have been taken over and run again elsewhere.
    log.warning("run %s: write of %s conflicted (lease no longer ours)", run["id"], to_state)
    try:
        policy = run_policy(db)
        columns = lease_columns(policy)
        rows = await db.read(lambda tx: tx.read_leases(policy, [run["id"]], columns=columns))
        row = rows[0] if rows else None
    except Exception:  # only the count depends on it: lost is the safe answer
        return "lost"
    return lost_outcome(row, lease)
