"""A deterministic virtual-time asyncio event loop.

The loop never sleeps: when nothing is ready it jumps its clock to the next event. Models
schedule on an integer-nanosecond heap of their own (`call_at_ns`: entries compared in C,
cancelled by clearing the callback), which is several times cheaper than asyncio timer
handles; asyncio's own timers (sleep, wait_for) work alongside and are rounded up to the
next nanosecond. Exceptions raised by model callbacks go to the loop's exception handler,
as they would from any asyncio callback.
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import math
import selectors
from collections.abc import Callable
from typing import Any

from oddl.controller.service.backend import Stalled

# cancelled entries wait in the heap for their time; when more than this many, and over
# half of it, are cancelled, they are swept out (a congestion law re-times every active
# flow's finish each tick: in cassini-fattree's DCQCN network the stale entries made a
# quarter of the run's time the heap's compares)
SWEEP_FROM = 1024


class VHandle(list):
    """[t_ns, seq, callback, args, events]; cancel() clears the callback, and counts it
    with the loop's events, which sweep the heap when it is mostly cancelled entries."""

    __slots__ = ()

    def cancel(self) -> None:
        if self[2] is not None:
            self[2] = None
            ev: Events = self[4]
            ev.cancelled += 1
            if ev.cancelled > SWEEP_FROM and 2 * ev.cancelled > len(ev.heap):
                ev.sweep()

    def cancelled(self) -> bool:
        return self[2] is None


class Events:
    """The model events: their heap, the virtual now, and what runs them. What every
    event's scheduling and running touches is here, apart from the asyncio loop, so that
    it is a typed class where compiled (sim/clock.pxd): its fields C fields, its loop C
    code. The loop hands out these methods as its own (`VirtualClockLoop`)."""

    def __init__(self) -> None:
        self.heap: list[VHandle] = []
        self.now = 0
        self.seq = 0
        self.cancelled = 0  # at least as many entries of the heap are cancelled
        self.events = 0  # model events run: the simulator's throughput figure

    def now_ns(self) -> int:
        return self.now

    def call_at_ns(self, t_ns: int, cb: Callable[..., Any], *args: Any) -> VHandle:
        self.seq += 1
        h = VHandle((t_ns, self.seq, cb, args, self))
        heapq.heappush(self.heap, h)
        return h

    def call_later_ns(self, delay_ns: int, cb: Callable[..., Any], *args: Any) -> VHandle:
        self.seq += 1
        h = VHandle((self.now + delay_ns, self.seq, cb, args, self))
        heapq.heappush(self.heap, h)
        return h

    def reserve_at_ns(self, t_ns: int, cb: Callable[..., Any], *args: Any) -> VHandle:
        """An event whose place in the order is taken now, as `call_at_ns` would take it,
        but not yet in the heap: `schedule` puts it there, any time before it is due (a
        flow's finish that the next tick of its law re-times first, as a rule)."""
        self.seq += 1
        return VHandle((t_ns, self.seq, cb, args, self))

    def rereserve(self, h: VHandle, t_ns: int) -> None:
        """A reserved event, not in the heap, moved to `t_ns`: its place in the order taken
        again now, as `reserve_at_ns` would take it for a new one (a held finish that its
        law's tick re-times again, nearly every tick: no new handle each time)."""
        self.seq += 1
        h[0] = t_ns
        h[1] = self.seq

    def schedule(self, h: VHandle) -> None:
        """A reserved event into the heap, in the place it reserved."""
        heapq.heappush(self.heap, h)

    def sweep(self) -> None:
        """The heap without its cancelled entries, in place (`run` holds it): the live
        ones keep their (time, sequence) order, so they run as they would have."""
        heap = self.heap
        heap[:] = [h for h in heap if h[2] is not None]
        heapq.heapify(heap)
        self.cancelled = 0

    def run(self, limit_ns: int | None, ready: collections.deque[asyncio.Handle],
            loop: asyncio.AbstractEventLoop) -> None:
        """Run events in time order, up to `limit_ns` (None: no limit), until something
        asyncio-level is `ready`; a callback's exception goes to the loop's handler."""
        heap = self.heap
        pop = heapq.heappop
        n = 0
        try:
            while heap and not ready:
                h = heap[0]
                t = h[0]
                if limit_ns is not None and t > limit_ns:
                    break
                pop(heap)
                cb = h[2]
                if cb is None:
                    self.cancelled -= 1
                    continue
                self.now = t
                n += 1
                try:
                    cb(*h[3])
                except (SystemExit, KeyboardInterrupt):
                    raise
                except BaseException as e:
                    loop.call_exception_handler({"message": f"exception in {cb!r}",
                                                 "exception": e})
        finally:
            self.events += n


class _VirtualSelector(selectors.BaseSelector):
    """A selector with no file objects: `select()` runs due model events or advances time."""

    def __init__(self, loop: VirtualClockLoop) -> None:
        self._loop = loop
        self._map: dict[Any, selectors.SelectorKey] = {}

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        raise RuntimeError("the virtual-time loop has no real I/O (sim back end: no sockets)")

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        raise KeyError(fileobj)

    def select(self, timeout: float | None = None) -> list[Any]:
        self._loop._advance()
        return []

    def close(self) -> None:
        self._map.clear()

    def get_map(self) -> dict[Any, selectors.SelectorKey]:
        return self._map


class VirtualClockLoop(asyncio.BaseEventLoop):
    """asyncio loop whose `time()` is virtual; run_until_complete finishes in CPU time.

    Its model events are `Events`': `call_at_ns`, `call_later_ns`, `now_ns`,
    `reserve_at_ns`, `rereserve` and `schedule` are that object's methods, handed out
    as the loop's own (a model's every event calls one: no call of the loop's between)."""

    # asyncio's BaseEventLoop keeps these (its ready callbacks, its timers); typeshed
    # does not declare them
    _ready: collections.deque[asyncio.Handle]
    _scheduled: list[asyncio.TimerHandle]
    now_ns: Callable[[], int]
    call_at_ns: Callable[..., VHandle]
    call_later_ns: Callable[..., VHandle]
    reserve_at_ns: Callable[..., VHandle]
    rereserve: Callable[[VHandle, int], None]
    schedule: Callable[[VHandle], None]

    def __init__(self) -> None:
        super().__init__()
        ev = self._model = Events()
        self.now_ns, self.call_at_ns, self.call_later_ns = \
            ev.now_ns, ev.call_at_ns, ev.call_later_ns
        self.reserve_at_ns, self.rereserve, self.schedule = \
            ev.reserve_at_ns, ev.rereserve, ev.schedule
        self._selector = _VirtualSelector(self)
        self._clock_resolution = 1e-9

    @property
    def events(self) -> int:
        """Model events run: the simulator's throughput figure."""
        return self._model.events

    def time(self) -> float:
        return self._model.now * 1e-9

    def pending(self) -> list[tuple[int, Callable[..., Any], tuple[Any, ...]]]:
        """What is scheduled, as (t_ns, callback, args): the model events in the order
        they will run, then asyncio's timers in theirs (sim/steady.py keys them)."""
        out = [(h[0], h[2], h[3]) for h in sorted(self._model.heap) if h[2] is not None]
        timers: list[Any] = sorted(self._scheduled, key=lambda h: h.when())
        return out + [(math.ceil(h.when() * 1e9 - 1e-3), h._callback, h._args)
                      for h in timers if not h.cancelled()]

    def _advance(self) -> None:
        """Run model events in time order until something asyncio-level becomes runnable."""
        if self._ready:
            return
        ev = self._model
        t_async = self._scheduled[0].when() if self._scheduled else math.inf
        limit_ns = math.ceil(t_async * 1e9 - 1e-3) if t_async != math.inf else None
        ready = self._ready
        ev.run(limit_ns, ready, self)
        vheap = ev.heap
        if ready or (vheap and (limit_ns is None or vheap[0][0] <= limit_ns)):
            return
        if self._scheduled:
            ev.now = max(ev.now, limit_ns or 0)
            return
        if not vheap:
            raise Stalled("virtual-time loop is idle with nothing scheduled: deadlock")

    def _process_events(self, event_list: list[Any]) -> None:
        return None

    def _write_to_self(self) -> None:
        return None

    def close(self) -> None:
        super().close()
        self._selector.close()
