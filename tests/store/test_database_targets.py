"""What names a database: a SQLite path or a PostgreSQL URL, each one spelling, refused
at construction (nothing opened, nothing written) when it would mean something else."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from ledgerq import StateDB
from ledgerq.errors import InvalidInput
from ledgerq.store.postgres.backend import CONNECT_TIMEOUT, url_connect_timeout


def test_a_sqlite_uri_is_refused_naming_the_path(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match=r"SQLite URI.*'c\.db'"):
        StateDB("file:c.db")
    with pytest.raises(InvalidInput, match="SQLite URI"):
        StateDB("file:c.db?mode=ro")


@pytest.mark.parametrize("url", ["postgresql://", "postgres://", "postgresql:///"])
def test_a_url_that_names_nothing_is_refused(url: str) -> None:
    with pytest.raises(InvalidInput, match="names no database, host or user"):
        StateDB(url)


def test_the_urls_connect_timeout_is_honoured() -> None:
    assert url_connect_timeout("postgresql://u@h/db") == CONNECT_TIMEOUT
    assert url_connect_timeout("postgresql://u@h/db?connect_timeout=3") == 3.0
    for bad in ("0", "-1", "soon"):
        with pytest.raises(InvalidInput, match="connect_timeout"):
            url_connect_timeout(f"postgresql://u@h/db?connect_timeout={bad}")


async def test_an_unreachable_server_gives_up_at_the_urls_timeout() -> None:
    """10.255.255.1 drops the connection attempt (no answer, no refusal): the open waits
    for the timeout the URL names, not the library's default."""
    db = StateDB("postgresql://u@10.255.255.1:5432/db?connect_timeout=1")
    started = time.monotonic()
    with pytest.raises(Exception):  # noqa: B017 (unavailable, however libpq says it)
        await db.open()
    assert time.monotonic() - started < CONNECT_TIMEOUT - 2


def test_the_command_says_what_is_wrong_with_the_target(tmp_path: Path) -> None:
    for target, words in (("file:c.db", "SQLite URI"), ("postgresql://", "names no")):
        res = subprocess.run([sys.executable, "-m", "ledgerq", "--db", target, "stats"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=60,
                             check=False)
        assert res.returncode == 2, res.stderr
        assert res.stderr.startswith("ledgerq: error:") and words in res.stderr
        assert "--synchronous" not in res.stderr
    assert list(tmp_path.iterdir()) == []  # nothing created
