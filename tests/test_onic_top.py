"""`onic_top` (issue 63): the O-NIC whole, the stage-2 control unit in its datapath, driven
as a board's PS and its MAC and laser would drive it, in Amaranth's simulator: the host
loads the unit's timing and routes and hands over a flow through the CU block of the
register map; the unit asks for the receiver by a REQUEST frame on the MAC's stream,
tunes the laser and starts the transfer through onic_ctrl's engine on the GRANT, releases
on tx_done; and as a receiver grants a peer's REQUEST, takes its transfer and hands the
delivered flow to the host with an interrupt."""

from __future__ import annotations

from typing import Any

import pytest
from oddl.controller.base.messages import Grant, Release, Request
from oddl.controller.stage2.wire import FRAME, decode_frame, encode_frame
from oddl.fpga import regmap as R

pytest.importorskip("amaranth", reason="the gateware extra: pip install 'oddl[gateware]'")

NODES = ["n0", "n1", "n2", "n3"]
INDEX = {n: i for i, n in enumerate(NODES)}
ME = "n0"
FW = 32 * R.CU_FLOW_WORDS


def flow_words(fid: int, src: int, dst: int, nbytes: int, iteration: int = 0,
               step: int = 0, hop: int = 0, t_submit: int = 0) -> list[int]:
    from oddl.fpga.frame import flow_word

    w = flow_word(FRAME, fid, src, dst, nbytes, iteration, step, hop, t_submit)
    return [(w >> (32 * k)) & 0xFFFFFFFF for k in range(R.CU_FLOW_WORDS)]


class Bench:
    """The PS, the laser driver and the MAC around the IP, one clock edge at a time."""

    def __init__(self, ctx: Any, dut: Any, ready: Any = None) -> None:
        """ready: the MAC's `ctl_tx_tready` each cycle (a callable; None: always)."""
        self.ctx, self.dut = ctx, dut
        self.frames_out: list[Any] = []
        self.effects: list[tuple[str, str, Any]] = []
        self.t = 0
        self.ready = ready or (lambda: 1)
        self.held = 0  # cycles a frame waited on a MAC that was not ready

    async def tick(self, n: int = 1) -> None:
        d, c = self.dut, self.ctx
        for _ in range(n):
            self.t += 4
            c.set(d.ts_ns, self.t)
            c.set(d.ctl_tx_tready, self.ready())
            if c.get(d.ctl_tx_tvalid):  # a frame leaves at this edge only if the MAC takes it
                if c.get(d.ctl_tx_tready):
                    self.frames_out.append(decode_frame(c.get(d.ctl_tx_tdata), NODES, R.PORTS))
                else:
                    self.held += 1
            await c.tick()
            for p in ("h", "v"):
                if self.ctx.get(getattr(d, f"{p}_tune_valid")):
                    self.effects.append(("tune", p, self.ctx.get(getattr(d, f"{p}_tune_channel"))))
                if self.ctx.get(getattr(d, f"{p}_tx_valid")):
                    self.effects.append(("tx", p, (self.ctx.get(getattr(d, f"{p}_tx_dst")),
                                                   self.ctx.get(getattr(d, f"{p}_tx_bytes")),
                                                   self.ctx.get(getattr(d, f"{p}_tx_flow")))))

    async def write(self, name: str | int, value: int) -> int:
        """A register by name, or by offset."""
        d, c = self.dut, self.ctx
        c.set(d.s_axi_awaddr, R.BY_NAME[name].offset if isinstance(name, str) else name)
        c.set(d.s_axi_wdata, value)
        c.set(d.s_axi_wstrb, 0xF)
        c.set(d.s_axi_awvalid, 1)
        c.set(d.s_axi_wvalid, 1)
        while not c.get(d.s_axi_awready):
            await self.tick()
        await self.tick()
        c.set(d.s_axi_awvalid, 0)
        c.set(d.s_axi_wvalid, 0)
        while not c.get(d.s_axi_bvalid):
            await self.tick()
        resp = c.get(d.s_axi_bresp)
        c.set(d.s_axi_bready, 1)
        await self.tick()
        c.set(d.s_axi_bready, 0)
        return int(resp)

    async def read(self, name: str) -> int:
        d, c = self.dut, self.ctx
        c.set(d.s_axi_araddr, R.BY_NAME[name].offset)
        c.set(d.s_axi_arvalid, 1)
        while not c.get(d.s_axi_arready):
            await self.tick()
        await self.tick()
        c.set(d.s_axi_arvalid, 0)
        while not c.get(d.s_axi_rvalid):
            await self.tick()
        v = c.get(d.s_axi_rdata)
        c.set(d.s_axi_rready, 1)
        await self.tick()
        c.set(d.s_axi_rready, 0)
        return int(v)

    async def frame_in(self, msg: Any) -> None:
        d, c = self.dut, self.ctx
        c.set(d.ctl_rx_tdata, encode_frame(msg, INDEX, R.PORTS))
        c.set(d.ctl_rx_tlast, 1)
        c.set(d.ctl_rx_tvalid, 1)
        while not c.get(d.ctl_rx_tready):
            await self.tick()
        await self.tick()
        c.set(d.ctl_rx_tvalid, 0)

    async def strobe(self, pin: str, **fields: int) -> None:
        for k, v in fields.items():
            self.ctx.set(getattr(self.dut, k), v)
        self.ctx.set(getattr(self.dut, pin), 1)
        await self.tick()
        self.ctx.set(getattr(self.dut, pin), 0)

    async def until(self, what: str, ok: Any, limit: int = 2000) -> None:
        for _ in range(limit):
            if ok():
                return
            await self.tick()
        raise AssertionError(f"no {what} within {limit} cycles: {self.frames_out} "
                             f"{self.effects}")


@pytest.mark.parametrize("mac", ["ready", "back-pressure"])
def test_the_top_schedules_a_flow_each_way_through_its_own_datapath(mac: str) -> None:
    """`back-pressure` (issue 84): the MAC's ctl_tx_tready low 70% of the cycles, at random
    (seeded); every frame leaves once, in order, as with a MAC always ready (ctl_tx_tready
    was held high in every harness and test)."""
    import random

    from amaranth.sim import Simulator
    from oddl.fpga.gateware.onic_top import OnicTop

    dut = OnicTop(FRAME, nodes=8, txq=4, rxq=4, done=8)
    seen: dict[str, Any] = {}
    rng = random.Random(84)

    async def bench(ctx: Any) -> None:
        b = Bench(ctx, dut, (lambda: int(rng.random() < 0.3)) if mac == "back-pressure"
                  else None)
        ctx.set(dut.node_id, INDEX[ME])
        ctx.set(dut.n_nodes, len(NODES))
        ctx.set(dut.n_channels, 8)
        ctx.set(dut.ports_present, 0b11)
        await b.tick(4)
        seen["version"] = await b.read("DESIGN_VERSION")
        seen["halted"] = await b.read("CU_CTRL")
        for name, v in (("CU_TUNING_NS", 11), ("CU_PROPAGATION_NS", 50),
                        ("CU_REQUEST_TIMEOUT_NS", 10**6), ("CU_RELEASE_TIMEOUT_NS", 10**6),
                        ("CU_LEASE_NS", 10**6), ("CU_MAX_RETRIES", 3), ("IRQ_ENABLE", 0x300)):
            assert await b.write(name, v) == 0
        for dst, port, channel in ((1, 0, 0), (2, 1, 0)):  # n1 on H, n2 on V, one hop
            await b.write("CU_ROUTE_DST", dst)
            await b.write("CU_ROUTE", dst | channel << 16 | port << 24 | 1 << 31)
        await b.write("CU_CTRL", 0)  # the job starts
        # --- as a sender: flow 5, 1,000 bytes to n1 -------------------------------------
        for k, w in enumerate(flow_words(5, 0, 1, 1000)):
            await b.write(f"CU_SUBMIT{k}", w)
        assert await b.write("CU_SUBMIT_GO", 1) == 0
        await b.until("REQUEST", lambda: any(type(f) is Request for f in b.frames_out))
        seen["request"] = next(f for f in b.frames_out if type(f) is Request)
        await b.frame_in(Grant(5, 0, "n1", "n0", "H", 0, 10**9))
        await b.until("a tune", lambda: any(e[0] == "tune" for e in b.effects))
        await b.strobe("h_tune_locked")
        await b.until("the transfer", lambda: any(e[0] == "tx" for e in b.effects))
        await b.strobe("h_tx_done")
        await b.until("RELEASE", lambda: any(type(f) is Release for f in b.frames_out))
        # --- as a receiver: n2's flow 9, 500 bytes, on V ----------------------------------
        await b.frame_in(Request(9, 0, "n2", "n0", "V", 0, 500, "n2", "n0", 0, 0, 0))
        await b.until("GRANT", lambda: any(type(f) is Grant for f in b.frames_out))
        ctx.set(dut.v_rx_busy, 1)
        ctx.set(dut.v_rx_cur_flow, 9)
        await b.tick(3)
        ctx.set(dut.v_rx_busy, 0)
        await b.strobe("v_rx_done", v_rx_src=2, v_rx_dst=0, v_rx_flow=9, v_rx_bytes=500)
        await b.until("the delivery", lambda: ctx.get(dut.irq))
        seen["irq"] = await b.read("IRQ_STATUS")
        seen["count"] = await b.read("CU_DELIV_COUNT")
        seen["delivered"] = [await b.read(f"CU_DELIV{k}") for k in range(R.CU_FLOW_WORDS)]
        await b.write("CU_DELIV_POP", 1)
        seen["count_after"] = await b.read("CU_DELIV_COUNT")
        await b.frame_in(Release(9, 0, "n2", "n0", "V"))
        await b.tick(20)
        seen["stats"] = {k: await b.read(f"CU_STAT_{k.upper()}")
                         for k in ("requests", "grants", "retries", "stray", "bad_frames")}
        seen["fail"] = await b.read("CU_FAIL")
        seen["sent"] = await b.read("CU_SENT")
        seen["frames"], seen["effects"], seen["held"] = b.frames_out, b.effects, b.held

    sim = Simulator(dut)
    sim.add_clock(4e-9)
    sim.add_testbench(bench)
    sim.run()

    assert seen["version"] == R.TOP_DESIGN_VERSION and seen["halted"] == 1
    q = seen["request"]
    assert (q.flow, q.hop, q.src, q.dst, q.port, q.channel, q.nbytes) == (
        5, 0, "n0", "n1", "H", 0, 1000)
    # the GRANT tuned the laser (no channel held yet), the lock started the transfer
    tune = [e for e in seen["effects"] if e[0] == "tune"]
    tx = [e for e in seen["effects"] if e[0] == "tx"]
    assert tune == [("tune", "h", 0)] and tx == [("tx", "h", (1, 1000, 5))]
    kinds = [type(f).__name__ for f in seen["frames"]]
    assert kinds == ["Request", "Release", "Grant"], seen["frames"]
    g = seen["frames"][2]
    assert (g.flow, g.src, g.dst, g.port) == (9, "n0", "n2", "V")
    assert seen["irq"] & (1 << R.IRQ_BITS["CU_DELIVERED"])
    assert (seen["count"], seen["count_after"]) == (1, 0)
    assert seen["delivered"] == flow_words(9, 2, 0, 500, hop=0)
    assert seen["stats"] == {"requests": 1, "grants": 1, "retries": 0, "stray": 0,
                             "bad_frames": 0}
    assert seen["fail"] == 0 and seen["sent"] == 3  # REQUEST, RELEASE, GRANT
    assert (seen["held"] > 0) == (mac == "back-pressure")  # the MAC did hold frames back


async def _engine_loaded(ctx: Any, dut: Any) -> Bench:
    """The top with its unit running, a route to n1 on H (channel 2), a transfer loaded in
    TXH's registers (flow 3 << 32 | 7 to n1, 700 bytes, step 4, iteration 2, submitted at
    1,234 ns) and a module that, on a DAC flag, tunes H to channel 5 and starts it."""
    from oddl.fpga.countaction import Program
    from oddl.fpga.countaction_image import compile_program, image_writes
    from oddl.fpga.regmap import header_words

    b = Bench(ctx, dut)
    for pin, v in (("node_id", 0), ("n_nodes", 4), ("n_channels", 8), ("ports_present", 0b11)):
        ctx.set(getattr(dut, pin), v)
    await b.tick(4)
    for name, v in (("CU_TUNING_NS", 11), ("CU_PROPAGATION_NS", 50),
                    ("CU_REQUEST_TIMEOUT_NS", 10**6), ("CU_RELEASE_TIMEOUT_NS", 10**6),
                    ("CU_LEASE_NS", 10**6), ("CU_MAX_RETRIES", 3), ("CU_ROUTE_DST", 1),
                    ("CU_ROUTE", 1 | 2 << 16 | 0 << 24 | 1 << 31), ("CU_CTRL", 0),
                    ("TXH_DST", 1), ("TXH_BYTES", 700), ("TXH_FLOW", 7)):
        await b.write(name, v)
    for k, w in enumerate(header_words(3 << 32 | 7, 0, 0, 4, 2, 1234)):
        await b.write(f"TXH_HDR{k}", w)
    prog = Program()
    prog.module("go", 1).count("DAC.valid", 1).act("tune", "H", 5).act("start", "H")
    for off, v in image_writes(compile_program(prog)):
        await b.write(off, v)
    return b


def _simulate(dut: Any, bench: Any) -> None:
    from amaranth.sim import Simulator

    sim = Simulator(dut)
    sim.add_clock(4e-9)
    sim.add_testbench(bench)
    sim.run()


def test_an_engines_start_hands_the_loaded_transfer_to_the_unit() -> None:
    """Issue 84: in onic_top the count-action engine's actions are the unit's to carry out.
    The module's start hands the transfer the host loaded in TXH's registers to the unit as
    a flow, every field kept: a REQUEST for it, the laser tuned on the GRANT to the route's
    channel (the unit's, not the action's), the transfer on the lock. (The engine had
    tuned the laser itself and started the transfer unasked: no REQUEST, no GRANT.)"""
    from oddl.fpga.gateware.onic_top import OnicTop

    dut = OnicTop(FRAME, nodes=8, txq=4, rxq=4, done=8)
    seen: dict[str, Any] = {}

    async def bench(ctx: Any) -> None:
        b = await _engine_loaded(ctx, dut)
        await b.strobe("dac_valid", dac_index=1)
        await b.until("REQUEST", lambda: any(type(f) is Request for f in b.frames_out))
        seen["request"] = next(f for f in b.frames_out if type(f) is Request)
        seen["effects_before_grant"] = list(b.effects)
        seen["channel"] = await b.read("TXH_CHANNEL")
        await b.frame_in(Grant(seen["request"].flow, 0, "n1", "n0", "H", 2, 10**9))
        await b.until("a tune", lambda: any(e[0] == "tune" for e in b.effects))
        await b.strobe("h_tune_locked")
        await b.until("the transfer", lambda: any(e[0] == "tx" for e in b.effects))
        seen["effects"] = list(b.effects)
        seen["error"] = await b.read("ERROR")

    _simulate(dut, bench)
    q = seen["request"]
    assert (q.flow, q.hop, q.src, q.dst, q.port, q.channel, q.nbytes, q.iteration, q.step,
            q.t_submit) == (3 << 32 | 7, 0, "n0", "n1", "H", 2, 700, 2, 4, 1234), q
    assert seen["effects_before_grant"] == []  # the engine tuned and started nothing itself
    assert seen["channel"] == 5  # the action's channel is kept in TXH_CHANNEL
    assert seen["effects"] == [("tune", "h", 2), ("tx", "h", (1, 700, 7))]
    assert seen["error"] == 0


def test_an_engines_start_the_full_queue_cannot_take_is_refused_by_name() -> None:
    """Issue 84: the engine's start is the flow queue's second writer; when the host has
    filled the queue (its CU_SUBMIT_GO answered SLVERR), the start is refused as a host's
    start on a busy port is, ERROR.TX_REFUSED_H, and queues nothing. (The unit is kept
    from taking flows by a stream of stray RELEASE frames, which it takes first.)"""
    from oddl.fpga.gateware.onic_bus import SLVERR
    from oddl.fpga.gateware.onic_top import OnicTop

    dut = OnicTop(FRAME, nodes=8, txq=4, rxq=4, done=8)
    seen: dict[str, Any] = {}

    async def bench(ctx: Any) -> None:
        b = await _engine_loaded(ctx, dut)
        ctx.set(dut.ctl_rx_tdata, encode_frame(Release(99, 0, "n1", "n0", "H"), INDEX,
                                               R.PORTS))
        ctx.set(dut.ctl_rx_tlast, 1)
        ctx.set(dut.ctl_rx_tvalid, 1)
        resp = []
        for fid in range(1, R.CU_QUEUE + 2):
            for k, w in enumerate(flow_words(fid, 0, 1, 64)):
                await b.write(f"CU_SUBMIT{k}", w)
            resp.append(await b.write("CU_SUBMIT_GO", 1))
        seen["resp"] = resp
        await b.strobe("dac_valid", dac_index=1)
        await b.tick(30)
        seen["error"] = await b.read("ERROR")
        seen["free"] = await b.read("CU_SUBMIT_FREE")

    _simulate(dut, bench)
    assert seen["resp"] == [0] * R.CU_QUEUE + [SLVERR]
    assert seen["free"] == 0
    assert seen["error"] == 1 << R.ERROR_BITS["TX_REFUSED_H"]
