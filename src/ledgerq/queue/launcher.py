"""Turning a run into an argv and a child process: never a shell, always its own group.

Build or resolution errors come back as ``(1, message)`` so a bad row ends as a failed
run with a readable reason instead of an exception in the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import shutil
import signal
import sys
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from ledgerq.store.codec import dumps

ExecuteFn = Callable[[dict[str, Any]], Awaitable[tuple[int, str]]]

#: The command that runs the record's action kinds (``li agent ...``); override per worker.
DEFAULT_COMMAND_PREFIX = "li"
#: Bytes of stdout/stderr kept per stream; the tail is what explains a failure.
OUTPUT_TAIL_BYTES = 4096
PR_SET_PDEATHSIG = 1
#: Seconds a child gets between SIGTERM and SIGKILL when it is stopped.
KILL_GRACE_SECONDS = 2.0


class LaunchError(ValueError):
    """The run cannot be turned into an argv (bad args, unresolvable command)."""


def build_argv(run: dict[str, Any], *, prefix: str = DEFAULT_COMMAND_PREFIX) -> list[str]:
    """The argv for a run: ``command`` runs ``args["argv"]``; other kinds go through ``prefix``."""
    kind = run["action_kind"]
    args = run.get("action_args") or {}
    if not isinstance(args, dict):
        raise LaunchError(f"action_args must be an object, got {type(args).__name__}")
    if kind == "command":
        argv = args.get("argv")
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            raise LaunchError('command tasks need args["argv"]: a non-empty list of strings')
        return [_resolve(argv[0]), *argv[1:]]
    if kind == "workflow":
        raise LaunchError("workflow tasks run only through a registered adapter")
    return [_resolve(prefix), kind.replace("_", "-"), "--args-json", dumps(args)]


def _resolve(program: str) -> str:
    if os.sep in program:
        path = os.path.abspath(program)
        if not os.access(path, os.X_OK):
            raise LaunchError(f"{program!r} is not an executable file")
        return path
    found = shutil.which(program)
    if found is None:
        raise LaunchError(f"cannot resolve {program!r} on PATH")
    return os.path.abspath(found)


async def _tail(stream: asyncio.StreamReader | None, limit: int) -> bytes:
    if stream is None:
        return b""
    chunks: deque[bytes] = deque()
    size = 0
    while chunk := await stream.read(65536):
        chunks.append(chunk)
        size += len(chunk)
        while size - len(chunks[0]) >= limit:
            size -= len(chunks.popleft())
    return b"".join(chunks)[-limit:]


def kill_group(pid: int, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _die_with_parent(parent: int) -> Callable[[], None] | None:
    """In the child before exec: ask Linux to SIGKILL it when the worker dies.

    A SIGKILLed worker cannot stop its children, and the reaper will hand the run to
    another worker after the lease expires; without this the orphan would still be
    running then, and the task would run twice at once.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the worker died before prctl took effect
            os._exit(137)

    return preexec


async def run_argv(argv: list[str], *, cwd: str | None = None, env: dict[str, str] | None = None,
                   tail_bytes: int = OUTPUT_TAIL_BYTES) -> tuple[int, str, str]:
    """Run a child in its own process group; returns (exit code, stdout tail, stderr tail).

    Cancelling the awaiting task stops the whole group (SIGTERM, then SIGKILL after a
    grace period), so a timed-out or cancelled run leaves no orphans behind.
    """
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, start_new_session=True, cwd=cwd,
        env=None if env is None else {**os.environ, **env},
        preexec_fn=_die_with_parent(os.getpid()),
    )
    readers = asyncio.gather(_tail(proc.stdout, tail_bytes), _tail(proc.stderr, tail_bytes))
    try:
        code = await proc.wait()
        # The run ends when its leader does: a background child still holding the pipes
        # would otherwise keep it "running" until that child exits.
        kill_group(proc.pid, signal.SIGKILL)
        out, err = await readers
    except BaseException:
        readers.cancel()
        # A cancelled gather keeps a CancelledError as its exception; retrieve it, or
        # asyncio logs "_GatheringFuture exception was never retrieved" on every stop.
        readers.add_done_callback(lambda f: f.cancelled() or f.exception())
        kill_group(proc.pid, signal.SIGTERM)
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(asyncio.shield(proc.wait()), KILL_GRACE_SECONDS)
        kill_group(proc.pid, signal.SIGKILL)
        with contextlib.suppress(BaseException):
            await asyncio.shield(proc.wait())
        raise
    finally:
        # The leader may exit while its group lives on; a run owns its whole group.
        kill_group(proc.pid, signal.SIGKILL)
    return code, out.decode(errors="replace"), err.decode(errors="replace")


def make_default_execute(prefix: str = DEFAULT_COMMAND_PREFIX,
                         tail_bytes: int = OUTPUT_TAIL_BYTES) -> ExecuteFn:
    """An executor that launches the run's argv; its detail is the stderr tail."""

    async def execute(run: dict[str, Any]) -> tuple[int, str]:
        try:
            argv = build_argv(run, prefix=prefix)
        except LaunchError as exc:
            return 1, str(exc)
        args = run.get("action_args") or {}
        cwd = args.get("cwd") if run["action_kind"] == "command" else None
        try:
            code, out, err = await run_argv(argv, cwd=cwd, tail_bytes=tail_bytes)
        except OSError as exc:
            return 1, f"cannot start {argv[0]}: {exc}"
        return code, (err or (out if code else "")).strip()[-tail_bytes:]

    return execute


default_execute: ExecuteFn = make_default_execute()
