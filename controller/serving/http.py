"""The HTTP servers we run (the arbiter's API, the dashboard, the emulator's drill endpoint):
uvicorn, with a client's waiting bounded in time and in number.

uvicorn's own bound, `limit_concurrency`, counts open connections, idle ones included, and
answers 503 to everyone beyond it: 16 idle sockets, which need no token, closed the drill
endpoint, and 64 half-sent requests the dashboard, for as long as they stayed open. Here,
instead:

- a request, head and body, must arrive whole within `request_timeout_s` of the connection
  (or of the previous response): otherwise the connection is closed;
- at most `max_waiting` connections may be waiting for their request to arrive; one more
  closes the longest waiting;

so a connection that is served is never refused for the ones that are not.

`HttpService` is the one lifecycle of each: started (listening) before it is registered
for its stop, stopped by the service scaffold (controller/serving/lifecycle.py), never by
uvicorn's own signal handling.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import socket
from collections.abc import Callable, Iterator, Mapping
from typing import Any
from urllib.parse import parse_qs

import h11
import uvicorn
from starlette.responses import JSONResponse
from uvicorn.protocols.http.h11_impl import H11Protocol

REQUEST_TIMEOUT_S = 10.0  # a request of ours is at most 64 KiB, sent at once by any client
MAX_WAITING = 128  # connections whose request has not yet arrived whole


class _Bounded(H11Protocol):
    """uvicorn's h11 protocol, armed with a deadline whenever the client owes a request."""

    request_timeout_s = REQUEST_TIMEOUT_S
    max_waiting = MAX_WAITING

    # (type: ignore below: uvicorn's own signature)
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._deadline: asyncio.TimerHandle | None = None
        self._arm()
        waiting = [c for c in self.connections if isinstance(c, _Bounded) and c._owes()]
        if len(waiting) > self.max_waiting:
            min(waiting, key=lambda c: c._since)._expire()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()  # the next request (keep-alive) is owed from now

    def handle_websocket_upgrade(self, event: h11.Request) -> None:
        self._disarm()  # the transport is the websocket's from here
        super().handle_websocket_upgrade(event)

    def _owes(self) -> bool:
        """Whether the client has still to send (the rest of) a request."""
        return self._deadline is not None and self.conn.their_state in (h11.IDLE, h11.SEND_BODY)

    def _arm(self) -> None:
        self._disarm()
        self._since = self.loop.time()
        self._deadline = self.loop.call_later(self.request_timeout_s, self._expire_if_owed)

    def _disarm(self) -> None:
        if getattr(self, "_deadline", None) is not None:
            self._deadline.cancel()  # type: ignore[union-attr]  # not None: checked above
            self._deadline = None

    def _expire_if_owed(self) -> None:
        if self._owes():
            self._expire()
        else:
            self._deadline = None  # answering: on_response_complete arms it again

    def _expire(self) -> None:
        self._disarm()
        if not self.transport.is_closing():
            self.transport.close()


class _Server(uvicorn.Server):
    """uvicorn's server without its signal handling: the service scaffold stops it (a
    signal taken by uvicorn was raised again after its stop, as a KeyboardInterrupt)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def server(app: Any, host: str, port: int, *, request_timeout_s: float = REQUEST_TIMEOUT_S,
           max_waiting: int = MAX_WAITING, **config: Any) -> uvicorn.Server:
    """A uvicorn server for `app` with the bounds above (`config`: uvicorn.Config's own)."""
    protocol = type("BoundedH11", (_Bounded,), {"request_timeout_s": request_timeout_s,
                                                 "max_waiting": max_waiting})
    return _Server(uvicorn.Config(app, host=host, port=port, http=protocol,
                                  log_level="warning", lifespan="off", access_log=False,
                                  **config))


class HttpService:
    """One HTTP server on the running loop: `await start()` returns once it listens (or
    raises why it cannot, e.g. the port is taken), `await stop()` closes it."""

    def __init__(self, app: Any, host: str, port: int, **config: Any) -> None:
        self.host = host
        self.server = server(app, host, port, **config)
        self.tls = bool(config.get("ssl_certfile"))
        self._task: asyncio.Task[None] | None = None

    @property
    def port(self) -> int:
        return int(self.server.servers[0].sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"

    async def start(self) -> HttpService:
        """Bound here, so that a taken port is an OSError that says so (uvicorn's own
        bind logs it and exits the process)."""
        cfg = self.server.config
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on sockets that say they are
        # TCP, and without it every answer waited 40 ms on the client's delayed ACK (Nagle:
        # 44 ms a request from httpx, against 1.5 ms)
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, cfg.port))
        except OSError as e:
            sock.close()
            raise OSError(f"cannot listen on {self.host}:{cfg.port}: "
                          f"{e.strerror or e}") from None
        self._task = asyncio.create_task(self._serve(sock))
        while not self.server.started:
            if self._task.done():
                self._task.result()
                raise OSError(f"{self.host}:{cfg.port}: the server stopped while starting")
            await asyncio.sleep(0.01)
        return self

    async def _serve(self, sock: socket.socket) -> None:
        try:
            await self.server.serve(sockets=[sock])
        except SystemExit:  # uvicorn's way to say it could not start: logged already
            raise OSError(f"the server on {self.host} could not start") from None
        finally:
            sock.close()

    async def wait(self) -> None:
        """Until the server ends by itself (it never does unless it fails)."""
        if self._task is not None:
            await asyncio.shield(self._task)

    async def stop(self) -> None:
        if self._task is None:
            return
        self.server.should_exit = True
        try:
            async with asyncio.timeout(5.0):
                await asyncio.shield(self._task)
        except TimeoutError:  # open connections that will not close: closed for them
            self.server.force_exit = True
            await self._task
        self._task = None


class BearerToken:
    """Who is asking, for every HTTP service of ours: each request (and websocket) carries
    a token, `Authorization: Bearer TOKEN` (or `?token=TOKEN` where `query`: a browser's
    page); the party it names goes into `scope["party"]`, compared in constant time with
    every known token (none matched sooner than another). Without a known one: 401, or a
    websocket closed (1008), said to `refused(why)` (a service counts them), and nothing
    behind it runs. `tokens` is read at each request: a token revoked is gone at once."""

    def __init__(self, app: Any, tokens: Mapping[str, Any], *, query: bool = False,
                 hint: str = "Authorization: Bearer TOKEN",
                 refused: Callable[[str], None] = lambda why: None) -> None:
        self.app, self.tokens, self.query, self.hint = app, tokens, query, hint
        self.refused = refused

    def party(self, given: str) -> Any:
        found = None
        g = given.encode()
        for token, party in list(self.tokens.items()):
            if hmac.compare_digest(token.encode(), g):
                found = party
        return found if given else None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        auth = dict(scope.get("headers") or []).get(b"authorization", b"").decode("latin-1")
        given = auth.removeprefix("Bearer ").strip() if auth.startswith("Bearer ") else ""
        if not given and self.query:
            given = (parse_qs(scope.get("query_string", b"").decode("latin-1"))
                     .get("token") or [""])[0]
        party = self.party(given)
        if party is None:
            self.refused(f"no valid token ({self.hint})")
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
            else:
                await JSONResponse({"error": f"no valid token ({self.hint})"}, 401)(
                    scope, receive, send)
            return
        scope["party"] = party
        await self.app(scope, receive, send)
