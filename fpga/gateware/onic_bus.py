"""The AXI-Lite slave's parts of `onic_ctrl` (fpga/gateware/onic_ctrl.py): its latched
addresses and answers, what each register reads through the two-stage read
multiplexer (also `onic_top`'s), and the executor's write and read states."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from amaranth import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from oddl.fpga import regmap as R

N_HDR = len(R.HEADER)  # a transfer's header words
ADDR_BITS = 16  # 64 KiB
GROUP_BITS = 5  # the read multiplexer's first stage: groups of 2**5 bytes, eight registers
OKAY, SLVERR = 0, 2


def read_groups(reads: dict[int, Any], name: str
                ) -> tuple[dict[int, dict[int, Any]], dict[int, Signal]]:
    """A register read multiplexer's first stage: the registers (offset -> value) by group
    of 2**GROUP_BITS bytes, and a 32-bit register for each group's word."""
    groups: dict[int, dict[int, Any]] = {}
    for off, value in reads.items():
        groups.setdefault(off >> GROUP_BITS, {})[off] = value
    return groups, {g: Signal(32, name=f"{name}_{g:x}") for g in groups}

def read_first_stage(m: Module, addr: Any, groups: dict[int, dict[int, Any]],
                     staged: dict[int, Signal]) -> None:
    """Each group's register takes its word at `addr` (zero: a hole or an SC register);
    the second stage takes the group's, by `addr[GROUP_BITS:]`."""
    for g, group in groups.items():
        m.d.sync += staged[g].eq(0)
        with m.Switch(addr[2:GROUP_BITS]):
            for off, value in sorted(group.items()):
                with m.Case((off >> 2) % (1 << (GROUP_BITS - 2))):
                    m.d.sync += staged[g].eq(value)

def read_second_stage(m: Module, addr: Any, staged: dict[int, Signal], rdata: Signal
                      ) -> None:
    """`rdata` takes the word of `addr`'s group (zero: no register's group)."""
    m.d.sync += rdata.eq(0)
    with m.Switch(addr[GROUP_BITS:]):
        for g in sorted(staged):
            with m.Case(g):
                m.d.sync += rdata.eq(staged[g])


class BusParts(wiring.Component):
    """The bus's part of `OnicCtrl.elaborate` (`net`: the nets the parts share)."""

    def _bus(self, m: Module, net: SimpleNamespace) -> None:
        """The AXI-Lite slave's latched addresses and answers, and the memories' ports."""
        nm, ns, route_rd, route_wr = net.nm, net.ns, net.route_rd, net.route_wr
        slots_rd, slots_wr = net.slots_rd, net.slots_wr

        waddr, wdata, wstrb = Signal(ADDR_BITS), Signal(32), Signal(4)
        raddr = Signal(ADDR_BITS)
        bresp, rdata, rresp = Signal(2), Signal(32), Signal(2)
        m.d.comb += [self.s_axi_bresp.eq(bresp), self.s_axi_rdata.eq(rdata),
                     self.s_axi_rresp.eq(rresp)]
        m.d.comb += route_wr.addr.eq(waddr[2:2 + 11]), route_wr.data.eq(wdata)
        m.d.comb += route_rd.addr.eq(raddr[2:2 + 11])
        in_routes_w = (waddr >= R.ROUTE_BASE) & (waddr < R.ROUTE_BASE + 8 * R.ROUTE_ENTRIES)
        in_routes_r = (raddr >= R.ROUTE_BASE) & (raddr < R.ROUTE_BASE + 8 * R.ROUTE_ENTRIES)
        in_ca_w = (waddr >= R.CA_BASE) & (waddr < R.CA_BASE + R.CA_STRIDE * nm)
        in_ca_r = (raddr >= R.CA_BASE) & (raddr < R.CA_BASE + R.CA_STRIDE * nm)
        ca_wm, ca_wf = waddr[7:11], waddr[0:7]  # module, field offset (CA_STRIDE = 0x80)
        ca_rm, ca_rf = raddr[7:11], raddr[0:7]
        assert R.CA_STRIDE == 0x80 and R.CA_BASE % 0x800 == 0
        # a slot's copy: module, then SRC (0x20 + 4k) or ACT (0x40 + 4k), then k
        assert ns == 8 and (R.ca(0, "SRC0"), R.ca(0, "ACT0")) == (R.CA_BASE + 0x20,
                                                                  R.CA_BASE + 0x40)
        m.d.comb += [slots_wr.addr.eq(Cat(ca_wf[2:5], ca_wf[6], ca_wm)),
                     slots_wr.data.eq(wdata),
                     slots_rd.addr.eq(Cat(ca_rf[2:5], ca_rf[6], ca_rm))]

        net.bresp, net.ca_rf, net.ca_rm, net.ca_wf, net.ca_wm = bresp, ca_rf, ca_rm, ca_wf, ca_wm
        net.in_ca_r, net.in_ca_w, net.in_routes_r = in_ca_r, in_ca_w, in_routes_r
        net.in_routes_w, net.raddr, net.rdata, net.rresp = in_routes_w, raddr, rdata, rresp
        net.waddr, net.wdata, net.wstrb = waddr, wdata, wstrb

    def _reads(self, m: Module, net: SimpleNamespace) -> None:
        """What each register reads, in the read multiplexer's groups."""
        channel, error, irq_status, nm = net.channel, net.error, net.irq_status, net.nm
        node_id, node_id_set, pin, ports = net.node_id, net.node_id_set, net.pin, net.ports
        rw, rx_bytes, rx_hdr, rx_keep = net.rw, net.rx_bytes, net.rx_hdr, net.rx_keep
        sending, ts_hi, tune_ns, tuned = net.sending, net.ts_hi, net.tune_ns, net.tuned
        tuning, tx_done_count, tx_sent = net.tuning, net.tx_done_count, net.tx_sent

        def status_word(i: int) -> object:
            return (tuning[i] | (sending[i] << 1) | ((tuned[i] & ~tuning[i]) << 2)
                    | (channel[i] << 8))

        # read values of everything outside the route table and the engine
        reads: dict[int, object] = {
            R.BY_NAME["MAGIC"].offset: Const(R.MAGIC, 32),
            R.BY_NAME["DESIGN_VERSION"].offset: Const(self.design_version, 32),
            R.BY_NAME["CAPS"].offset: Const(R.BY_NAME["CAPS"].reset, 32),
            R.BY_NAME["NODE_ID"].offset: Mux(node_id_set, node_id, self.node_id),
            R.BY_NAME["IRQ_STATUS"].offset: irq_status,
            R.BY_NAME["ERROR"].offset: error,
            R.BY_NAME["TS_LO"].offset: self.ts_ns[0:32],
            R.BY_NAME["TS_HI"].offset: ts_hi,
        }
        for k in range(8):  # word 0 most significant
            reads[R.BY_NAME[f"BITSTREAM_HASH{k}"].offset] = \
                self.bitstream_hash[256 - 32 * (k + 1): 256 - 32 * k]
        for name, sig in rw.items():
            reads[R.BY_NAME[name].offset] = sig
        for i, P in enumerate(R.PORTS):
            def o(n: str, P: str = P) -> int:
                return R.BY_NAME[n.replace("#", P)].offset
            reads |= {o("TX#_STATUS"): status_word(i), o("TX#_DONE_COUNT"): tx_done_count[i],
                      o("TX#_SENT_LO"): tx_sent[i][0:32], o("TX#_SENT_HI"): tx_sent[i][32:64],
                      o("TX#_TUNE_NS"): tune_ns[i], o("RX#_STATUS"): pin(ports[i], "rx_busy"),
                      o("RX#_BYTES_LO"): rx_bytes[i][0:32],
                      o("RX#_BYTES_HI"): rx_bytes[i][32:64],
                      o("RX#_CUR_FLOW"): Mux(pin(ports[i], "rx_busy"),
                                             pin(ports[i], "rx_cur_flow"), 0xFFFFFFFF)}
            for name, sigs in rx_keep.items():
                reads[o(f"RX#_{name}")] = sigs[i]
            for h in range(N_HDR):
                reads[o(f"RX#_HDR{h}")] = rx_hdr[i][h]
        # The read multiplexer, in two registered stages: in READ each group of eight
        # registers (a port's TX block, its RX counters, ...) picks its word beside them,
        # and the engine its field; in READ_DATA one of the groups' words is taken. (One
        # multiplexer of every register had drawn them all, and their counters' adders,
        # to one spot of the die: the routing congestion that kept the board build from
        # converging, docs/gateware.md.) A register is read as it was in READ: the cycle
        # TS_HI is latched in, so TS_LO and TS_HI are one instant's.
        groups, staged = read_groups(reads, "read_group")
        assert nm == 16, "the engine's read: four groups of four modules"
        ca_staged = [Signal(32, name=f"read_ca_{q}") for q in range(4)]
        writable = {R.BY_NAME[n].offset for n in rw} | {R.BY_NAME["NODE_ID"].offset}
        w1c = {r.offset for r in R.REGISTERS if r.access == "W1C"}
        sc = {r.offset for r in R.REGISTERS if r.access == "SC" and not r.name.startswith("CA")}

        net.ca_staged, net.groups, net.sc, net.staged, net.w1c = ca_staged, groups, sc, staged, w1c
        net.writable = writable

    def _write_states(self, m: Module, net: SimpleNamespace) -> None:
        """A bus write, by the kind of register."""
        bresp, ca_ctrl, ca_target, ca_wf = net.bresp, net.ca_ctrl, net.ca_target, net.ca_wf
        ca_wm, clear, do_start, do_tune = net.ca_wm, net.clear, net.do_start, net.do_tune
        err_clr, in_ca_w, in_routes_w = net.err_clr, net.in_ca_w, net.in_routes_w
        irq_clr, node_id, node_id_set, ns = net.irq_clr, net.node_id, net.node_id_set, net.ns
        route_wr, rw, rx_keep, sc = net.route_wr, net.rw, net.rx_keep, net.sc
        slots_wr, src_col, then_start = net.slots_wr, net.src_col, net.then_start
        tune_arg, w1c, waddr, wdata = net.tune_arg, net.w1c, net.waddr, net.wdata
        writable, wstrb = net.writable, net.wstrb

        with m.State("WRITE"):
            ok = Signal()
            m.d.comb += ok.eq(wstrb == 0xF)
            with m.If(~ok):
                m.d.sync += bresp.eq(SLVERR)
            with m.Elif(in_routes_w):
                m.d.comb += route_wr.en.eq(1)
                m.d.sync += bresp.eq(OKAY)
            with m.Elif(in_ca_w):
                m.d.sync += bresp.eq(OKAY)
                with m.Switch(ca_wf):
                    with m.Case(0x00):
                        m.d.sync += ca_ctrl[ca_wm].eq(wdata[0:2])
                    with m.Case(0x04), m.If(wdata[0]):
                        m.d.sync += clear(ca_wm)
                    with m.Case(0x0C):
                        m.d.sync += ca_target[ca_wm].eq(wdata)
                    for k in range(ns):
                        with m.Case(0x20 + 4 * k):
                            m.d.sync += src_col[k][ca_wm].eq(wdata)
                            m.d.comb += slots_wr.en.eq(1)
                        with m.Case(0x40 + 4 * k):
                            m.d.comb += slots_wr.en.eq(1)
                    with m.Default():  # STATUS, COUNT (read only) and the holes
                        m.d.sync += bresp.eq(SLVERR)
            with m.Else():
                m.d.sync += bresp.eq(OKAY)
                with m.Switch(waddr):
                    for off in sorted(writable):
                        with m.Case(off):
                            if off == R.BY_NAME["NODE_ID"].offset:
                                m.d.sync += [node_id.eq(wdata), node_id_set.eq(1)]
                            else:
                                m.d.sync += rw[R.BY_OFFSET[off].name].eq(wdata)
                    for off in sorted(w1c):
                        name = R.BY_OFFSET[off].name
                        with m.Case(off):
                            if name == "IRQ_STATUS":
                                m.d.comb += irq_clr.eq(wdata)
                            elif name == "ERROR":
                                m.d.comb += err_clr.eq(wdata)
                            else:
                                i = R.PORTS.index(name[2])
                                s = rx_keep["ERRORS"][i]
                                m.d.sync += s.eq(s & ~wdata)
                    for off in sorted(sc):
                        name = R.BY_OFFSET[off].name
                        i = R.PORTS.index(name[2])
                        with m.Case(off), m.If(wdata[0]):
                            if name.endswith("_CMD"):
                                m.d.comb += [do_tune[i].eq(1),
                                             tune_arg[i].eq(rw[f"TX{name[2]}_CHANNEL"]),
                                             then_start[i].eq(wdata[1])]
                            else:
                                m.d.comb += do_start[i].eq(1)
                    with m.Default():  # read-only or unmapped
                        m.d.sync += bresp.eq(SLVERR)
            m.next = "BRESP"
        with m.State("BRESP"):
            m.d.comb += self.s_axi_bvalid.eq(1)
            with m.If(self.s_axi_bready):
                m.next = "IDLE"

    def _read_states(self, m: Module, net: SimpleNamespace) -> None:
        """A bus read, in the multiplexer's two registered stages."""
        ca_count, ca_ctrl, ca_fired = net.ca_count, net.ca_ctrl, net.ca_fired
        ca_nfire, ca_rf, ca_rm, ca_staged = net.ca_nfire, net.ca_rf, net.ca_rm, net.ca_staged
        ca_target, groups, in_ca_r = net.ca_target, net.groups, net.in_ca_r
        in_routes_r, ns, raddr, rdata = net.in_routes_r, net.ns, net.raddr, net.rdata
        route_rd, rresp, slots_rd, staged = net.route_rd, net.rresp, net.slots_rd, net.staged
        ts_hi = net.ts_hi

        with m.State("READ"):  # the route table's read port answers a cycle later
            with m.If(raddr == R.BY_NAME["TS_LO"].offset):
                m.d.sync += ts_hi.eq(self.ts_ns[32:64])
            # the first stage: each group's register, and the engine's field
            read_first_stage(m, raddr, groups, staged)
            for q, part in enumerate(ca_staged):  # modules 4q .. 4q + 3
                mod = Cat(ca_rm[:2], Const(q, 2))
                m.d.sync += part.eq(0)
                with m.Switch(ca_rf):
                    with m.Case(0x00):
                        m.d.sync += part.eq(ca_ctrl[mod])
                    with m.Case(0x08):
                        m.d.sync += part.eq(ca_ctrl[mod][0] | (ca_fired[mod] << 1)
                                            | (ca_nfire[mod] << 8))
                    with m.Case(0x0C):
                        m.d.sync += part.eq(ca_target[mod])
                    with m.Case(0x10):
                        m.d.sync += part.eq(ca_count[mod])
            m.next = "READ_DATA"
        with m.State("READ_DATA"):  # the second: which group, or a memory's word
            m.d.sync += rresp.eq(OKAY)
            with m.If(in_routes_r):
                m.d.sync += rdata.eq(route_rd.data)
            with m.Elif(in_ca_r):
                m.d.sync += rdata.eq(Array(ca_staged)[ca_rm[2:]])
                with m.Switch(ca_rf), m.Case(*(f + 4 * k for f in (0x20, 0x40)
                                               for k in range(ns))):
                    m.d.sync += rdata.eq(slots_rd.data)  # (read in READ)
            with m.Else():
                read_second_stage(m, raddr, staged, rdata)
            m.next = "RRESP"
            if self.unit_port:  # (an engine's handover reads so too: onic_engine)
                with m.If(net.handing):
                    m.next = "HANDOVER"
        with m.State("RRESP"):
            m.d.comb += self.s_axi_rvalid.eq(1)
            with m.If(self.s_axi_rready):
                m.next = "IDLE"
