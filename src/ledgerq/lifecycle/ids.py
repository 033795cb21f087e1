"""The ids of rows and facts, and the fencing tokens of leases: made on every write, so
made cheaply."""

from __future__ import annotations

import os
import time


def new_id() -> str:
    """A time-ordered (version 7) UUID string: 48-bit Unix milliseconds, then 74 random bits.

    Ids are primary keys of append-mostly tables; ordered keys land on the index's last
    page instead of a random one, so a group commit writes a few index pages, not one
    per row. Cheaper to make than ``str(uuid.uuid4())``, too.
    """
    h = ((time.time_ns() // 1_000_000).to_bytes(6, "big") + os.urandom(10)).hex()
    # The version digit (7) replaces the 13th digit; the variant's bits (10) the top two
    # of the 17th. Hex digits are sliced, not an integer masked: a third cheaper.
    return f"{h[:8]}-{h[8:12]}-7{h[13:16]}-{_VARIANT[h[16]]}{h[17:20]}-{h[20:]}"


#: A random hex digit -> the same digit with its top two bits set to the RFC 9562
#: variant (10): its two low bits stay random.
_VARIANT = {d: "89ab"[int(d, 16) & 3] for d in "0123456789abcdef"}


def new_token() -> str:
    """A fresh random token (128 bits as 32 hex digits, the shape of ``uuid4().hex``):
    a lease's fencing token, made by every claim, at a quarter of uuid4's cost."""
    return os.urandom(16).hex()
