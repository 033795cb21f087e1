"""A dialect's SQL, kept by name in its ``queries.sql`` (Procrastinate's layout).

A file is a sequence of ``-- name: NAME`` headers, each followed by one statement
template. Templates hold the dialect's own SQL and placeholders; ``{braced}`` fields
are filled only with identifiers the registry validated (quoted by the dialect) or
with other templates of the same file, never with values.
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


class Queries:
    """One dialect's named templates, rendered (and cached) per set of identifiers."""

    def __init__(self, package: str) -> None:
        self.package = package
        self.templates = parse(resources.files(package).joinpath("queries.sql")
                               .read_text(encoding="utf-8"))
        self.render = lru_cache(maxsize=1024)(self._render)

    def _render(self, name: str, **fields: Any) -> str:
        try:
            template = self.templates[name]
        except KeyError:
            raise KeyError(f"{self.package} defines no query {name!r}") from None
        return template.format(**fields)

    def __call__(self, name: str, **fields: Any) -> str:
        return self.render(name, **fields)
