"""The emulator's real-time selector: polls while devices are busy, never starves I/O."""

from __future__ import annotations

import asyncio
import selectors
import socket

import pytest
from oddl.sim.devices.realtime import SpinSelector, new_loop

pytestmark = pytest.mark.realtime  # brokers, emulators, sockets: the wall clock


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


def test_garbage_is_collected_when_idle_not_while_busy() -> None:
    import gc
    import weakref

    class Node:
        pass

    def cycles(n: int) -> list[weakref.ref[Node]]:
        refs = []
        for _ in range(n):
            a, b = Node(), Node()
            a.other, b.other = b, a  # type: ignore[attr-defined]  # only gc frees these
            refs.append(weakref.ref(a))
        return refs

    was = gc.isenabled()
    gc.collect()
    gc.disable()
    sel = SpinSelector(0.0, collect_when_idle=True)
    try:
        refs = cycles(2000)
        assert sel.select(0.001) == []  # a short wait: busy, nothing collected
        assert sel.collections == 0 and all(r() is not None for r in refs)
        assert sel.select(0.02) == []  # a wait longer than IDLE_S: collect first
        assert sel.collections == 1 and all(r() is None for r in refs)
    finally:
        sel.close()
        if was:
            gc.enable()


def test_serves_past_file_descriptor_1024() -> None:
    """Reproducer (issue 13): `oddl emulate` crashed at about 1,000 open connections
    (ValueError: filedescriptor out of range in select()). The loop serves the 1,100th."""
    async def main() -> bytes:
        async def echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            w.write(await r.read(8))
            await w.drain()

        server = await asyncio.start_server(echo, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(1100)]
        try:
            assert max(w.get_extra_info("socket").fileno() for _, w in held) >= 1024
            r, w = held[-1]
            w.write(b"ping")
            return await asyncio.wait_for(r.read(8), 10)
        finally:
            for _, w in held:
                w.close()
            server.close()

    with asyncio.Runner(loop_factory=lambda: new_loop(0.002)) as runner:
        assert runner.run(main()) == b"ping"
