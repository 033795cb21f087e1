"""Storage: the StateDB handle and one subpackage per dialect (``sqlite/``, ``postgres/``).

Only ``store/<dialect>/`` imports a driver or holds SQL text; see
:mod:`ledgerq.operations` for the operations every dialect implements.
"""

from ledgerq.store.db import StateDB

__all__ = ["StateDB"]
