"""Stage 2: the per-O-NIC control unit.

Each unit owns its transmitters (per port: idle / requesting / sending, the current
wavelength, a flow queue) and its receivers (per port: the granted request, a FCFS queue of
requests) and nothing global. A flow costs REQUEST, GRANT and RELEASE with the next-hop
receiver only. Robustness, so that lost or late messages never lose, duplicate or hang a
flow:
- a REQUEST unanswered within the timeout is sent again (same flow id, idempotent at the
  receiver: one that repeats a granted flow's is not answered, since a poll that crossed
  the GRANT and a retry after a lost one look alike; a lease that then lapses unused was a
  lost GRANT, sent again: one GRANT a hop without faults);
  a receiver busy with another flow queues it and answers WAIT, at once and to
  every repeat, which resets the retry count: a repeat after a WAIT is a poll, not a retry
  (a pipeline's transfers outlast the timeout; waiting for one is no disturbance);
- a GRANT is a lease: the transmitter uses it only if it can start before `expires_ns`,
  and the receiver revokes it if no data has started by then;
- the receiver frees itself when the data has arrived and RELEASE has come, or when the
  data has arrived and RELEASE is overdue;
- after `max_retries` the flow fails with an error that names it.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from oddl.controller.base.clock import Clock
from oddl.controller.base.devices import Bus, ONic
from oddl.controller.base.hostload import LAG_FLOOR_NS, host_load
from oddl.controller.base.messages import ControlMessage, Flow, Grant, Release, Request, Wait
from oddl.controller.base.telemetry import PortView
from oddl.controller.base.throttle import worth_logging
from oddl.controller.stage1.plan import Route
from oddl.controller.stage2.invariants import tag_of
from oddl.controller.stage2.trace import REQUESTING as T_REQUESTING
from oddl.controller.stage2.trace import SENDING as T_SENDING
from oddl.controller.stage2.trace import TUNING as T_TUNING
from oddl.controller.stage2.trace import WAITING as T_WAITING
from oddl.controller.stage2.trace import Tracer, TraceRow

log = logging.getLogger(__name__)

IDLE, REQUESTING, SENDING = "idle", "requesting", "sending"
_KIND = {Request: "REQUEST", Grant: "GRANT", Release: "RELEASE", Wait: "WAIT"}


@dataclass(frozen=True, slots=True)
class Timing:
    tuning_ns: int
    guard_ns: int
    propagation_ns: int
    request_timeout_ns: int
    release_timeout_ns: int
    lease_ns: int
    max_retries: int
    # the bounds (`[control]` of the testbed; the gateware's are the same): flows queued a
    # port, REQUESTs waiting a receiver port and of them from one sender (one flow per
    # transmitter at a time, and stale repeats), delivered keys remembered a port
    flow_queue: int = 64
    request_queue: int = 64
    requests_per_sender: int = 4
    delivered_keys: int = 64


class Unit(Protocol):
    """What a job runner, a heartbeat and the dashboard use of a node's control unit: this
    module's `ControlUnit`, or the gateware's in the loop (sim/devices/rtl_control_unit.py)."""

    node: str
    onic: ONic
    trace: Tracer | None
    tag: int

    @property
    def sent(self) -> int: ...  # control messages it has sent
    @property
    def stats(self) -> dict[str, int]: ...
    @property
    def unexpected_rx(self) -> dict[str, int]: ...
    def submit(self, flow: Flow) -> None: ...
    def halt(self) -> None: ...
    def in_flight(self) -> int: ...
    def transmitting(self) -> bool: ...
    def ports_view(self) -> dict[str, PortView]: ...


UnitFactory = Callable[[str, Clock, Bus, ONic, dict[str, Route], Timing, Callable[[Flow], None],
                        Callable[[Exception], None]], Unit]


class FlowFailed(RuntimeError):
    """A flow could not be scheduled; the run must stop and say which (and, when a peer
    never answered, which peer). `code`: why, as the gateware's unit says it (no_route,
    retries, short, queue_full: fpga/regmap.py CU_FAIL_CODES)."""

    def __init__(self, message: str, peer: str | None = None, code: str = "", flow: int = 0,
                 nbytes: int = 0) -> None:
        super().__init__(message)
        self.peer = peer
        self.code = code
        self.flow, self.nbytes = flow, nbytes  # the flow's id; the bytes that arrived


class _Tx:
    __slots__ = ("channel", "current", "late", "port", "queue", "retries", "route", "shown",
                 "since", "state", "timer", "waited")

    def __init__(self, port: str) -> None:
        self.port = port
        self.queue: deque[Flow] = deque()
        self.state = IDLE
        self.channel: int | None = None
        self.current: Flow | None = None
        self.route: Route | None = None
        self.retries = 0
        self.late = 0  # the latest its host ran a time-out of the current flow's (ns)
        self.waited = False  # a WAIT came since the latest REQUEST
        self.timer = None
        self.shown: str | None = None  # the state the trace and dashboard see, since when
        self.since = 0


class _Rx:
    __slots__ = ("asked", "data_done", "deferred", "done", "done_order", "granted",
                 "lease_timer", "port", "queue", "queued", "release_timer", "released")

    def __init__(self, port: str) -> None:
        self.port = port
        self.granted: Request | None = None
        self.queue: deque[Request] = deque()
        self.queued: set[tuple[int, int]] = set()
        self.done: set[tuple[int, int]] = set()
        self.done_order: deque[tuple[int, int]] = deque()
        self.data_done = False
        self.released = False
        self.asked = False  # the granted sender asked again during its lease
        self.lease_timer = None
        self.deferred = 0  # lease checks put off while the loop was behind (`_lease_check`)
        self.release_timer = None


class ControlUnit:
    def __init__(self, node: str, clock: Clock, bus: Bus, onic: ONic,
                 routes: dict[str, Route], timing: Timing,
                 deliver: Callable[[Flow], None], fail: Callable[[Exception], None]) -> None:
        self.node = node
        self.clock = clock
        self.bus = bus
        self.onic = onic
        self.routes = routes
        self.t = timing
        self.deliver = deliver
        self.fail = fail
        self.tx = {p: _Tx(p) for p in onic.ports}
        self.rx = {p: _Rx(p) for p in onic.ports}
        self.halted = False
        self.trace: Tracer | None = None  # the job runner's, while a trace is recorded
        self.unexpected_rx = dict.fromkeys(onic.ports, 0)  # per receiver, for the heartbeat
        self.sent = 0  # control messages this unit has sent (its job's share of the bus)
        self.tag = 0  # the job's, in its flow ids' high bits (stage2/invariants.py)
        # stray: GRANTs and RELEASEs of this job that match nothing here (a duplicate after
        # a retry, or a peer gone bad): dropped and counted, a run's disturbance; late: an
        # earlier job's last ones, which may land after the node has a new job
        self.stats = {"requests": 0, "retries": 0, "polls": 0, "grants": 0, "revoked": 0,
                      "waits": 0,
                      "stale_grants": 0, "relayed": 0, "releases_overdue": 0,
                      "unexpected_rx": 0, "requests_refused": 0, "stray": 0, "late": 0}
        onic.attach(self)
        bus.attach(node, self.on_message)

    # --- the trace --------------------------------------------------------------------
    def _show(self, tx: _Tx, state: str | None, at: int | None = None) -> None:
        """The transmitter is in `state` from `at` (now): the trace gets the slice it left
        (and the dashboard sees the state)."""
        tr = self.trace
        now = self.clock.now_ns() if at is None else at
        if tr is not None and tx.shown is not None and tr.on and tx.current is not None:
            f, r = tx.current, tx.route
            tr.add(TraceRow("state", self.node, tx.port, tx.shown, tx.since, now, f.id, f.hop,
                            r.next_hop if r is not None else ""))
        tx.shown, tx.since = state, now

    def _send(self, dst: str, m: ControlMessage) -> None:
        tr = self.trace
        if tr is not None and tr.on:
            tr.add(TraceRow("send", self.node, m.port, _KIND[type(m)], self.clock.now_ns(), 0,
                            m.flow, m.hop, dst))
        self.sent += 1
        self.bus.send(self.node, dst, m)

    def ports_view(self) -> dict[str, PortView]:
        """Each transmitter now, for the dashboard (controller/base/telemetry.py)."""
        now = self.clock.now_ns()
        out = {}
        for p, tx in self.tx.items():
            state = tx.shown or IDLE
            if state == T_SENDING and now < tx.since:
                state = T_TUNING  # the channel locks at `since`
            f, r = tx.current, tx.route
            # (type: ignore below: a port's state: one of the view's literals)
            out[p] = PortView(state, -1 if tx.channel is None else tx.channel,  # type: ignore[arg-type]
                              f.id if f is not None else -1,
                              r.next_hop if r is not None and f is not None else "",
                              max(len(tx.queue) - 1, 0))
        return out

    def transmitting(self) -> bool:
        """A transmitter here still has a flow (its TX_DONE, and RELEASE, to come)."""
        return any(tx.current is not None for tx in self.tx.values())

    def in_flight(self) -> int:
        return (sum(tx.current is not None for tx in self.tx.values())
                + sum(rx.granted is not None for rx in self.rx.values()))

    # --- transmit side ----------------------------------------------------------------
    def submit(self, flow: Flow) -> None:
        if self.halted:
            return
        route = self.routes.get(flow.dst)
        if route is None:
            self.fail(FlowFailed(f"{self.node}: no route to {flow.dst} for {flow!r}",
                                 code="no_route", flow=flow.id))
            return
        tx = self.tx[route.port]
        if len(tx.queue) >= self.t.flow_queue:
            self.fail(FlowFailed(f"{self.node}/{route.port}: flow queue full "
                                 f"({self.t.flow_queue} flows, the testbed's flow_queue) for "
                                 f"{flow!r}", code="queue_full", flow=flow.id))
            return
        tx.queue.append(flow)
        if tx.state == IDLE:
            self._next(tx)

    def _next(self, tx: _Tx) -> None:
        self._show(tx, None)  # the end of the flow it carried, if any
        if not tx.queue:
            tx.state = IDLE
            tx.current = None
            return
        flow = tx.queue[0]
        tx.current = flow
        tx.route = self.routes[flow.dst]
        tx.state = REQUESTING
        tx.retries = tx.late = 0
        self._show(tx, T_REQUESTING)
        self._request(tx)

    def _request(self, tx: _Tx) -> None:
        f, r = tx.current, tx.route
        assert f is not None and r is not None
        self.stats["requests"] += 1
        tx.waited = False
        self._send(r.next_hop, Request(f.id, f.hop, self.node, r.next_hop, tx.port, r.channel,
                                       f.nbytes, f.src, f.dst, f.iteration, f.step,
                                       f.t_submit))
        # the time-out runs on the host's own time (the same as device time, but on a real
        # loop that stalled): a starved host runs its overdue timers at once, and time-outs
        # reckoned from their due times would spend every retry in a burst, with no answer
        # read in between ("got no GRANT after 60 retries" on a busy machine)
        tx.timer = self.clock.call_at_ns(self.clock.loop_ns() + self.t.request_timeout_ns,
                                         self._request_timeout, tx, f)

    def _request_timeout(self, tx: _Tx, flow: Flow) -> None:
        if self.halted or tx.current is not flow or tx.state != REQUESTING:
            return
        tx.retries += 1
        tx.late = max(tx.late, self.clock.loop_ns() - self.clock.now_ns())
        self.stats["polls" if tx.waited else "retries"] += 1
        if tx.retries > self.t.max_retries:
            assert tx.route is not None
            self.fail(FlowFailed(
                f"{self.node}: flow {flow.id} ({flow.src}->{flow.dst}, hop {flow.hop} via "
                f"{tx.route.next_hop}, {flow.nbytes} B) got no GRANT after "
                f"{self.t.max_retries} retries{self._host_said(tx.late)}",
                tx.route.next_hop, "retries", flow.id))
            return
        self._request(tx)

    def _host_said(self, late_ns: int) -> str:
        """A flow's failure a loaded host may explain says the host's lag and load (a
        virtual loop is never late: nothing is said)."""
        if late_ns < LAG_FLOOR_NS:
            return ""
        load = host_load()
        cause = load or late_ns >= self.t.request_timeout_ns
        return (f" (this host ran its time-outs up to {late_ns / 1e6:.0f} ms late"
                f"{'; ' + load if load else ''}{': the host may be the cause' if cause else ''})")

    def _on_grant(self, g: Grant) -> None:
        tx = self.tx.get(g.port)
        f = tx.current if tx else None
        if tx is None or f is None or tx.state != REQUESTING or (f.id, f.hop) != (g.flow, g.hop):
            self._stray(g)  # duplicate or stale (we are past this flow), or forged
            return
        now = self.clock.now_ns()
        tune = 0 if tx.channel == g.channel else self.t.tuning_ns
        if now + tune + self.t.propagation_ns > g.expires_ns:
            self.stats["stale_grants"] += 1
            return  # the lease would lapse before our data reaches the receiver: re-request
        if tx.timer is not None:
            tx.timer.cancel()
            tx.timer = None
        tx.state = SENDING
        if tune:  # the O-NIC tunes and starts the moment the channel locks
            self._show(tx, T_TUNING, now)
            self._show(tx, T_SENDING, now + tune)
            tx.channel = g.channel
            self.onic.tune_and_send(tx.port, g.channel, f)
        else:
            self._show(tx, T_SENDING, now)
            self.onic.send(tx.port, f)

    def on_tx_done(self, port: str, flow: Flow) -> None:
        if self.halted:
            return
        tx = self.tx[port]
        r = tx.route
        assert r is not None
        self._send(r.next_hop, Release(flow.id, flow.hop, self.node, r.next_hop, port))
        tx.queue.popleft()
        self._next(tx)

    def _on_wait(self, w: Wait) -> None:
        tx = self.tx.get(w.port)
        f = tx.current if tx else None
        if tx is not None and f is not None and (f.id, f.hop) == (w.flow, w.hop):
            self.stats["waits"] += 1
            tx.retries = 0
            tx.waited = True
            if tx.shown != T_WAITING:
                self._show(tx, T_WAITING)

    # --- receive side -----------------------------------------------------------------
    def _on_request(self, q: Request) -> None:
        rx = self.rx.get(q.port)
        if rx is None:
            log.warning("%s: request for unknown port %r dropped", self.node, q.port)
            return
        key = (q.flow, q.hop)
        g = rx.granted
        if g is not None and (g.flow, g.hop) == key:
            # granted already: a repeat is a poll that crossed our GRANT, or a retry after
            # it was lost; the two look alike here, so neither is answered now (one GRANT a
            # hop without faults). If the lease then lapses unused, the GRANT was lost: it
            # is sent again (`_lease_check`).
            rx.asked = True
            return
        if key in rx.done:
            return
        if key in rx.queued:
            self._send(q.src, Wait(q.flow, q.hop, self.node, q.src, q.port, len(rx.queue)))
            return
        if g is None:
            self._grant(rx, q)
        elif (len(rx.queue) >= self.t.request_queue
              or sum(r.src == q.src for r in rx.queue) >= self.t.requests_per_sender):
            # a sender's transmitter asks for one flow at a time: more is a peer gone bad
            # (or a flood), and must not grow the queue nor starve the others
            self.stats["requests_refused"] += 1
            if worth_logging(self.stats["requests_refused"]):
                log.warning("%s/%s: REQUESTs over the bound refused (%d so far; latest "
                            "from %s)", self.node, q.port, self.stats["requests_refused"],
                            q.src)
        else:
            rx.queue.append(q)
            rx.queued.add(key)
            self._send(q.src, Wait(q.flow, q.hop, self.node, q.src, q.port, len(rx.queue)))

    def _grant(self, rx: _Rx, q: Request) -> None:
        rx.granted = q
        rx.data_done = False
        rx.released = False
        rx.asked = False
        rx.deferred = 0
        expires = self.clock.now_ns() + self.t.lease_ns
        self.stats["grants"] += 1
        self._send(q.src, Grant(q.flow, q.hop, self.node, q.src, q.port, q.channel, expires))
        if rx.lease_timer is not None:
            rx.lease_timer.cancel()
        rx.lease_timer = self.clock.call_at_ns(expires + self.t.propagation_ns + 1,
                                               self._lease_check, rx, q)

    def _lease_check(self, rx: _Rx, q: Request) -> None:
        rx.lease_timer = None
        if self.halted:
            return
        if rx.granted is not q or rx.data_done:
            return
        if self.onic.rx_receiving(rx.port, q.flow, q.hop):
            return  # data is arriving
        due = self.clock.now_ns()
        if self.clock.behind(due) and rx.deferred < self.t.max_retries:
            # the loop runs this check late (a paused or starved host) and the sender's
            # start, due before it, is still queued, each step of it a pass of the loop:
            # looked at again, as of its due time, once what was due before has run (on a
            # virtual loop, never: it runs each timer at its instant)
            rx.deferred += 1
            rx.lease_timer = self.clock.call_at_ns(due, self._lease_check, rx, q)
            return
        self.stats["revoked"] += 1
        if rx.asked:  # its sender asked again meanwhile: our GRANT was lost, not its
            self._grant(rx, q)  # interest; it keeps its turn, with a fresh lease
            return
        rx.granted = None
        self._grant_next(rx)

    def _grant_next(self, rx: _Rx) -> None:
        while rx.queue:
            q = rx.queue.popleft()
            rx.queued.discard((q.flow, q.hop))
            if (q.flow, q.hop) not in rx.done:
                self._grant(rx, q)
                return
        rx.granted = None

    def on_rx_done(self, port: str, flow_id_lo: int, nbytes: int) -> None:
        """The O-NIC took a whole transfer: it must be the one this receiver granted."""
        if self.halted:
            return
        rx = self.rx[port]
        g = rx.granted
        # a grant is one transfer: a second completion under it (the board reporting one
        # twice) is no transfer anyone granted, and relaying it again would strand a copy
        if g is None or g.flow & 0xFFFFFFFF != flow_id_lo or rx.data_done:
            self.stats["unexpected_rx"] += 1
            self.unexpected_rx[port] += 1
            log.error("%s/%s: received flow %#x that was not granted (granted %r)", self.node,
                      port, flow_id_lo, g)
            return
        if nbytes != g.nbytes:
            self.fail(FlowFailed(f"{self.node}/{port}: flow {g.flow} arrived with {nbytes} of "
                                 f"{g.nbytes} bytes", code="short", flow=g.flow,
                                 nbytes=nbytes))
            return
        key = (g.flow, g.hop)
        if key not in rx.done:
            rx.done.add(key)
            rx.done_order.append(key)
            if len(rx.done_order) > self.t.delivered_keys:
                rx.done.discard(rx.done_order.popleft())
        rx.data_done = True
        if rx.lease_timer is not None:
            rx.lease_timer.cancel()
            rx.lease_timer = None
        if rx.released:
            self._free(rx)
        else:
            rx.release_timer = self.clock.call_later_ns(self.t.release_timeout_ns,
                                                        self._release_overdue, rx, g)
        flow = g.as_flow()
        if flow.dst == self.node:
            self.deliver(flow)
        else:
            self.stats["relayed"] += 1
            self.submit(flow.next_hop_copy())

    def _on_release(self, m: Release) -> None:
        rx = self.rx.get(m.port)
        g = rx.granted if rx is not None else None
        if rx is None or g is None or (g.flow, g.hop) != (m.flow, m.hop):
            self._stray(m)
            return
        rx.released = True
        if rx.data_done:
            self._free(rx)

    def _stray(self, m: ControlMessage) -> None:
        if tag_of(m.flow) != self.tag:
            self.stats["late"] += 1
            return
        self.stats["stray"] += 1
        if worth_logging(self.stats["stray"]):
            log.warning("%s: %s for flow %d hop %d from %s matches nothing here (%d so "
                        "far)", self.node, _KIND.get(type(m), "?"), m.flow, m.hop, m.src,
                        self.stats["stray"])

    def _release_overdue(self, rx: _Rx, g: Request) -> None:
        rx.release_timer = None
        if self.halted:
            return
        if rx.granted is g and rx.data_done:
            self.stats["releases_overdue"] += 1
            self._free(rx)

    def _free(self, rx: _Rx) -> None:
        if rx.release_timer is not None:
            rx.release_timer.cancel()
            rx.release_timer = None
        rx.granted = None
        self._grant_next(rx)

    def halt(self) -> None:
        """The job is over here (done, failed or stopped for a fault): answer nothing,
        start nothing; the timers of its flows lapse unheard."""
        self.halted = True
        for tx in self.tx.values():
            if tx.timer is not None:
                tx.timer.cancel()
        for rx in self.rx.values():
            for t in (rx.lease_timer, rx.release_timer):
                if t is not None:
                    t.cancel()

    # --- dispatch ---------------------------------------------------------------------
    def on_message(self, m: ControlMessage) -> None:
        if self.halted:
            return
        tr = self.trace
        if tr is not None and tr.on:
            tr.add(TraceRow("recv", self.node, m.port, _KIND.get(type(m), "?"),
                            self.clock.now_ns(), 0, m.flow, m.hop, m.src))
        # the hot path's dispatch: type(m) is X (cheaper than isinstance), on which the type
        # checker does not narrow m: hence the ignores below
        t = type(m)
        if t is Request:
            self._on_request(m)  # type: ignore[arg-type]
        elif t is Grant:
            self._on_grant(m)  # type: ignore[arg-type]
        elif t is Release:
            self._on_release(m)  # type: ignore[arg-type]
        elif t is Wait:
            self._on_wait(m)  # type: ignore[arg-type]
        else:
            log.warning("%s: unknown control message %r dropped", self.node, m)
