"""Which callable runs a claimed row, chosen by its action kind."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ledgerq.queue.worker.launcher import ExecuteFn, default_execute


@dataclass
class Executors:
    """Which callable runs which action kind: adapters first, then ``execute``, then default.

    ``workflow`` has no default: without an adapter its rows are never claimed.
    """

    execute: ExecuteFn | None = None
    adapters: Mapping[str, ExecuteFn] = field(default_factory=dict)

    def for_kind(self, kind: str) -> ExecuteFn | None:
        if kind in self.adapters:
            return self.adapters[kind]
        if kind == "workflow":
            return None
        return self.execute or default_execute

    def excluded_kinds(self) -> list[str]:
        return [] if "workflow" in self.adapters else ["workflow"]
