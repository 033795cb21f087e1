"""Run a command the way a user without write permission would, even though tests run as root.

Root bypasses file permissions through CAP_DAC_OVERRIDE; dropping it (and
CAP_DAC_READ_SEARCH) from the bounding and inheritable sets keeps uid 0, so the
venv's interpreter under /root stays executable, while a 0444 file or a 0555
directory owned by root refuses writes exactly as it would refuse another user.
"""

from __future__ import annotations

import os
import shutil

CAPS = "-dac_override,-dac_read_search"


def without_write_permission() -> list[str] | None:
    """The argv prefix that drops the override, or None where it cannot be done."""
    if os.geteuid() != 0:
        return []  # permissions already apply to this user
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return None
    return [setpriv, "--bounding-set", CAPS, "--inh-caps", CAPS]
