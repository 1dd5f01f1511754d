"""Integer-nanosecond scheduling on any asyncio loop (virtual in sim, real in emu/hw)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

NS = 1e-9


class _Due(threading.local):
    ns: int | None = None  # the instant the timer now running was due (see Clock)


_due = _Due()


class Clock:
    """Integer-nanosecond view of an asyncio loop, shared by models and controller code.

    The same object wraps a virtual loop (sim) or a real one (emu, hw), so nothing that
    schedules through it knows which it has. A loop with a native nanosecond scheduler
    (`call_at_ns`, `now_ns`) is used directly; any other goes through `call_at`.

    Device time on a real loop: a timer callback and everything it calls see "now" as
    the instant the timer was due, not the (later) instant a busy loop got round to it,
    exactly as on the virtual loop. A laser that locks at t starts its burst at t and the
    burst ends at t + duration, however late the emulator ran the lock event; a model's
    timeline does not slip with the CPU load of the process emulating it. Anything
    arriving from outside (a socket, a register write over the network) is at the real now.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        native_at = getattr(loop, "call_at_ns", None)
        native_now = getattr(loop, "now_ns", None)
        native_later = getattr(loop, "call_later_ns", None)
        if native_at is not None and native_now is not None:
            self.call_at_ns = native_at  # type: ignore[method-assign]
            self.now_ns = native_now  # type: ignore[method-assign]
            self.loop_ns = native_now  # type: ignore[method-assign]  # exactly: no floats
            if native_later is not None:
                self.call_later_ns = native_later  # type: ignore[method-assign]
            self.behind = _never  # type: ignore[method-assign,assignment]  # each at its instant

    def now_ns(self) -> int:
        due = _due.ns
        return due if due is not None else round(self.loop.time() * 1e9)

    def call_at_ns(self, t_ns: int, cb: Callable[..., Any], *args: Any) -> Any:
        return self.loop.call_at(t_ns * NS, _at, t_ns, cb, args)

    def call_later_ns(self, delay_ns: int, cb: Callable[..., Any], *args: Any) -> Any:
        return self.call_at_ns(self.now_ns() + delay_ns, cb, *args)

    def loop_ns(self) -> int:
        """The loop's own time now, never a timer's due time: what synchronous work took
        is measured on it (on a virtual loop it is the virtual now, and nothing passes)."""
        return round(self.loop.time() * 1e9)

    def call_soon(self, cb: Callable[..., Any], *args: Any) -> asyncio.Handle:
        return self.loop.call_soon(cb, *args)

    def behind(self, t_ns: int) -> bool:
        """Whether timers due before `t_ns` have yet to run. A late loop runs every timer
        it finds due in one pass, and the timers those set, though due as early, in the
        next: a callback that judges what should have happened by its own due time asks
        this first (never so on a virtual loop, which runs each timer at its instant)."""
        heap: list[asyncio.TimerHandle] | None = getattr(self.loop, "_scheduled", None)
        if heap is None:  # a loop that does not show its timers: whether it is late at all
            return self.loop_ns() > t_ns
        return bool(heap) and heap[0].when() < t_ns * NS


def _never(_t_ns: int) -> bool:
    return False


def _at(t_ns: int, cb: Callable[..., Any], args: tuple[Any, ...]) -> None:
    outer, _due.ns = _due.ns, t_ns
    try:
        cb(*args)
    finally:
        _due.ns = outer
