"""Property-based tests of any lifecycle, generated from its spec (needs the ``testing``
extra: ``pip install 'ledgerq[testing]'``).

``LifecycleMachine.for_entity("order", registry=...)`` is a Hypothesis stateful test of
one entity; :mod:`ledgerq.testing.strategies` draws its values and moves for tests of
your own. The pytest fixtures ``ledgerq_db`` and ``ledgerq_app`` come with the package
(a ``pytest11`` plugin, :mod:`ledgerq.testing.plugin`), which is why this package imports
Hypothesis only when one of its names is asked for: pytest loads the plugin in every
project that installs ledgerq, with or without the extra.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ledgerq.extras import require

if TYPE_CHECKING:
    from ledgerq.testing import strategies
    from ledgerq.testing.machine import LifecycleMachine, ModelRow

_NAMES = {"LifecycleMachine": "ledgerq.testing.machine", "ModelRow": "ledgerq.testing.machine",
          "strategies": "ledgerq.testing.strategies"}


def __getattr__(name: str) -> Any:
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'ledgerq.testing' has no attribute {name!r}")
    require("testing")
    found = importlib.import_module(module)
    return found if name == "strategies" else getattr(found, name)


__all__ = ["LifecycleMachine", "ModelRow", "strategies"]
