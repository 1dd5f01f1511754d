"""`oddl dashboard`: a live web page of the testbed, fed from its MQTT bus.

It logs in as the read-only party `oddl-dash` and listens to what the testbed says anyway
(statuses, jobs, results, heartbeats) and to its telemetry (controller/base/telemetry.py): each
node's ports, and the controller's notes (plan, iterations, health, acceptance). `View`
folds all of it into one bounded picture; a Starlette app serves the page (its JS and CSS
ship in the package: labs are often offline) and pushes the picture over a websocket
whenever it changes, at most `PUSH_HZ` times a second.

It listens on 127.0.0.1. Anywhere else needs `--host` and a token: the page is then
opened as http://HOST:PORT/?token=..., and every request and the websocket must carry it.
A junk message is counted and dropped, as everywhere on the bus.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from importlib import resources
from pathlib import Path
from typing import Any

import msgspec
from oddl.controller.base.access import CONTROLLER
from oddl.controller.base.config import Testbed
from oddl.controller.base.telemetry import NOTE_TYPES, PortsNote
from oddl.controller.base.throttle import worth_logging
from oddl.controller.base.topology import Grid
from oddl.controller.service.health import Heartbeat, Heartbeats
from oddl.controller.serving import http
from oddl.controller.serving.lifecycle import Services
from oddl.controller.stage2.job import DECODE_ERRORS, JobEvent, JobSpec
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.websockets import WebSocket, WebSocketDisconnect

log = logging.getLogger(__name__)
PUSH_HZ = 5
MAX_WATCHERS = 32  # open websockets: one more is told to try later (1013)
MAX_POINTS = 2000  # iterations kept per network for the plot
MAX_ERRORS = 20  # node failures kept
MAX_NETWORKS = 16  # networks whose iterations and health are kept
MAX_JOBS = 8  # the arbiter's jobs whose iterations are kept, a series each
ASSETS = Path(str(resources.files("oddl.app") / "web"))


def _now_ms() -> float:
    return time.monotonic() * 1e3


class View:
    """The testbed as the bus tells it: bounded, whatever a peer sends."""

    def __init__(self, tb: Testbed) -> None:
        grid = Grid.from_testbed(tb)
        self.tb = tb.name
        self.period_ms = tb.monitor.heartbeat_ms
        self.testbed = {"name": tb.name, "rows": tb.grid.rows, "cols": tb.grid.cols,
                        "nodes": [{"id": n.id, "row": n.row, "col": n.col} for n in tb.nodes],
                        "wss": [w.id for w in tb.wss],
                        "wavelengths_nm": list(tb.optical.wavelengths()),
                        "heartbeat_ms": self.period_ms}
        self.known = set(grid.nodes)
        self.status: dict[str, str] = {}
        self.beats: dict[str, tuple[float, Heartbeat]] = {}
        self.ports: dict[str, tuple[float, PortsNote]] = {}
        self.rates: dict[str, float] = {}  # node -> control messages per second
        self.notes: dict[str, dict[str, Any]] = {}  # kind -> the latest note
        self.health: dict[str, dict[str, Any]] = {}  # network -> its latest health note
        # network -> (its run, that run's iterations, in the order they came)
        self.iterations: dict[str, tuple[str, deque[tuple[int, float]]]] = {}
        self.job: dict[str, Any] | None = None
        self.errors: deque[str] = deque(maxlen=MAX_ERRORS)
        self.rejected = 0
        self.version = 0
        self._dec_beat = msgspec.json.Decoder(Heartbeat)
        self._dec_ports = msgspec.json.Decoder(PortsNote)
        self._dec_job = msgspec.json.Decoder(JobSpec)
        self._dec_event = msgspec.json.Decoder(JobEvent)
        self._dec_note = {k: msgspec.json.Decoder(t) for k, t in NOTE_TYPES.items()}

    def feed(self, topic: str, payload: bytes) -> None:
        parts = topic.split("/")
        try:
            self._feed(parts[2:], payload)
        except (*DECODE_ERRORS, ValueError, KeyError) as e:
            self.rejected += 1
            if worth_logging(self.rejected):
                log.warning("dashboard: %s: rejected: %s (%d so far)", topic, e, self.rejected)
            return
        self.version += 1

    def _feed(self, where: list[str], payload: bytes) -> None:
        kind, rest = where[0], where[1:]
        if kind == "status" and len(rest) == 1:
            state = payload.partition(b" ")[0]  # "online SESSION": a controller says its
            if state not in (b"online", b"offline") or len(payload) > 64:
                raise ValueError(f"status {payload[:20]!r}")
            self.status[rest[0]] = state.decode()
        elif kind == "health" and len(rest) == 1:
            hb = self._dec_beat.decode(payload)
            self._own(hb.node, rest[0])
            self.beats[hb.node] = (_now_ms(), hb)
        elif kind == "telemetry" and len(rest) == 1 and rest[0] != CONTROLLER:
            note = self._dec_ports.decode(payload)
            self._own(note.node, rest[0])
            now = _now_ms()
            last = self.ports.get(note.node)
            if last is not None and now > last[0] and note.sent >= last[1].sent:
                rate = (note.sent - last[1].sent) / (now - last[0]) * 1e3
                self.rates[note.node] = 0.5 * self.rates.get(note.node, rate) + 0.5 * rate
            self.ports[note.node] = (now, note)
        elif kind == "telemetry" and len(rest) == 2 and rest[0] == CONTROLLER:
            what = rest[1]
            note = self._dec_note[what].decode(payload)
            d = msgspec.to_builtins(note)
            # a series a network, or a job of several (the arbiter's): "oddl/j7"
            key = f"{note.network}/{note.job}" if what == "iteration" and note.job else \
                getattr(note, "network", "")
            if what in ("iteration", "health"):  # a peer naming ever new networks: bounded
                held = self.iterations if what == "iteration" else self.health
                jobs = [k for k in held if "/" in k]
                if key in held:
                    pass
                elif "/" in key and len(jobs) >= MAX_JOBS:
                    del held[jobs[0]]  # jobs come and go: the one heard of longest ago goes
                elif "/" not in key and len(held) - len(jobs) >= MAX_NETWORKS:
                    raise ValueError(f"more than {MAX_NETWORKS} networks")
            if what == "iteration":
                run, pts = self.iterations.get(key, (None, None))
                if pts is None or run != note.run:  # a new run of it
                    pts = deque(maxlen=MAX_POINTS)
                self.iterations.pop(key, None)  # (to the end: the latest reported last)
                self.iterations[key] = (note.run, pts)
                pts.append((note.iteration, note.time_ms))
            elif what == "health":
                self.health[note.network] = d
            self.notes[what] = d
        elif kind == "telemetry" and len(rest) == 3 and rest[:2] == [CONTROLLER, "ended"]:
            if payload:  # (empty: the arbiter cleared a job's end it had kept long enough)
                note = self._dec_note["ended"].decode(payload)
                if note.job != rest[2]:
                    raise ValueError(f"job {note.job!r} on {rest[2]!r}'s topic")
        elif kind == "job" and rest == ["run"]:
            spec = self._dec_job.decode(payload)
            self.job = {"job": spec.job, "collective": spec.collective,
                        "ranks": len(spec.ranks), "nodes": len(spec.nodes),
                        "iterations": spec.iterations, "start": spec.start}
        elif kind == "job" and len(rest) == 2 and rest[0] == "result":
            ev = self._dec_event.decode(payload)
            self._own(ev.node, rest[1])
            if ev.kind == "failed":
                self.errors.append(f"{ev.node}: {ev.error[:300]}")
        else:
            raise ValueError("not a topic the dashboard reads")

    def _own(self, said: str, topic_node: str) -> None:
        if said != topic_node or said not in self.known:
            raise ValueError(f"{said!r} on {topic_node!r}'s topic, or no node of this testbed")

    def snapshot(self) -> dict[str, Any]:
        now = _now_ms()
        nodes = {}
        # node programs beat slowly while no controller listens (Heartbeats.slow)
        period = self.period_ms if self.status.get(CONTROLLER) == "online" else \
            max(self.period_ms, Heartbeats.SLOW_NS / 1e6)
        for n in sorted(self.known):
            seen = self.beats.get(n)
            age = now - seen[0] if seen else None
            status = self.status.get(n, "unknown")
            silent = age is None or age > 3 * period
            p = self.ports.get(n)
            nodes[n] = {
                "status": status,
                "health": "offline" if status == "offline" else ("silent" if silent else "ok"),
                "beat_age_ms": None if age is None else round(age),
                "crc_errors": dict(seen[1].crc_errors) if seen else {},
                "error_flags": seen[1].error_flags if seen else 0,
                "ports": msgspec.to_builtins(p[1].ports) if p else {},
                "in_flight": p[1].in_flight if p else 0,
                "job": p[1].job if p else "",
                "msgs_per_s": round(self.rates.get(n, 0.0), 1),
            }
        return {
            "testbed": self.testbed, "nodes": nodes, "status": dict(self.status),
            "plan": self.notes.get("plan"), "run": self.notes.get("run"),
            "accept": self.notes.get("accept"), "queue": self.notes.get("queue"),
            "ended": self.notes.get("ended"),
            "job": self.job,
            "iterations": {k: [list(p) for p in sorted(v)]
                           for k, (_, v) in self.iterations.items()},
            "health": self.health, "errors": list(self.errors),
            "totals": {"in_flight": sum(x["in_flight"] for x in nodes.values()),
                       "msgs_per_s": round(sum(x["msgs_per_s"] for x in nodes.values()), 1)},
            "rejected": self.rejected, "version": self.version,
        }


class Dashboard:
    """The page and its feed: one uvicorn server and one bus connection, one lifecycle."""

    def __init__(self, tb: Testbed, bus: Any, host: str = "127.0.0.1", port: int = 8050,
                 token: str | None = None) -> None:
        if host not in ("127.0.0.1", "localhost", "::1") and not token:
            raise ValueError(f"--host {host}: a dashboard beyond 127.0.0.1 needs a token")
        self.view = View(tb)
        self.bus = bus
        self.token = token
        for t in ("status/+", "health/+", "telemetry/#", "job/run", "job/result/+"):
            bus.on(f"oddl/{tb.name}/{t}", self.view.feed)
        hosts = ["127.0.0.1", "localhost", "[::1]", host]
        middleware = [Middleware(TrustedHostMiddleware, allowed_hosts=hosts)]  # rebinding
        if token:
            middleware.append(Middleware(http.BearerToken, tokens={token: "watcher"},
                                         query=True, hint="this dashboard's ?token=..."))
        self.app = Starlette(routes=[
            Route("/", self._index), Route("/api/state", self._state),
            WebSocketRoute("/ws", self._ws), Mount("/static", StaticFiles(directory=ASSETS)),
        ], middleware=middleware)
        self.http = http.HttpService(self.app, host, port, ws_max_size=4096)
        self.watchers = 0

    @property
    def url(self) -> str:
        return f"{self.http.url}/" + (f"?token={self.token}" if self.token else "")

    async def _index(self, request: Any) -> Response:
        return FileResponse(ASSETS / "index.html")

    async def _state(self, request: Any) -> Response:
        return JSONResponse(self.view.snapshot())

    async def _ws(self, ws: WebSocket) -> None:
        # a browser says which page opens the socket: only the dashboard's own may (any
        # page the operator has open could otherwise read the testbed over loopback);
        # clients that are not browsers send no Origin
        origin = ws.headers.get("origin")
        if origin is not None and origin != f"http://{ws.headers.get('host')}":
            await ws.close(code=1008)  # before accept: the handshake is refused
            return
        await ws.accept()
        if self.watchers >= MAX_WATCHERS:  # the page retries (dashboard.js); the API still answers
            await ws.close(code=1013, reason=f"{MAX_WATCHERS} watchers already: try later")
            return
        self.watchers += 1
        sent, t_sent = -1, 0.0
        try:
            with contextlib.suppress(WebSocketDisconnect, RuntimeError):
                while True:
                    # beat ages move even when nothing is said: a push at least once a second
                    if self.view.version != sent or time.monotonic() - t_sent >= 1.0:
                        sent, t_sent = self.view.version, time.monotonic()
                        await ws.send_json(self.view.snapshot())
                    await asyncio.sleep(1 / PUSH_HZ)
        finally:
            self.watchers -= 1

    async def serve(self, services: Services) -> None:
        """Connect to the bus and listen, each registered with `services` for its stop."""
        await services.start("bus connection", self.bus.start(), self.bus.close)
        await services.start("web server", self.http.start(), self.http.stop)
