"""`serial_onic`: the O-NIC a lab can drive on a board it can buy (issue 84).

`onic_top` as it is (onic_ctrl, the count-action engine, the stage-2 control unit), its
AXI-Lite slave driven by the serial bridge (fpga/gateware/serial_bridge.py) from the
board's USB serial port, and the rest of an O-NIC's world inside the fabric:
- each optical port looped back (`Loopback`): the laser locks `tune_cycles` after a tune;
  a transfer's light leaves the transmitter and lands on the same port's receiver,
  `bytes_per_cycle` a cycle, from this node to the destination it names; so a flow
  completes on one board;
- the control frames' stream from the unit's transmit side back to its receive side,
  through a FIFO (a MAC that takes what it can: `ctl_tx_tready` falls when it is full);
- the straps: this node's id and the testbed's size, the wavelengths, the ports present,
  the design's hash; the time base a nanosecond counter of the fabric's clock.
The interrupt is a status bit the host polls (IRQ_STATUS, as over PYNQ.remote), and an
output for an LED. What it cannot be: an O-NIC's optics or its 100 GbE (docs/gateware.md).
"""

from __future__ import annotations

from typing import Any

from amaranth import Module, Signal
from amaranth.lib import fifo, wiring
from amaranth.lib.wiring import In, Out
from oddl.fpga import regmap as R
from oddl.fpga.frame import BEAT_BITS, FrameFormat
from oddl.fpga.gateware.control_unit import BUILD
from oddl.fpga.gateware.onic_bus import ADDR_BITS, N_HDR
from oddl.fpga.gateware.onic_top import OnicTop
from oddl.fpga.gateware.serial_bridge import SerialBridge

CTL_FIFO = 4  # control frames in flight from the unit's transmitter to its receiver


class Loopback(wiring.Component):
    """One optical port, its transmitter's light onto its own receiver."""

    def __init__(self, tune_cycles: int, bytes_per_cycle: int) -> None:
        self.tune_cycles, self.bpc = tune_cycles, bytes_per_cycle
        super().__init__({
            "tune_valid": In(1), "tune_locked": Out(1),
            "tx_valid": In(1), "tx_dst": In(16), "tx_bytes": In(32), "tx_flow": In(32),
            "tx_hdr": In(32 * N_HDR), "tx_done": Out(1), "node": In(16),
            "rx_done": Out(1), "rx_src": Out(16), "rx_dst": Out(16), "rx_flow": Out(32),
            "rx_bytes": Out(32), "rx_hdr": Out(32 * N_HDR), "rx_busy": Out(1),
            "rx_cur_flow": Out(32)})

    def elaborate(self, platform: Any) -> Module:
        m = Module()
        tuning = Signal(range(self.tune_cycles + 1))
        m.d.sync += self.tune_locked.eq(0)
        with m.If(self.tune_valid):
            m.d.sync += tuning.eq(self.tune_cycles)
        with m.Elif(tuning == 1):
            m.d.sync += [self.tune_locked.eq(1), tuning.eq(0)]
        with m.Elif(tuning != 0):
            m.d.sync += tuning.eq(tuning - 1)
        left = Signal(32)  # bytes still in flight
        m.d.sync += [self.tx_done.eq(0), self.rx_done.eq(0)]
        m.d.comb += self.rx_cur_flow.eq(self.rx_flow)
        with m.If(self.tx_valid & ~self.rx_busy):
            m.d.sync += [self.rx_busy.eq(1), left.eq(self.tx_bytes), self.rx_src.eq(self.node),
                         self.rx_dst.eq(self.tx_dst), self.rx_flow.eq(self.tx_flow),
                         self.rx_bytes.eq(self.tx_bytes), self.rx_hdr.eq(self.tx_hdr)]
        with m.Elif(self.rx_busy & (left <= self.bpc)):
            m.d.sync += [self.rx_busy.eq(0), left.eq(0), self.tx_done.eq(1),
                         self.rx_done.eq(1)]
        with m.Elif(self.rx_busy):
            m.d.sync += left.eq(left - self.bpc)
        return m


class SerialONic(wiring.Component):
    """The board's top: its UART's two pins in and out, and the interrupt for an LED."""

    def __init__(self, frame: FrameFormat, clks_per_bit: int, ns_per_clk: int, *,
                 node_id: int = 0, nodes: int = 1, channels: int = 8, tune_cycles: int = 50,
                 bytes_per_cycle: int = 64, bitstream_hash: int = 0,
                 bounds: dict[str, int] | None = None, strap_ports: bool = False) -> None:
        """`strap_ports`: the node's id, the testbed's size and the wavelengths as input
        ports (a co-simulation sets them: one build serves every node), not constants."""
        b = dict(BUILD, per_sender=4) | (bounds or {})
        self.top = OnicTop(frame, b["nodes"], b["txq"], b["rxq"], b["done"], b["per_sender"])
        self.clks, self.ns_per_clk = clks_per_bit, ns_per_clk
        self.straps = {"node_id": node_id, "n_nodes": nodes, "n_channels": channels,
                       "ports_present": (1 << len(R.PORTS)) - 1,
                       "bitstream_hash": bitstream_hash}
        self.tune_cycles, self.bpc = tune_cycles, bytes_per_cycle
        self.strap_ports = strap_ports
        members: dict[str, Any] = {"uart_rx": In(1, init=1), "uart_tx": Out(1, init=1),
                                   "irq": Out(1)}
        if strap_ports:
            members |= {"node_id": In(16), "n_nodes": In(16), "n_channels": In(8)}
        super().__init__(members)

    def elaborate(self, platform: Any) -> Module:
        m = Module()
        m.submodules.top = top = self.top
        m.submodules.bridge = bridge = SerialBridge(self.clks, ADDR_BITS)
        m.d.comb += [bridge.rx.eq(self.uart_rx), self.uart_tx.eq(bridge.tx),
                     self.irq.eq(top.irq)]
        for name in ("awaddr", "awvalid", "wdata", "wstrb", "wvalid", "bready", "araddr",
                     "arvalid", "rready"):
            m.d.comb += getattr(top, f"s_axi_{name}").eq(getattr(bridge, f"m_axi_{name}"))
        for name in ("awready", "wready", "bresp", "bvalid", "arready", "rdata", "rresp",
                     "rvalid"):
            m.d.comb += getattr(bridge, f"m_axi_{name}").eq(getattr(top, f"s_axi_{name}"))
        ts = Signal(64)
        m.d.sync += ts.eq(ts + self.ns_per_clk)
        m.d.comb += [top.ts_ns.eq(ts), top.dac_valid.eq(0), top.dac_index.eq(0)]
        m.d.comb += [getattr(top, k).eq(getattr(self, k) if self.strap_ports and
                                        k in ("node_id", "n_nodes", "n_channels") else v)
                     for k, v in self.straps.items()]
        for p in R.PORTS:
            p = p.lower()
            lb = Loopback(self.tune_cycles, self.bpc)
            m.submodules[f"loop_{p}"] = lb
            m.d.comb += [lb.node.eq(top.node_id)]
            for name in ("tune_valid", "tx_valid", "tx_dst", "tx_bytes", "tx_flow", "tx_hdr"):
                m.d.comb += getattr(lb, name).eq(getattr(top, f"{p}_{name}"))
            for name in ("tune_locked", "tx_done", "rx_done", "rx_src", "rx_dst", "rx_flow",
                         "rx_bytes", "rx_hdr", "rx_busy", "rx_cur_flow"):
                m.d.comb += getattr(top, f"{p}_{name}").eq(getattr(lb, name))
            m.d.comb += getattr(top, f"{p}_rx_crc_error").eq(0)
        # the control frames: the unit's transmitter to its receiver, through a FIFO
        m.submodules.ctl = q = fifo.SyncFIFOBuffered(width=BEAT_BITS + 1, depth=CTL_FIFO)
        m.d.comb += [q.w_data.eq(top.ctl_tx_tdata), q.w_en.eq(top.ctl_tx_tvalid),
                     top.ctl_tx_tready.eq(q.w_rdy),
                     top.ctl_rx_tdata.eq(q.r_data[:BEAT_BITS]), top.ctl_rx_tlast.eq(1),
                     top.ctl_rx_tvalid.eq(q.r_rdy), q.r_en.eq(top.ctl_rx_tready)]
        return m
