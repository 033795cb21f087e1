"""The one typer app every command module registers on, its root options, and the
entry point that turns whatever a command raised into one stderr line and an exit code.
"""

from __future__ import annotations

import getpass
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from ledgerq import __version__
from ledgerq.cli.db import DbOption
from ledgerq.cli.failures import (
    DOMAIN_FAILURE,
    OK,
    USAGE_ERROR,
    database_message,
    die,
    report,
)
from ledgerq.errors import DatabaseError

SPECS_ENV = "LEDGERQ_SPECS"
SPECS_ONLY_ENV = "LEDGERQ_SPECS_ONLY"
SYNC_ENV = "LEDGERQ_SYNCHRONOUS"
POOLED_ENV = "LEDGERQ_POOLED"
LISTEN_URL_ENV = "LEDGERQ_LISTEN_URL"

app = typer.Typer(
    name="ledgerq",
    help="Event-sourced lifecycles with a durable task queue: submit, watch, cancel, "
         "verify and run workers.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def current_user() -> str:
    """Who an operator's write is recorded as when no ``--actor`` is given: the login
    name, or ``operator`` where the system has none (a container without a passwd entry)."""
    try:
        return getpass.getuser()
    except Exception:
        return "operator"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"ledgerq {__version__}")
        raise typer.Exit(OK)


@app.callback()
def root(
    ctx: typer.Context,
    db: DbOption = None,
    specs: Annotated[Path | None, typer.Option(
        "--specs", envvar=SPECS_ENV, exists=True,
        help=f"Spec directory (or file) the database commands use, with the packaged "
             f"specs of entities it does not declare (env {SPECS_ENV}; default: the "
             "packaged specs).", show_default=False)] = None,
    specs_only: Annotated[bool, typer.Option(
        "--specs-only", envvar=SPECS_ONLY_ENV,
        help=f"Use --specs alone, without the packaged specs (env {SPECS_ONLY_ENV}=1): "
             "a database without the queue's entities, or one dropping them through "
             "`migrate --apply`.")] = False,
    synchronous: Annotated[str | None, typer.Option(
        "--synchronous", envvar=SYNC_ENV, metavar="NORMAL|FULL",
        help=f"SQLite durability of every commit (env {SYNC_ENV}; default NORMAL). NORMAL "
             "survives a killed process; FULL also survives power loss, one fsync per "
             "commit. EXTRA and OFF are accepted too.", show_default=False)] = None,
    pooled: Annotated[bool, typer.Option(
        "--pooled", envvar=POOLED_ENV,
        help=f"The PostgreSQL URL goes through a pooler in transaction mode, such as "
             f"PgBouncer (env {POOLED_ENV}=1): nothing is kept on a server connection "
             "between transactions, and workers poll unless --listen-url is given.")] = False,
    listen_url: Annotated[str | None, typer.Option(
        "--listen-url", envvar=LISTEN_URL_ENV, metavar="URL",
        help=f"The PostgreSQL server's own URL, for LISTEN, when --db goes through a "
             f"pooler (env {LISTEN_URL_ENV}; implies --pooled).", show_default=False)] = None,
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.",
                                          is_eager=True, callback=_print_version)] = False,
) -> None:
    """ledgerq: every status change is a guarded fact in an append-only log."""
    if specs_only and specs is None:
        die("--specs-only needs --specs DIR")
    ctx.obj = {"db": db, "specs": specs, "synchronous": synchronous,
               "specs_only": specs_only, "pooled": pooled, "listen_url": listen_url}


def _click_exceptions() -> Any:
    """click's exception module: typer >= 0.2x vendors click as ``typer._click``; older
    typers (``typer>=0.12`` is allowed) depend on click itself."""
    try:
        return importlib.import_module("typer._click.exceptions")
    except ImportError:  # pragma: no cover - depends on the installed typer
        return importlib.import_module("click.exceptions")


def usage_message(exc: Any) -> str:
    """click's usage error as our one line: the message, then where the help is."""
    ctx = getattr(exc, "ctx", None)
    command = ctx.command_path if ctx is not None else "ledgerq"
    return f"{exc.format_message()} (see '{command} --help')"


def run_cli(args: Sequence[str] | None = None) -> int:
    """Run the command line and return its exit code; errors are one stderr line each.

    click in standalone mode prints usage errors as multi-line rich boxes and lets every
    other exception through as a traceback. Here click raises instead, and each kind
    becomes one ``ledgerq: error:`` line: a usage error exits 2, a database failure that
    got past :func:`open_db` exits 1. ``--help`` and ``--version`` are not errors (0); a
    bare ``ledgerq`` (or ``ledgerq specs``) still prints its help, to stderr, exit 2.
    """
    click_exc = _click_exceptions()
    no_args_is_help = getattr(click_exc, "NoArgsIsHelpError", ())
    aborts = (typer.Abort, getattr(click_exc, "Abort", typer.Abort))
    try:
        result = app(args=None if args is None else list(args), prog_name="ledgerq",
                     standalone_mode=False)
    except click_exc.ClickException as exc:
        if isinstance(exc, no_args_is_help):
            exc.show()
            return USAGE_ERROR
        if isinstance(exc, click_exc.UsageError):
            report(usage_message(exc))
            return USAGE_ERROR
        report(exc.format_message())
        return int(exc.exit_code)
    except aborts:  # end of input at a prompt
        report("aborted")
        return DOMAIN_FAILURE
    except DatabaseError as exc:
        report(database_message(exc))
        return DOMAIN_FAILURE
    return result if isinstance(result, int) else OK


def main() -> NoReturn:
    """Console-script entry point (``python -m ledgerq`` too)."""
    sys.exit(run_cli())
