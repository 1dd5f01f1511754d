"""A deterministic virtual-time asyncio event loop.

The loop never sleeps: when nothing is ready it jumps its clock to the next scheduled
handle. Models think in integer nanoseconds; asyncio thinks in float seconds, and the
two round-trip exactly for every time a simulation reaches (below ~100 days).
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Callable
from typing import Any

NS = 1e-9


class _VirtualSelector(selectors.BaseSelector):
    """A selector with no file objects: `select(timeout)` advances virtual time instead."""

    def __init__(self, loop: VirtualClockLoop) -> None:
        self._loop = loop
        self._map: dict[Any, selectors.SelectorKey] = {}

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        raise RuntimeError("the virtual-time loop has no real I/O (sim back end: no sockets)")

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        raise KeyError(fileobj)

    def select(self, timeout: float | None = None) -> list[Any]:
        loop = self._loop
        if loop._ready:  # noqa: SLF001 - something is runnable now: no time passes
            return []
        if loop._scheduled:  # noqa: SLF001
            loop._now = max(loop._now, loop._scheduled[0].when())  # noqa: SLF001
            return []
        if timeout is None:
            raise RuntimeError("virtual-time loop is idle with nothing scheduled: deadlock")
        loop._now += timeout  # noqa: SLF001
        return []

    def close(self) -> None:
        self._map.clear()

    def get_map(self) -> dict[Any, selectors.SelectorKey]:  # type: ignore[override]
        return self._map


class VirtualClockLoop(asyncio.BaseEventLoop):
    """asyncio loop whose `time()` is virtual; run_until_complete finishes in CPU time."""

    def __init__(self) -> None:
        super().__init__()
        self._now = 0.0
        self._selector = _VirtualSelector(self)
        self._clock_resolution = 1e-10  # handles 1 ns apart must not be merged

    def time(self) -> float:
        return self._now

    def _process_events(self, event_list: list[Any]) -> None:
        return None

    def _write_to_self(self) -> None:
        return None

    def close(self) -> None:
        super().close()
        self._selector.close()


class Clock:
    """Integer-nanosecond view of an asyncio loop, shared by models and controller code.

    The same object wraps a virtual loop (sim) or a real one (emu, hw), so nothing that
    schedules through it knows which it has.
    """

    __slots__ = ("_call_at", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._call_at = loop.call_at

    def now_ns(self) -> int:
        return round(self.loop.time() * 1e9)

    def call_at_ns(self, t_ns: int, cb: Callable[..., Any], *args: Any) -> asyncio.TimerHandle:
        return self._call_at(t_ns * NS, cb, *args)

    def call_later_ns(
        self, delay_ns: int, cb: Callable[..., Any], *args: Any
    ) -> asyncio.TimerHandle:
        return self._call_at((self.now_ns() + delay_ns) * NS, cb, *args)

    def call_soon(self, cb: Callable[..., Any], *args: Any) -> asyncio.Handle:
        return self.loop.call_soon(cb, *args)
