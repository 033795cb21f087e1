"""The pytest plugin (entry point ``pytest11``): fixtures for tests of code that uses
ledgerq.

* ``ledgerq_target``: a scratch database per test, dropped after it: a SQLite file in
  the test's ``tmp_path``, or a fresh schema of the PostgreSQL database that
  ``--ledgerq-postgres URL`` (or ``$LEDGERQ_TEST_POSTGRES``) names.
* ``ledgerq_db``: a :class:`~ledgerq.StateDB` open on it (async: needs pytest-asyncio),
  with the specs of the ``ledgerq_specs`` ini option beside the packaged ones.
* ``ledgerq_app``: an :class:`~ledgerq.tasks.App` on it: the app the ``ledgerq_app`` ini
  option (or ``$LEDGERQ_APP``) names, pointed at the scratch database for the test and
  back after, or else a new, empty one. Its ``drain_sync()`` / ``await drain()`` run
  what the test deferred, in the test's process.

Only pytest is imported here until a fixture is used: the plugin loads in every project
that installs ledgerq.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from ledgerq.store.db import StateDB
    from ledgerq.tasks.app import App

#: Where the PostgreSQL URL comes from when the option is not given.
POSTGRES_ENV = "LEDGERQ_TEST_POSTGRES"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("ledgerq")
    group.addoption("--ledgerq-postgres", metavar="URL", default=None,
                    help="run ledgerq_db / ledgerq_app on a fresh schema per test of this "
                         f"PostgreSQL database (default ${POSTGRES_ENV}; else SQLite)")
    parser.addini("ledgerq_app", "MODULE:ATTRIBUTE of the App the ledgerq_app fixture "
                  "points at a scratch database (default $LEDGERQ_APP; else a new App)",
                  default=None)
    parser.addini("ledgerq_specs", "a directory of spec files (beside the packaged ones) "
                  "for ledgerq_db and a new ledgerq_app", default=None)


def _registry(config: pytest.Config) -> Any:
    """The registry the ini's ``ledgerq_specs`` names (relative to the ini file), or None
    (the packaged specs)."""
    specs = config.getini("ledgerq_specs")
    if not specs:
        return None
    from ledgerq.lifecycle.registry import load_registry

    return load_registry(Path(config.inipath.parent if config.inipath else config.rootpath,
                              str(specs)))


@pytest.fixture
def ledgerq_target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A scratch database for one test (SQLite, or a PostgreSQL schema): what to open."""
    from ledgerq.store.scratch import Scratch

    url = request.config.getoption("--ledgerq-postgres") or os.environ.get(POSTGRES_ENV)
    scratch = Scratch(url or tmp_path, prefix="ledgerq_test")
    try:
        yield scratch.target
    finally:
        scratch.drop()


async def _open_db(request: pytest.FixtureRequest, ledgerq_target: str
                   ) -> AsyncIterator[StateDB]:
    """An open StateDB on the test's scratch database (the ini's ``ledgerq_specs`` beside
    the packaged specs)."""
    from ledgerq.store.db import StateDB

    async with StateDB(ledgerq_target, registry=_registry(request.config)) as db:
        yield db


def _needs_pytest_asyncio() -> None:
    pytest.fail("ledgerq_db is an async fixture: pip install pytest-asyncio")


ledgerq_db: Any
try:
    import pytest_asyncio
except ImportError:  # the fixture says what it needs when a test asks for it
    ledgerq_db = pytest.fixture(_needs_pytest_asyncio, name="ledgerq_db")
else:
    ledgerq_db = pytest_asyncio.fixture(_open_db, name="ledgerq_db")


@pytest.fixture
def ledgerq_app(request: pytest.FixtureRequest, ledgerq_target: str) -> Iterator[App]:
    """The project's App (ini ``ledgerq_app`` / ``$LEDGERQ_APP``) on the scratch database
    for this test, or a new one. In an async test, open it: ``async with ledgerq_app:``."""
    from ledgerq.tasks.app import App
    from ledgerq.tasks.loading import APP_ENV, load_app

    spec: Any = request.config.getini("ledgerq_app") or os.environ.get(APP_ENV)
    app = load_app(spec) if spec else App(ledgerq_target, registry=_registry(request.config))
    saved = app.target
    app.retarget(ledgerq_target)
    try:
        yield app
    finally:
        app.close_sync()
        app.retarget(saved)
