"""A deterministic virtual-time asyncio event loop.

The loop never sleeps: when nothing is ready it jumps its clock to the next scheduled
handle. Models think in integer nanoseconds; asyncio thinks in float seconds, and the
two round-trip exactly for every time a simulation reaches (below ~100 days).
"""

from __future__ import annotations

import asyncio
import selectors
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
        if loop._ready:
            return []
        if loop._scheduled:
            loop._now = max(loop._now, loop._scheduled[0].when())
            return []
        if timeout is None:
            raise RuntimeError("virtual-time loop is idle with nothing scheduled: deadlock")
        loop._now += timeout
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
