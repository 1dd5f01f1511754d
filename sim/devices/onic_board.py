"""A register-accurate emulated O-NIC: the register file of fpga/regmap.py with its access
semantics, the count-action engine, the tunable transmitters and the transfer engine on
the fabric model. Reached through pynq (sim/devices/pynq_device.py), never called by the controller.

Writes to RO registers are refused (DeviceRefused, like an AXI SLVERR), a transfer started
while tuning or sending is refused and flagged in ERROR, as the hardware would. The model
follows the gateware (fpga/gateware/onic_ctrl.py) to the cycle's outcome: the count-action
engine's order (breadth first, CA_FIRE_LIMIT, 32-bit counts) is the RTL's, and a differential
test drives both with the same register traffic.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from oddl.controller.base.devices import DeviceRefused
from oddl.controller.base.messages import Flow
from oddl.fpga import regmap as R
from oddl.fpga.countaction import ACTION_NAMES
from oddl.fpga.overlay import placeholder_bit
from oddl.sim.devices.fabric import Fabric

# power-on: the board boots the shipped (placeholder) overlay, as a flashed board would
PLACEHOLDER_HASH = hashlib.sha256(placeholder_bit()).digest()

# read as the device's state, not storage (IRQ_STATUS is storage, read per interrupt)
_COMPUTED = {"TS_LO", "TS_HI"} | {f"{d}{p}_{k}" for p in R.PORTS for d, k in (
    ("TX", "STATUS"), ("RX", "STATUS"), ("RX", "CUR_FLOW"))}
_IRQ_STATUS = R.BY_NAME["IRQ_STATUS"].offset
_ANY = len(R.PORTS)  # index code of rx[any]
_MODULE_BITS = ((1 << R.N_MODULES) - 1) << R.IRQ_MODULE_SHIFT  # signalled with CA_FIRED
_IRQ_ENABLE = R.BY_NAME["IRQ_ENABLE"].offset
# the count-action engine's registers are its modules' fields (`_ca_read`, `_ca_write`)
_CA_MODULES = tuple(f"CA{m}_" for m in range(R.N_MODULES))  # (CAPS is no module's)
# registers that are plain storage on read / on write: the fast path of the bus decode
_PLAIN_READ = frozenset(r.offset for r in R.REGISTERS if r.access != "SC"
                        and not r.name.startswith(_CA_MODULES) and r.name not in _COMPUTED)
_PLAIN_WRITE = frozenset(r.offset for r in R.REGISTERS if r.access == "RW"
                         and not r.name.startswith(_CA_MODULES) and r.offset != _IRQ_ENABLE)
_NODE_ID = R.BY_NAME["NODE_ID"].offset
# the registers a board holds as words, at reset: not the count-action engine's (336 of
# 419: 14 kB a board that was never read, 57 MB of grid-4096)
_RESET = {r.offset: r.reset for r in R.REGISTERS if not r.name.startswith(_CA_MODULES)}
_W1C = frozenset(r.offset for r in R.REGISTERS if r.access == "W1C")
_START = {R.BY_NAME[f"TX{p}_START"].offset: p for p in R.PORTS}  # SC: offset -> port


def in_index_order(node_index: dict[str, int], nodes: list[str] | None) -> list[str]:
    """The testbed's nodes in NODE_ID order: `nodes` when given (a testbed's boards share
    one list: at 4,096 nodes a copy each was 16 M entries), else derived."""
    return nodes if nodes is not None else sorted(node_index, key=node_index.__getitem__)


@dataclass(slots=True)
class _CAModule:
    ctrl: int = 0
    target: int = 0
    count: int = 0
    fired: bool = False
    fire_count: int = 0
    src: list[int] = field(default_factory=lambda: [0] * R.N_SLOTS)
    act: list[int] = field(default_factory=lambda: [0] * R.N_SLOTS)


# a module listening to a signal: its number, itself, its sources' (index, filter) on it
_Listener = tuple[int, _CAModule, tuple[tuple[int, int], ...]]


class ONicBoard:
    """One board. `unit`: an `onic_top` (design 0.2), the stage-2 control unit inside it,
    on the control network `unit[0]` with the bounds of `unit[1]` (sim/devices/onic_unit.py);
    None: an `onic_ctrl`, stage 2 on the host."""

    def __init__(self, fabric: Fabric, node: str, node_index: dict[str, int],
                 nodes: list[str] | None = None,
                 bitstream_hash: bytes = PLACEHOLDER_HASH,
                 design_version: int = R.DESIGN_VERSION,
                 unit: tuple[Any, Any] | None = None) -> None:
        self.fabric = fabric
        self.clock = fabric.clock
        self.node = node
        self.nodes = in_index_order(node_index, nodes)
        self.index = node_index
        self.regs: dict[int, int] = dict(_RESET)
        self.regs[R.BY_NAME["DESIGN_VERSION"].offset] = design_version
        for i in range(8):
            self.regs[R.BY_NAME[f"BITSTREAM_HASH{i}"].offset] = int.from_bytes(
                bitstream_hash[4 * i: 4 * i + 4], "big")
        self.regs[R.BY_NAME["NODE_ID"].offset] = node_index[node]
        # the route RAM's words written since power-on (the rest read 0, as at reset):
        # a board holds a few dozen of its 2,048; a list of all was 16 kB a board,
        # 67 MB of grid-4096
        self.routes: dict[int, int] = {}
        self.ca = [_CAModule() for _ in range(R.N_MODULES)]
        self.ports = fabric.ports[node]
        self.start_after_tune: set[str] = set()  # CA "start" issued while its port tunes
        self.tuning_pending: set[str] = set()  # ports whose lock has not been reported yet
        self._ca_index: dict[int, list[_Listener]] | None = None
        self._events: deque[tuple[int, int, int, int | None]] = deque()
        self._fires = 0  # in the current drain (R.CA_FIRE_LIMIT)
        self.fires = 0  # since power-on (a statistic; the registers keep 8 bits of it)
        self.loaded_bitstream: str | None = None  # the last bitstream downloaded to it
        self.ts_hi_latch = 0
        self.streamed: list[tuple[int, int]] = []  # (t_ns, DAC) for Lightning
        self.on_irq: Callable[[], None] | None = None  # the board's interrupt line
        self._hdr_tx = {p: [R.BY_NAME[f"TX{p}_HDR{i}"].offset for i in range(len(R.HEADER))]
                        for p in R.PORTS}
        self._hdr_rx = {p: [R.BY_NAME[f"RX{p}_HDR{i}"].offset for i in range(len(R.HEADER))]
                        for p in R.PORTS}
        self._dst_off = {p: R.BY_NAME[f"TX{p}_DST"].offset for p in R.PORTS}
        self._flow_off = {p: R.BY_NAME[f"TX{p}_FLOW"].offset for p in R.PORTS}
        self._bytes_off = {p: R.BY_NAME[f"TX{p}_BYTES"].offset for p in R.PORTS}
        self._rx_err = {p: R.BY_NAME[f"RX{p}_ERRORS"].offset for p in R.PORTS}
        self._seen_err = dict.fromkeys(R.PORTS, 0)
        # per port: TX_DONE_COUNT, TX_SENT_LO, TX_SENT_HI, its IRQ bit, its index
        self._tx_done_at = {p: (R.BY_NAME[f"TX{p}_DONE_COUNT"].offset,
                                R.BY_NAME[f"TX{p}_SENT_LO"].offset,
                                R.BY_NAME[f"TX{p}_SENT_HI"].offset,
                                1 << R.IRQ_BITS[f"TX_DONE_{p}"], R.PORTS.index(p))
                            for p in R.PORTS}
        self._rx_irq = {p: (1 << R.IRQ_BITS[f"RX_DONE_{p}"], R.PORTS.index(p))
                        for p in R.PORTS}
        # per port, the receive registers a completion writes, in `_rx_done`'s order
        self._rx_off = {p: tuple(R.BY_NAME[f"RX{p}_{k}"].offset for k in (
            "BYTES_LO", "BYTES_HI", "SRC", "LAST_FLOW", "DST", "LAST_BYTES", "DONE_COUNT"))
            for p in R.PORTS}
        fabric.rx_handlers[node] = self._rx_done
        fabric.tx_handlers[node] = self._tx_done
        fabric.tuned_handlers[node] = self._tuned
        self.unit_block: Any = None
        if unit is not None:
            from oddl.sim.devices.onic_unit import UnitBlock

            self.regs[R.BY_NAME["DESIGN_VERSION"].offset] = R.TOP_DESIGN_VERSION
            self.unit_block = UnitBlock(self, *unit)

    # --- bus access -------------------------------------------------------------------
    def read(self, off: int) -> int:
        if off in _PLAIN_READ:
            return self.regs[off]
        if R.ROUTE_BASE <= off < R.ROUTE_BASE + 8 * R.ROUTE_ENTRIES:
            return self.routes.get((off - R.ROUTE_BASE) // 4, 0)
        if off >= R.CU_BASE and self.unit_block is not None:
            return int(self.unit_block.read(off))
        reg = R.BY_OFFSET.get(off)
        if reg is None:
            return 0  # unmapped: reads as zero (AXI decode of a hole)
        name = reg.name
        if reg.access == "SC":
            return 0
        if name == "TS_LO":
            now = self.clock.now_ns()
            self.ts_hi_latch = now >> 32
            return now & 0xFFFFFFFF
        if name == "TS_HI":
            return self.ts_hi_latch
        if name.startswith(_CA_MODULES):
            return self._ca_read(name)
        if name[:2] in ("TX", "RX") and name[2] not in self.ports:
            return self.regs[off]  # a port with no fibre: its status as at reset
        if name.startswith("TX") and name.endswith("_STATUS"):
            return self._tx_status(name[2])
        if name.startswith("RX") and name.endswith("_STATUS"):
            return 1 if self.fabric.rx[(self.node, name[2])].current is not None else 0
        if name.endswith("_CUR_FLOW"):
            cur = self.fabric.rx[(self.node, name[2])].current
            return 0xFFFFFFFF if cur is None else cur.id & 0xFFFFFFFF
        return self.regs[off]

    def write(self, off: int, value: int) -> None:
        value &= 0xFFFFFFFF
        if off in _PLAIN_WRITE:  # cannot change the interrupt line
            self.regs[off] = value
            return
        if R.ROUTE_BASE <= off < R.ROUTE_BASE + 8 * R.ROUTE_ENTRIES:
            self.routes[(off - R.ROUTE_BASE) // 4] = value
            return
        start = _START.get(off)
        if off >= R.CU_BASE and self.unit_block is not None:
            self.unit_block.write(off, value)
        elif start is not None:  # TXn_START, the per-flow command
            if value & 1:
                self._start(start)
        elif off in _W1C:  # IRQ_STATUS and ERROR, cleared per interrupt and per refusal
            self.regs[off] &= ~value
        else:
            self._write(off, value)
        self._interrupt()  # a level line: a write may raise it (IRQ_ENABLE, an ERROR flag)

    def load_bitstream_hash(self, digest: bytes) -> None:
        """What configuring the FPGA with a bitstream leaves in the identity block."""
        for i in range(8):
            self.regs[R.BY_NAME[f"BITSTREAM_HASH{i}"].offset] = int.from_bytes(
                digest[4 * i: 4 * i + 4], "big")

    def _write(self, off: int, value: int) -> None:
        reg = R.BY_OFFSET.get(off)
        if reg is None:
            raise DeviceRefused(f"{self.node}: write to unmapped offset 0x{off:04X}")
        if reg.access == "RO":
            raise DeviceRefused(f"{self.node}: {reg.name} is read-only (write refused)")
        name = reg.name  # (TXn_START and the W1C registers: `write` takes them)
        if name.startswith(_CA_MODULES):
            self._ca_write(name, value)
            return
        if reg.access == "SC":
            if value & 1 and name.endswith("_CMD"):
                self._tune(name[2])
                if value & 2 and name[2] in self.tuning_pending:
                    self.start_after_tune.add(name[2])
            return
        self.regs[off] = value

    def close(self) -> None:
        """Nothing to let go of (the RTL board hands its simulator on)."""

    # --- transmitter / transfer engine ------------------------------------------------
    def _r(self, name: str) -> int:
        return self.regs[R.BY_NAME[name].offset]

    def _set(self, name: str, v: int) -> None:
        self.regs[R.BY_NAME[name].offset] = v & 0xFFFFFFFF

    def _flag(self, reg: str, bit: int) -> None:
        self.regs[R.BY_NAME[reg].offset] |= 1 << bit

    def _interrupt(self) -> None:
        """Raise the (level) interrupt line once an event has set all its flags."""
        if self.on_irq is not None and self.regs[_IRQ_STATUS] & (
                self.regs[_IRQ_ENABLE] | _MODULE_BITS):
            self.on_irq()

    def _tx_status(self, p: str) -> int:
        tx = self.fabric.tx[(self.node, p)]
        tuning = p in self.tuning_pending  # until the laser's lock is reported
        ch = tx.channel if tx.channel is not None and not tuning else 0
        return (int(tuning) | (int(tx.busy is not None) << 1)
                | (int(tx.channel is not None and not tuning) << 2) | (ch << 8))

    def _tune(self, p: str) -> None:
        ch = self._r(f"TX{p}_CHANNEL")
        if p not in self.ports or ch >= self.fabric.n_channels:
            self._flag("ERROR", R.ERROR_BITS["BAD_CHANNEL"])
            self._flag("IRQ_STATUS", R.IRQ_BITS["ERROR"])
            return
        try:
            self.fabric.tune(self.node, p, ch)
        except DeviceRefused:
            self._flag("ERROR", R.ERROR_BITS[f"TX_REFUSED_{p}"])
            self._flag("IRQ_STATUS", R.IRQ_BITS["ERROR"])
            return
        self.tuning_pending.add(p)

    def _tuned(self, p: str, ch: int) -> None:
        self.tuning_pending.discard(p)
        # latched by the timestamp counter at lock: the modelled lock instant, not the
        # moment a (real-time, emu) loop got round to this callback
        tx = self.fabric.tx[(self.node, p)]
        self._set(f"TX{p}_TUNE_NS", tx.tune_until - tx.tune_from)
        self._flag("IRQ_STATUS", R.IRQ_BITS[f"TUNED_{p}"])
        if p in self.start_after_tune:
            self.start_after_tune.discard(p)
            self._start(p)
        self._interrupt()

    def _start(self, p: str) -> None:
        tx = self.fabric.tx[(self.node, p)]
        if (p in self.tuning_pending or self.clock.now_ns() < tx.tune_until
                or tx.busy is not None or tx.channel is None):
            self._flag("ERROR", R.ERROR_BITS[f"TX_REFUSED_{p}"])
            self._flag("IRQ_STATUS", R.IRQ_BITS["ERROR"])
            return
        fid, src, dst, nbytes, it, step, hop, t_submit = self.loaded_transfer(p)
        if dst >= len(self.nodes) or src >= len(self.nodes):
            self._flag("ERROR", R.ERROR_BITS["ROUTE_MISS"])
            self._flag("IRQ_STATUS", R.IRQ_BITS["ERROR"])
            return
        flow = Flow(fid, self.nodes[src], self.nodes[dst], nbytes, it, step, hop, t_submit)
        self.fabric.send(self.node, p, flow)

    def loaded_transfer(self, p: str) -> tuple[int, int, int, int, int, int, int, int]:
        """The transfer the host loaded in port `p`'s registers, as they hold it, in a
        flow word's order (frame.flow_word): id, src, dst, bytes, iteration, step, hop,
        submit time; the nodes are indices, unchecked."""
        r = self.regs
        fid, src, hop, step, it, t_submit = R.header_unpack(
            r[self._flow_off[p]], [r[x] for x in self._hdr_tx[p]])
        return fid, src, r[self._dst_off[p]], r[self._bytes_off[p]], it, step, hop, t_submit

    def _tx_done(self, p: str, flow: Flow) -> None:
        r = self.regs
        done, lo, hi, bit, pi = self._tx_done_at[p]
        r[done] = (r[done] + 1) & 0xFFFFFFFF
        sent = (r[hi] << 32 | r[lo]) + flow.nbytes
        r[lo] = sent & 0xFFFFFFFF
        r[hi] = (sent >> 32) & 0xFFFFFFFF
        r[_IRQ_STATUS] |= bit
        self.signal((3, pi, 1, None))
        if self.unit_block is not None:
            self.unit_block.tx_done(p, flow)
        self._interrupt()

    def _rx_done(self, p: str, flow: Flow) -> None:
        r = self.regs
        bytes_lo, bytes_hi, src_reg, last_flow, dst_reg, last_bytes, done = self._rx_off[p]
        got = (r[bytes_hi] << 32 | r[bytes_lo]) + flow.nbytes
        r[bytes_lo] = got & 0xFFFFFFFF
        r[bytes_hi] = (got >> 32) & 0xFFFFFFFF
        leg = self.fabric.rx[(self.node, p)]
        leg_src = leg.src
        src = self.index[leg_src] if leg_src is not None else self.index[flow.src]
        r[src_reg] = src
        r[last_flow] = flow.id & 0xFFFFFFFF
        r[dst_reg] = self.index[flow.dst]
        r[last_bytes] = flow.nbytes
        r[done] = (r[done] + 1) & 0xFFFFFFFF
        errors = leg.errors
        if errors != self._seen_err[p]:  # a CRC failure on this transfer: count it (W1C)
            r[self._rx_err[p]] = (r[self._rx_err[p]] + errors - self._seen_err[p]) & 0xFFFFFFFF
            self._seen_err[p] = errors
        for off, v in zip(self._hdr_rx[p], R.header_words(
                flow.id, self.index[flow.src], flow.hop, flow.step, flow.iteration,
                flow.t_submit), strict=True):
            r[off] = v
        bit, pi = self._rx_irq[p]
        r[_IRQ_STATUS] |= bit
        final = r[dst_reg] == r[_NODE_ID]  # the final leg: the bytes are this node's step's
        self.signal((1, pi, flow.nbytes, src), (2, pi, 1, src),
                    *[(6, _ANY, flow.nbytes, flow.step)] * final)
        if self.unit_block is not None:
            self.unit_block.rx_done(p, flow)
        self._interrupt()

    # --- count-action engine ----------------------------------------------------------
    def _ca_slot(self, name: str) -> tuple[_CAModule, int, str]:
        head, _, field_ = name.partition("_")
        m = int(head[2:])
        return self.ca[m], m, field_

    def _ca_read(self, name: str) -> int:
        mod, _, f = self._ca_slot(name)
        if f == "CTRL":
            return mod.ctrl
        if f == "STATUS":
            return int(bool(mod.ctrl & 1)) | (int(mod.fired) << 1) | ((mod.fire_count & 0xFF) << 8)
        if f == "TARGET":
            return mod.target
        if f == "COUNT":
            return mod.count
        if f.startswith("SRC"):
            return mod.src[int(f[3:])]
        if f.startswith("ACT"):
            return mod.act[int(f[3:])]
        return 0

    def _ca_write(self, name: str, v: int) -> None:
        mod, _, f = self._ca_slot(name)
        if f.startswith("SRC"):
            self._ca_index = None
        if f == "CTRL":
            mod.ctrl = v & 3
        elif f == "RESET":
            if v & 1:
                mod.count, mod.fired, mod.fire_count = 0, False, 0
        elif f == "TARGET":
            mod.target = v
        elif f.startswith("SRC"):
            mod.src[int(f[3:])] = v
        elif f.startswith("ACT"):
            mod.act[int(f[3:])] = v

    def _listeners(self) -> dict[int, list[_Listener]]:
        """signal -> each module with a source on it, ascending, with those sources'
        (index, filter) in slot order (rebuilt after the engine is reprogrammed)."""
        if self._ca_index is None:
            idx: dict[int, list[_Listener]] = {}
            for m, mod in enumerate(self.ca):
                for sig in dict.fromkeys(w & 0xFF for w in mod.src if w & 0xFF):
                    conds = tuple(((w >> 8) & 0xFF, w >> 16) for w in mod.src
                                  if (w & 0xFF) == sig)
                    idx.setdefault(sig, []).append((m, mod, conds))
            self._ca_index = idx
        return self._ca_index

    def signal(self, *events: tuple[int, int, int, int | None]) -> None:
        """Events on the board (signal, index, value, src), queued in order, then the queue
        drained breadth first, as the gateware's event FIFO: a firing's `module[m].fired`
        waits behind what is already queued."""
        self._events.extend(events)
        while self._events:
            if not self._count(*self._events[0]):
                self._events.clear()  # a loop, cut: what it queued is dropped
                break
            self._events.popleft()
        self._fires = 0

    def _count(self, sig: int, index: int, value: int, src: int | None) -> bool:
        """Every armed module with a matching source counts the event once, in ascending
        order; one that reaches its target fires before the next counts. False: cut."""
        mods = self._listeners().get(sig)
        if not mods:
            return True
        for m, mod, conds in mods:
            if not mod.ctrl & 1:
                continue
            for widx, filt in conds:
                if widx != index and not (sig == 6 and widx == _ANY):
                    continue
                if filt and (src is None or filt - 1 != src):
                    continue
                mod.count = (mod.count + value) & 0xFFFFFFFF
                if mod.count >= mod.target > 0:
                    if self._fires == R.CA_FIRE_LIMIT:
                        self._flag("ERROR", R.ERROR_BITS["CA_LOOP"])
                        self._flag("IRQ_STATUS", R.IRQ_BITS["ERROR"])
                        return False
                    self._fires += 1
                    self._fire(m, mod)
                break
        return True

    def set_dac_valid(self, dac: int) -> None:
        self.signal((4, dac, 1, None))
        self._interrupt()

    def _fire(self, m: int, mod: _CAModule) -> None:
        self.fires += 1
        mod.fired = True
        mod.fire_count = (mod.fire_count + 1) & 0xFF
        if mod.ctrl & 2:
            mod.count = (mod.count - mod.target) & 0xFFFFFFFF  # auto re-arm: count on
        else:
            mod.ctrl &= ~1
        self.regs[_IRQ_STATUS] |= 1 << (R.IRQ_MODULE_SHIFT + m)
        self._events.append((5, m, 1, None))
        for w in mod.act:
            a = ACTION_NAMES.get(w & 0xFF)
            idx, arg = (w >> 8) & 0xFF, w >> 16
            if a in ("tune", "start") and idx < len(R.PORTS):
                p = R.PORTS[idx]
                if self.unit_block is not None:  # onic_top: the port is the unit's to drive
                    if a == "tune":  # the unit tunes as its route says, once granted
                        self._set(f"TX{p}_CHANNEL", arg)
                    else:  # the flow loaded in the port's registers goes to the unit
                        self.unit_block.submit_loaded(p)
                elif a == "tune":
                    self._set(f"TX{p}_CHANNEL", arg)
                    self._tune(p)
                elif p in self.tuning_pending:
                    self.start_after_tune.add(p)  # the engine sequences: send once locked
                else:
                    self._start(p)
            elif a == "stream":
                self.streamed.append((self.clock.now_ns(), idx))
            elif a == "irq":
                self._flag("IRQ_STATUS", R.IRQ_BITS["CA_FIRED"])
            elif a == "arm" and idx < R.N_MODULES:
                self.ca[idx].ctrl |= 1
            elif a == "reset" and idx < R.N_MODULES:
                t = self.ca[idx]
                t.count, t.fired, t.fire_count = 0, False, 0


class BoardLine:
    """The board model's interrupt line (`controller.devices.InterruptLine`): the handler
    runs on the model's loop at the instant the board raises the line, as a task awaiting
    `pynq.Interrupt` wakes on a board."""

    def __init__(self, board: ONicBoard) -> None:
        self.board = board

    def connect(self, handler: Callable[[], None]) -> None:
        self.board.on_irq = handler

    def disconnect(self) -> None:
        self.board.on_irq = None
