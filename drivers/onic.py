"""O-NIC driver over pynq MMIO: the same code against a real board or the emulated one.

Every operation is a short, fixed sequence of register reads and writes on `onic_ctrl`
(fpga/regmap.py); tests pin those sequences down exactly.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from oddl.controller.base.devices import DeviceRefused
from oddl.fpga import regmap as R
from oddl.fpga.countaction import Program
from oddl.fpga.countaction_image import compile_program, decompile, image_writes
from oddl.fpga.overlay import check_ip_dict

log = logging.getLogger(__name__)


class IdentityMismatch(RuntimeError):
    pass


class RegisterWindow(Protocol):
    """What the driver uses of `pynq.MMIO`: 32-bit reads and writes of the AXI-Lite window
    (a real board's, an emulated one's, a cassette's)."""

    def read(self, offset: int = 0, length: int = 4, word_order: str = "little") -> int: ...

    def write(self, offset: int, data: int | bytes) -> None: ...


def _off(name: str) -> int:
    return R.BY_NAME[name].offset


_OFFSETS = {name: reg.offset for name, reg in R.BY_NAME.items()}
_ERROR = _off("ERROR")
_IRQ_STATUS = _off("IRQ_STATUS")
_CA_FIRED = 1 << R.IRQ_BITS["CA_FIRED"]
_CU_BITS = 1 << R.IRQ_BITS["CU_DELIVERED"] | 1 << R.IRQ_BITS["CU_FAILED"]
_MODULE_BITS = ((1 << R.N_MODULES) - 1) << R.IRQ_MODULE_SHIFT  # signalled with CA_FIRED


_DESCRIPTOR = struct.Struct(f"<{3 + len(R.HEADER)}I")  # DST, BYTES, FLOW, HDR0..
_TUNE = struct.Struct("<2I")  # CHANNEL, CMD


class ONicDriver:
    def __init__(self, mmio: RegisterWindow, node: str = "", nodes: list[str] | None = None,
                 index: Mapping[str, int] | None = None) -> None:
        """nodes: the testbed's, in NODE_ID order; index: node -> its NODE_ID (give the
        testbed's one to every driver: at 4,096 nodes one each is 16 M entries)."""
        self.mmio = mmio
        self.node = node
        self.design = R.DESIGN_VERSION  # its overlay's IP's (open_onic): which unit it takes
        self.nodes = nodes or []
        self.index = index if index is not None else {n: i for i, n in enumerate(self.nodes)}
        # per port: TX_DST, TX_CHANNEL, TX_START offsets and its ERROR.TX_REFUSED bit
        self._tx = {p: (_off(f"TX{p}_DST"), _off(f"TX{p}_CHANNEL"), _off(f"TX{p}_START"),
                        1 << R.ERROR_BITS[f"TX_REFUSED_{p}"]) for p in R.PORTS}

    # --- identity -----------------------------------------------------------------------
    def identity(self) -> dict[str, Any]:
        magic = self.mmio.read(_off("MAGIC"))
        version = self.mmio.read(_off("DESIGN_VERSION"))
        words = [self.mmio.read(_off(f"BITSTREAM_HASH{i}")) for i in range(8)]
        return {"magic": magic, "design_version": version,
                "bitstream_hash": b"".join(w.to_bytes(4, "big") for w in words).hex(),
                "node_id": self.mmio.read(_off("NODE_ID"))}

    def check_identity(self, design_version: int = R.DESIGN_VERSION,
                       bitstream_hash: str | None = None) -> dict[str, Any]:
        ident = self.identity()
        if ident["magic"] != R.MAGIC:
            raise IdentityMismatch(f"{self.node}: magic 0x{ident['magic']:08X} is not an oddl "
                                   f"O-NIC (expected 0x{R.MAGIC:08X})")
        if ident["design_version"] != design_version:
            v = ident["design_version"]
            raise IdentityMismatch(f"{self.node}: design version {v >> 16}.{v & 0xFFFF} "
                                   f"(0x{v:08X}), driver expects {design_version >> 16}."
                                   f"{design_version & 0xFFFF} (0x{design_version:08X})")
        if bitstream_hash is not None and ident["bitstream_hash"] != bitstream_hash:
            raise IdentityMismatch(f"{self.node}: bitstream hash {ident['bitstream_hash']} "
                                   f"!= expected {bitstream_hash}")
        return ident

    # --- transmitter and transfer engine ------------------------------------------------
    def tune(self, port: str, channel: int) -> None:
        """CHANNEL then CMD.TUNE, adjacent: one block write."""
        self.mmio.write(_off(f"TX{port}_CHANNEL"), channel.to_bytes(4, "little") + b"\x01\0\0\0")

    def tune_and_start(self, port: str, channel: int, dst: int, nbytes: int, flow: int,
                       header: tuple[int, ...] = (0,) * len(R.HEADER)) -> None:
        """Load a transfer, then TUNE|THEN_START: the board sends once the channel locks
        (no host round trip between a 10 ns tune and the start)."""
        self._command(port, (dst, nbytes, flow, header), 1, _TUNE.pack(channel, 3),
                      "tune refused (busy)")

    def tx_status(self, port: str) -> dict[str, int | bool]:
        s = self.mmio.read(_off(f"TX{port}_STATUS"))
        return {"tuning": bool(s & 1), "sending": bool(s & 2), "tuned": bool(s & 4),
                "channel": (s >> 8) & 0xFF}

    def last_tune_ns(self, port: str) -> int:
        return self.mmio.read(_off(f"TX{port}_TUNE_NS"))

    def start_transfer(self, port: str, dst: int, nbytes: int, flow: int,
                       header: tuple[int, ...] = (0,) * len(R.HEADER)) -> None:
        """Load and start a transfer (one block write, START, one status read);
        DeviceRefused if the board refuses it."""
        self._command(port, (dst, nbytes, flow, header), 2, 1,
                      "transfer refused (tuning or busy)")

    def _command(self, port: str, transfer: tuple[int, int, int, tuple[int, ...]], which: int,
                 data: int | bytes, refused: str) -> None:
        """The transfer's descriptor in one block write, then the command (`which`: 1 the
        CHANNEL+CMD pair, 2 START), then ERROR read once: DeviceRefused, the flag cleared
        (W1C), if the board refused it."""
        dst, nbytes, flow, header = transfer
        if not 0 <= nbytes < 2**32:
            raise ValueError(f"{nbytes} bytes does not fit the 32-bit TX_BYTES register")
        tx = self._tx[port]
        mmio, bit = self.mmio, tx[3]
        mmio.write(tx[0], _DESCRIPTOR.pack(dst, nbytes, flow & 0xFFFFFFFF, *header))
        mmio.write(tx[which], data)
        if mmio.read(_ERROR) & bit:
            mmio.write(_ERROR, bit)  # W1C
            raise DeviceRefused(f"{self.node}/{port}: {refused}")

    def counters(self, port: str) -> dict[str, int]:
        rd = self.mmio.read
        return {
            "tx_done": rd(_off(f"TX{port}_DONE_COUNT")),
            "tx_bytes": rd(_off(f"TX{port}_SENT_LO")) | rd(_off(f"TX{port}_SENT_HI")) << 32,
            "rx_done": rd(_off(f"RX{port}_DONE_COUNT")),
            "rx_bytes": rd(_off(f"RX{port}_BYTES_LO")) | rd(_off(f"RX{port}_BYTES_HI")) << 32,
            "rx_errors": rd(_off(f"RX{port}_ERRORS")),
            "rx_src": rd(_off(f"RX{port}_SRC")),
        }

    def timestamp_ns(self) -> int:
        lo = self.mmio.read(_off("TS_LO"))  # latches the high word
        return self.mmio.read(_off("TS_HI")) << 32 | lo

    def irq_status(self, clear: bool = True) -> int:
        s = self.mmio.read(_off("IRQ_STATUS"))
        if clear and s:
            self.mmio.write(_off("IRQ_STATUS"), s)
        return s

    # --- route table --------------------------------------------------------------------
    def load_routes(self, routes: dict[str, tuple[str, int, str]]) -> None:
        if len(routes) > R.ROUTE_ENTRIES:
            raise DeviceRefused(f"{self.node}: {len(routes)} routes, the table holds "
                                f"{R.ROUTE_ENTRIES}")
        idx = self.index
        for dst, (_port, _ch, nh) in routes.items():
            for name in (dst, nh):
                if name not in idx:
                    raise DeviceRefused(f"{self.node}: a route to {dst} (next hop {nh}): "
                                        f"{name} is no node of this board's testbed")
        e = -1
        for e, dst in enumerate(sorted(routes, key=idx.__getitem__)):
            port, ch, nh = routes[dst]
            w0, w1 = R.route_words(idx[dst], port, ch, idx[nh])
            self.mmio.write(R.ROUTE_BASE + 8 * e, w0)
            self.mmio.write(R.ROUTE_BASE + 8 * e + 4, w1)
        if e + 1 < R.ROUTE_ENTRIES:  # terminate the table: the first invalid entry ends it
            self.mmio.write(R.ROUTE_BASE + 8 * (e + 1), 0)

    def read_routes(self) -> dict[str, tuple[str, int, str]]:
        out = {}
        for e in range(R.ROUTE_ENTRIES):
            w0 = self.mmio.read(R.ROUTE_BASE + 8 * e)
            if not w0 & R.ROUTE_VALID:
                break
            r = R.route_unpack(w0, self.mmio.read(R.ROUTE_BASE + 8 * e + 4))
            if r is None:
                break
            dst, port, ch, nh = r
            out[self.nodes[dst]] = (port, ch, self.nodes[nh])
        return out

    # --- count-action -------------------------------------------------------------------
    def load_countaction(self, prog: Program) -> dict[str, Any]:
        """The program in place of whatever the engine held: its modules written and
        armed, and every other module disarmed and cleared (a deeper program loaded
        before, by another client, would otherwise go on firing into this one's)."""
        image = compile_program(prog)
        for off, val in image_writes(image):
            self.mmio.write(off, val)
        used = {m["slot"] for m in image["modules"]}
        for slot in range(R.N_MODULES):
            if slot not in used:
                self.mmio.write(R.ca(slot, "CTRL"), 0)
                self.mmio.write(R.ca(slot, "RESET"), 1)
        return image

    def read_countaction(self, names: list[str]) -> Program:
        """Read the engine back (slots 0..len(names)-1) and decompile it."""
        mods = []
        for slot, name in enumerate(names):
            fields = ["CTRL", "TARGET", *(f"{k}{j}" for j in range(R.N_SLOTS)
                                           for k in ("SRC", "ACT"))]
            regs = {f: self.mmio.read(R.ca(slot, f)) for f in fields}
            mods.append({"slot": slot, "name": name, "registers": regs})
        return decompile({"design": R.DESIGN_NAME, "modules": mods})

    def ca_status(self, slot: int) -> dict[str, int | bool]:
        s = self.mmio.read(R.ca(slot, "STATUS"))
        return {"armed": bool(s & 1), "fired": bool(s & 2), "fire_count": (s >> 8) & 0xFF,
                "count": self.mmio.read(R.ca(slot, "COUNT"))}


class DriverONic:
    """`controller.devices.ONic` over the register driver: what a control unit runs on.

    Transfers carry the flow's header words; completion comes by interrupt: the board's
    line calls `on_interrupt` (on a real board, a task awaiting `pynq.Interrupt`), which
    reads and clears IRQ_STATUS and reports tuned / sent / received to the control unit.
    """

    # no TUNED_*: a tune is issued with THEN_START, and TX_DONE follows it
    _IRQS = ("TX_DONE_H", "TX_DONE_V", "RX_DONE_H", "RX_DONE_V", "CA_FIRED")

    def __init__(self, driver: ONicDriver, ports: tuple[str, ...]) -> None:
        self.d = driver
        self.node = driver.node
        self.ports = ports
        self.index = driver.index
        self.inflight: dict[str, Any] = {}
        self.events: Any = None
        self.on_module_fired: Any = None  # called with the slot of each count-action firing
        self._mask = 0
        self.tampered = 0  # times the interrupt enables were found changed under it
        self._ca_names: list[str] = []
        self._w = driver.mmio.write
        self._r = driver.mmio.read
        self._o = _OFFSETS
        # per port: its TX_DONE and RX_DONE bits, RX_LAST_FLOW and RX_LAST_BYTES offsets
        self._irq_ports = [(p, 1 << R.IRQ_BITS[f"TX_DONE_{p}"], 1 << R.IRQ_BITS[f"RX_DONE_{p}"],
                            _off(f"RX{p}_LAST_FLOW"), _off(f"RX{p}_LAST_BYTES"))
                           for p in ports]
        # per port: what a heartbeat reads, RX_ERRORS and TX_TUNE_NS (each period, each node)
        self._health_regs = [(p, _off(f"RX{p}_ERRORS"), _off(f"TX{p}_TUNE_NS")) for p in ports]
        self.unit_routes: set[str] = set()  # what a GatewareUnit last loaded (onic_unit.py)

    def attach(self, events: Any) -> None:
        """A new owner (a job) starts clean: what a previous one left pending is not its."""
        self.events = events
        self.inflight.clear()
        self._mask = 0
        for name in self._IRQS:
            self._mask |= 1 << R.IRQ_BITS[name]
        stale = self._r(self._o["IRQ_STATUS"])
        if stale:  # cleared before enabling: a level line would interrupt for them
            self._w(self._o["IRQ_STATUS"], stale)  # W1C
        self._w(self._o["IRQ_ENABLE"], self._mask)

    def listen(self, names: tuple[str, ...]) -> None:
        """Interrupts on these IRQ_STATUS flags only (a unit in the board's gateware hears
        its deliveries, not the transfers: drivers/onic_unit.py)."""
        self._mask = 0
        for name in names:
            self._mask |= 1 << R.IRQ_BITS[name]
        self._w(self._o["IRQ_ENABLE"], self._mask)

    def transmitting(self) -> bool:
        """Is any transmitter tuning or sending (light still to land somewhere)?"""
        return any(self._r(self._o[f"TX{p}_STATUS"]) & 0b11 for p in self.ports)

    def health(self) -> dict[str, Any]:
        """What a heartbeat carries from the registers: CRC errors per receiver, the last
        tuning time per transmitter, the ERROR flags. And the interrupt enables this driver
        set, checked: a board whose enables someone else cleared hears nothing and wedges
        its job (another writer over an open PYNQ.remote port, docs/deploy.md); they are
        restored, and counted (`tampered`)."""
        r, o = self._r, self._o
        if self._mask and r(o["IRQ_ENABLE"]) != self._mask:
            self.tampered += 1
            log.warning("board %s: IRQ_ENABLE is not what its driver set (0x%x): someone "
                        "else writes its registers (an open PYNQ.remote port?); restored "
                        "(%d times)", self.node, self._mask, self.tampered)
            self._w(o["IRQ_ENABLE"], self._mask)
        regs = self._health_regs
        return {"crc_errors": {p: r(errors) for p, errors, _ in regs},
                "tune_ns": {p: r(tune_ns) for p, _, tune_ns in regs},
                "error_flags": r(_ERROR)}

    def identity(self) -> dict[str, str]:
        ident = self.d.identity()
        v = ident["design_version"]
        return {"node": self.node, "design": f"oddl-onic-{v >> 16}.{v & 0xFFFF}",
                "bitstream_hash": ident["bitstream_hash"], "ports": ",".join(self.ports)}

    def send(self, port: str, flow: Any) -> None:
        prev = self._in_flight(port, flow)
        try:
            self.d.start_transfer(port, self.index[flow.dst], flow.nbytes, flow.id,
                                  self._header(flow))
        except DeviceRefused:
            self._refused(port, prev)
            raise

    def tune_and_send(self, port: str, channel: int, flow: Any) -> None:
        prev = self._in_flight(port, flow)
        try:
            self.d.tune_and_start(port, channel, self.index[flow.dst], flow.nbytes, flow.id,
                                  self._header(flow))
        except DeviceRefused:
            self._refused(port, prev)
            raise

    def _header(self, flow: Any) -> tuple[int, ...]:
        return R.header_words(flow.id, self.index[flow.src], flow.hop, flow.step,
                              flow.iteration, flow.t_submit)

    def _in_flight(self, port: str, flow: Any) -> Any:
        """The flow is in flight from the start command on (returns the one it replaces)."""
        prev = self.inflight.get(port)
        self.inflight[port] = flow
        return prev

    def _refused(self, port: str, prev: Any) -> None:
        """The board refused the start: the transfer it is still busy with stays the one
        in flight (its TX_DONE is coming)."""
        if prev is None:
            self.inflight.pop(port, None)
        else:
            self.inflight[port] = prev

    def rx_receiving(self, port: str, flow: int, hop: int) -> bool:
        """Is this flow's light arriving now? (A receiver sees one leg of a flow only.)"""
        return self._r(self._o[f"RX{port}_CUR_FLOW"]) == flow & 0xFFFFFFFF

    def load_routes(self, routes: dict[str, tuple[str, int, str]]) -> None:
        self.d.load_routes(routes)

    def read_routes(self) -> dict[str, tuple[str, int, str]]:
        return self.d.read_routes()

    def load_countaction(self, prog: Program) -> None:
        self.d.load_countaction(prog)
        self._ca_names = [m.name for m in prog.modules]

    def read_countaction(self) -> Program:
        return self.d.read_countaction(self._ca_names)

    def on_interrupt(self) -> None:
        r = self._r
        status = r(_IRQ_STATUS)
        if not status:
            return
        self._w(_IRQ_STATUS, status)  # W1C
        status &= self._mask | _MODULE_BITS  # what its owner listens to (`listen`)
        for port, tx_bit, rx_bit, last_flow, last_bytes in self._irq_ports:
            if status & tx_bit:
                flow = self.inflight.pop(port, None)
                if flow is None:  # the board finished a transfer nobody started: say so
                    log.warning("%s/%s: TX_DONE with no transfer in flight", self.node, port)
                else:
                    self.events.on_tx_done(port, flow)
            if status & rx_bit:
                self.events.on_rx_done(port, r(last_flow), r(last_bytes))
        if status & _CU_BITS and self.events is not None:  # the board's unit's deliveries
            self.events.on_unit_irq(status & _CU_BITS)
        # count-action fires last: a step completes only after its deliveries are handled
        if status & _CA_FIRED:
            fired = status >> R.IRQ_MODULE_SHIFT
            if self.on_module_fired is not None:
                m = 0
                while fired:
                    if fired & 1:
                        self.on_module_fired(m)
                    fired >>= 1
                    m += 1



def open_onic(bitfile: str | Path, device: Any = None, node: str = "",
              nodes: list[str] | None = None, download: bool = True,
              design_version: int = R.DESIGN_VERSION,
              bitstream_hash: str | None = None,
              tap: Callable[[Any], Any] = lambda mmio: mmio) -> ONicDriver:
    """Load the O-NIC overlay with pynq, hold its .hwh to the register map and the board's
    identity block to the expected design, and return a driver on `onic_ctrl` (its MMIO
    through `tap`, from the first access: a transport's error types, a cassette)."""
    import pynq

    ol = pynq.Overlay(str(bitfile), device=device, download=download)
    ip = check_ip_dict(ol.ip_dict, str(Path(bitfile).with_suffix(".hwh")))
    drv = ONicDriver(tap(pynq.MMIO(ip["phys_addr"], ip["addr_range"], device=ol.device)),
                     node, nodes)
    # the overlay's IP says which design the board is: onic_top carries the control unit
    drv.design = ip["design"] if design_version == R.DESIGN_VERSION else design_version
    drv.check_identity(drv.design, bitstream_hash)
    return drv
