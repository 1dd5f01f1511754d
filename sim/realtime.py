"""The real-time loop the emulated devices run on: microsecond timers, no sleepy wake-ups.

Emulated devices keep nanosecond-scale times (a 10.5 ns tune, 50 ns of fibre) and
millisecond bursts on a real clock. Two things of the host get in the way:
- epoll (asyncio's default) sleeps to the millisecond: select() sleeps to the microsecond;
- waking a sleeping process costs what the machine's idle states cost: measured on the
  2-core VMs here, a 4 ms timer fires 170 us late at the median, 500 us at p99.
So the selector polls instead of sleeping while the devices are busy: for `spin_s` after
any activity and for the last `spin_s` before a timer falls due. Between bursts (a
training step's compute) it sleeps as usual. It costs CPU while traffic flows and buys
device timing within a few microseconds (docs/emu-run.md has the figures).
"""

from __future__ import annotations

import asyncio
import selectors
import time
from typing import Any

DEFAULT_SPIN_S = 0.002


class SpinSelector(selectors.SelectSelector):
    def __init__(self, spin_s: float = DEFAULT_SPIN_S) -> None:
        super().__init__()
        self.spin_s = spin_s
        self._busy = 0.0  # when something last happened

    def select(self, timeout: float | None = None) -> list[tuple[Any, int]]:
        now = time.monotonic()
        spin = self.spin_s
        deadline = float("inf") if timeout is None else now + max(timeout, 0.0)
        spin_end = deadline if deadline - now <= spin else self._busy + spin
        if spin > 0 and spin_end > now:
            while True:
                ready = super().select(0)
                t = time.monotonic()
                if ready or t >= deadline:
                    self._busy = t
                    return ready
                if t >= spin_end:
                    break
            now = t
        # sleep, but wake `spin` before the next timer to poll into it
        wait = None if deadline == float("inf") else max(deadline - now - spin, 0.0)
        ready = super().select(wait)
        if ready:
            self._busy = time.monotonic()
        return ready


def new_loop(spin_s: float = DEFAULT_SPIN_S) -> asyncio.AbstractEventLoop:
    """An event loop for emulated devices (spin_s = 0: a plain select() loop)."""
    return asyncio.SelectorEventLoop(SpinSelector(spin_s))
