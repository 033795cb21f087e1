"""Private PostgreSQL servers for tests: a fresh cluster, a streaming replica of it.

Each cluster is its own data directory and server process on its own port, started
from the distribution's binaries (Debian's ``/usr/lib/postgresql/<version>/bin``),
never the test/postgres server the other tests share, so a test may stop, cut off or
replicate it freely.

PostgreSQL refuses to run as root: when the tests do, every server command runs as the
``postgres`` user (``runuser``) and the data directories are given to it. They then live
under a directory that user can traverse (:func:`make_root`: under /tmp, mode 0755;
pytest's own tmp_path is 0700 to other users).

::

    with pgcluster.clusters() as pgs:           # everything stopped and removed after
        primary = pgs.initdb(conf={"wal_keep_size": "64MB"})
        primary.start()
        standby = pgs.basebackup(primary)
        standby.start()
        psycopg.connect(standby.url())

or, with a directory of one's own, :func:`initdb` and :func:`basebackup` themselves.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

#: How long start() waits for the server to accept connections.
START_TIMEOUT = 30.0
#: The OS user the servers run as when the tests run as root.
SERVER_USER = "postgres"
#: What every fresh cluster's pg_hba.conf allows beyond initdb's own lines: a streaming
#: replica connecting over TCP from this host (initdb's defaults already have it on
#: PostgreSQL 15; kept here so that no version's defaults matter).
DEFAULT_HBA = ("host replication all 127.0.0.1/32 trust",)


def bindir() -> Path:
    """The directory of the server binaries: ``pg_config --bindir`` when it holds
    ``initdb``, else the newest ``/usr/lib/postgresql/<version>/bin``."""
    pg_config = shutil.which("pg_config")
    if pg_config is not None:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True,
                                 check=True, timeout=10).stdout.strip()
            if out and (Path(out) / "initdb").exists():
                return Path(out)
    found = [p for p in Path("/usr/lib/postgresql").glob("*/bin") if (p / "initdb").exists()]
    if not found:
        raise FileNotFoundError("no PostgreSQL server binaries (pg_config --bindir, "
                                "/usr/lib/postgresql/*/bin)")
    return max(found, key=lambda p: _version_key(p.parent.name))


def _version_key(name: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", name)) or (0,)


def unavailable() -> str | None:
    """Why private clusters cannot be made here, or None."""
    try:
        found = bindir()
    except FileNotFoundError as exc:
        return str(exc)
    missing = [b for b in ("initdb", "pg_ctl", "pg_isready", "pg_basebackup", "postgres")
               if not (found / b).exists()]
    if missing:
        return f"{found} lacks {', '.join(missing)}"
    if os.geteuid() == 0:
        if _runuser() is None:
            return "running as root without runuser to start the server as another user"
        try:
            pwd.getpwnam(SERVER_USER)
        except KeyError:
            return f"running as root and there is no {SERVER_USER!r} user to run the server"
    return None


def _runuser() -> str | None:
    return shutil.which("runuser") or next(
        (p for p in ("/usr/sbin/runuser", "/sbin/runuser") if os.path.exists(p)), None)


def _as_server_user(argv: Sequence[str]) -> list[str]:
    """``argv`` as the user the server runs as (only root needs to change user)."""
    if os.geteuid() != 0:
        return list(argv)
    runuser = _runuser()
    if runuser is None:
        raise RuntimeError("running as root and runuser is missing")
    return [runuser, "-u", SERVER_USER, "--", *argv]


def _give(path: Path) -> None:
    """``path`` owned by the server's user (a no-op unless running as root)."""
    if os.geteuid() == 0:
        user = pwd.getpwnam(SERVER_USER)
        os.chown(path, user.pw_uid, user.pw_gid)


def _run(argv: Sequence[str], *, cwd: Path, timeout: float = 120) -> str:
    """Run a server command as the server's user; its output, or RuntimeError with it."""
    done = subprocess.run(_as_server_user(argv), cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{Path(argv[0]).name} exited {done.returncode}:\n"
                           f"{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return done.stdout


def _check_traversable(root: Path) -> None:
    """Refuse a directory the server's user could not reach (running as root only)."""
    if os.geteuid() != 0:
        return
    for d in [root, *root.parents]:
        if not os.stat(d).st_mode & 0o001:
            raise PermissionError(f"{d} is not searchable by other users, so the "
                                  f"{SERVER_USER!r} user cannot reach {root}: use "
                                  "pgcluster.make_root() (or chmod o+x)")


def _quoted(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def free_port() -> int:
    """A TCP port nothing listens on now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Cluster:
    """One private server: its data directory, its port, and the address clients use."""

    datadir: Path
    port: int
    #: The address clients use (one of those it listens on).
    host: str = "127.0.0.1"
    bindir: Path = field(default_factory=bindir)

    @property
    def logfile(self) -> Path:
        """The server's log (beside the data directory: a base backup copies none of it)."""
        return self.datadir.with_name(self.datadir.name + ".log")

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@{self.host}:{self.port}/{dbname}"

    def _bin(self, name: str) -> str:
        return str(self.bindir / name)

    @property
    def running(self) -> bool:
        """Whether a postmaster holds the data directory (its pid file exists)."""
        return (self.datadir / "postmaster.pid").exists()

    def start(self) -> None:
        """Start the server; returns once it accepts connections on :attr:`host`, else
        raises with the tail of its log (within about :data:`START_TIMEOUT` seconds)."""
        if not self.logfile.exists():
            self.logfile.touch()
            _give(self.logfile)
        deadline = time.monotonic() + START_TIMEOUT
        # -w: pg_ctl waits for the pid file to say ready (and notices a server that
        # exited); then what a client sees, pg_isready on the address clients use.
        try:
            _run([self._bin("pg_ctl"), "-D", str(self.datadir), "-l", str(self.logfile),
                  "-w", "-t", str(int(START_TIMEOUT)), "start"], cwd=self.datadir.parent,
                 timeout=START_TIMEOUT + 10)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            raise RuntimeError(f"PostgreSQL in {self.datadir} (port {self.port}) did not "
                               f"start: {exc}\nits log ends:\n{self.log_tail()}") from None
        while True:
            ready = subprocess.run(
                [self._bin("pg_isready"), "-q", "-h", self.host, "-p", str(self.port),
                 "-U", "postgres", "-d", "postgres", "-t", "2"], check=False)
            if ready.returncode == 0:
                return
            if time.monotonic() >= deadline:
                raise RuntimeError(f"PostgreSQL in {self.datadir} does not accept "
                                   f"connections on {self.host}:{self.port} after "
                                   f"{START_TIMEOUT:g}s; its log ends:\n{self.log_tail()}")
            time.sleep(0.1)

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``smart``, ``fast`` or ``immediate``); nothing when it is not
        running. A ``fast`` stop that takes too long becomes ``immediate``."""
        if not self.running:
            return
        try:
            _run([self._bin("pg_ctl"), "-D", str(self.datadir), "-m", mode, "-w", "-t", "30",
                  "stop"], cwd=self.datadir.parent, timeout=60)
        except (RuntimeError, subprocess.TimeoutExpired):
            if not self.running:
                return
            if mode == "immediate":
                raise
            self.stop("immediate")

    def log_tail(self, n: int = 40) -> str:
        try:
            lines = self.logfile.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(lines[-n:])


def _new_datadir(root: Path, port: int) -> Path:
    _check_traversable(root)
    datadir = root / f"pg-{port}"
    datadir.mkdir(mode=0o700)  # an existing one is an error: never reuse a cluster
    _give(datadir)
    return datadir


def _append_conf(datadir: Path, settings: Mapping[str, str]) -> None:
    lines = "".join(f"{k} = {_quoted(v)}\n" for k, v in settings.items())
    with open(datadir / "postgresql.conf", "a") as f:
        f.write("\n# pgcluster\n" + lines)


def initdb(root: Path, port: int, *, listen: str = "127.0.0.1", hba: Sequence[str] = (),
           conf: Mapping[str, str] | None = None) -> Cluster:
    """A fresh cluster in ``root``/pg-<port>, not started: trust authentication, UTF8,
    listening on ``listen`` (listen_addresses: a comma-separated list) and on a Unix
    socket inside its data directory; ``hba`` lines appended to pg_hba.conf (after
    :data:`DEFAULT_HBA`), ``conf`` settings to postgresql.conf. fsync stays on."""
    datadir = _new_datadir(root, port)
    cluster = Cluster(datadir, port, host=listen.split(",")[0].strip() or "127.0.0.1")
    if cluster.host in ("*", "0.0.0.0"):
        cluster.host = "127.0.0.1"
    # --no-sync: initdb's own files are not flushed (a crash loses the test's temporary
    # directory anyway); the server's fsync setting is left as it is (on).
    _run([cluster._bin("initdb"), "-D", str(datadir), "--auth=trust", "--username=postgres",
          "--encoding=UTF8", "--locale=C", "--no-sync", "--no-instructions"], cwd=root)
    with open(datadir / "pg_hba.conf", "a") as f:
        f.write("\n# pgcluster\n" + "".join(f"{line}\n" for line in (*DEFAULT_HBA, *hba)))
    _append_conf(datadir, {"listen_addresses": listen, "port": str(port),
                           "unix_socket_directories": str(datadir), **(conf or {})})
    return cluster


def basebackup(primary: Cluster, root: Path, port: int) -> Cluster:
    """A streaming replica of the running ``primary`` in ``root``/pg-<port>, not started:
    ``pg_basebackup -R`` (standby.signal, primary_conninfo to the primary's host and
    port), with its own port and Unix socket directory."""
    datadir = _new_datadir(root, port)
    standby = Cluster(datadir, port, host="127.0.0.1", bindir=primary.bindir)
    _run([standby._bin("pg_basebackup"), "-D", str(datadir), "-h", primary.host,
          "-p", str(primary.port), "-U", "postgres", "-R", "-X", "stream",
          "--checkpoint=fast", "--no-sync"], cwd=root, timeout=300)
    # It copied the primary's settings: these lines come last, so they win.
    _append_conf(datadir, {"port": str(port), "unix_socket_directories": str(datadir)})
    listen = _setting(primary.datadir, "listen_addresses")
    if listen is not None and "127.0.0.1" not in listen and "*" not in listen:
        _append_conf(datadir, {"listen_addresses": "127.0.0.1"})
    return standby


def _setting(datadir: Path, name: str) -> str | None:
    """The last value postgresql.conf gives ``name`` (quoted values only), or None."""
    found = None
    for line in (datadir / "postgresql.conf").read_text().splitlines():
        m = re.match(rf"\s*{name}\s*=\s*'((?:[^']|'')*)'", line)
        if m:
            found = m.group(1).replace("''", "'")
    return found


def make_root(prefix: str = "ledgerq-pg-") -> Path:
    """A new directory under /tmp (mode 0755) the server's user can traverse."""
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    root.chmod(0o755)
    return root


class Clusters:
    """Clusters made in one directory, to stop and remove together (:func:`clusters`)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.made: list[Cluster] = []

    def initdb(self, port: int | None = None, *, listen: str = "127.0.0.1",
               hba: Sequence[str] = (), conf: Mapping[str, str] | None = None) -> Cluster:
        cluster = initdb(self.root, port or free_port(), listen=listen, hba=hba, conf=conf)
        self.made.append(cluster)
        return cluster

    def basebackup(self, primary: Cluster, port: int | None = None) -> Cluster:
        standby = basebackup(primary, self.root, port or free_port())
        self.made.append(standby)
        return standby

    def close(self) -> None:
        """Stop every cluster (immediately: their data is thrown away), then remove the
        directory. Goes on past a failure; raises the first one at the end."""
        failure: BaseException | None = None
        for cluster in reversed(self.made):
            try:
                cluster.stop("immediate")
            except BaseException as exc:  # the others still stop
                failure = failure or exc
        shutil.rmtree(self.root, ignore_errors=True)
        if failure is not None:
            raise failure


@contextlib.contextmanager
def clusters(prefix: str = "ledgerq-pg-") -> Iterator[Clusters]:
    """A :class:`Clusters` in a fresh :func:`make_root` directory; on leaving (a failed
    test included), every cluster is stopped and the directory removed. In a fixture::

        @pytest.fixture
        def pgs() -> Iterator[pgcluster.Clusters]:
            with pgcluster.clusters() as made:
                yield made
    """
    made = Clusters(make_root(prefix))
    try:
        yield made
    finally:
        made.close()
