"""Python's cyclic garbage collector while oddl simulates or plans.

A run allocates small objects by the million (flows, events, messages, schedule steps),
most of them short-lived. With the default young generation (700 allocations) the
collector scanned the survivors thousands of times a second: a third of a 1,024-node
ring's run, a quarter of a 4,096-node plan (docs/performance.md).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

YOUNG = 10_000  # allocations between young collections while tuned


@contextlib.contextmanager
def tuned() -> Iterator[None]:
    """A larger young generation for the duration; the thresholds restored, and whatever
    was frozen meanwhile (`gc.freeze()`: what a run set up) thawed, on the way out."""
    thresholds = gc.get_threshold()
    gc.set_threshold(YOUNG, *thresholds[1:])
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
