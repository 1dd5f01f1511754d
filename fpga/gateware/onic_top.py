"""`onic_top`, the O-NIC whole: `onic_ctrl` with the stage-2 control unit in its datapath.

ODDL runs its second stage "in the control unit in each Optical-NIC". Here that unit,
`ctrl_unit` (fpga/gateware/control_unit.py), sits inside the IP, not beside it:
- it drives the tuning sequencer and the transfer handshake through `onic_ctrl`'s command
  port (tune, then start on lock; or start on the channel it holds), which the executor
  takes as it takes the host's register writes, so no register has two writers; the
  transfer's completions (`tx_done`, `rx_done`, the light arriving) reach both;
- it takes and sends its control frames on the MAC-facing AXI-Stream (`ctl_rx_*`,
  `ctl_tx_*`, one 512-bit beat a frame, `ctl_tx_tdest` the destination node);
- the host reaches it through the control unit's block of the register map (CU_*, at
  `CU_BASE`, fpga/regmap.py), on the same AXI-Lite slave: timing, tag, routes, the flows
  it hands over (a queue of `CU_QUEUE`), deliveries it reads back (another), the first
  failure, the counters; IRQ_STATUS bits CU_DELIVERED and CU_FAILED interrupt it.

The frame layout comes from the control plane (`FrameFormat`, passed in, as to
`ctrl_unit`); the bounds of the unit's memories are parameters (`BUILD` for a board).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import fifo, wiring
from amaranth.lib.wiring import In, Out
from oddl.fpga import regmap as R
from oddl.fpga.frame import BEAT_BITS, FrameFormat, flow_widths
from oddl.fpga.gateware.control_unit import BUILD, STATS, ControlUnitRTL
from oddl.fpga.gateware.onic_bus import (
    ADDR_BITS,
    N_HDR,
    OKAY,
    SLVERR,
    read_first_stage,
    read_groups,
    read_second_stage,
)
from oddl.fpga.gateware.onic_ctrl import OnicCtrl
from oddl.fpga.gateware.onic_ctrl import members as ctrl_members
from oddl.fpga.gateware.onic_engine import HANDOVER_WORDS

CU_WINDOW = 0x400  # the CU block's share of the address space (from R.CU_BASE)


def _word(v: Any, width: int = 32) -> Any:
    """`v` zero-extended to `width` bits (it must fit)."""
    assert len(v) <= width, (len(v), width)
    return Cat(v, Const(0, width - len(v)))


class OnicTop(wiring.Component):
    """The IP a board's bitstream holds: `onic_ctrl`'s ports (AXI-Lite, the laser driver,
    the MAC's transfer engine, the DACs, the straps) plus the control frames' streams."""

    def __init__(self, frame: FrameFormat, nodes: int = BUILD["nodes"], txq: int = BUILD["txq"],
                 rxq: int = BUILD["rxq"], done: int = BUILD["done"], per_sender: int = 4,
                 *, sim_view: bool = False) -> None:
        """`sim_view`: the unit's timers as ports, for a co-simulation that clocks the RTL
        only when it has work (sim/devices/rtl_board.py): which are armed, when each is due,
        which were armed in this cycle (outputs `unit_armed`, `unit_due`, `unit_arming`),
        and which may fire (input `unit_timers_en`: the model's clock wakes the RTL for one
        timer at a time, so that timers due at one instant fire in the model's order). A
        bitstream's build leaves them out, its timers all enabled."""
        assert tuple(STATS) == R.CU_STATS, "the counters' order is the register map's"
        self.frame = frame
        self.bounds = {"nodes": nodes, "txq": txq, "rxq": rxq, "done": done,
                       "per_sender": per_sender}
        self._ctrl_members = ctrl_members()
        members = dict(self._ctrl_members)
        nw = frame.width("src")
        members |= {"ctl_rx_tvalid": In(1), "ctl_rx_tready": Out(1),
                    "ctl_rx_tdata": In(BEAT_BITS), "ctl_rx_tlast": In(1),
                    "ctl_tx_tvalid": Out(1), "ctl_tx_tready": In(1),
                    "ctl_tx_tdata": Out(BEAT_BITS), "ctl_tx_tlast": Out(1),
                    "ctl_tx_tdest": Out(nw)}
        if sim_view:
            timers = 3 * len(R.PORTS)
            members |= {"unit_armed": Out(timers), "unit_due": Out(64 * timers),
                        "unit_arming": Out(timers), "unit_timers_en": In(timers)}
        self.sim_view = sim_view
        super().__init__(members)

    def elaborate(self, platform: object) -> Module:
        net = SimpleNamespace()  # the nets each part makes for the parts after it
        m = Module()
        F = self.frame
        m.submodules.ctrl = ctrl = OnicCtrl(R.TOP_DESIGN_VERSION, unit_port=True)
        m.submodules.unit = unit = ControlUnitRTL(F, len(R.PORTS), **self.bounds)
        if self.sim_view:
            m.d.comb += [self.unit_armed.eq(unit.armed), self.unit_due.eq(unit.due),
                         self.unit_arming.eq(unit.arming),
                         unit.timers_en.eq(self.unit_timers_en)]
        else:
            m.d.comb += unit.timers_en.eq(-1)
        FLOW = unit.FLOW
        fw = FLOW.size
        assert fw <= 32 * R.CU_FLOW_WORDS, (fw, R.CU_FLOW_WORDS)
        ports = [p.lower() for p in R.PORTS]

        net.F, net.FLOW, net.ctrl, net.fw, net.ports, net.unit = F, FLOW, ctrl, fw, ports, unit

        self._ctrl_pins(m, net)
        self._unit_wiring(m, net)
        self._commands(m, net)
        self._queues(m, net)
        self._cu_block(m, net)
        self._bus(m, net)
        return m

    def _ctrl_pins(self, m: Module, net: SimpleNamespace) -> None:
        """onic_ctrl's pins are the top's, but for the AXI-Lite slave (shared below)."""
        ctrl = net.ctrl

        for name in self._ctrl_members:
            if name.startswith("s_axi_"):
                continue
            outer, inner = getattr(self, name), getattr(ctrl, name)
            if self._ctrl_members[name].flow == wiring.In:  # (a wiring.Member)
                m.d.comb += inner.eq(outer)
            else:
                m.d.comb += outer.eq(inner)

    def _unit_wiring(self, m: Module, net: SimpleNamespace) -> None:
        """The unit: its straps, its frames, the datapath's reports."""
        F, ctrl, ports, unit = net.F, net.ctrl, net.ports, net.unit

        regs: dict[str, Signal] = {r.name: Signal(32, name=r.name.lower(), init=r.reset)
                                   for r in R.CU_REGISTERS if r.access == "RW"}
        m.d.comb += [unit.ts_ns.eq(self.ts_ns), unit.node_id.eq(ctrl.node),
                     unit.tag.eq(regs["CU_TAG"]), unit.halt.eq(regs["CU_CTRL"][0]),
                     *[getattr(unit, f"{t.lower()}").eq(regs[f"CU_{t}"]) for t in (
                         "TUNING_NS", "PROPAGATION_NS", "REQUEST_TIMEOUT_NS",
                         "RELEASE_TIMEOUT_NS", "LEASE_NS")],
                     unit.max_retries.eq(regs["CU_MAX_RETRIES"])]
        m.d.comb += [unit.rx_tvalid.eq(self.ctl_rx_tvalid), self.ctl_rx_tready.eq(unit.rx_tready),
                     unit.rx_tdata.eq(self.ctl_rx_tdata), unit.rx_tlast.eq(self.ctl_rx_tlast),
                     self.ctl_tx_tvalid.eq(unit.tx_tvalid), unit.tx_tready.eq(self.ctl_tx_tready),
                     self.ctl_tx_tdata.eq(unit.tx_tdata), self.ctl_tx_tlast.eq(unit.tx_tlast),
                     self.ctl_tx_tdest.eq(unit.tx_tdest)]
        kw = F.width("flow") + F.width("hop")
        nb = F.width("nbytes")
        for i, p in enumerate(ports):
            rx_bytes = getattr(self, f"{p}_rx_bytes")
            m.d.comb += [
                unit.tx_done[i].eq(getattr(self, f"{p}_tx_done")),
                unit.rx_done[i].eq(getattr(self, f"{p}_rx_done")),
                unit.rx_done_flow[32 * i: 32 * i + 32].eq(getattr(self, f"{p}_rx_flow")),
                unit.rx_done_bytes[nb * i: nb * i + nb].eq(rx_bytes),
                # the granted flow's light arriving: the receiver busy with that flow
                unit.rx_receiving[i].eq(getattr(self, f"{p}_rx_busy") & unit.granted_ok[i] & (
                    getattr(self, f"{p}_rx_cur_flow") == unit.granted_key[kw * i: kw * i + 32]))]

        net.regs = regs

    def _commands(self, m: Module, net: SimpleNamespace) -> None:
        """The unit's starts become onic_ctrl's commands (one a port at a time)."""
        FLOW, ctrl, fw, unit = net.FLOW, net.ctrl, net.fw, net.unit

        pend = Signal()
        cmd = Signal(1 + 1 + 8 + fw)  # port, tune, channel, flow
        with m.If(unit.start_valid):
            m.d.sync += [pend.eq(1), cmd.eq(Cat(unit.start_port[0], unit.start_tune,
                                                 unit.start_channel, unit.start_flow))]
        with m.Elif(ctrl.cmd_ready):
            m.d.sync += pend.eq(0)
        fl = FLOW(cmd[10:])
        m.d.comb += [ctrl.cmd_valid.eq(pend), ctrl.cmd_port.eq(cmd[0]), ctrl.cmd_tune.eq(cmd[1]),
                     ctrl.cmd_channel.eq(cmd[2:10]), ctrl.cmd_dst.eq(fl.dst),
                     ctrl.cmd_bytes.eq(fl.nbytes), ctrl.cmd_flow.eq(fl.id),
                     # the header as the TX registers take it (regmap.header_words), each
                     # field its own 32-bit word (a relay's hop had landed in the source's
                     # word, and onic_ctrl refused the transfer: ROUTE_MISS)
                     ctrl.cmd_hdr.eq(Cat(*(_word(v) for v in (
                         fl.id[32:64], fl.src, Cat(_word(fl.hop, 8), fl.step)[:32], fl.iteration,
                         fl.t_submit[:32], fl.t_submit[32:64]))))]
        assert len(ctrl.cmd_hdr) == 32 * N_HDR

        net.pend = pend

    def _handed_over(self, m: Module, ctrl: OnicCtrl) -> tuple[Any, Signal, Signal]:
        """An engine's `start tx[P]`: the words of port P's transfer registers as onic_ctrl
        hands them over (HANDOVER_WORDS), staged; returns the flow they make (the header
        words carry the whole flow, as regmap.header_words writes it), a flag set once the
        last word is in (cleared by the queue's write), and the port."""
        stage = Signal(32 * len(HANDOVER_WORDS))
        go, port = Signal(), Signal()
        with m.If(ctrl.ca_word_valid):
            m.d.sync += stage.eq(Cat(stage[32:], ctrl.ca_word))
        with m.If(ctrl.ca_word_valid & ctrl.ca_word_last):
            m.d.sync += [go.eq(1), port.eq(ctrl.ca_word_port)]
        w = {n: stage[32 * k: 32 * k + 32] for k, n in enumerate(HANDOVER_WORDS)}
        nw = self.frame.width("src")
        fields = {"id": Cat(w["FLOW"], w["HDR0"]), "src": w["HDR1"][:nw], "dst": w["DST"][:nw],
                  "nbytes": w["BYTES"], "iteration": w["HDR3"], "step": w["HDR2"][8:32],
                  "hop": w["HDR2"][0:8], "t_submit": Cat(w["HDR4"], w["HDR5"])}
        flow = Cat(*(_word(fields[name], width) for name, width in flow_widths(self.frame)))
        return flow, go, port

    def _queues(self, m: Module, net: SimpleNamespace) -> None:
        """The flows the host hands to the unit, and the deliveries and the first
        failure it reads back."""
        ctrl, fw, regs, unit = net.ctrl, net.fw, net.regs, net.unit

        m.submodules.submit = submit = fifo.SyncFIFO(width=fw, depth=R.CU_QUEUE)
        m.submodules.delivered = dq = fifo.SyncFIFO(width=fw, depth=R.CU_QUEUE)
        sub_words = [regs[f"CU_SUBMIT{k}"] for k in range(R.CU_FLOW_WORDS)]
        # its two writers: the host's CU_SUBMIT_GO, and the engine's starts, staged here
        # word by word (`_handed_over`), which wait a cycle for the host's
        host_go = Signal()
        staged, ca_go, ca_port = self._handed_over(m, ctrl)
        with m.If(ca_go & ~host_go):
            m.d.sync += ca_go.eq(0)
            m.d.comb += ctrl.ca_refused.eq(Mux(submit.w_rdy, 0, Mux(ca_port, 0b10, 0b01)))
        m.d.comb += [submit.w_en.eq(host_go | ca_go),
                     submit.w_data.eq(Mux(host_go, Cat(*sub_words)[:fw], staged)),
                     unit.submit_valid.eq(submit.r_rdy),
                     unit.submit_flow.eq(submit.r_data), submit.r_en.eq(unit.submit_ready),
                     dq.w_data.eq(unit.deliver_flow), dq.w_en.eq(unit.deliver_valid)]
        lost = Signal(32)
        with m.If(unit.deliver_valid & ~dq.w_rdy):
            m.d.sync += lost.eq(lost + 1)
        fail = {k: Signal(32, name=f"cu_fail_{k}") for k in ("code", "lo", "hi", "peer", "bytes")}
        fail_clr = Signal(32)
        with m.If(unit.fail_valid & (fail["code"] == 0)):  # the first, kept until cleared
            m.d.sync += [fail["code"].eq(unit.fail_code), fail["lo"].eq(unit.fail_flow[:32]),
                         fail["hi"].eq(unit.fail_flow[32:64]), fail["peer"].eq(unit.fail_peer),
                         fail["bytes"].eq(unit.fail_bytes[:32])]
        with m.Elif(fail_clr.any()):
            m.d.sync += fail["code"].eq(fail["code"] & ~fail_clr)
        m.d.comb += ctrl.irq_raise.eq(
            Mux(unit.deliver_valid, 1 << R.IRQ_BITS["CU_DELIVERED"], 0)
            | Mux(unit.fail_valid, 1 << R.IRQ_BITS["CU_FAILED"], 0))

        net.dq, net.fail, net.fail_clr, net.lost = dq, fail, fail_clr, lost
        net.submit, net.host_go, net.ca_go = submit, host_go, ca_go

    def _cu_block(self, m: Module, net: SimpleNamespace) -> None:
        """The bus's CU block: what each register reads, and its latched accesses."""
        ctrl, dq, fail, fw, lost, regs = net.ctrl, net.dq, net.fail, net.fw, net.lost, net.regs
        submit, unit = net.submit, net.unit

        reads: dict[int, Any] = {
            R.BY_NAME["CU_CAPS"].offset: Const(
                self.bounds["txq"] | self.bounds["rxq"] << 8 | self.bounds["done"] << 16
                | self.bounds["per_sender"] << 24, 32),
            R.BY_NAME["CU_NODES"].offset: Const(self.bounds["nodes"], 32),
            R.BY_NAME["CU_SUBMIT_FREE"].offset: R.CU_QUEUE - submit.level,
            R.BY_NAME["CU_DELIV_COUNT"].offset: dq.level,
            R.BY_NAME["CU_DELIV_LOST"].offset: lost,
            R.BY_NAME["CU_FAIL"].offset: fail["code"],
            R.BY_NAME["CU_FAIL_FLOW_LO"].offset: fail["lo"],
            R.BY_NAME["CU_FAIL_FLOW_HI"].offset: fail["hi"],
            R.BY_NAME["CU_FAIL_PEER"].offset: fail["peer"],
            R.BY_NAME["CU_FAIL_BYTES"].offset: fail["bytes"],
        }
        head = Cat(dq.r_data, Const(0, 32 * R.CU_FLOW_WORDS - fw))
        for w in range(R.CU_FLOW_WORDS):
            reads[R.BY_NAME[f"CU_DELIV{w}"].offset] = head[32 * w: 32 * w + 32]
        for i, stat in enumerate(STATS):
            reads[R.BY_NAME[f"CU_STAT_{stat.upper()}"].offset] = unit.stats[32 * i: 32 * i + 32]
        sent = Signal(32)  # frames out, as the Python unit counts the messages it sends
        with m.If(unit.tx_tvalid & self.ctl_tx_tready):
            m.d.sync += sent.eq(sent + 1)
        reads[R.BY_NAME["CU_SENT"].offset] = sent
        for i, p in enumerate(R.PORTS):
            reads[R.BY_NAME[f"CU_UNEXPECTED_{p}"].offset] = unit.unexpected[32 * i: 32 * i + 32]
        for name, sig in regs.items():
            reads[R.BY_NAME[name].offset] = sig

        # the read multiplexer in two registered stages, as onic_ctrl's (one multiplexer
        # of every CU register drew them, the counters and the delivered queue to one spot
        # of the die): each group of eight picks its word as the read is accepted, then
        # the group's word is taken. A register is read as it was in that cycle.
        groups, staged = read_groups(reads, "cu_read_group")

        def mine(addr: Any) -> Any:
            return (addr >= R.CU_BASE) & (addr < R.CU_BASE + CU_WINDOW)

        waddr, wdata, wstrb = Signal(ADDR_BITS), Signal(32), Signal(4)
        raddr = Signal(ADDR_BITS)
        bresp, rdata = Signal(2), Signal(32)
        route_word = Signal(32)
        route_we = Signal()
        m.d.comb += [unit.route_we.eq(route_we), unit.route_dst.eq(regs["CU_ROUTE_DST"]),
                     unit.route_valid.eq(route_word[31]), unit.route_port.eq(route_word[24]),
                     unit.route_channel.eq(route_word[16:24]), unit.route_next.eq(route_word[0:16])]
        s = self

        def through(down: tuple[str, ...], up: tuple[str, ...]) -> list[Any]:
            """onic_ctrl's own handshakes, passed through until its answer is taken."""
            return [*(getattr(ctrl, f"s_axi_{n}").eq(getattr(s, f"s_axi_{n}")) for n in down),
                    *(getattr(s, f"s_axi_{n}").eq(getattr(ctrl, f"s_axi_{n}")) for n in up)]

        net.bresp, net.groups, net.mine, net.raddr, net.rdata = bresp, groups, mine, raddr, rdata
        net.route_we, net.route_word, net.s, net.staged = route_we, route_word, s, staged
        net.through, net.waddr, net.wdata, net.wstrb = through, waddr, wdata, wstrb

    def _bus(self, m: Module, net: SimpleNamespace) -> None:
        """The bus: the CU block here, the rest passed through to onic_ctrl."""
        bresp, ctrl, dq, fail_clr, groups = net.bresp, net.ctrl, net.dq, net.fail_clr, net.groups
        mine, pend, raddr, rdata = net.mine, net.pend, net.raddr, net.rdata
        regs, route_we, route_word, s = net.regs, net.route_we, net.route_word, net.s
        staged, submit, through, unit = net.staged, net.submit, net.through, net.unit
        waddr, wdata, wstrb = net.waddr, net.wdata, net.wstrb


        with m.FSM(name="bus"):
            with m.State("IDLE"):
                with m.If(s.s_axi_awvalid & s.s_axi_wvalid & mine(s.s_axi_awaddr)):
                    m.d.comb += [s.s_axi_awready.eq(1), s.s_axi_wready.eq(1)]
                    m.d.sync += [waddr.eq(s.s_axi_awaddr & ~3), wdata.eq(s.s_axi_wdata),
                                 wstrb.eq(s.s_axi_wstrb)]
                    m.next = "CU_WRITE"
                with m.Elif(s.s_axi_awvalid & s.s_axi_wvalid):
                    m.next = "CTRL_WRITE"
                with m.Elif(s.s_axi_arvalid & mine(s.s_axi_araddr)):
                    m.d.comb += s.s_axi_arready.eq(1)
                    m.d.sync += raddr.eq(s.s_axi_araddr & ~3)
                    read_first_stage(m, s.s_axi_araddr, groups, staged)  # as accepted
                    m.next = "CU_READ"
                with m.Elif(s.s_axi_arvalid):
                    m.next = "CTRL_READ"
            with m.State("CU_WRITE"):
                m.d.sync += bresp.eq(OKAY)
                with m.If(wstrb != 0xF):
                    m.d.sync += bresp.eq(SLVERR)
                with m.Else(), m.Switch(waddr):
                    for name, sig in regs.items():
                        with m.Case(R.BY_NAME[name].offset):
                            m.d.sync += sig.eq(wdata)
                    with m.Case(R.BY_NAME["CU_ROUTE"].offset):
                        m.d.sync += [route_word.eq(wdata), route_we.eq(1)]
                    with m.Case(R.BY_NAME["CU_SUBMIT_GO"].offset), m.If(wdata[0]):
                        m.d.comb += net.host_go.eq(1)
                        with m.If(~submit.w_rdy):
                            m.d.sync += bresp.eq(SLVERR)  # full: said, nothing queued
                    with m.Case(R.BY_NAME["CU_DELIV_POP"].offset), m.If(wdata[0]):
                        m.d.comb += dq.r_en.eq(1)
                    with m.Case(R.BY_NAME["CU_FAIL"].offset):
                        m.d.comb += fail_clr.eq(wdata)
                    with m.Default():  # read only, or a hole
                        m.d.sync += bresp.eq(SLVERR)
                m.next = "CU_BRESP"
            with m.State("CU_BRESP"):
                m.d.sync += route_we.eq(0)
                m.d.comb += [s.s_axi_bvalid.eq(1), s.s_axi_bresp.eq(bresp)]
                with m.If(s.s_axi_bready):
                    m.next = "IDLE"
            with m.State("CU_READ"):  # the second: the group's word
                read_second_stage(m, raddr, staged, rdata)
                m.next = "CU_RRESP"
            with m.State("CU_RRESP"):
                m.d.comb += [s.s_axi_rvalid.eq(1), s.s_axi_rdata.eq(rdata),
                             s.s_axi_rresp.eq(OKAY)]
                with m.If(s.s_axi_rready):
                    m.next = "IDLE"
            with m.State("CTRL_WRITE"):
                m.d.comb += through(("awvalid", "awaddr", "wvalid", "wdata", "wstrb", "bready"),
                                    ("awready", "wready", "bvalid", "bresp"))
                with m.If(ctrl.s_axi_bvalid & s.s_axi_bready):
                    m.next = "IDLE"
            with m.State("CTRL_READ"):
                m.d.comb += through(("arvalid", "araddr", "rready"),
                                    ("arready", "rvalid", "rdata", "rresp"))
                with m.If(ctrl.s_axi_rvalid & s.s_axi_rready):
                    m.next = "IDLE"
        m.d.comb += self.busy.eq(ctrl.busy | unit.busy | pend | submit.r_rdy | net.ca_go)
