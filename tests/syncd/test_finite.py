"""JSON a browser reads (syncd/finite.py)."""

import json
import math

from syncd.finite import finite


def test_every_non_finite_float_however_deep_becomes_none():
    value = {"loss": math.nan, "islands": {"a": {"rate": math.inf, "ok": 1.5}},
             "curve": [1.0, -math.inf, (2, math.nan)], "name": "run", "count": 3}
    assert finite(value) == {"loss": None, "islands": {"a": {"rate": None, "ok": 1.5}},
                             "curve": [1.0, None, [2, None]], "name": "run", "count": 3}
    json.dumps(finite(value), allow_nan=False)  # strict JSON


def test_finite_values_pass_unchanged():
    assert finite({"a": [0.0, 1e300, -2]}) == {"a": [0.0, 1e300, -2]}
