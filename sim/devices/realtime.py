"""The real-time loop the emulated devices run on: microsecond timers, no sleepy wake-ups.

Emulated devices keep nanosecond-scale times (a 10.5 ns tune, 50 ns of fibre) and
millisecond bursts on a real clock. Two things of the host get in the way:
- epoll (asyncio's default) and poll() sleep to the millisecond (select() would sleep to the
  microsecond, but it cannot watch a file descriptor numbered 1024 or more: an emulator
  with a thousand connections crashed on it). So the sleep is cut to whole milliseconds,
  rounded down, and the rest is polled;
- waking a sleeping process costs what the machine's idle states cost: measured on the
  2-core VMs here, a 4 ms timer fires 170 us late at the median, 500 us at p99.
- the garbage collector stops the world when it likes: measured during an emu run,
  11 young-generation collections per training iteration (~90 us each), one middle one
  (up to 1.9 ms) and now and then a full one (50 ms).
So the selector polls instead of sleeping while the devices are busy (`wanted()`: the
emulator says when, a job running on them): for `spin_s` after any activity and for the
last `spin_s` before a timer falls due. Idle, it sleeps (an idle grid-64 emulator spun a
whole core before its heartbeats and keep-alives). Between bursts (a
training step's compute) it sleeps as usual, and that is when it collects garbage
(automatic collection off; the young generations when the loop is about to sleep for
longer than `IDLE_S`, all of them every `FULL_EVERY`-th time, and a young collection
anyway if `MAX_YOUNG` objects pile up with no idle moment). It costs CPU while traffic
flows and buys device timing within microseconds (docs/emu-run.md has the figures).
"""

from __future__ import annotations

import asyncio
import gc
import math
import selectors
import time
from collections.abc import Callable
from typing import Any

DEFAULT_SPIN_S = 0.002
IDLE_S = 0.010
FULL_EVERY = 20
MAX_YOUNG = 100_000
WANTED_S = 0.01  # how often the owner is asked whether its devices are busy


class SpinSelector(selectors.PollSelector):
    def __init__(self, spin_s: float = DEFAULT_SPIN_S, collect_when_idle: bool = False
                 ) -> None:
        super().__init__()
        self.spin_s = spin_s
        self.collect_when_idle = collect_when_idle  # the owner has switched gc off
        self.collections = 0
        self._busy = 0.0  # when something last happened
        self.wanted: Callable[[], bool] = lambda: True  # are the devices busy?
        self._wanted = (0.0, True)  # its last answer, and when (asked every WANTED_S)

    def _collect(self, wait: float | None) -> None:
        young = gc.get_count()[0]
        if wait is None or wait > IDLE_S:
            if young > 700:  # gc's own threshold, moved to where nobody waits
                self.collections += 1
                gc.collect(2 if self.collections % FULL_EVERY == 0 else 1)
        elif young > MAX_YOUNG:
            gc.collect(0)

    def _busy_devices(self, now: float) -> bool:
        if now - self._wanted[0] > WANTED_S:
            self._wanted = (now, self.wanted())
        return self._wanted[1]

    def select(self, timeout: float | None = None) -> list[tuple[Any, int]]:
        if not self._busy_devices(time.monotonic()):  # idle: sleep (poll rounds up)
            if self.collect_when_idle:
                self._collect(timeout)
            return super().select(timeout)
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
        # sleep, but wake `spin` before the next timer to poll into it; poll() sleeps in
        # whole milliseconds, rounding up: round down instead, and poll the remainder
        wait = None if deadline == float("inf") else max(deadline - now - spin, 0.0)
        if self.collect_when_idle:
            self._collect(wait)
        ready = super().select(None if wait is None else math.floor(wait * 1e3) / 1e3 - 1e-9)
        if ready:
            self._busy = time.monotonic()
        return ready


def new_loop(spin_s: float = DEFAULT_SPIN_S, collect_when_idle: bool = False
             ) -> asyncio.AbstractEventLoop:
    """An event loop for emulated devices (spin_s = 0: no spinning but the last
    millisecond before a timer).

    collect_when_idle: switch automatic garbage collection off for this process and
    collect in the loop's idle moments instead (for a process that runs only this loop)."""
    if collect_when_idle:
        gc.disable()
    return SpinLoop(SpinSelector(spin_s, collect_when_idle))


class SpinLoop(asyncio.SelectorEventLoop):
    """The loop on a SpinSelector, which its owner reaches (`spin`) to say when the
    devices are busy (`spin.wanted`)."""

    def __init__(self, selector: SpinSelector) -> None:
        super().__init__(selector)
        self.spin = selector
