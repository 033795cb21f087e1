"""The ``ledgerq`` command: submit, watch, cancel, verify and run workers.

Exit codes (every command):

* 0 — success.
* 1 — a domain failure: a cancel that conflicts (the run had already ended), an
  unknown run id (``no run <id>``), drift found by ``verify``, an invalid spec; or a
  database failure: a damaged file (``database is damaged: <file>: ...``), a file
  without ledgerq's schema, any database error after the open.
* 2 — a usage or validation error: bad options, an application the queue refuses
  (unknown kind or target, args that are not a JSON object, unknown dependency, a
  limit exceeded, text that is not UTF-8), a missing database file for a read command,
  a database path SQLite cannot open. Nothing is written.

Errors are one line on stderr, prefixed ``ledgerq: error:`` (usage errors too: see
:func:`run_cli`), never a traceback. Human-readable output escapes control characters
(:func:`printable`); every read command has ``--json`` whose keys are a stable contract
(see docs and tests/cli/test_cli.py) and whose strings are exact. Read commands (``ls``,
``show``, ``stats``, ``verify``) open the database read-only.
The database comes from ``--db`` (on the command or before it), else ``LEDGERQ_DB``,
else ``./ledgerq.db``.
"""

# Each command module registers its commands on the one app when imported, and
# ``ledgerq --help`` lists them in registration order: hence this order, not sorted.
# isort: off
from ledgerq.cli import tasks  # noqa: F401
from ledgerq.cli import worker  # noqa: F401
from ledgerq.cli import log  # noqa: F401
from ledgerq.cli import stats  # noqa: F401
from ledgerq.cli import specs  # noqa: F401
from ledgerq.cli import demo  # noqa: F401
from ledgerq.cli import migrate  # noqa: F401
from ledgerq.cli import schedules  # noqa: F401
from ledgerq.cli import output  # noqa: F401
from ledgerq.cli import retry  # noqa: F401
from ledgerq.cli import archive  # noqa: F401
from ledgerq.cli import watch  # noqa: F401
from ledgerq.cli import workers  # noqa: F401
from ledgerq.cli import serve  # noqa: F401
from ledgerq.cli import entities  # noqa: F401
# isort: on
from ledgerq.cli.app import app, main, run_cli

# ``run`` and ``_DB_THREAD_SUFFIX`` are not part of the interface (not in __all__);
# tests/cli/test_cli_errors.py reaches them through ``ledgerq.cli`` as it did when the CLI
# was one module.
from ledgerq.cli.db import _DB_THREAD_SUFFIX as _DB_THREAD_SUFFIX
from ledgerq.cli.db import run as run
from ledgerq.cli.render import cell, printable

__all__ = ["app", "cell", "main", "printable", "run_cli"]
