"""The C parts of the readers (tieredcore/formats/cbatch.c), or None.

None when the extension was not built (no C compiler at install), cannot be loaded (the package imported
from a zip on ``sys.path``, as Spark's --py-files ships it) or ``TIERED_NO_C`` is set; every caller then
reads in Python, which is also the reference the C readers are tested against.
"""

from __future__ import annotations

import os
from types import ModuleType


def _load() -> ModuleType | None:
    if os.environ.get("TIERED_NO_C", "") not in ("", "0"):
        return None
    try:
        from tieredcore.formats import cbatch
    except ImportError:
        return None
    return cbatch


cbatch = _load()
