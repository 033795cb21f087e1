"""A dialect's SQL, kept by name in its ``*.sql`` files (Procrastinate's layout).

A dialect's package holds one file per owner of the operations (``events.sql``,
``workers.sql``, ... as ``ledgerq.store.sqltx`` has one module per owner). A file is a
sequence of ``-- name: NAME`` headers, each followed by one statement template; a name
is defined once in all of a dialect's files. Templates hold the dialect's own SQL and
placeholders; ``{braced}`` fields are filled only with identifiers the registry
validated (quoted by the dialect) or with other templates of the dialect, never with
values.
"""

from __future__ import annotations

import re
from functools import lru_cache
from importlib import resources
from typing import Any

_HEADER = re.compile(r"^-- name: ([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)


def parse(text: str) -> dict[str, str]:
    """name -> template; a name given twice is an error (one operation, one text)."""
    parts = _HEADER.split(text)
    found: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in found:
            raise ValueError(f"query {name!r} is defined twice")
        lines = [ln for ln in body.strip().splitlines() if not ln.lstrip().startswith("--")]
        found[name] = "\n".join(lines).strip()
    return found


def load(package: str) -> dict[str, str]:
    """name -> template of every ``*.sql`` file of ``package``, read in name order; a name
    defined twice, in one file or in two, is an error."""
    files = sorted((f for f in resources.files(package).iterdir()
                    if f.name.endswith(".sql") and f.is_file()), key=lambda f: f.name)
    if not files:
        raise FileNotFoundError(f"{package} holds no *.sql file")
    found: dict[str, str] = {}
    where: dict[str, str] = {}
    for f in files:
        for name, template in parse(f.read_text(encoding="utf-8")).items():
            if name in found:
                raise ValueError(f"query {name!r} is defined twice ({where[name]}, {f.name})")
            found[name], where[name] = template, f.name
    return found


class Queries:
    """One dialect's named templates, rendered (and cached) per set of identifiers."""

    def __init__(self, package: str) -> None:
        self.package = package
        self.templates = load(package)
        self.render = lru_cache(maxsize=1024)(self._render)

    def _render(self, name: str, **fields: Any) -> str:
        try:
            template = self.templates[name]
        except KeyError:
            raise KeyError(f"{self.package} defines no query {name!r}") from None
        return template.format(**fields)

    def __call__(self, name: str, **fields: Any) -> str:
        return self.render(name, **fields)
