"""The optical data plane: per-port tunable transmitters and receivers, WSSs, line rate.

Light from node n's port (H or V) enters its group's WSS at port index i on the channel its
transmitter is tuned to, leaves at M[i][channel], and reaches that port's node. Every
send is reported to the invariant checker before it takes effect.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from oddl.controller.base.clock import Clock
from oddl.controller.base.config import Testbed
from oddl.controller.base.devices import DeviceRefused
from oddl.controller.base.messages import Flow
from oddl.controller.base.topology import Grid
from oddl.controller.stage2.invariants import InvariantChecker
from oddl.sim.devices.wss import WSSModel


class Transmitter:
    __slots__ = ("busy", "channel", "sent_bytes", "tune_from", "tune_until", "tunes")

    def __init__(self) -> None:
        self.channel: int | None = None
        self.tune_from = -1  # ns; when the last tune began
        self.tune_until = -1  # ns; tuning while now < tune_until
        self.busy: Flow | None = None
        self.tunes = 0
        self.sent_bytes = 0


class Receiver:
    __slots__ = ("current", "errors", "rx_bytes", "src")

    def __init__(self) -> None:
        self.current: Flow | None = None
        self.src: str | None = None  # the node whose light this receiver takes (last leg)
        self.rx_bytes = 0
        self.errors = 0


class Fabric:
    def __init__(self, tb: Testbed, grid: Grid, clock: Clock, checker: InvariantChecker) -> None:
        self.tb = tb
        self.grid = grid
        self.clock = clock
        self.checker = checker
        checker.sees_light = True
        o = tb.optical
        self.rate = o.line_rate_gbps  # bits per ns
        self.tuning_ns = o.tuning_ns
        self.guard_ns = math.ceil(o.guard_time_ns)
        self.prop_ns = math.ceil(o.propagation_ns)
        n_ch = self.n_channels = len(o.wavelengths())
        self.wss = {w.id: WSSModel(w.id, w.ports, n_ch) for w in tb.wss}
        self.tx: dict[tuple[str, str], Transmitter] = {}
        self.rx: dict[tuple[str, str], Receiver] = {}
        self.lit: dict[tuple[str, int, int], Flow] = {}
        # (node, port) -> (wss model, my port index, group members)
        self.attach_pt: dict[tuple[str, str], tuple[WSSModel, int, tuple[str, ...]]] = {}
        self.ports: dict[str, tuple[str, ...]] = {}
        for node in grid.nodes:
            ps = []
            for port in ("H", "V"):
                g = grid.group_of(node, port)
                if g.wss is None:
                    continue
                ps.append(port)
                self.tx[(node, port)] = Transmitter()
                self.rx[(node, port)] = Receiver()
                self.attach_pt[(node, port)] = (self.wss[g.wss], grid.port_index(node, port),
                                                g.members)
            self.ports[node] = tuple(ps)
        self.rx_handlers: dict[str, Callable[[str, Flow], None]] = {}
        self.tx_handlers: dict[str, Callable[[str, Flow], None]] = {}
        self.tuned_handlers: dict[str, Callable[[str, int], None]] = {}
        self.transfers = 0
        self.bytes = 0
        self.tune_override: dict[tuple[str, str], int] = {}  # fault: a slow transmitter
        self.corrupt: set[tuple[str, str]] = set()  # fault: receivers whose link corrupts
        self.dead: set[str] = set()  # fault: boards that are gone (no light in or out)
        self.lost = 0  # transfers whose light a fault swallowed

    def duration_ns(self, nbytes: int) -> int:
        return math.ceil(nbytes * 8 / self.rate)

    # --- transmitter ------------------------------------------------------------------
    def tune(self, node: str, port: str, channel: int) -> None:
        tx = self.tx[(node, port)]
        now = self.clock.now_ns()
        if tx.busy is not None:
            raise DeviceRefused(f"{node}/{port}: cannot tune while sending {tx.busy!r}")
        if not 0 <= channel < self.n_channels:
            raise DeviceRefused(f"{node}/{port}: no channel {channel}")
        tx.tunes += 1
        tx.channel = None  # dark while the laser switches
        tx.tune_from = now
        tx.tune_until = now + self.tune_override.get((node, port), self.tuning_ns)
        self.clock.call_at_ns(tx.tune_until, self._tuned, node, port, tx, channel)

    def _tuned(self, node: str, port: str, tx: Transmitter, channel: int) -> None:
        if self.clock.now_ns() != tx.tune_until:
            return  # re-tuned meanwhile: the laser locks once, on the last channel asked
        tx.channel = channel
        self.tuned_handlers[node](port, channel)

    def send(self, node: str, port: str, flow: Flow) -> None:
        if node in self.dead:
            return  # a dead board emits nothing (and its program is gone with it)
        tx = self.tx[(node, port)]
        now = self.clock.now_ns()
        tuning = now < tx.tune_until
        self.checker.on_send(now, node, port, tx.channel, tuning, tx.busy is not None, flow)
        if tuning:
            raise DeviceRefused(f"{node}/{port}: transfer refused while tuning")
        if tx.busy is not None:
            raise DeviceRefused(f"{node}/{port}: transfer refused while sending {tx.busy!r}")
        wss, i, members = self.attach_pt[(node, port)]
        ch = tx.channel
        if wss.dead:  # the light goes nowhere, by the device's fault and not the plan's
            tx.busy = flow
            self.lost += 1
            dur = self.duration_ns(flow.nbytes)
            self.clock.call_at_ns(now + dur + self.guard_ns, self._tx_done, node, port, tx,
                                  flow)
            return
        out = wss.route(i, ch) if ch is not None else None
        key = (wss.id, out if out is not None else -1, ch if ch is not None else -1)
        dst = members[out] if out is not None else None
        rx = self.rx[(dst, port)] if dst is not None else None
        self.checker.on_light(now, wss.id, out, ch, self.lit.get(key),
                              rx.current if rx is not None else None, flow, dst)
        tx.busy = flow
        dur = self.duration_ns(flow.nbytes)
        self.lit[key] = flow
        if rx is not None:
            rx.current = flow
            rx.src = node
        self.transfers += 1
        self.bytes += flow.nbytes
        self.clock.call_at_ns(now + dur + self.guard_ns, self._tx_done, node, port, tx, flow)
        self.clock.call_at_ns(now + dur + self.prop_ns, self._rx_done, dst, port, rx, key, flow,
                              node)

    def _tx_done(self, node: str, port: str, tx: Transmitter, flow: Flow) -> None:
        tx.busy = None
        tx.sent_bytes += flow.nbytes
        self.tx_handlers[node](port, flow)

    def _rx_done(self, dst: str | None, port: str, rx: Receiver | None,
                 key: tuple[str, int, int], flow: Flow, src: str) -> None:
        if self.lit.get(key) is flow:
            del self.lit[key]
        if rx is None or dst is None:
            return  # light into a blocked port: lost (already a violation)
        if rx.current is flow:
            rx.current = None
        if self.dead and (dst in self.dead or src in self.dead):
            self.lost += 1  # the burst was cut, or nobody is there to take it
            return
        if self.corrupt and (dst, port) in self.corrupt:
            rx.errors += 1  # the CRC fails; the receiver still reports the transfer
        rx.rx_bytes += flow.nbytes
        self.checker.on_arrival(self.clock.now_ns(), dst, flow, flow.nbytes)
        self.rx_handlers[dst](port, flow)
