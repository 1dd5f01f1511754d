"""The O-NIC's gateware in the loop: `onic_ctrl` (fpga/gateware) simulated cycle by cycle in
Amaranth's simulator, behind the same pynq `Device` as the Python board model, so the
unmodified driver's register traffic reaches the RTL as AXI-Lite transactions.

The optics stay modelled (sim/devices/fabric.py): the harness plays the laser driver and the MAC,
turning the IP's tune commands and transfer descriptors into fabric calls, and the fabric's
lock, sent and received reports into the IP's strobes.

With the control unit on the board (`control_model = "board"`), the RTL is `onic_top`: the
harness is then also the MAC's control port (a message for this node on the control
network becomes a frame on `ctl_rx`, a frame on `ctl_tx` a message), and each timer the
unit arms is a timer on the model's clock, made in the order the RTL arms them; when one is
due, the clock wakes the RTL with that timer alone enabled, so that timers due at one
instant fire in the model's order (the top built for simulation gives its unit's timers as
ports).

The RTL is clocked only while it has work (a register access, a lock, a transfer ending, a
DAC valid, the count-action events these queue), at the model's instant of that work, and
is left unclocked in between. That is exact for this design: nothing in it counts cycles
while idle (time comes from the `ts_ns` time base, set from the model's clock before each
piece of work), so an idle span of any length leaves every register as it found it.
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oddl.controller.base.devices import Bus, DeviceRefused
from oddl.controller.base.extras import require
from oddl.controller.base.messages import ControlMessage, Flow
from oddl.controller.stage2.control_unit import Timing
from oddl.controller.stage2.wire import FRAME, decode_frame
from oddl.fpga import regmap as R
from oddl.fpga.gateware.verilated import Ports, TestbenchPorts
from oddl.sim.devices.fabric import Fabric
from oddl.sim.devices.onic_board import PLACEHOLDER_HASH, in_index_order
from oddl.sim.devices.rtl_control_unit import Bounds, Framer

CLOCK_HZ = 250e6  # PL0, as the overlay's .hwh sets it
_N_HDR = len(R.HEADER)


class RtlError(RuntimeError):
    """The RTL asked the optics for something the model refuses: a disagreement between
    the gateware's view of a port and the fabric's, which the differential test hunts."""


@dataclass
class _Op:
    kind: str  # read, write, lock, tx_done, rx_done, dac
    port: int = 0
    args: dict[str, int] = field(default_factory=dict)
    result: int = 0
    resp: int = 0
    done: bool = False


_PINS = ("tune_valid", "tune_channel", "tx_valid", "tx_dst", "tx_bytes", "tx_flow", "tx_hdr",
         "rx_busy", "rx_cur_flow", "tune_locked", "tx_done", "rx_done")


def _drive(io: Ports, core: Any, board: RtlBoard, op: _Op) -> Iterator[None]:
    """One piece of work into the IP, as the PS and the datapath would present it: yields
    for each clock edge (the caller's simulator ticks), and after each, takes what came
    out (tunes, descriptors, streams, firings) into `core`."""
    pins = [{k: f"{p.lower()}_{k}" for k in _PINS} for p in R.PORTS]

    def tick() -> Iterator[None]:
        yield
        core.cycles += 1
        core.total += 1
        if core.top is not None:
            if io.get("ctl_tx_tvalid"):  # (ctl_tx_tready held high)
                core.effects.append(("frame", -1, io.get("ctl_tx_tdata")))
            arming = io.get("unit_arming")
            core.effects.extend(("arm", i, None) for i in range(arming.bit_length())
                                if arming >> i & 1)
        if not io.get("strobe"):
            return
        for i, pn in enumerate(pins):
            if io.get(pn["tune_valid"]):
                core.effects.append(("tune", i, io.get(pn["tune_channel"])))
            if io.get(pn["tx_valid"]):
                hdr = io.get(pn["tx_hdr"])
                core.effects.append(("tx", i, (
                    io.get(pn["tx_dst"]), io.get(pn["tx_bytes"]), io.get(pn["tx_flow"]),
                    [(hdr >> (32 * k)) & 0xFFFFFFFF for k in range(_N_HDR)])))
        if io.get("fired"):
            core.fires += 1
        if io.get("stream_valid"):
            core.effects.append(("stream", -1, io.get("stream_dac")))

    def handshake(valid: str, ready: str) -> Iterator[None]:
        io.set(valid, 1)
        while True:
            go = io.get(ready)
            yield from tick()
            if go:
                break
        io.set(valid, 0)

    a = op.args
    io.set("ts_ns", board.clock.now_ns())
    io.set("bitstream_hash", int.from_bytes(board.bitstream_hash, "big"))
    for i, p in enumerate(R.PORTS):
        rx = board.fabric.rx.get((board.node, p))
        cur = rx.current if rx is not None else None
        io.set(pins[i]["rx_busy"], cur is not None)
        io.set(pins[i]["rx_cur_flow"], 0 if cur is None else cur.id & 0xFFFFFFFF)
    pn = pins[op.port] if op.kind != "wake" else {}
    if core.top is not None:  # a wake is for one timer (`op.port`), nothing else is
        io.set("unit_timers_en", 1 << op.port if op.kind == "wake" else 0)
    if op.kind == "write":
        io.set("s_axi_awaddr", a["addr"])
        io.set("s_axi_wdata", a["data"])
        io.set("s_axi_wvalid", 1)
        yield from handshake("s_axi_awvalid", "s_axi_awready")
        io.set("s_axi_wvalid", 0)
        while not io.get("s_axi_bvalid"):
            yield from tick()
        op.resp = io.get("s_axi_bresp")
        yield from handshake("s_axi_bready", "s_axi_bvalid")
    elif op.kind == "read":
        io.set("s_axi_araddr", a["addr"])
        yield from handshake("s_axi_arvalid", "s_axi_arready")
        while not io.get("s_axi_rvalid"):
            yield from tick()
        op.result, op.resp = io.get("s_axi_rdata"), io.get("s_axi_rresp")
        yield from handshake("s_axi_rready", "s_axi_rvalid")
    elif op.kind == "frame":  # a control frame from the MAC, one beat
        io.set("ctl_rx_tdata", a["data"])
        io.set("ctl_rx_tlast", 1)
        yield from handshake("ctl_rx_tvalid", "ctl_rx_tready")
    elif op.kind != "wake":  # (a wake: the unit's timer is due, nothing else to present)
        if op.kind == "rx_done":
            for k, v in a.items():
                io.set(f"{R.PORTS[op.port].lower()}_rx_{k}", v)
        if op.kind == "dac":
            io.set("dac_index", a["index"])
        strobe = "dac_valid" if op.kind == "dac" else pn[{
            "lock": "tune_locked", "tx_done": "tx_done", "rx_done": "rx_done"}[op.kind]]
        io.set(strobe, 1)
        yield from tick()
        io.set(strobe, 0)
    while io.get("busy"):
        yield from tick()
    core.line = bool(io.get("irq"))
    if core.top is not None:  # the unit's timers, for the next wake
        core.timers = (io.get("unit_armed"), io.get("unit_due"))


def _straps(io: Ports, board: RtlBoard) -> None:
    if board.core.top is not None:
        io.set("ctl_tx_tready", 1)  # the MAC takes every frame at once
    io.set("node_id", board.index[board.node])
    io.set("n_nodes", len(board.nodes))
    io.set("n_channels", board.fabric.n_channels)
    io.set("ports_present", sum(1 << i for i, p in enumerate(R.PORTS) if p in board.ports))
    io.set("s_axi_wstrb", 0xF)


class _Core:
    """One elaborated, compiled `onic_ctrl` and its simulator. Compiling costs about 0.3 s,
    so a core outlives its board: the next board takes it, reset to power-on."""

    def __init__(self, design_version: int, top: Bounds | None = None) -> None:
        from amaranth.sim import Simulator
        from oddl.fpga.gateware.onic_ctrl import OnicCtrl

        # `top`: `onic_top`, the control unit inside, with these bounds
        self.top = top
        self.dut: Any = OnicCtrl(design_version) if top is None else _top(top)
        self.timers = (0, 0)  # the unit's: which are armed, and their due times
        self.sim = Simulator(self.dut)
        self.sim.add_clock(1 / CLOCK_HZ)
        self.sim.add_testbench(self._bench, background=True)
        self.owner: Callable[[], RtlBoard | None] = lambda: None
        self.ops: deque[_Op] = deque()
        self.effects: list[tuple[str, int, Any]] = []
        self.cycles = 0  # for the board that holds it
        self.total = 0  # since it was compiled
        self.fires = 0
        self.line = False

    def reset(self) -> None:
        self.sim.reset()

    def run(self, op: _Op) -> _Op:
        self.ops.append(op)
        while not op.done:
            self.sim.advance()
        return op

    async def _bench(self, ctx: Any) -> None:
        d = self.dut
        io = TestbenchPorts(ctx, d)
        board = self.owner()
        assert board is not None
        _straps(io, board)
        del board  # held weakly: the board may go, and the core to the next one
        while True:
            await ctx.tick()
            while self.ops:
                op = self.ops.popleft()
                board = self.owner()
                assert board is not None
                for _ in _drive(io, self, board, op):
                    await ctx.tick()
                del board
                op.done = True


class _VCore:
    """`onic_ctrl` (or `onic_top`) compiled by Verilator (fpga/gateware/verilated.py): the
    library built once a machine, a model of its own per board."""

    def __init__(self, design_version: int, top: Bounds | None = None) -> None:
        from oddl.fpga.gateware import verilated
        from oddl.fpga.gateware.onic_ctrl import OnicCtrl

        key = (design_version, top)
        if key not in _BUILT:
            dut = OnicCtrl(design_version) if top is None else _top(top)
            _BUILT[key] = (dut, verilated.build(dut, R.IP_NAME if top is None
                                                else R.TOP_IP_NAME))
        self._design = _BUILT[key]
        self.model: Any = None
        self.owner: Callable[[], RtlBoard | None] = lambda: None
        self.effects: list[tuple[str, int, Any]] = []
        self.cycles = self.total = self.fires = 0
        self.line = False
        self.top = top
        self.timers = (0, 0)
        self._strapped = False
        self.reset()

    def reset(self) -> None:
        """Power-on: a fresh model (a reset leaves memories as they were, and the route
        table and count-action images must not pass from one board to the next), then
        the edge Amaranth's testbench waits for before its first piece of work."""
        from oddl.fpga.gateware import verilated

        if self.model is not None:
            self.model.close()
        self.model = verilated.Model(self._design[1], self._design[0])
        self.model.reset()
        self.model.tick()
        self._strapped = False

    def run(self, op: _Op) -> _Op:
        board = self.owner()
        assert board is not None
        m = self.model
        if not self._strapped:
            _straps(m, board)
            self._strapped = True
        for _ in _drive(m, self, board, op):
            m.tick()
        op.done = True
        return op


_BUILT: dict[tuple[int, Bounds | None], tuple[Any, Path]] = {}  # a design and its library


def _top(b: Bounds) -> Any:
    """`onic_top` with these bounds, its unit's timers out for the harness to wake it."""
    from oddl.fpga.gateware.onic_top import OnicTop

    return OnicTop(FRAME, b.nodes, b.txq, b.rxq, b.done, b.per_sender, sim_view=True)
_CORES: dict[tuple[str, int, Bounds | None], list[_Core | _VCore]] = {}


def cycles_simulated() -> int:
    """Clock cycles simulated by every core in this process (bench/gateware_bench.py)."""
    return sum(c.total for cores in _CORES.values() for c in cores)


def _take_core(board: RtlBoard, design_version: int, simulator: str,
               top: Bounds | None) -> _Core | _VCore:
    """A core no live board holds, reset to power-on; or a new one."""
    cores = _CORES.setdefault((simulator, design_version, top), [])
    for core in cores:
        if core.owner() is None:
            core.reset()
            break
    else:
        core = (_Core if simulator == "amaranth" else _VCore)(design_version, top)
        cores.append(core)
    core.owner = weakref.ref(board)
    if isinstance(core, _Core):
        core.ops.clear()
    core.effects.clear()
    core.cycles = core.fires = 0
    core.line = False
    core.timers = (0, 0)
    return core


class RtlBoard:
    """`ONicBoard`'s interface over the simulated RTL (read, write, set_dac_valid, on_irq)."""

    def __init__(self, fabric: Fabric, node: str, node_index: dict[str, int],
                 nodes: list[str] | None = None,
                 bitstream_hash: bytes = PLACEHOLDER_HASH,
                 design_version: int = R.DESIGN_VERSION, simulator: str = "amaranth",
                 unit: tuple[Bus, Timing] | None = None) -> None:
        """`unit`: the board is `onic_top`, the stage-2 control unit inside it, on the
        control network `unit[0]` with the bounds of `unit[1]` (as `ONicBoard`'s)."""
        require("gateware", "the RTL board model (board_model = \"rtl\")")
        top = None
        if unit is not None:
            design_version = R.TOP_DESIGN_VERSION
            top = Bounds.of(unit[1], len(node_index))
        self.fabric = fabric
        self.clock = fabric.clock
        self.node = node
        self.nodes = in_index_order(node_index, nodes)
        self.index = node_index
        self.ports = fabric.ports[node]
        self.bitstream_hash = bitstream_hash
        self.core = _take_core(self, design_version, simulator, top)
        self._wakes: dict[int, Any] = {}  # the clock's timer for each armed one of the unit's
        self._frame = Framer(node, node_index, R.PORTS)
        self.bus = unit[0] if unit is not None else None
        if self.bus is not None:
            self.bus.attach(node, self._on_message)
        self.streamed: list[tuple[int, int]] = []
        self.on_irq: Callable[[], None] | None = None
        self.loaded_bitstream: str | None = None
        self._seen_err = dict.fromkeys(R.PORTS, 0)
        fabric.rx_handlers[node] = self._rx_done
        fabric.tx_handlers[node] = self._tx_done
        fabric.tuned_handlers[node] = self._tuned

    @property
    def cycles(self) -> int:
        return self.core.cycles

    @property
    def fires(self) -> int:
        return self.core.fires

    def close(self) -> None:
        """Hand the compiled core on to the next board (it is reset when taken); the
        unit's wake, if one is due, is not for that board."""
        for t in self._wakes.values():
            t.cancel()
        self._wakes.clear()
        self.core.owner = lambda: None

    # --- the interface the pynq device and the fabric use -----------------------------
    def read(self, off: int) -> int:
        return self._run(_Op("read", args={"addr": off})).result

    def write(self, off: int, value: int) -> None:
        op = self._run(_Op("write", args={"addr": off, "data": value & 0xFFFFFFFF}))
        if op.resp:
            reg = R.BY_OFFSET.get(off)
            what = f"{reg.name} is read-only" if reg else f"unmapped offset 0x{off:04X}"
            raise DeviceRefused(f"{self.node}: {what} (write refused: SLVERR)")
        self._interrupt()

    def set_dac_valid(self, dac: int) -> None:
        self._run(_Op("dac", args={"index": dac}))
        self._interrupt()

    def load_bitstream_hash(self, digest: bytes) -> None:
        self.bitstream_hash = digest

    def _tuned(self, p: str, ch: int) -> None:
        self._run(_Op("lock", R.PORTS.index(p)))
        self._interrupt()

    def _tx_done(self, p: str, flow: Flow) -> None:
        self._run(_Op("tx_done", R.PORTS.index(p)))
        self._interrupt()

    def _rx_done(self, p: str, flow: Flow) -> None:
        rx = self.fabric.rx[(self.node, p)]
        src = self.index[rx.src] if rx.src is not None else self.index[flow.src]
        crc = rx.errors != self._seen_err[p]
        self._seen_err[p] = rx.errors
        hdr = R.header_words(flow.id, self.index[flow.src], flow.hop, flow.step,
                             flow.iteration, flow.t_submit)
        self._run(_Op("rx_done", R.PORTS.index(p), {
            "src": src, "dst": self.index[flow.dst], "flow": flow.id & 0xFFFFFFFF,
            "bytes": flow.nbytes, "hdr": sum(w << (32 * i) for i, w in enumerate(hdr)),
            "crc_error": int(crc)}))
        self._interrupt()

    # --- the control unit's frames and timers (onic_top) ---------------------------------
    def _on_message(self, m: ControlMessage) -> None:
        if (word := self._frame(m)) is None:
            return
        self._run(_Op("frame", args={"data": word}))
        self._interrupt()

    def _due(self, timer: int) -> None:
        self._wakes.pop(timer, None)
        self._run(_Op("wake", timer))
        self._interrupt()

    def _arm(self, timer: int) -> None:
        """The unit armed `timer` (again): the clock wakes the RTL when it is due. (A timer
        is work: the RTL is clocked only while it has work.)"""
        old = self._wakes.pop(timer, None)
        if old is not None:
            old.cancel()
        armed, due = self.core.timers
        loop = getattr(self.clock, "loop", None)  # (the model checker's clock has none)
        if armed >> timer & 1 and not (loop is not None and loop.is_closed()):
            # (a register read after the run, its loop closed, wakes nothing)
            at = due >> 64 * timer & (1 << 64) - 1
            self._wakes[timer] = self.clock.call_at_ns(max(at, self.clock.now_ns()),
                                                       self._due, timer)

    # --- the loop -----------------------------------------------------------------------
    def _run(self, op: _Op) -> _Op:
        core = self.core
        core.run(op)
        effects, core.effects = core.effects, []
        for kind, i, data in effects:
            if kind == "arm":
                self._arm(i)
            else:
                self._effect(kind, R.PORTS[i] if i >= 0 else "", data)
        armed = core.timers[0]
        for i in [i for i in self._wakes if not armed >> i & 1]:  # disarmed, or fired
            self._wakes.pop(i).cancel()
        return op

    def _effect(self, kind: str, p: str, data: Any) -> None:
        if kind == "frame":
            assert self.bus is not None
            msg = decode_frame(data, self.nodes, R.PORTS)
            self.bus.send(self.node, msg.dst, msg)
            return
        if kind == "stream":
            self.streamed.append((self.clock.now_ns(), data))
            return
        try:
            if kind == "tune":
                self.fabric.tune(self.node, p, data)
            else:
                dst, nbytes, flow_lo, hdr = data
                fid, src, hop, step, it, t_submit = R.header_unpack(flow_lo, hdr)
                self.fabric.send(self.node, p, Flow(fid, self.nodes[src], self.nodes[dst],
                                                    nbytes, it, step, hop, t_submit))
        except DeviceRefused as e:
            raise RtlError(f"{self.node}: the RTL's {kind} on {p} was refused by the "
                           f"optics: {e}") from e

    def _interrupt(self) -> None:
        """The level line, looked at after each piece of work, as on the Python model."""
        if self.on_irq is not None and self.core.line:
            self.on_irq()
