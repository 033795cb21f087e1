"""PgBouncer in transaction mode in front of the test PostgreSQL, started by the tests.

Debian's ``pgbouncer`` (``apt-get install pgbouncer``; ``.ci/run`` installs it) runs
on a free loopback port with ``pool_mode = transaction``: every transaction of a client
may run on another server connection, which is what a ledgerq handle behind it must
survive. Any database name maps to the server's database of that name (``* =``), so a
test's scratch database is reached through the pooler by its own name. PgBouncer refuses
to run as root; as root it runs as the ``postgres`` user.

Targets reached through a pooler are remembered with the server's own URL, so that a
test opens them as a user would: ``StateDB(target, **options(target))`` (``listen_url``:
LISTEN goes to the server directly).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.parse
from pathlib import Path
from typing import Any

from helpers import pg

BINARY = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
#: Pooled target URL -> the server's own URL of the same database.
_DIRECT: dict[str, str] = {}


def missing() -> str | None:
    """Why PgBouncer cannot be started here, or None."""
    if not Path(BINARY).exists():
        return "pgbouncer is not installed (apt-get install pgbouncer)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Bouncer:
    """One running PgBouncer; :meth:`stop` ends it and removes its directory."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="ledgerq-pgbouncer-", dir="/tmp"))
        self.dir.chmod(0o755)
        self.port = _free_port()
        server = urllib.parse.urlsplit(pg.ADMIN_URL)
        self.server_host = server.hostname or "127.0.0.1"
        self.server_port = server.port or 5432
        self.user = server.username or "postgres"
        (self.dir / "users.txt").write_text(f'"{self.user}" ""\n')
        (self.dir / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host={self.server_host} port={self.server_port}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {self.dir / 'users.txt'}\n"
            "pool_mode = transaction\nmax_client_conn = 1000\ndefault_pool_size = 20\n"
            "server_reset_query =\nignore_startup_parameters = extra_float_digits\n"
            f"logfile = {self.dir / 'pgbouncer.log'}\n")
        command = [BINARY, "-q", str(self.dir / "pgbouncer.ini")]
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres")
            for name in ("users.txt", "pgbouncer.ini"):
                shutil.chown(self.dir / name, "postgres")
            command = ["runuser", "-u", "postgres", "--", *command]
        self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode() if self.proc.stderr else ""
                raise RuntimeError(f"pgbouncer exited ({self.proc.returncode}): {err}"
                                   f"{self.log_tail()}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"pgbouncer did not listen on {self.port}: {self.log_tail()}")

    def log_tail(self, lines: int = 20) -> str:
        log = self.dir / "pgbouncer.log"
        return "\n".join(log.read_text().splitlines()[-lines:]) if log.exists() else ""

    def url(self, dbname: str) -> str:
        """The pooled URL of the server's database ``dbname`` (remembered, with the
        server's own URL, for :func:`options`)."""
        pooled = f"postgresql://{self.user}@127.0.0.1:{self.port}/{dbname}"
        _DIRECT[pooled] = (f"postgresql://{self.user}@{self.server_host}:"
                           f"{self.server_port}/{dbname}")
        return pooled

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def options(target: str) -> dict[str, Any]:
    """What ``StateDB`` takes besides ``target`` to open it: for a pooled target, the
    server's own URL as ``listen_url`` (which makes the handle pooled); else nothing."""
    direct = _DIRECT.get(target)
    return {} if direct is None else {"listen_url": direct}


def direct_url(target: str) -> str:
    """The server's own URL of a pooled target (the target itself otherwise)."""
    return _DIRECT.get(target, target)
