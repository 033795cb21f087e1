"""Watching the queue: ``--follow`` on ``ls`` and ``show``, and ``ledgerq wait``.

Following polls the log (facts after a cursor, :class:`FactFollower`) every
:data:`FOLLOW_INTERVAL` seconds: one indexed read of the newest facts, the same on
both backends. SIGINT and SIGTERM end a follow cleanly (exit 0, no traceback): it is
how one stops watching.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
import threading
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ledgerq.cli.app import app
from ledgerq.cli.db import DbOption, db_path, open_db, run
from ledgerq.cli.failures import DOMAIN_FAILURE, OK, die
from ledgerq.cli.render import (
    JsonOption,
    cell,
    emit_json,
    err_console,
    fmt_ts,
    out,
    printable,
    styled_status,
)
from ledgerq.durations import parse_duration
from ledgerq.errors import InvalidInput
from ledgerq.queue.reads import RUN_ENTITY

if TYPE_CHECKING:
    from ledgerq.lifecycle.registry import EntityPolicy

#: Seconds between polls of the log while following or waiting.
FOLLOW_INTERVAL = 0.5


#: Set by a SIGINT/SIGTERM that arrived while no follow loop was listening (during the
#: listing that precedes a follow, between its event loops).
_signalled = threading.Event()


def catch_stop_signals() -> None:
    """From now on SIGINT/SIGTERM mean "stop following", not a KeyboardInterrupt (130) or
    a kill: a command that will follow calls this before it reads anything."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(ValueError):  # not the main thread: nothing to catch
            signal.signal(sig, lambda *_: _signalled.set())


async def until_signalled(step: Callable[[], Awaitable[bool]],
                          interval: float = FOLLOW_INTERVAL) -> bool:
    """Call ``step`` every ``interval`` seconds until it returns False or SIGINT/SIGTERM
    arrives; True when a signal ended it."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    installed: list[signal.Signals] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)
            installed.append(sig)
    if _signalled.is_set():
        stop.set()
    try:
        while not stop.is_set():
            if not await step():
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)
        return True
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
        if installed:
            catch_stop_signals()  # removing them restored the defaults


def print_fact(fact: dict[str, Any], policy: EntityPolicy, *, json_lines: bool) -> None:
    """One move as one line (``--json``: one JSON object per line), flushed: a pipe
    reading a follow sees each move as it happens."""
    if json_lines:
        sys.stdout.write(json.dumps(fact, sort_keys=True, default=str) + "\n")
    else:
        gap = "  "
        line = (cell(f"{fmt_ts(fact['created_at'])}{gap}{fact['entity_id']}{gap}"
                     f"{fact['previous_status'] or '(created)'} -> ")
                .append(styled_status(policy, fact["status"]))
                .append(cell(f"{gap}{fact['reason_code']}{gap}{fact['source']}:"
                             f"{fact['actor']}")))
        out.print(line, soft_wrap=True)  # one line, never cut to the width
    sys.stdout.flush()


def since_time(value: str | None, option: str = "--since") -> float | None:
    """``--since 10m`` as the epoch time that long ago (usage error naming a bad value)."""
    import time

    if value is None:
        return None
    try:
        return time.time() - parse_duration(value, option)
    except InvalidInput as exc:
        die(str(exc))


def follow_runs(ctx: typer.Context, path: str, policy: EntityPolicy, *, statuses: list[str],
                kinds: list[str], targets: list[str], json_lines: bool,
                since: float | None = None, queues: list[str] | None = None) -> None:
    """``ls --follow``: print every move of a run matching the filters from ``since``
    (default now) on, until SIGINT/SIGTERM (exit 0). ``--status`` matches the state a
    move enters."""
    from ledgerq.queue.reads import FactFollower, get_runs

    async def go() -> None:
        async with open_db(ctx, path, readonly=True) as handle:
            follower = FactFollower(handle, RUN_ENTITY, since=since)

            async def step() -> bool:
                facts = [f for f in await follower.poll()
                         if not statuses or f["status"] in statuses]
                if facts and (kinds or targets or queues):
                    rows = await get_runs(handle, {f["entity_id"] for f in facts})
                    facts = [f for f in facts if (r := rows.get(f["entity_id"])) is not None
                             and (not kinds or r["action_kind"] in kinds)
                             and (not targets or r["execution_target"] in targets)
                             and (not queues or r.get("queue", "default") in queues)]
                for f in facts:
                    print_fact(f, policy, json_lines=json_lines)
                return True

            await until_signalled(step)

    run(go())


def follow_run(ctx: typer.Context, path: str, policy: EntityPolicy, run_id: str,
               after_version: int, *, json_lines: bool) -> None:
    """``show --follow``: print the run's moves after ``after_version`` as they happen;
    stop when it has ended (its recorded output is printed then) or at SIGINT/SIGTERM."""
    from ledgerq.cli.output import print_output
    from ledgerq.queue.reads import get_run, run_history

    async def go() -> dict[str, Any] | None:
        async with open_db(ctx, path, readonly=True) as handle:
            last = after_version
            ended = False

            async def step() -> bool:
                nonlocal last, ended
                facts = await run_history(handle, run_id)
                for f in facts:
                    if f["entity_version"] > last:
                        print_fact(f, policy, json_lines=json_lines)
                        last = f["entity_version"]
                # From the whole history, not only the facts printed here: the run may
                # have ended between the caller's read of its row and its read of the
                # history, and then no later fact ever comes.
                ended = bool(facts) and facts[-1]["status"] in policy.terminal
                return not ended

            await until_signalled(step)
            return await get_run(handle, run_id) if ended and not json_lines else None

    row = run(go())
    if row is not None:
        print_output(row)


@app.command()
def wait(
    ctx: typer.Context,
    run_ids: Annotated[list[str], typer.Argument(
        help="Runs to wait for (ids, or unique prefixes or suffixes of 4+ characters).",
        show_default=False, metavar="ID...")],
    timeout: Annotated[str | None, typer.Option(
        "--timeout", metavar="DURATION", help="Give up after this long (e.g. 90s, 10m): "
        "exit 1.", show_default=False)] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print nothing; only the "
                                        "exit code tells.")] = False,
    db: DbOption = None,
    json_out: JsonOption = False,
) -> None:
    """Wait until every run has ended: exit 0 when all completed, 1 otherwise (one ended
    otherwise, a timeout, an interrupt). Read-only; for shell pipelines and CI."""
    import time

    from ledgerq.cli.db import resolve_run
    from ledgerq.lifecycle.registry import SUCCEEDED
    from ledgerq.queue.reads import get_runs

    limit: float | None = None
    if timeout is not None:
        try:
            limit = parse_duration(timeout, "--timeout")
        except InvalidInput as exc:
            die(str(exc))
    path = db_path(ctx, db)

    async def go() -> tuple[dict[str, dict[str, Any]], bool, bool, Any]:
        async with open_db(ctx, path, readonly=True) as handle:
            policy = handle.registry.entity(RUN_ENTITY)
            ids = list(dict.fromkeys([await resolve_run(handle, i) for i in run_ids]))
            deadline = None if limit is None else time.monotonic() + limit
            rows: dict[str, dict[str, Any]] = {}

            async def step() -> bool:
                nonlocal rows
                rows = await get_runs(handle, ids)
                if all(r["status"] in policy.terminal for r in rows.values()):
                    return False
                return deadline is None or time.monotonic() < deadline

            interrupted = await until_signalled(step)
            ended = all(r["status"] in policy.terminal for r in rows.values())
            return {i: rows[i] for i in ids}, ended, interrupted, policy

    rows, ended, interrupted, policy = run(go())
    done = policy.states_with_outcome(SUCCEEDED)
    ok = ended and all(r["status"] in done for r in rows.values())
    if json_out:
        emit_json({"ok": ok, "ended": ended, "interrupted": interrupted,
                   "runs": {i: {"status": r["status"], "exit_code": r["exit_code"]}
                            for i, r in rows.items()}})
    elif not quiet:
        for i, r in rows.items():
            code = "" if r["exit_code"] is None else f" (exit {r['exit_code']})"
            out.print(cell(f"{i} ").append(styled_status(policy, r["status"]))
                      .append(cell(code)))
        if not ended:
            why = "interrupted" if interrupted else f"timed out after {timeout}"
            left = sum(r["status"] not in policy.terminal for r in rows.values())
            err_console.print(printable(f"{why}: {left} run(s) not ended"), markup=False)
    raise typer.Exit(OK if ok else DOMAIN_FAILURE)
