"""Integer-nanosecond scheduling on any asyncio loop (virtual in sim, real in emu/hw)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

NS = 1e-9


class Clock:
    """Integer-nanosecond view of an asyncio loop, shared by models and controller code.

    The same object wraps a virtual loop (sim) or a real one (emu, hw), so nothing that
    schedules through it knows which it has. A loop with a native nanosecond scheduler
    (`call_at_ns`, `now_ns`) is used directly; any other goes through `call_at`.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        native_at = getattr(loop, "call_at_ns", None)
        native_now = getattr(loop, "now_ns", None)
        if native_at is not None and native_now is not None:
            self.call_at_ns = native_at  # type: ignore[method-assign]
            self.now_ns = native_now  # type: ignore[method-assign]

    def now_ns(self) -> int:
        return round(self.loop.time() * 1e9)

    def call_at_ns(self, t_ns: int, cb: Callable[..., Any], *args: Any) -> Any:
        return self.loop.call_at(t_ns * NS, cb, *args)

    def call_later_ns(self, delay_ns: int, cb: Callable[..., Any], *args: Any) -> Any:
        return self.call_at_ns(self.now_ns() + delay_ns, cb, *args)

    def call_soon(self, cb: Callable[..., Any], *args: Any) -> asyncio.Handle:
        return self.loop.call_soon(cb, *args)
