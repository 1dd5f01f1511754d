"""The serial bridge's gateware (issue 84) in Amaranth's simulator, bit by bit on its UART
pins, against an AXI-Lite slave the testbench plays (four registers, and a count of the
writes it took): requests run as one transaction each; a garbled, cut or unknown request
is dropped unanswered; a request sent again with the same sequence number is answered
from the answer kept, never run twice."""

from __future__ import annotations

from typing import Any

from amaranth.sim import Simulator
from oddl.fpga import serial_frames as S
from oddl.fpga.gateware.serial_bridge import SerialBridge

CLKS = 4  # clocks a bit


async def ticks(ctx: Any, n: int = 1) -> None:
    for _ in range(n):  # (plain ticks: a background testbench is left suspended at the end)
        await ctx.tick()


async def until(ctx: Any, sig: Any, value: int) -> None:
    """Ticks until `sig` is `value` after one (as `tick().until()`)."""
    await ctx.tick()
    while ctx.get(sig) != value:
        await ctx.tick()


async def taken(ctx: Any, ready: Any) -> None:
    """Ticks until an edge at which `ready` was high (a valid held until then is taken)."""
    while True:
        was = ctx.get(ready)
        await ctx.tick()
        if was:
            return


def run(requests: list[bytes], slverr_at: int = 0xFFFF) -> tuple[list[bytes], dict[str, Any]]:
    """Each request's bytes onto the bridge's rx pin (a gap between requests); what came
    back on tx, cut into answers, and the slave's registers and writes."""
    dut = SerialBridge(CLKS, 16)
    slave: dict[str, Any] = {"regs": {0: 0, 4: 0, 8: 0, 12: 0}, "writes": 0}
    got: list[int] = []

    async def uart_out(ctx: Any) -> None:  # the host's receiver, on tx
        while True:
            await until(ctx, dut.tx, 0)
            await ticks(ctx, CLKS // 2)
            byte = 0
            for i in range(8):
                await ticks(ctx, CLKS)
                byte |= ctx.get(dut.tx) << i
            await ticks(ctx, CLKS)
            got.append(byte)

    async def axi(ctx: Any) -> None:  # the slave
        while True:
            await ctx.tick()
            if ctx.get(dut.m_axi_awvalid) and ctx.get(dut.m_axi_wvalid):
                addr, data = ctx.get(dut.m_axi_awaddr), ctx.get(dut.m_axi_wdata)
                ctx.set(dut.m_axi_awready, 1)
                ctx.set(dut.m_axi_wready, 1)
                await ticks(ctx)
                ctx.set(dut.m_axi_awready, 0)
                ctx.set(dut.m_axi_wready, 0)
                ok = addr in slave["regs"] and addr != slverr_at
                if ok:
                    slave["regs"][addr] = data
                slave["writes"] += 1
                ctx.set(dut.m_axi_bresp, 0 if ok else 2)
                ctx.set(dut.m_axi_bvalid, 1)
                await taken(ctx, dut.m_axi_bready)
                ctx.set(dut.m_axi_bvalid, 0)
            elif ctx.get(dut.m_axi_arvalid):
                addr = ctx.get(dut.m_axi_araddr)
                ctx.set(dut.m_axi_arready, 1)
                await ctx.tick()
                ctx.set(dut.m_axi_arready, 0)
                ctx.set(dut.m_axi_rdata, slave["regs"].get(addr, 0xDEAD))
                ctx.set(dut.m_axi_rresp, 0 if addr in slave["regs"] else 2)
                ctx.set(dut.m_axi_rvalid, 1)
                await taken(ctx, dut.m_axi_rready)
                ctx.set(dut.m_axi_rvalid, 0)

    async def host(ctx: Any) -> None:  # the requests, bit by bit
        ctx.set(dut.rx, 1)
        await ticks(ctx, 10)
        for req in requests:
            for byte in req:
                for bit in [0, *((byte >> i) & 1 for i in range(8)), 1]:
                    ctx.set(dut.rx, bit)
                    await ticks(ctx, CLKS)
            await ticks(ctx, S.GAP_BITS * CLKS + 12 * S.ANS_LEN * CLKS)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(uart_out, background=True)
    sim.add_testbench(axi, background=True)
    sim.add_testbench(host)
    sim.run()
    raw = bytes(got)
    return [raw[i: i + S.ANS_LEN] for i in range(0, len(raw), S.ANS_LEN)], slave


def test_reads_and_writes_run_as_axi_lite_transactions() -> None:
    answers, slave = run([S.request(S.WRITE, 1, 4, 0xCAFEF00D),
                          S.request(S.READ, 2, 4),
                          S.request(S.READ, 3, 0x40),  # a hole: SLVERR, as AXI said
                          S.request(S.WRITE, 4, 8, 7)], slverr_at=8)
    got = [S.answer(a) for a in answers]
    assert [(a.status, a.seq, a.data) for a in got] == [
        (S.OKAY, 1, 0), (S.OKAY, 2, 0xCAFEF00D), (S.SLVERR, 3, 0xDEAD), (S.SLVERR, 4, 0)]
    assert slave["regs"][4] == 0xCAFEF00D and slave["writes"] == 2


def test_a_request_sent_again_is_answered_from_the_kept_answer_not_run_twice() -> None:
    w = S.request(S.WRITE, 9, 12, 5)
    answers, slave = run([w, w, S.request(S.READ, 10, 12), S.request(S.WRITE, 11, 12, 6)])
    got = [S.answer(a) for a in answers]
    assert [(a.status, a.seq) for a in got] == [(S.OKAY, 9), (S.OKAY, 9), (S.OKAY, 10),
                                                 (S.OKAY, 11)]
    assert slave["writes"] == 2 and got[2].data == 5  # the repeated write ran once


def test_garbled_cut_and_unknown_requests_are_dropped_unanswered() -> None:
    good = S.request(S.WRITE, 1, 0, 0x11)
    garbled = bytearray(S.request(S.WRITE, 2, 0, 0x22))
    garbled[6] ^= 0x10  # a bit flipped on the wire: the CRC no longer holds
    cut = S.request(S.WRITE, 3, 0, 0x33)[:6]  # the line went quiet mid-request
    unknown = bytearray(S.request(S.READ, 4, 0))
    unknown[1] = 0x07
    unknown[-1] = S.crc8(bytes(unknown[1:-1]))  # whole, but no operation of ours
    answers, slave = run([good, bytes(garbled), cut, bytes(unknown),
                          S.request(S.READ, 5, 0)])
    got = [S.answer(a) for a in answers]
    assert [(a.seq, a.data) for a in got] == [(1, 0), (5, 0x11)]
    assert slave["writes"] == 1 and slave["regs"][0] == 0x11
