"""Turning a run into an argv and a child process: never a shell, always its own group.

Build or resolution errors come back as ``(1, message)`` so a bad row ends as a failed
run with a readable reason instead of an exception in the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import ctypes
import os
import shutil
import signal
import sys
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ledgerq.codec import dumps
from ledgerq.queue.worker import orphans
from ledgerq.queue.worker.finished import Finished
from ledgerq.queue.worker.starvation import is_starved

#: What runs a claimed row: the ADR-0071 queue's ``(exit_code, detail)``, or a
#: :class:`~ledgerq.queue.worker.finished.Finished` that says more (a result, an error).
ExecuteFn = Callable[[dict[str, Any]], Awaitable["tuple[int, str] | Finished"]]

#: The command that runs the ADR-0071 queue's action kinds (``li agent ...``); override
#: per worker.
DEFAULT_COMMAND_PREFIX = "li"
#: Bytes of stdout/stderr kept per stream; the tail is what explains a failure. It is
#: also the default of what a run records of each stream (``WorkerConfig.output_tail``).
OUTPUT_TAIL_BYTES = 4096
#: The most a worker may be configured to record per stream: the tails ride on the row
#: and on its terminal fact, read by ``show`` and every fold of the log.
MAX_OUTPUT_TAIL_BYTES = 1024 * 1024
PR_SET_PDEATHSIG = 1
#: Seconds a child gets between SIGTERM and SIGKILL when it is stopped.
KILL_GRACE_SECONDS = 2.0
#: How long the output tails may still drain once the run's group is killed. Only a
#: descendant that escaped the group (``setsid``) can hold a pipe open past the kill.
DRAIN_SECONDS = 1.0


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


class _Tail:
    """The last ``limit`` bytes read from one of the child's output pipes.

    The pipes are the run's own ``os.pipe()`` pairs, not asyncio's subprocess pipes: an
    asyncio subprocess counts as exited only once every pipe it made is closed, so a
    helper that inherited stdout (``sleep 60 &``, a plain ``os.fork``) kept its run
    "running" until the helper exited. With our own pipes the exit is the leader's.
    """

    def __init__(self, fd: int, limit: int) -> None:
        self.fd = fd
        self.limit = limit
        self.chunks: deque[bytes] = deque()
        self.size = 0
        self.adopted = False

    async def drain(self) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        self.adopted = True  # the file object (and its transport) closes the fd from here
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(self.fd, "rb", 0))
        try:
            while chunk := await reader.read(65536):
                self.chunks.append(chunk)
                self.size += len(chunk)
                while self.size - len(self.chunks[0]) >= self.limit:
                    self.size -= len(self.chunks.popleft())
        finally:
            transport.close()

    def close_unadopted(self) -> None:
        """A drain cancelled before it started never took the fd: close it here."""
        if not self.adopted:
            self.adopted = True
            os.close(self.fd)

    def text(self, limit: int | None = None) -> str:
        # A NUL is no text either backend stores the same (PostgreSQL refuses it): it is
        # recorded as U+FFFD, like any byte that is not UTF-8.
        keep = self.limit if limit is None else limit
        if keep <= 0:
            return ""
        return b"".join(self.chunks)[-keep:].decode(errors="replace").replace(
            "\x00", "\ufffd")


@dataclass
class OutputCapture:
    """Where :func:`run_argv` leaves the tails of one run's output for its terminal fact.

    The executor's shape is the ADR-0071 queue's ``(exit_code, detail)``, which has no room for
    two streams; the supervisor instead sets a capture in the context the executor's task
    runs in (:func:`capturing`), and any executor that launches through :func:`run_argv`
    fills it, also when the run is cancelled or timed out half way (its output up to the
    kill is often what explains it). An executor that launches nothing leaves it empty.
    """

    #: Bytes kept of each stream (0: keep nothing).
    limit: int
    stdout: str | None = None
    stderr: str | None = None
    #: How stopping the run works, as its timeout record says it: a launched process
    #: group is killed; an executor that runs otherwise says what it does instead
    #: (:func:`stops_by`).
    stopping: str = "process group killed"
    #: What still runs after the run was stopped (a thread no one can stop): its
    #: supervisor waits for it once the run's end is written, so the capacity slot it
    #: takes stays taken until it returns.
    lingering: Awaitable[Any] | None = None

    def columns(self) -> dict[str, str | None]:
        """The run columns this capture fills (the spec's ``stdout_tail``/``stderr_tail``)."""
        return {"stdout_tail": self.stdout, "stderr_tail": self.stderr}


_capture: contextvars.ContextVar[OutputCapture | None] = contextvars.ContextVar(
    "ledgerq_output_capture", default=None)


def current_capture() -> OutputCapture | None:
    """The capture of the run whose executor calls this (None outside a run)."""
    return _capture.get()


def stops_by(how: str) -> None:
    """Say, from inside an executor, how stopping this run works (for its timeout
    record: "cancelled", "process killed", ...)."""
    capture = _capture.get()
    if capture is not None:
        capture.stopping = how


def capturing(capture: OutputCapture) -> contextvars.Context:
    """A copy of the current context with ``capture`` set: what runs in it (an executor,
    and every task it creates) fills ``capture``, and nothing it sets leaks out."""
    context = contextvars.copy_context()
    context.run(_capture.set, capture)
    return context


def kill_group(pid: int, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _die_with_parent(parent: int, ledger: orphans.GroupLedger | None
                     ) -> Callable[[], None] | None:
    """In the child before exec: ask Linux to SIGKILL it when the worker dies, and record
    its process group in ``ledger`` (the worker's; the child leads its own group).

    A SIGKILLed worker cannot stop its children, and the reaper will hand the run to
    another worker after the lease expires; without this the orphan would still be
    running then, and the task would run twice at once. The group is recorded before the
    command runs, so a worker killed at any moment after it started has left a record of
    whatever the command forks (the worker records it again once the spawn returns, in
    case the child could not).
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
        if ledger is not None:
            with contextlib.suppress(OSError):
                ledger.record(os.getpid())

    return preexec


async def run_argv(argv: list[str], *, cwd: str | None = None, env: dict[str, str] | None = None,
                   tail_bytes: int = OUTPUT_TAIL_BYTES) -> tuple[int, str, str]:
    """Run a child in its own process group; returns (exit code, stdout tail, stderr tail).

    Cancelling the awaiting task stops the whole group (SIGTERM, then SIGKILL after a
    grace period), so a timed-out or cancelled run leaves no orphans behind.
    """
    ledger = orphans.current()
    out_r, out_w = os.pipe()
    try:
        err_r, err_w = os.pipe()
    except BaseException:
        os.close(out_r)
        os.close(out_w)
        raise
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=out_w, stderr=err_w,
            start_new_session=True, cwd=cwd,
            env=None if env is None else {**os.environ, **env},
            preexec_fn=_die_with_parent(os.getpid(), ledger),
        )
    except BaseException:
        for fd in (out_r, err_r):
            os.close(fd)
        raise
    finally:
        os.close(out_w)
        os.close(err_w)
    if ledger is not None:
        ledger.record(proc.pid)  # the child leads its own group: pgid == pid
    capture = _capture.get()
    kept = tail_bytes if capture is None else max(tail_bytes, capture.limit)
    tails = (_Tail(out_r, kept), _Tail(err_r, kept))
    readers = asyncio.gather(*(t.drain() for t in tails))
    # A cancelled gather keeps a CancelledError as its exception; retrieve it, or asyncio
    # logs "_GatheringFuture exception was never retrieved" on every stop.
    readers.add_done_callback(lambda f: f.cancelled() or f.exception())
    try:
        code = await proc.wait()
        # The run ends when its leader does; it owns its whole group, so what the leader
        # left behind (a forked helper, a background job) is killed now, not waited for.
        kill_group(proc.pid, signal.SIGKILL)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(readers), DRAIN_SECONDS)
    except BaseException:
        kill_group(proc.pid, signal.SIGTERM)
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(asyncio.shield(proc.wait()), KILL_GRACE_SECONDS)
        kill_group(proc.pid, signal.SIGKILL)
        with contextlib.suppress(BaseException):
            await asyncio.shield(proc.wait())
        raise
    finally:
        kill_group(proc.pid, signal.SIGKILL)
        if ledger is not None:
            ledger.forget(proc.pid)
        readers.cancel()
        for tail in tails:
            tail.close_unadopted()
        if capture is not None and capture.limit > 0:
            capture.stdout, capture.stderr = (t.text(capture.limit) for t in tails)
    return code, tails[0].text(tail_bytes), tails[1].text(tail_bytes)


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
            if is_starved(exc):  # the worker's trouble, not the task's: see starvation.py
                raise
            return 1, f"cannot start {argv[0]}: {exc}"
        return code, (err or (out if code else "")).strip()[-tail_bytes:]

    return execute


default_execute: ExecuteFn = make_default_execute()
