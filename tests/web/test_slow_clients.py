"""``ledgerq serve`` under slow clients, on loopback with a bounded number of sockets:
connections holding partial headers past the server's file limit, and anonymous
clients trickling large bodies. ``/healthz`` keeps answering and memory stays bounded.
"""

from __future__ import annotations

import resource
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from helpers.server import TOKEN, free_port, token_env
from ledgerq.web.server import FILE_RESERVE, HEADER_SECONDS

pytest.importorskip("uvicorn")

FILE_LIMIT = 300
SLOW = 320


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.fixture
def limited_server(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    port = free_port()

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (FILE_LIMIT, FILE_LIMIT))

    proc = subprocess.Popen(
        [sys.executable, "-m", "ledgerq", "serve", "--db", str(tmp_path / "s.db"),
         "--port", str(port)], env=token_env(TOKEN), preexec_fn=limit,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, "server did not start"
        time.sleep(0.1)
    try:
        yield url, proc
    finally:
        proc.terminate()
        proc.communicate(timeout=20)


def opened(port: int, first: bytes) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(first)
    return s


def closed_by_server(s: socket.socket) -> bool:
    """Whether the server closed ``s`` (after whatever it answered)."""
    s.settimeout(0.5)
    try:
        while s.recv(65536):
            pass
    except TimeoutError:
        return False
    except OSError:
        pass
    return True


def test_slow_clients_never_stop_healthz_and_hold_no_memory(
        limited_server: tuple[str, subprocess.Popen[str]]) -> None:
    url, proc = limited_server
    port = int(url.rsplit(":", 1)[1])
    base = rss_mb(proc.pid)
    # Slowloris: more connections holding partial headers than the server has files.
    slow: list[socket.socket] = []
    for _ in range(SLOW):
        try:
            slow.append(opened(port, b"GET /api/tasks HTTP/1.1\r\nHost: 127.0.0.1\r\n"))
        except OSError:
            break
    assert len(slow) == SLOW  # loopback accepted them all: the server shed, not refused
    for _ in range(5):
        assert httpx.get(url + "/healthz", timeout=5).status_code == 200
    # Anonymous bodies: refused from their headers, never read into memory.
    trickle = []
    for _ in range(100):
        s = opened(port, b"POST /api/tasks HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                         b"Content-Type: application/json\r\nContent-Length: 1000000\r\n\r\n")
        s.sendall(b"x" * 60_000)
        trickle.append(s)
    answers = []
    for s in trickle:
        s.settimeout(5)
        try:
            answers.append(s.recv(200))
        except OSError:
            answers.append(b"")
    assert sum(a.startswith(b"HTTP/1.1 401") for a in answers) >= 90, answers[:3]
    assert httpx.get(url + "/healthz", timeout=5).status_code == 200
    assert rss_mb(proc.pid) - base < 40, (base, rss_mb(proc.pid))
    # Every slow connection is closed by the server within the header deadline.
    time.sleep(HEADER_SECONDS + 1)
    assert all(closed_by_server(s) for s in slow)
    for s in slow + trickle:
        s.close()
    assert httpx.get(url + "/healthz", timeout=5).status_code == 200


def test_the_connection_cap_sits_below_the_file_limit() -> None:
    from ledgerq.web.server import max_connections

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (FILE_LIMIT, hard))
        assert max_connections() == FILE_LIMIT - FILE_RESERVE
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
