"""``ledgerq serve``: the HTTP API, the live dashboard and Prometheus metrics.

A thin binding over the library: every write goes through ``submit_task``/``cancel_task``
(the same validation, the same messages), every read through ``ledgerq.projections``.
Nothing here holds SQL or imports a database driver.
"""

from ledgerq.web.app import create_app
from ledgerq.web.config import ServeConfig

__all__ = ["ServeConfig", "create_app"]
