"""The serial bridge: the O-NIC's AXI-Lite register map reached over a UART (fpga/
serial_frames.py has the frames and why they are so).

Three small components with typed ports: `UartRx` and `UartTx` (8N1, `clks_per_bit`
clocks a bit, the receiver sampling mid-bit after a two-flip-flop synchroniser) and
`SerialBridge`, whose state machine hunts for a request's sync byte, takes its nine bytes
(dropping it if a gap of GAP_BITS bit times cuts it, or if its CRC is wrong), runs it as one
AXI-Lite transaction (a master: address and data together, then the response) unless it
is the last one sent again (answered from the answer kept), and sends the answer.
"""

from __future__ import annotations

from typing import Any

from amaranth import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from oddl.fpga import serial_frames as S


def crc8_next(crc: Any, byte: Any) -> Any:
    """CRC-8 (S.CRC_POLY) of `crc` extended by `byte`, as logic (one byte a cycle)."""
    c: Any = crc ^ byte
    for _ in range(8):
        c = Mux(c[7], (c << 1)[:8] ^ S.CRC_POLY, (c << 1)[:8])
    return c


class UartRx(wiring.Component):
    """8N1 in: `valid` for one cycle with each byte."""

    def __init__(self, clks_per_bit: int) -> None:
        assert clks_per_bit >= 4, "the receiver samples mid-bit"
        self.clks = clks_per_bit
        super().__init__({"rx": In(1, init=1), "data": Out(8), "valid": Out(1)})

    def elaborate(self, platform: Any) -> Module:
        m = Module()
        sync = Signal(2, init=3)
        m.d.sync += sync.eq(Cat(self.rx, sync[0]))
        line = sync[1]
        count = Signal(range(self.clks * 3 // 2 + 1))
        bit = Signal(range(9))
        shift = Signal(8)
        m.d.sync += self.valid.eq(0)
        with m.FSM():
            with m.State("IDLE"), m.If(~line):  # a start bit: to the first data bit's middle
                m.d.sync += [count.eq(self.clks * 3 // 2 - 1), bit.eq(0)]
                m.next = "DATA"
            with m.State("DATA"):
                with m.If(count == 0):
                    m.d.sync += [shift.eq(Cat(shift[1:], line)), bit.eq(bit + 1),
                                 count.eq(self.clks - 1)]
                    with m.If(bit == 7):
                        m.next = "STOP"
                with m.Else():
                    m.d.sync += count.eq(count - 1)
            with m.State("STOP"):
                with m.If(count == 0):
                    with m.If(line):  # a stop bit: the byte stands (a framing error: dropped)
                        m.d.sync += [self.data.eq(shift), self.valid.eq(1)]
                    m.next = "WAIT"
                with m.Else():
                    m.d.sync += count.eq(count - 1)
            # the line back high before another start is looked for
            with m.State("WAIT"), m.If(line):
                m.next = "IDLE"
        return m


class UartTx(wiring.Component):
    """8N1 out: `start` with `data` when not `busy`."""

    def __init__(self, clks_per_bit: int) -> None:
        self.clks = clks_per_bit
        super().__init__({"tx": Out(1, init=1), "data": In(8), "start": In(1),
                          "busy": Out(1)})

    def elaborate(self, platform: Any) -> Module:
        m = Module()
        frame = Signal(10, init=0x3FF)  # start, 8 data bits LSB first, stop
        bits = Signal(range(11))
        count = Signal(range(self.clks))
        m.d.comb += [self.tx.eq(frame[0]), self.busy.eq(bits != 0)]
        with m.If(bits == 0), m.If(self.start):
            m.d.sync += [frame.eq(Cat(Const(0, 1), self.data, Const(1, 1))), bits.eq(10),
                         count.eq(self.clks - 1)]
        with m.Elif(count == 0):
            m.d.sync += [frame.eq(Cat(frame[1:], Const(1, 1))), bits.eq(bits - 1),
                         count.eq(self.clks - 1)]
        with m.Else():
            m.d.sync += count.eq(count - 1)
        return m


def master_members(addr_bits: int) -> dict[str, Any]:
    """An AXI-Lite master's ports (the slave's `s_axi_*` of onic_ctrl, flipped)."""
    return {
        "m_axi_awaddr": Out(addr_bits), "m_axi_awvalid": Out(1), "m_axi_awready": In(1),
        "m_axi_wdata": Out(32), "m_axi_wstrb": Out(4), "m_axi_wvalid": Out(1),
        "m_axi_wready": In(1), "m_axi_bresp": In(2), "m_axi_bvalid": In(1),
        "m_axi_bready": Out(1), "m_axi_araddr": Out(addr_bits), "m_axi_arvalid": Out(1),
        "m_axi_arready": In(1), "m_axi_rdata": In(32), "m_axi_rresp": In(2),
        "m_axi_rvalid": In(1), "m_axi_rready": Out(1)}


class SerialBridge(wiring.Component):
    """Requests in on `rx`, answers out on `tx`, each run on the AXI-Lite master."""

    def __init__(self, clks_per_bit: int, addr_bits: int) -> None:
        self.clks, self.addr_bits = clks_per_bit, addr_bits
        super().__init__({"rx": In(1, init=1), "tx": Out(1, init=1),
                          **master_members(addr_bits)})

    def elaborate(self, platform: Any) -> Module:
        m = Module()
        m.submodules.urx = urx = UartRx(self.clks)
        m.submodules.utx = utx = UartTx(self.clks)
        m.d.comb += [urx.rx.eq(self.rx), self.tx.eq(utx.tx)]
        body = Array(Signal(8, name=f"b{i}") for i in range(S.REQ_LEN - 1))  # op .. crc
        op, seq = body[0], body[1]
        addr = Cat(body[3], body[2])
        wdata = Cat(body[7], body[6], body[5], body[4])
        idx = Signal(range(S.REQ_LEN))
        crc = Signal(8)
        gap = Signal(range(S.GAP_BITS * self.clks + 1))
        last = {"valid": Signal(), "seq": Signal(8), "op": Signal(8)}
        status, rdata = Signal(8), Signal(32)
        aw_done, w_done = Signal(), Signal()
        out = Array([Const(S.ANS_SYNC, 8), status, last["seq"], rdata[24:], rdata[16:24],
                     rdata[8:16], rdata[:8], crc])
        m.d.comb += [self.m_axi_awaddr.eq(addr), self.m_axi_araddr.eq(addr),
                     self.m_axi_wdata.eq(wdata), self.m_axi_wstrb.eq(0xF)]
        with m.FSM():
            with m.State("HUNT"), m.If(urx.valid & (urx.data == S.REQ_SYNC)):
                m.d.sync += [idx.eq(0), crc.eq(0), gap.eq(0)]
                m.next = "RECV"
            with m.State("RECV"):
                m.d.sync += gap.eq(gap + 1)
                with m.If(urx.valid):
                    m.d.sync += [body[idx].eq(urx.data), idx.eq(idx + 1), gap.eq(0)]
                    with m.If(idx == S.REQ_LEN - 2):  # the CRC byte
                        m.next = "CHECK"
                    with m.Else():
                        m.d.sync += crc.eq(crc8_next(crc, urx.data))
                with m.Elif(gap == S.GAP_BITS * self.clks):  # cut short: dropped
                    m.next = "HUNT"
            with m.State("CHECK"):
                good = (body[S.REQ_LEN - 2] == crc) & ((op == S.READ) | (op == S.WRITE))
                again = last["valid"] & (seq == last["seq"]) & (op == last["op"])
                with m.If(~good):
                    m.next = "HUNT"
                with m.Elif(again):  # its answer was lost: the one kept, not run twice
                    m.d.sync += [idx.eq(0), crc.eq(0)]
                    m.next = "SEND"
                with m.Elif(op == S.WRITE):
                    m.d.sync += [aw_done.eq(0), w_done.eq(0)]
                    m.next = "WRITE"
                with m.Else():
                    m.next = "READ"
            with m.State("WRITE"):
                m.d.comb += [self.m_axi_awvalid.eq(~aw_done), self.m_axi_wvalid.eq(~w_done)]
                aw = aw_done | self.m_axi_awready
                w = w_done | self.m_axi_wready
                m.d.sync += [aw_done.eq(aw), w_done.eq(w)]
                with m.If(aw & w):
                    m.next = "RESP"
            with m.State("RESP"):
                m.d.comb += self.m_axi_bready.eq(1)
                with m.If(self.m_axi_bvalid):
                    m.d.sync += [status.eq(Mux(self.m_axi_bresp == 0, S.OKAY, S.SLVERR)),
                                 rdata.eq(0)]
                    m.next = "KEEP"
            with m.State("READ"):
                m.d.comb += self.m_axi_arvalid.eq(1)
                with m.If(self.m_axi_arready):
                    m.next = "RDATA"
            with m.State("RDATA"):
                m.d.comb += self.m_axi_rready.eq(1)
                with m.If(self.m_axi_rvalid):
                    m.d.sync += [status.eq(Mux(self.m_axi_rresp == 0, S.OKAY, S.SLVERR)),
                                 rdata.eq(self.m_axi_rdata)]
                    m.next = "KEEP"
            with m.State("KEEP"):
                m.d.sync += [last["valid"].eq(1), last["seq"].eq(seq), last["op"].eq(op),
                             idx.eq(0), crc.eq(0)]
                m.next = "SEND"
            with m.State("SEND"), m.If(~utx.busy):
                m.d.comb += [utx.data.eq(out[idx]), utx.start.eq(1)]
                with m.If((idx != 0) & (idx != S.ANS_LEN - 1)):
                    m.d.sync += crc.eq(crc8_next(crc, out[idx]))
                m.d.sync += idx.eq(idx + 1)
                with m.If(idx == S.ANS_LEN - 1):
                    m.next = "HUNT"
        return m
