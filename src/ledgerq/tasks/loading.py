"""Finding an app by name: ``pkg.module:app`` (or ``pkg.module``, whose ``app``), as
``ledgerq worker --app`` and ``$LEDGERQ_APP`` name it."""

from __future__ import annotations

import importlib
import os
import sys

from ledgerq.errors import InvalidInput
from ledgerq.tasks.app import App

#: The environment variable that names the app when ``--app`` is not given.
APP_ENV = "LEDGERQ_APP"


def load_app(spec: str) -> App:
    """The :class:`App` ``spec`` names; InvalidInput saying what could not be found.

    The current directory is importable, as it is for ``python -m``: a worker started
    next to the code finds it.
    """
    module_name, _, attribute = spec.partition(":")
    attribute = attribute or "app"
    if not module_name or not all(part.isidentifier() for part in module_name.split(".")) \
            or not all(part.isidentifier() for part in attribute.split(".")):
        raise InvalidInput(f"--app {spec!r}: expected MODULE:ATTRIBUTE, e.g. myproject.tasks:app")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        if exc.name is not None and module_name.startswith(exc.name):
            raise InvalidInput(f"--app {spec!r}: no module named {exc.name!r} "
                               f"(sys.path starts with {sys.path[0]!r})") from None
        raise
    found: object = module
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise InvalidInput(f"--app {spec!r}: module {module_name!r} has no "
                               f"attribute {attribute!r}")
        found = getattr(found, part)
    if not isinstance(found, App):
        raise InvalidInput(f"--app {spec!r}: {attribute} is a {type(found).__name__}, "
                           "not a ledgerq App")
    return found


__all__ = ["APP_ENV", "load_app"]
