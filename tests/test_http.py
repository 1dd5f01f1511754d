"""Our HTTP servers bound what a client that never finishes its request can hold: idle and
half-sent connections neither lock others out nor stay open for ever (issue 33, 7 and 8)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import websockets
from oddl.app.dashboard import MAX_WATCHERS, Dashboard
from oddl.controller.base.config import load_testbed
from oddl.controller.serving.http import HttpService
from oddl.drivers.mqtt import MQTTBus
from oddl.sim.devices.control import ControlEndpoint
from oddl.sim.devices.faults import Drill
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

pytestmark = pytest.mark.realtime  # sockets


@contextlib.asynccontextmanager
async def serving(srv: HttpService) -> AsyncIterator[str]:
    await srv.start()
    try:
        yield f"127.0.0.1:{srv.port}"
    finally:
        for w in _KEPT:
            w.close()
        _KEPT.clear()
        await srv.stop()


_KEPT: list[asyncio.StreamWriter] = []  # a writer collected closes its connection


async def _hang(addr: str, n: int, sent: bytes) -> list[asyncio.StreamReader]:
    """n connections that send `sent` (nothing, or part of a request) and then wait."""
    host, port = addr.split(":")
    out = []
    for _ in range(n):
        r, w = await asyncio.open_connection(host, int(port))
        w.write(sent)
        await w.drain()
        _KEPT.append(w)
        out.append(r)
    return out


HALF = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "  # the head never ends


def test_idle_connections_do_not_close_the_drill_endpoint(root: Path) -> None:
    """Reproducer: 16 idle connections, which need no token, made every drill request 503."""
    tb = load_testbed(root / "hw_configs/prototype-4node.toml")

    async def go() -> int:
        async with serving(ControlEndpoint(tb, Drill(None, None, []), "t").http) as addr:
            await _hang(addr, 40, b"")
            async with httpx.AsyncClient(base_url=f"http://{addr}") as c:
                r = await c.get("/faults", headers={"authorization": "Bearer t"})
            return r.status_code

    assert asyncio.run(go()) == 200


def test_half_sent_requests_and_open_websockets_do_not_close_the_dashboard(root: Path) -> None:
    """Reproducer: 64 half-sent requests, or 70 open websockets, gave everyone 503 for as
    long as they stayed open. Watchers beyond MAX_WATCHERS are told so (1013), and the page
    and the API still answer."""
    tb = load_testbed(root / "hw_configs/prototype-4node.toml")
    dash = Dashboard(tb, MQTTBus(tb.name, "127.0.0.1", 1, user="oddl-dash", readonly=True))

    async def go() -> tuple[int, int, int | None]:
        async with serving(dash.http) as addr:
            await _hang(addr, 64, HALF)
            socks = [await websockets.connect(f"ws://{addr}/ws") for _ in range(70)]
            over = socks[MAX_WATCHERS]
            with contextlib.suppress(websockets.ConnectionClosed):
                await over.recv()
            async with httpx.AsyncClient(base_url=f"http://{addr}") as c:
                page = (await c.get("/")).status_code
                state = (await c.get("/api/state")).status_code
            for s in socks:
                await s.close()
            return page, state, over.close_code

    assert asyncio.run(go()) == (200, 200, 1013)


def test_a_request_that_never_arrives_whole_is_closed_and_the_longest_waiting_goes_first(
        ) -> None:
    async def ok(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok" + (await request.body()).decode())

    app = Starlette(routes=[Route("/", ok, methods=["GET", "POST"])])
    srv = HttpService(app, "127.0.0.1", 0, request_timeout_s=0.5, max_waiting=8)

    async def go() -> tuple[list[bytes], list[bytes], int, bytes]:
        async with serving(srv) as addr:
            # half a head, and a head with half its body: both closed at the deadline
            slow = await _hang(addr, 2, HALF)
            slow += await _hang(addr, 2, b"POST / HTTP/1.1\r\nHost: x\r\n"
                                         b"Content-Length: 100\r\n\r\nabc")
            closed = [await asyncio.wait_for(r.read(), 5) for r in slow]
            # beyond 8 waiting, the longest waiting is closed at once
            first = await _hang(addr, 1, b"")
            await _hang(addr, 8, HALF)
            evicted = [await asyncio.wait_for(r.read(), 0.4) for r in first]
            async with httpx.AsyncClient(base_url=f"http://{addr}") as c:
                r = await c.get("/")
            return closed, evicted, r.status_code, r.content

    closed, evicted, status, body = asyncio.run(go())
    assert closed == [b""] * 4 and evicted == [b""]
    assert (status, body) == (200, b"ok")


def test_answers_leave_at_once_not_behind_nagle() -> None:
    """The connections our servers accept have TCP_NODELAY: without it (a listening socket
    made without naming TCP, which asyncio then leaves alone), every answer to httpx
    waited 40 ms on the client's delayed ACK (44 ms a request, against 1.5 ms)."""
    import socket

    seen: list[int] = []

    async def ok(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    srv = HttpService(Starlette(routes=[Route("/", ok)]), "127.0.0.1", 0)

    async def go() -> None:
        async with serving(srv) as addr, httpx.AsyncClient(base_url=f"http://{addr}") as c:
            assert (await c.get("/")).status_code == 200  # kept alive: still connected
            for conn in srv.server.server_state.connections:
                sock = conn.transport.get_extra_info("socket")
                seen.append(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

    asyncio.run(go())
    assert seen and all(seen), seen
