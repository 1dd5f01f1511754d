"""Integer-nanosecond scheduling on any asyncio loop (virtual in sim, real in emu/hw)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

NS = 1e-9


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
