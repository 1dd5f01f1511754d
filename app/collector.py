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

# allocations between young collections while tuned. A run's ODDL core makes no cyclic
# garbage (10 objects in all, in Table 1's 200 iterations or grid-4096's iteration, under
# gc.DEBUG_SAVEALL: tests/test_experiment.py), so a young collection finds nothing; it
# walks what lives, and grid-4096's event heap and flows keep ~10,000 young objects alive:
# at 10,000, 188 young collections took 0.63 s of its 7.9 s iteration, at 100,000 nine
# took 0.17 s (gc.callbacks); Table 1's network: 8 (6 ms) and none. What a run that does
# make cycles can hold between collections: 100,000 objects, some 10 MB.
YOUNG = 100_000
# young collections between older ones, while tuned: a run's survivors are its models,
# frozen after setup, and what dies in cycles dies young.
# grid-4096's HD iteration: 0.91 of the time at 10 (Python's default; 3 pairs, 0.81 to
# 1.10), the same peak (489 MB); Table 1's ODDL network: no clear change (0.90 and 1.04
# in two sets of 5 pairs), the same peak
OLDER = 100


@contextlib.contextmanager
def tuned() -> Iterator[None]:
    """A larger young generation, older ones collected less often, for the duration; the
    thresholds restored, and whatever was frozen meanwhile (`gc.freeze()`: what a run set
    up) thawed, on the way out."""
    thresholds = gc.get_threshold()
    gc.set_threshold(YOUNG, OLDER, OLDER)
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
