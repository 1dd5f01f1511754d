"""Stage 2 handed to the board's FPGA: the host's side of an `onic_top` O-NIC, whose control
unit runs in the gateware (fpga/gateware/onic_top.py), not on the host.

`GatewareUnit` stands where the Python `ControlUnit` stands for a job runner (the `Unit`
interface: submit, halt, stats, ...), over the CU block of the register map only
(fpga/regmap.py): at the job's start it halts the board's unit, loads the timing, the tag
and the routes, and clears HALT; it hands each flow over (CU_SUBMIT0-8, CU_SUBMIT_GO); on
the board's interrupt it reads the flows delivered there (CU_DELIV*), and a failure
(CU_FAIL*), and tells the runner. Control messages never cross the host: the board's unit
sends them on its own port. One controller above the driver, unchanged: which unit a node
runs is the board's overlay's to say (its IP: `drivers/onic.py`, `unit_for`).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable

from oddl.controller.base.clock import Clock
from oddl.controller.base.devices import Bus, ONic
from oddl.controller.base.messages import Flow
from oddl.controller.base.telemetry import PortView
from oddl.controller.stage1.plan import Route
from oddl.controller.stage2.control_unit import ControlUnit, FlowFailed, Timing, UnitFactory
from oddl.controller.stage2.trace import Tracer
from oddl.controller.stage2.wire import FRAME
from oddl.drivers.onic import DriverONic
from oddl.fpga import regmap as R
from oddl.fpga.frame import flow_fields, flow_word

log = logging.getLogger(__name__)
_O = {r.name: r.offset for r in R.CU_REGISTERS}
_CODES = {v: k for k, v in R.CU_FAIL_CODES.items()}
CU_IRQS = ("CU_DELIVERED", "CU_FAILED")
_DELIVERED, _FAILED = (1 << R.IRQ_BITS[n] for n in CU_IRQS)


class GatewareUnit:
    """A node's control unit in its board's gateware, as a job runner uses one."""

    def __init__(self, node: str, clock: Clock, bus: Bus, onic: ONic,
                 routes: dict[str, Route], timing: Timing,
                 deliver: Callable[[Flow], None], fail: Callable[[Exception], None]) -> None:
        if not isinstance(onic, DriverONic):
            raise TypeError(f"{node}: a control unit in the gateware is reached through the "
                            f"board's register driver, not {type(onic).__name__}")
        self.node, self.clock = node, clock
        self.onic: ONic = onic
        self.deliver, self.fail = deliver, fail
        d = onic.d
        self._w, self._r = d.mmio.write, d.mmio.read
        self.index = d.index
        self.nodes: list[str] = d.nodes
        self.trace: Tracer | None = None  # (the gateware keeps no timeline)
        self.halted = False
        self._pending: deque[Flow] = deque()  # while the submit queue is full
        self._sent0 = self._r(_O["CU_SENT"])
        w = self._w
        w(_O["CU_CTRL"], 1)  # a fresh job: the last one's unit halted
        for name, v in (("TUNING_NS", timing.tuning_ns),
                        ("PROPAGATION_NS", timing.propagation_ns),
                        ("REQUEST_TIMEOUT_NS", timing.request_timeout_ns),
                        ("RELEASE_TIMEOUT_NS", timing.release_timeout_ns),
                        ("LEASE_NS", timing.lease_ns), ("MAX_RETRIES", timing.max_retries)):
            w(_O[f"CU_{name}"], v)
        stale = onic.unit_routes - set(routes)
        for dst in sorted(stale, key=self.index.__getitem__):  # the last job's, gone
            w(_O["CU_ROUTE_DST"], self.index[dst])
            w(_O["CU_ROUTE"], 0)
        for dst, r in routes.items():
            w(_O["CU_ROUTE_DST"], self.index[dst])
            w(_O["CU_ROUTE"], self.index[r.next_hop] | r.channel << 16
              | R.PORTS.index(r.port) << 24 | R.ROUTE_VALID)
        onic.unit_routes = set(routes)
        onic.attach(self)
        onic.listen(("CA_FIRED", *CU_IRQS))  # the transfers are the board's unit's to hear
        w(_O["CU_FAIL"], 0xF)  # (a failure of a job before)
        w(_O["CU_CTRL"], 0)

    # --- what a job runner and a heartbeat read of a unit -------------------------------
    @property
    def tag(self) -> int:
        return self._r(_O["CU_TAG"])

    @tag.setter
    def tag(self, tag: int) -> None:
        self._w(_O["CU_TAG"], tag)

    @property
    def sent(self) -> int:
        """Control frames the board's unit has sent for this job."""
        return (self._r(_O["CU_SENT"]) - self._sent0) & 0xFFFFFFFF

    @property
    def stats(self) -> dict[str, int]:
        return {k: self._r(_O[f"CU_STAT_{k.upper()}"]) for k in R.CU_STATS}

    @property
    def unexpected_rx(self) -> dict[str, int]:
        return {p: self._r(_O[f"CU_UNEXPECTED_{p}"]) for p in self.onic.ports}

    def transmitting(self) -> bool:
        return self.onic.transmitting()

    def in_flight(self) -> int:
        return int(self.transmitting()) + len(self._pending)

    def ports_view(self) -> dict[str, PortView]:
        out = {}
        for p in self.onic.ports:
            s = self._r(R.BY_NAME[f"TX{p}_STATUS"].offset)
            state = "tuning" if s & 1 else "sending" if s & 2 else "idle"
            out[p] = PortView(state, (s >> 8) & 0xFF if s & 4 else -1, -1, "", 0)  # type: ignore[arg-type]
        return out

    # --- the job ------------------------------------------------------------------------
    def submit(self, flow: Flow) -> None:
        if self.halted:
            return
        self._pending.append(flow)
        self._hand_over()

    def _hand_over(self) -> None:
        """The flows waiting here into the board's submit queue, as far as it has room."""
        idx = self.index
        while self._pending and self._r(_O["CU_SUBMIT_FREE"]):
            f = self._pending.popleft()
            word = flow_word(FRAME, f.id, idx[f.src], idx[f.dst], f.nbytes, f.iteration,
                             f.step, f.hop, f.t_submit)
            for k in range(R.CU_FLOW_WORDS):
                self._w(_O[f"CU_SUBMIT{k}"], word >> (32 * k) & 0xFFFFFFFF)
            self._w(_O["CU_SUBMIT_GO"], 1)

    def halt(self) -> None:
        self.halted = True
        self._pending.clear()
        self._w(_O["CU_CTRL"], 1)

    def on_unit_irq(self, status: int) -> None:
        """The board said CU_DELIVERED or CU_FAILED (its driver cleared the flags)."""
        if self.halted:
            return
        if status & _DELIVERED:
            for _ in range(self._r(_O["CU_DELIV_COUNT"])):
                word = sum(self._r(_O[f"CU_DELIV{k}"]) << (32 * k)
                           for k in range(R.CU_FLOW_WORDS))
                self._w(_O["CU_DELIV_POP"], 1)
                f = flow_fields(FRAME, word)
                self.deliver(Flow(f["id"], self.nodes[f["src"]], self.nodes[f["dst"]],
                                  f["nbytes"], f["iteration"], f["step"], f["hop"],
                                  f["t_submit"]))
            if lost := self._r(_O["CU_DELIV_LOST"]):
                self.fail(FlowFailed(f"{self.node}: {lost} deliveries lost: the board's "
                                     f"queue of {R.CU_QUEUE} was full"))
        if status & _FAILED and (code := self._r(_O["CU_FAIL"])):
            flow = self._r(_O["CU_FAIL_FLOW_HI"]) << 32 | self._r(_O["CU_FAIL_FLOW_LO"])
            peer = self.nodes[self._r(_O["CU_FAIL_PEER"])] \
                if code == R.CU_FAIL_CODES["retries"] else None
            why = {"no_route": "no route", "retries": f"got no GRANT from {peer}",
                   "short": f"arrived with {self._r(_O['CU_FAIL_BYTES'])} bytes",
                   "queue_full": "the flow queue was full"}.get(_CODES.get(code, ""), code)
            self.fail(FlowFailed(f"{self.node}: flow {flow}: {why} (the board's control "
                                 f"unit)", peer, _CODES.get(code, ""), flow))
        self._hand_over()

    # (the transfers' completions are the board's unit's: a job runner's calls, none here)
    def on_tx_done(self, port: str, flow: Flow) -> None: ...
    def on_rx_done(self, port: str, flow_id_lo: int, nbytes: int) -> None: ...


def unit_for(design: int, otherwise: UnitFactory = ControlUnit) -> UnitFactory:
    """The control unit a node runs on a board of `design` (its overlay's IP): the board's
    own in `onic_top`, else `otherwise` on the host."""
    return gateware_unit if design == R.TOP_DESIGN_VERSION else otherwise


gateware_unit: UnitFactory = GatewareUnit  # (a Unit: what a job runner makes)
