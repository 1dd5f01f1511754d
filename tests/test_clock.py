from __future__ import annotations

import asyncio

import pytest
from oddl.controller.base.clock import Clock
from oddl.sim.clock import VirtualClockLoop


def test_virtual_time_jumps_and_keeps_ns_order() -> None:
    loop = VirtualClockLoop()
    c = Clock(loop)
    seen: list[tuple[str, int]] = []
    c.call_at_ns(7, lambda: seen.append(("b", c.now_ns())))
    c.call_at_ns(6, lambda: seen.append(("a", c.now_ns())))
    c.call_at_ns(3_600_000_000_001, lambda: seen.append(("c", c.now_ns())))

    async def main() -> None:
        await asyncio.sleep(3601)

    loop.run_until_complete(main())
    assert seen == [("a", 6), ("b", 7), ("c", 3_600_000_000_001)]
    assert c.now_ns() == 3_601_000_000_000
    loop.close()


def test_idle_loop_with_pending_future_is_a_deadlock_not_a_hang() -> None:
    loop = VirtualClockLoop()
    fut = loop.create_future()
    with pytest.raises(RuntimeError, match="deadlock"):
        loop.run_until_complete(fut)
    loop.close()


def test_no_real_sockets() -> None:
    loop = VirtualClockLoop()

    async def main() -> None:
        await asyncio.open_connection("127.0.0.1", 9)

    with pytest.raises((RuntimeError, NotImplementedError)):
        loop.run_until_complete(main())
    loop.close()


@pytest.mark.realtime
def test_real_loop_timer_sees_the_instant_it_was_due() -> None:
    """Device time: a timer that a busy loop runs late still acts at its due instant, and
    what it schedules counts from there; anything else sees the real now."""
    import time

    loop = asyncio.new_event_loop()
    c = Clock(loop)
    seen: dict[str, int] = {}

    def hog() -> None:  # keep the loop busy past the timer's due time
        end = time.monotonic() + 0.005
        while time.monotonic() < end:
            pass

    def due() -> None:
        seen["due_now"] = c.now_ns()
        c.call_later_ns(1_000, lambda: seen.setdefault("chained", c.now_ns()))
        loop.call_soon(lambda: seen.setdefault("io_now", c.now_ns()))

    async def main() -> None:
        t = c.now_ns() + 1_000_000
        seen["t"] = t
        c.call_at_ns(t, due)
        loop.call_soon(hog)
        while "io_now" not in seen or "chained" not in seen:
            await asyncio.sleep(0.001)

    loop.run_until_complete(main())
    loop.close()
    assert seen["due_now"] == seen["t"]
    assert seen["chained"] == seen["t"] + 1_000
    assert seen["io_now"] >= seen["t"] + 4_000_000  # outside a timer: the real, late now


def test_a_heap_of_mostly_cancelled_events_is_swept_and_runs_as_before() -> None:
    """A congestion law re-times every active flow's finish each tick: the cancelled
    entries piled up in the heap, each push and pop comparing its way through them. Once
    they are most of it, they are swept out; the live events still run in (time,
    scheduling) order, ties included."""
    from oddl.sim.clock import SWEEP_FROM

    loop = VirtualClockLoop()
    c = Clock(loop)
    seen: list[int] = []
    flows = 16
    handles = [c.call_at_ns(100, seen.append, k) for k in range(flows)]
    most = 0
    for tick in range(1000):  # each flow's finish re-timed, as a law's tick does
        for k in range(flows):
            handles[k].cancel()
            handles[k].cancel()  # (twice: counted once)
            handles[k] = c.call_at_ns(100 + (k * 7 + tick) % 5, seen.append, k)
            most = max(most, len(loop._model.heap))
    assert most <= 2 * SWEEP_FROM + 2 * flows  # without the sweep: 16,016
    handles[3].cancel()

    async def main() -> None:
        await asyncio.sleep(1e-6)

    loop.run_until_complete(main())
    # the last tick's times; among equal times, the order they were scheduled in
    assert seen == sorted((k for k in range(flows) if k != 3),
                          key=lambda k: (100 + (k * 7 + 999) % 5, k))
    assert loop.events == flows - 1
    loop.close()


def test_a_reserved_event_moved_again_takes_its_new_place_in_the_order() -> None:
    """`rereserve`: a held finish re-timed by its law's next tick keeps its handle and
    takes its place in the order again, as a fresh reservation or `call_at_ns` would."""
    loop = VirtualClockLoop()
    c = Clock(loop)
    seen: list[str] = []
    a = loop.reserve_at_ns(50, seen.append, "a")
    c.call_at_ns(50, seen.append, "b")  # scheduled after a's first reservation
    loop.rereserve(a, 50)  # a's place now after b's
    d = loop.reserve_at_ns(40, seen.append, "d")
    loop.rereserve(d, 60)
    loop.schedule(a)
    loop.schedule(d)

    async def main() -> None:
        await asyncio.sleep(1e-6)

    loop.run_until_complete(main())
    assert seen == ["b", "a", "d"]
    assert (a[0], d[0]) == (50, 60)
    loop.close()
