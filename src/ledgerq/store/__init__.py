"""Storage: the StateDB handle and one subpackage per dialect (``sqlite/``, ``postgres/``).

Only ``store/<dialect>/`` imports a driver or holds SQL text. Every dialect implements
every operation declared by the engine (:mod:`ledgerq.lifecycle.store`) and by the queue's
wings (``ledgerq.queue.store``, ``ledgerq.queue.<wing>.store``), once, in
:mod:`ledgerq.store.sqltx`; the store imports nothing of the queue.
"""

from ledgerq.store.db import StateDB

__all__ = ["StateDB"]
