"""The values a QICK board's soc takes and gives, as a cassette holds them
(drivers/soc_tape.py records and replays them; drivers/cassette.py's reader holds each to
`why_not_value` before a replay begins): numbers, text, lists, dicts as {"map": [[key,
value], ...]}, numpy arrays as {"nd": dtype, "shape", "data"}.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

MAX_ELEMENTS = 1 << 22  # of one array (a readout window of a Lightning run: ~6,000)
MAX_DEPTH = 32  # of a value's nesting


def why_not_value(v: Any, depth: int = 0) -> str | None:
    """Why `v` is not what `encode` makes, or None (read with the cassette, before any
    replay: an array is a number's, of its shape's size, within MAX_ELEMENTS)."""
    if depth > MAX_DEPTH:
        return f"nested deeper than {MAX_DEPTH}"
    if v is None or isinstance(v, bool | int | float | str):
        return None
    if isinstance(v, list):
        return next((w for x in v if (w := why_not_value(x, depth + 1))), None)
    if not isinstance(v, dict):
        return f"a {type(v).__name__}"
    if set(v) == {"map"} and isinstance(v["map"], list):
        for kv in v["map"]:
            if not isinstance(kv, list) or len(kv) != 2:
                return "a map's entry is not a [key, value] pair"
            if w := why_not_value(kv[0], depth + 1) or why_not_value(kv[1], depth + 1):
                return w
        return None
    if set(v) != {"nd", "shape", "data"}:
        return f"a dict that is neither a map nor an array: {sorted(v)[:5]}"
    shape, data = v["shape"], v["data"]
    try:
        dt = np.dtype(v["nd"]) if isinstance(v["nd"], str) else None
    except TypeError:
        dt = None
    if dt is None or dt.kind not in "biuf" or dt.itemsize > 8:
        return f"an array of dtype {str(v['nd'])[:20]!r}: not a number's"
    if not isinstance(shape, list) or not all(isinstance(n, int) and not isinstance(n, bool)
                                              and n >= 0 for n in shape):
        return "an array's shape is not a list of sizes"
    if not isinstance(data, list) or len(data) > MAX_ELEMENTS or \
            math.prod(shape) != len(data):
        return f"an array of shape {shape[:8]} does not hold its values (at most " \
               f"{MAX_ELEMENTS:,})"
    if not all(isinstance(x, int | float) for x in data):
        return "an array holds something other than numbers"
    return None


def encode(v: Any) -> Any:
    """`v` as JSON (TypeError for what does not cross a soc's boundary as data)."""
    if v is None or isinstance(v, bool | int | float | str):
        return v
    if isinstance(v, np.ndarray):
        return {"nd": v.dtype.str, "shape": list(v.shape), "data": v.ravel().tolist()}
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, list | tuple):
        return [encode(x) for x in v]
    if isinstance(v, dict):
        return {"map": [[encode(k), encode(x)] for k, x in v.items()]}
    raise TypeError(f"a {type(v).__name__} does not cross the soc's boundary as data")


def decode(v: Any) -> Any:
    """What `encode` made, back (the cassette's reader has held it to `why_not_value`)."""
    if isinstance(v, list):
        return [decode(x) for x in v]
    if not isinstance(v, dict):
        return v
    if "map" in v:
        return {_key(decode(k)): decode(x) for k, x in v["map"]}
    return np.array(v["data"], dtype=np.dtype(v["nd"])).reshape(v["shape"])


def _key(k: Any) -> Any:
    return tuple(k) if isinstance(k, list) else k  # (a key that was a tuple)
