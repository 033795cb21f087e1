"""``ledgerq serve``: the HTTP API, the live dashboard and Prometheus metrics.

A thin binding over the library: every write goes through ``submit_task``/``cancel_task``
(the same validation, the same messages), every read through ``ledgerq.projections``.
Nothing here holds SQL or imports a database driver.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ledgerq.web.app import create_app
    from ledgerq.web.config import ServeConfig


def __getattr__(name: str) -> Any:
    # Lazy: ``ledgerq.web.metrics`` and ``ledgerq.web.config`` serve the core install
    # (a worker's metrics, the CLI's option checks); only the app needs the server extra.
    if name == "create_app":
        from ledgerq.web.app import create_app

        return create_app
    if name == "ServeConfig":
        from ledgerq.web.config import ServeConfig

        return ServeConfig
    raise AttributeError(f"module 'ledgerq.web' has no attribute {name!r}")


__all__ = ["ServeConfig", "create_app"]
