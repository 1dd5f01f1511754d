"""The stage-2 control unit inside an emulated `onic_top` board (design 0.2): the CU block of
the register map (fpga/regmap.py) over the Python `ControlUnit`, as the gateware's
(fpga/gateware/onic_top.py) is over `ctrl_unit`.

The unit runs on the board's own transfer engine (`BoardEngine`: the tune, the start once
locked, the transfer's completions, as onic_ctrl's command port gives them to the RTL) and
speaks to its peers on the testbed's control network, the emulated one (the world's bus,
with the testbed's control latency), not the host's. The host reaches it by registers only
(drivers/onic_unit.py): it loads the timing and the routes, starts a job by clearing HALT,
hands over flows, and reads back deliveries, the first failure and the counters, each
delivery and failure raising IRQ_STATUS's CU bits.
"""

from __future__ import annotations

from collections import deque
from typing import Any, cast

from oddl.controller.base.devices import Bus, DeviceRefused, ONic
from oddl.controller.base.messages import Flow
from oddl.controller.stage1.plan import Route
from oddl.controller.stage2.control_unit import ControlUnit, Timing
from oddl.controller.stage2.wire import FRAME
from oddl.fpga import regmap as R
from oddl.fpga.frame import flow_fields, flow_widths, flow_word

_RW = {r.offset: r for r in R.CU_REGISTERS if r.access == "RW"}
_CU = R.BY_NAME
_DELIV = {_CU[f"CU_DELIV{k}"].offset: k for k in range(R.CU_FLOW_WORDS)}
_STAT = {_CU[f"CU_STAT_{k.upper()}"].offset: k for k in R.CU_STATS}
_NODE_MASK = {k: (1 << w) - 1 for k, w in flow_widths(FRAME) if k in ("src", "dst")}
_UNEXPECTED = {_CU[f"CU_UNEXPECTED_{p}"].offset: p for p in R.PORTS}


# (`board` below: an ONicBoard, which holds this module's block; typed Any to keep the
# modules of sim/devices free of a cycle)
class BoardEngine:
    """The board's transfer engine as the unit drives it (`controller.devices.ONic`, the
    part a control unit uses): a transfer's registers loaded and started, tuning first if
    asked; the light arriving seen on the receiver."""

    def __init__(self, board: Any) -> None:
        self.board = board
        self.node = board.node
        self.ports = tuple(board.ports)
        self.tampered = 0
        self.on_module_fired = None

    def attach(self, events: Any) -> None:  # (the block forwards the completions)
        pass

    def _load(self, port: str, flow: Flow) -> None:
        b, idx = self.board, self.board.index
        regs = b.regs
        regs[b._dst_off[port]] = idx[flow.dst]
        regs[b._bytes_off[port]] = flow.nbytes & 0xFFFFFFFF
        regs[b._flow_off[port]] = flow.id & 0xFFFFFFFF
        for off, v in zip(b._hdr_tx[port], R.header_words(
                flow.id, idx[flow.src], flow.hop, flow.step, flow.iteration, flow.t_submit),
                strict=True):
            regs[off] = v

    def send(self, port: str, flow: Flow) -> None:
        self._load(port, flow)
        self.board._start(port)

    def tune_and_send(self, port: str, channel: int, flow: Flow) -> None:
        b = self.board
        self._load(port, flow)
        b._set(f"TX{port}_CHANNEL", channel)
        b._tune(port)
        if port in b.tuning_pending:  # the engine sequences: it starts once locked
            b.start_after_tune.add(port)

    def rx_receiving(self, port: str, flow: int, hop: int) -> bool:
        cur = self.board.fabric.rx[(self.board.node, port)].current
        return cur is not None and cur.id & 0xFFFFFFFF == flow & 0xFFFFFFFF


class UnitBlock:
    """The CU registers of one emulated board, and the unit behind them (one per job:
    clearing HALT starts one with the timing and routes loaded, setting it halts it)."""

    def __init__(self, board: Any, bus: Bus, bounds: Timing) -> None:
        self.board, self.bus, self.bounds = board, bus, bounds
        self.regs = {off: r.reset for off, r in _RW.items()}
        self.routes: dict[str, Route] = {}
        self.unit: ControlUnit | None = None
        self.engine = BoardEngine(board)
        self.delivered: deque[int] = deque()
        self.lost = 0
        self.failure = (0, 0, 0, 0)  # code, flow, peer, bytes
        self.sent = 0  # of the units before the running one

    # --- the registers ------------------------------------------------------------------
    def read(self, off: int) -> int:
        if off in self.regs:
            return self.regs[off]
        if off in _DELIV:
            word = self.delivered[0] if self.delivered else 0
            return word >> (32 * _DELIV[off]) & 0xFFFFFFFF
        if off in _STAT:
            return self.unit.stats.get(_STAT[off], 0) & 0xFFFFFFFF if self.unit else 0
        if off in _UNEXPECTED:
            return self.unit.unexpected_rx.get(_UNEXPECTED[off], 0) if self.unit else 0
        b = self.bounds
        code, flow, peer, nbytes = self.failure
        return {_CU["CU_CAPS"].offset: b.flow_queue | b.request_queue << 8
                | b.delivered_keys << 16 | b.requests_per_sender << 24,
                _CU["CU_NODES"].offset: len(self.board.nodes),
                _CU["CU_SUBMIT_FREE"].offset: R.CU_QUEUE,
                _CU["CU_DELIV_COUNT"].offset: len(self.delivered),
                _CU["CU_DELIV_LOST"].offset: self.lost,
                _CU["CU_FAIL"].offset: code, _CU["CU_FAIL_FLOW_LO"].offset: flow & 0xFFFFFFFF,
                _CU["CU_FAIL_FLOW_HI"].offset: flow >> 32 & 0xFFFFFFFF,
                _CU["CU_FAIL_PEER"].offset: peer, _CU["CU_FAIL_BYTES"].offset: nbytes,
                _CU["CU_SENT"].offset: (self.sent + (self.unit.sent if self.unit else 0))
                & 0xFFFFFFFF}.get(off, 0)

    def write(self, off: int, value: int) -> None:
        if off in self.regs:
            halted = self.regs[_CU["CU_CTRL"].offset] & 1
            self.regs[off] = value
            if off == _CU["CU_CTRL"].offset and value & 1 != halted:
                self._halt() if value & 1 else self._start()
            elif off == _CU["CU_TAG"].offset and self.unit is not None:
                self.unit.tag = value & 0xFFFF
            return
        if off == _CU["CU_ROUTE"].offset:
            nodes = self.board.nodes
            dst, nxt = self.regs[_CU["CU_ROUTE_DST"].offset], value & 0xFFFF
            if dst >= len(nodes) or nxt >= len(nodes):
                raise DeviceRefused(f"{self.board.node}: a route of node {dst} via {nxt}: "
                                    f"no such node")
            if value >> 31:
                self.routes[nodes[dst]] = Route(R.PORTS[value >> 24 & 1], value >> 16 & 0xFF,
                                                nodes[nxt])
            else:
                self.routes.pop(nodes[dst], None)
        elif off == _CU["CU_SUBMIT_GO"].offset:
            if value & 1:
                self._submit()
        elif off == _CU["CU_DELIV_POP"].offset:
            if value & 1 and self.delivered:
                self.delivered.popleft()
        elif off == _CU["CU_FAIL"].offset:
            if self.failure[0] & value:
                self.failure = (self.failure[0] & ~value, *self.failure[1:])
        else:
            raise DeviceRefused(f"{self.board.node}: the control unit's 0x{off:04X} is "
                                f"read-only (write refused)")

    # --- the unit -----------------------------------------------------------------------
    def _timing(self) -> Timing:
        r = self.regs
        b = self.bounds

        def v(name: str) -> int:
            return r[_CU[f"CU_{name}"].offset]
        return Timing(v("TUNING_NS"), b.guard_ns, v("PROPAGATION_NS"),
                      v("REQUEST_TIMEOUT_NS"), v("RELEASE_TIMEOUT_NS"), v("LEASE_NS"),
                      v("MAX_RETRIES"), b.flow_queue, b.request_queue,
                      b.requests_per_sender, b.delivered_keys)

    def _start(self) -> None:
        self.unit = ControlUnit(self.board.node, self.board.clock, self.bus,
                                cast(ONic, self.engine),  # (the part a unit drives)
                                dict(self.routes), self._timing(), self._deliver, self._fail)
        self.unit.tag = self.regs[_CU["CU_TAG"].offset] & 0xFFFF

    def _halt(self) -> None:
        if self.unit is not None:
            self.unit.halt()
            self.sent += self.unit.sent
            self.unit = None

    def _submit(self) -> None:
        r = self.regs
        self._queue(sum(r[_CU[f"CU_SUBMIT{k}"].offset] << (32 * k)
                        for k in range(R.CU_FLOW_WORDS)))

    def submit_loaded(self, port: str) -> None:
        """A count-action `start tx[port]`: the flow the host loaded in the port's transfer
        registers (DST, BYTES, FLOW and the header words, which carry the whole flow) is
        handed to the unit, as CU_SUBMIT_GO hands one over (onic_top's second writer of
        its submit queue)."""
        fid, src, dst, *rest = self.board.loaded_transfer(port)
        self._queue(flow_word(FRAME, fid, src & _NODE_MASK["src"], dst & _NODE_MASK["dst"],
                              *rest))  # (a node's field: the register's low bits)

    def _queue(self, word: int) -> None:
        nodes = self.board.nodes
        f = flow_fields(FRAME, word)
        if self.unit is None or f["src"] >= len(nodes) or f["dst"] >= len(nodes):
            return  # halted, or no such node: dropped, as the gateware's halted unit does
        self.unit.submit(Flow(f["id"], nodes[f["src"]], nodes[f["dst"]], f["nbytes"],
                              f["iteration"], f["step"], f["hop"], f["t_submit"]))

    def tx_done(self, port: str, flow: Flow) -> None:
        if self.unit is not None:
            self.unit.on_tx_done(port, flow)

    def rx_done(self, port: str, flow: Flow) -> None:
        if self.unit is not None:
            self.unit.on_rx_done(port, flow.id & 0xFFFFFFFF, flow.nbytes)

    def _deliver(self, f: Flow) -> None:
        idx = self.board.index
        if len(self.delivered) >= R.CU_QUEUE:
            self.lost += 1
        else:
            self.delivered.append(flow_word(FRAME, f.id, idx[f.src], idx[f.dst], f.nbytes,
                                            f.iteration, f.step, f.hop, f.t_submit))
        # (a delivery comes of a transfer received: the board raises its line after it)
        self.board._flag("IRQ_STATUS", R.IRQ_BITS["CU_DELIVERED"])

    def _fail(self, e: Exception) -> None:
        if not self.failure[0]:
            code = R.CU_FAIL_CODES.get(getattr(e, "code", ""), R.CU_FAIL_CODES["retries"])
            peer = self.board.index.get(getattr(e, "peer", None) or "", 0)
            flow = getattr(e, "flow", 0)
            nbytes = getattr(e, "nbytes", 0)
            self.failure = (code, flow, peer, nbytes)
        self.board._flag("IRQ_STATUS", R.IRQ_BITS["CU_FAILED"])
        self.board._interrupt()
