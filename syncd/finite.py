"""JSON that browsers read: a non-finite float (NaN, an infinity) becomes null.

Python's json writes NaN and Infinity, which JSON.parse refuses, so one diverged
loss would stop a page's live updates. Every figure that leaves for a page or an
API client passes through `finite` first.
"""

from __future__ import annotations

import math
from typing import Any


def finite(value: Any) -> Any:
    """`value` with every non-finite float in it, however deep, replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value
