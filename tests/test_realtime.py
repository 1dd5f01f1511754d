"""The emulator's real-time selector: polls while devices are busy, never starves I/O."""

from __future__ import annotations

import asyncio
import selectors
import socket

import pytest

from sim.realtime import SpinSelector, new_loop


@pytest.mark.parametrize("spin_s", [0.0, 0.002])
def test_ready_socket_is_reported_even_with_a_zero_timeout(spin_s: float) -> None:
    # asyncio asks select(0) whenever callbacks are ready; an early version returned []
    # without looking at the sockets, so a busy loop never read anything
    a, b = socket.socketpair()
    sel = SpinSelector(spin_s)
    try:
        sel.register(a, selectors.EVENT_READ)
        assert sel.select(0) == []
        b.send(b"x")
        assert [key.fileobj for key, _ in sel.select(0)] == [a]
        assert [key.fileobj for key, _ in sel.select(None)] == [a]
    finally:
        sel.close()
        a.close()
        b.close()


@pytest.mark.parametrize("spin_s", [0.0, 0.002])
def test_loop_runs_timers_and_io(spin_s: float) -> None:
    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        order: list[str] = []
        r, w = socket.socketpair()
        r.setblocking(False)
        got = loop.create_future()
        loop.add_reader(r, lambda: (order.append(r.recv(8).decode()), got.set_result(None)))
        loop.call_later(0.003, lambda: (order.append("timer"), w.send(b"io")))
        await asyncio.wait_for(got, 5)
        await asyncio.sleep(0.02)  # an idle stretch: it sleeps, then wakes for the timer
        loop.remove_reader(r)
        r.close()
        w.close()
        return order

    with asyncio.Runner(loop_factory=lambda: new_loop(spin_s)) as runner:
        assert runner.run(main()) == ["timer", "io"]
