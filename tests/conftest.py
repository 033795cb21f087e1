"""Shared test fixtures: an open StateDB on each backend, and hypothesis profiles.

Backends: every test that takes ``db`` (or ``db_target``) runs once on a fresh SQLite
file and once on a fresh PostgreSQL schema (its own ``search_path``, dropped after the
test) in a scratch database this session creates and drops. PostgreSQL comes from
``LEDGERQ_TEST_POSTGRES`` (default ``postgresql://postgres@127.0.0.1:5432/postgres``,
used only to create the scratch database). When it cannot be reached the PostgreSQL
cases are skipped, unless ``LEDGERQ_REQUIRE_POSTGRES=1`` (as CI sets): then they fail.

Hypothesis profiles (select with LEDGERQ_HYPOTHESIS_PROFILE, default "ci"):

* ``ci``   — 150 examples per property; stateful machines run up to 50 steps each.
* ``long`` — 2000 examples per property; stateful machines run up to 80 steps each.
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from helpers import pg, pgbouncer
from ledgerq import StateDB
from lifecycle_support import with_dispatch

# The tests live in one folder per package (tests/lifecycle/, tests/queue/worker/, ...), and
# a few import another folder's test module by name (``from test_cli import cli``): every
# folder that holds test modules is importable, whichever file runs alone.
_TESTS = Path(__file__).resolve().parent
for _folder in sorted({path.parent for path in _TESTS.rglob("test_*.py")} - {_TESTS}):
    if str(_folder) not in sys.path:
        sys.path.append(str(_folder))

settings.register_profile(
    "ci",
    max_examples=150,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "long",
    max_examples=2000,
    stateful_step_count=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("LEDGERQ_HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "state.db"


BACKENDS = ["sqlite", "postgresql"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "sqlite_only(why): the test exercises SQLite itself (its file, pragmas, "
        "group commit); its PostgreSQL case is not collected")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Drop the PostgreSQL case of tests marked ``sqlite_only``."""
    keep, drop = [], []
    for item in items:
        spec = getattr(item, "callspec", None)
        on_pg = spec is not None and spec.params.get("backend") in ("postgresql", "pgbouncer")
        (drop if on_pg and item.get_closest_marker("sqlite_only") else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
_schemas = itertools.count()


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """A scratch PostgreSQL database for this session (created here, dropped at the end)."""
    problem = pg.unreachable()
    if problem is not None:
        if os.environ.get("LEDGERQ_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"PostgreSQL is required (LEDGERQ_REQUIRE_POSTGRES=1): {problem}")
        pytest.skip(f"PostgreSQL not reachable: {problem}")
    url = pg.session_database()
    try:
        yield url
    finally:
        pg.drop_database(url)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def db_target(backend: str, request: pytest.FixtureRequest,
              tmp_path: Path) -> str:
    """Where a test's database lives: a fresh SQLite file, or a fresh PostgreSQL schema
    (``pgbouncer``, which a module asks for by its own ``backend`` fixture: a fresh
    database reached through PgBouncer in transaction mode)."""
    if backend == "sqlite":
        return str(tmp_path / "state.db")
    if backend == "pgbouncer":
        return str(request.getfixturevalue("bouncer_target"))
    return str(request.getfixturevalue("pg_target"))


@pytest.fixture(scope="session")
def pg_bouncer(pg_database: str) -> Iterator[pgbouncer.Bouncer]:
    """PgBouncer in transaction mode before the test server (one per test process)."""
    problem = pgbouncer.missing()
    if problem is not None:
        if os.environ.get("LEDGERQ_REQUIRE_PGBOUNCER") == "1":
            pytest.fail(f"PgBouncer is required (LEDGERQ_REQUIRE_PGBOUNCER=1): {problem}")
        pytest.skip(problem)
    bouncer = pgbouncer.Bouncer()
    try:
        yield bouncer
    finally:
        bouncer.stop()


@pytest.fixture
def bouncer_target(pg_bouncer: pgbouncer.Bouncer) -> Iterator[str]:
    """A fresh database reached through PgBouncer: a schema would need ``search_path``
    as a startup option, which PgBouncer does not pass on."""
    name = f"ledgerq_bouncer_{os.getpid()}_{next(_schemas)}"
    direct = pg.create_database(name)
    try:
        yield pg_bouncer.url(name)
    finally:
        pg.drop_database(direct)


@pytest.fixture
def pg_target(pg_database: str) -> Iterator[str]:
    """A fresh PostgreSQL schema only, for tests of what only PostgreSQL has."""
    schema = f"p{os.getpid()}_{next(_schemas)}"
    url = pg.create_schema(pg_database, schema)
    try:
        yield url
    finally:
        pg.drop_schema(pg_database, schema)


@pytest.fixture
async def db(db_target: str) -> AsyncIterator[StateDB]:
    """An open StateDB on a fresh database of each backend: the packaged specs and the
    docs' example outbox entity (``dispatch``, docs/examples/dispatch.toml), which many
    engine tests use as a second entity."""
    async with StateDB(db_target, registry=with_dispatch(),
                       **pgbouncer.options(db_target)) as handle:
        yield handle
