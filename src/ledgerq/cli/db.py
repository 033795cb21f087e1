"""The database (and spec set) a command runs against, and the loop it runs on.

Every command opens its database through :func:`open_db` so that each way a database can
fail (missing, unopenable, damaged, gone mid-command) ends as the same one line and the
same exit code whichever command met it.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar, cast

import typer

from ledgerq.cli.failures import DOMAIN_FAILURE, database_message, die
from ledgerq.errors import DatabaseError, DatabaseUnavailable, MigrationRefused, MissingExtra

if TYPE_CHECKING:
    from ledgerq.lifecycle.registry import Registry
    from ledgerq.store.db import StateDB, Synchronous

T = TypeVar("T")

DEFAULT_DB = "ledgerq.db"
DB_ENV = "LEDGERQ_DB"
DbOption = Annotated[
    str | None,
    typer.Option("--db", help=f"Database: a SQLite file, or a postgresql:// URL (env {DB_ENV}; "
                 f"default ./{DEFAULT_DB}).", show_default=False),
]


#: aiosqlite names each connection's thread after its target function.
_DB_THREAD_SUFFIX = "(_connection_worker_thread)"
#: Bounds the wait for those threads (each needs one loop turn to finish; a live
#: connection never would, and must not hang the exit).
_DB_THREAD_GRACE = 5.0


def run(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run``, but the loop closes only after aiosqlite's threads have finished.

    A connection that fails to open (``--db`` under a missing directory) leaves its
    thread to post one last result to the loop; when ``die()`` ended the loop first,
    that thread died with a 24-line "Event loop is closed" traceback after our one line.
    """

    async def settled() -> T:
        before = set(threading.enumerate())
        try:
            return await coro
        finally:
            deadline = time.monotonic() + _DB_THREAD_GRACE
            for thread in set(threading.enumerate()) - before:
                if not thread.name.endswith(_DB_THREAD_SUFFIX):
                    continue
                while thread.is_alive() and time.monotonic() < deadline:
                    await asyncio.sleep(0.005)

    return asyncio.run(settled())


def db_path(ctx: typer.Context, db: str | None) -> str:
    """--db on the command, else --db before it, else $LEDGERQ_DB, else ./ledgerq.db."""
    from ledgerq.store.db import conninfo_problem

    root = ctx.find_root().obj
    if db is None and isinstance(root, dict) and root.get("db") is not None:
        db = str(root["db"])
    path = db if db is not None else os.environ.get(DB_ENV) or DEFAULT_DB
    problem = conninfo_problem(path)
    if problem is not None:
        die(f"--db: {problem}")
    return path


def root_specs(ctx: typer.Context) -> Path | None:
    """The spec directory given before the command (``ledgerq --specs DIR ...``), if any."""
    root = ctx.find_root().obj
    specs = root.get("specs") if isinstance(root, dict) else None
    return Path(specs) if specs is not None else None


def specs_only(ctx: typer.Context) -> bool:
    """Whether ``--specs-only`` asked for the spec directory without the packaged specs."""
    root = ctx.find_root().obj
    return bool(root.get("specs_only")) if isinstance(root, dict) else False


def load_specs(specs: Path | None, *, packaged: bool = True) -> Registry:
    """The registry of ``specs`` (None: the packaged specs; ``packaged=False``: the
    directory alone, ``--specs-only``), refused like ``ledgerq specs check`` refuses it:
    also when it lacks a move the queue makes (queue/moves.py), if it declares runs."""
    from ledgerq.errors import SpecError
    from ledgerq.lifecycle.registry import default_registry, load_registry
    from ledgerq.queue.moves import ENTITY, check

    try:
        if specs is None:
            return check(default_registry())
        registry = load_registry(specs, packaged=packaged)
        return check(registry) if packaged or ENTITY in registry.entities else registry
    except SpecError as exc:
        die(f"{specs} is not a valid spec set ({len(exc.problems)} problem(s)); "
            f"run `ledgerq specs check {specs}`", DOMAIN_FAILURE)


async def resolve_run(handle: StateDB, run_id: str) -> str:
    """The full id of the run ``run_id`` names (a whole id, or a unique prefix or suffix
    of 4+ characters), or one error line: an unknown run is a domain failure."""
    from ledgerq.cli.failures import text_option
    from ledgerq.queue.reads import resolve_run_id

    text_option(run_id, "ID")
    try:
        return await resolve_run_id(handle, run_id)
    except LookupError as exc:
        die(str(exc).strip("'\""), DOMAIN_FAILURE)
    except ValueError as exc:
        die(str(exc))


def pooler_options(ctx: typer.Context, path: str) -> dict[str, Any]:
    """The root ``--pooled`` and ``--listen-url``, as StateDB takes them: for a
    PostgreSQL URL only (a SQLite file has no pooler; a command given one ignores them,
    so that one environment serves both)."""
    from ledgerq.store.db import is_postgres

    root = ctx.find_root().obj
    if not isinstance(root, dict) or not is_postgres(path):
        return {}
    return {"pooled": bool(root.get("pooled")), "listen_url": root.get("listen_url")}


@asynccontextmanager
async def open_db(ctx: typer.Context, path: str, *, must_exist: bool = True,
                  readonly: bool = False, registry: Registry | None = None,
                  migrate_on_open: bool = True, by_record: bool = True,
                  pool_size: int | None = None) -> AsyncIterator[StateDB]:
    """Open the database with the root options: the spec directory and ``--synchronous``.

    Read commands pass ``readonly=True``: the file is opened read-only and never written
    (no schema, no WAL switch), so a user who may only read it can still run them.
    Every database failure of a command ends here as one line: a path SQLite cannot open
    is a usage error (exit 2); a damaged file, one without ledgerq's schema, or anything
    failing after the open is a database failure (exit 1). Never a traceback.

    Without ``--specs`` (and ``by_record``), the command judges by the specs the database
    records (:meth:`~ledgerq.StateDB.adopt_recorded`); a worker passes
    ``by_record=False``: it runs its own release's specs, as a rolling upgrade expects.
    """
    from ledgerq.store.db import SYNCHRONOUS_LEVELS, StateDB, is_postgres

    if must_exist and not is_postgres(path) and path != ":memory:" and not Path(path).exists():
        die(f"no database at {path} (pass --db or set {DB_ENV}; submit and worker create one)")
    judged_by_record = by_record and registry is None and root_specs(ctx) is None
    if registry is None:
        specs = root_specs(ctx)
        registry = load_specs(specs, packaged=not specs_only(ctx)) if specs is not None \
            else None
    root = ctx.find_root().obj
    synchronous = (root.get("synchronous") if isinstance(root, dict) else None) or "NORMAL"
    if str(synchronous).upper() not in SYNCHRONOUS_LEVELS:
        die(f"--synchronous: {synchronous!r} is not one of {', '.join(SYNCHRONOUS_LEVELS)}")
    pooling = pooler_options(ctx, path)
    try:
        db = StateDB(path, registry=registry, synchronous=cast("Synchronous", synchronous),
                     readonly=readonly, migrate_on_open=migrate_on_open,
                     pool_size=pool_size, **pooling)
    except MissingExtra as exc:
        die(str(exc))
    except ValueError as exc:  # the synchronous level, a path or URL refused: each says so
        die(str(exc))
    try:
        await db.open()
    except DatabaseUnavailable as exc:
        die(f"cannot open database {exc}")
    except MigrationRefused as exc:
        die(f"{path}: {exc}", DOMAIN_FAILURE)
    except DatabaseError as exc:
        die(database_message(exc, path), DOMAIN_FAILURE)
    if judged_by_record:
        db.adopt_recorded()
    failure: BaseException | None = None
    try:
        yield db
    except DatabaseError as exc:
        failure = exc
    finally:
        try:
            await db.close()
        except DatabaseError as exc:
            failure = failure or exc
    if failure is not None:
        die(database_message(failure, path), DOMAIN_FAILURE)
