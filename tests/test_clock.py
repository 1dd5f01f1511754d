from __future__ import annotations

import asyncio

import pytest

from controller.clock import Clock
from sim.clock import VirtualClockLoop


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
