"""`onic_ctrl`, the O-NIC's control IP, in Amaranth HDL, generated from fpga/regmap.py.

One AXI-Lite slave (the PS's M_AXI_HPM0_FPD) over the register map: identity, interrupts,
per port the tuning sequencer and the transfer engine's start / done handshake, the
1,024-entry route table, and the count-action engine (16 modules of 8 slots) that runs the
images fpga/countaction.py compiles. The optics stay outside: the IP commands the laser
driver and hands transfer descriptors to the MAC, and hears back from them by strobes
(docs/gateware.md gives the timing of each interface).

One executor does one thing at a time, so that no register has two writers in a cycle:
an engine event, a datapath completion (lock, sent, received, DAC valid), or a bus access,
in that order of priority. Count-action semantics, which the Python board model follows:
- an event visits the armed modules with a matching source in ascending order, one per
  cycle; a module counts it once (its first matching slot) and, on reaching its target,
  fires before the next module counts: its actions run in slot order, one per cycle;
- a firing queues `module[m].fired` behind the events already queued (breadth first);
- at most FIRE_LIMIT firings follow one datapath event: a program whose modules trigger each
  other for ever is cut there, the queue dropped and ERROR.CA_LOOP set;
- counts wrap at 32 bits, as the registers do.
"""

from __future__ import annotations

from typing import Any

from amaranth import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import fifo, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from oddl.fpga import regmap as R
from oddl.fpga.countaction import ACTIONS, SIGNALS

ADDR_BITS = 16  # 64 KiB
N_HDR = len(R.HEADER)
FIRE_LIMIT = R.CA_FIRE_LIMIT
GROUP_BITS = 5  # the read multiplexer's first stage: groups of 2**5 bytes, eight registers
# queued count-action events: a datapath event queues at most 3, each firing 1
EVENT_DEPTH = FIRE_LIMIT + 4
ANY_PORT = len(R.PORTS)  # index code of rx[any]
# the engine's codes, as fpga/countaction.py compiles them
SIG = {"rx_bytes": SIGNALS["rx", "bytes"], "rx_transfers": SIGNALS["rx", "transfers"],
       "tx_done": SIGNALS["tx", "done"], "dac_valid": SIGNALS["DAC", "valid"],
       "fired": SIGNALS["module", "fired"], "delivered": SIGNALS["rx", "delivered"]}
ACT = ACTIONS
OKAY, SLVERR = 0, 2
# event entry: sig (3) | index (8) | value (32) | has_src (1) | src (24)
# a queued event's word: its fields and widths, in order
_EV_LAYOUT = (("sig", 3), ("idx", 8), ("val", 32), ("has_src", 1), ("src", 24))
_EV_WIDTH = sum(w for _, w in _EV_LAYOUT)


def _ev(word: Any, name: str) -> Any:
    """Field `name` of an event word (`_EV_LAYOUT`)."""
    at = 0
    for f, w in _EV_LAYOUT:
        if f == name:
            return word[at: at + w]
        at += w
    raise KeyError(name)


def _port_members(p: str) -> dict[str, object]:
    return {
        # laser driver: a one-cycle command, and a one-cycle report once the laser has locked
        f"{p}_tune_valid": Out(1), f"{p}_tune_channel": Out(8), f"{p}_tune_locked": In(1),
        # MAC transmit: a one-cycle descriptor (the MAC always takes it: a start is refused
        # while the port sends); tx_done once the last byte and the guard time are out
        f"{p}_tx_valid": Out(1), f"{p}_tx_dst": Out(16), f"{p}_tx_bytes": Out(32),
        f"{p}_tx_flow": Out(32), f"{p}_tx_hdr": Out(32 * N_HDR), f"{p}_tx_done": In(1),
        # MAC receive: a one-cycle completion with the transfer's fields, and the live state
        f"{p}_rx_done": In(1), f"{p}_rx_src": In(16), f"{p}_rx_dst": In(16),
        f"{p}_rx_flow": In(32), f"{p}_rx_bytes": In(32), f"{p}_rx_hdr": In(32 * N_HDR),
        f"{p}_rx_crc_error": In(1), f"{p}_rx_busy": In(1), f"{p}_rx_cur_flow": In(32),
    }


def members(unit_port: bool = False) -> dict[str, Any]:
    """The IP's ports (`OnicCtrl`'s signature)."""
    out: dict[str, Any] = {
        "s_axi_awaddr": In(ADDR_BITS), "s_axi_awvalid": In(1), "s_axi_awready": Out(1),
        "s_axi_wdata": In(32), "s_axi_wstrb": In(4), "s_axi_wvalid": In(1),
        "s_axi_wready": Out(1), "s_axi_bresp": Out(2), "s_axi_bvalid": Out(1),
        "s_axi_bready": In(1), "s_axi_araddr": In(ADDR_BITS), "s_axi_arvalid": In(1),
        "s_axi_arready": Out(1), "s_axi_rdata": Out(32), "s_axi_rresp": Out(2),
        "s_axi_rvalid": Out(1), "s_axi_rready": In(1),
        "irq": Out(1),
        "busy": Out(1),  # the executor has work (for the co-simulation's clocking)
        "strobe": Out(1),  # a tune, descriptor, stream or fired strobe is out
        "fired": Out(1),  # a count-action module fired (one cycle; for statistics)
        "ts_ns": In(64), "node_id": In(16), "n_nodes": In(16), "n_channels": In(8),
        "ports_present": In(len(R.PORTS)), "bitstream_hash": In(256),
        "dac_valid": In(1), "dac_index": In(8),
        "stream_valid": Out(1), "stream_dac": Out(8),
    }
    for p in R.PORTS:
        out |= _port_members(p.lower())
    if unit_port:
        out |= {"cmd_valid": In(1), "cmd_ready": Out(1), "cmd_port": In(1), "cmd_tune": In(1),
                "cmd_channel": In(8), "cmd_dst": In(16), "cmd_bytes": In(32),
                "cmd_flow": In(32), "cmd_hdr": In(32 * N_HDR), "irq_raise": In(32),
                "node": Out(16),
                # a count-action `start tx[P]`: port P's loaded transfer, for the unit's
                # queue; held until `ca_submit_ready`; `ca_submit_full`: refused
                "ca_submit_valid": Out(1), "ca_submit_port": Out(1),
                "ca_submit_ready": In(1), "ca_submit_full": In(1),
                "ca_submit_dst": Out(32), "ca_submit_bytes": Out(32),
                "ca_submit_flow": Out(32), "ca_submit_hdr": Out(32 * N_HDR)}
    return out


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


class OnicCtrl(wiring.Component):
    """The IP. Straps (`node_id`, `n_nodes`, `n_channels`, `ports_present`,
    `bitstream_hash`) come from the shell; `ts_ns` from the board's time base.

    `unit_port`: the ports by which the stage-2 control unit beside it (`onic_top`) drives
    the datapath: a transfer command (`cmd_*`: load a port's transfer and start it, tuning
    first if asked), taken by the executor as a host's register writes are, so that no
    register has two writers; `irq_raise`, flags it sets in IRQ_STATUS; `node`, this node's
    index as NODE_ID says it; `ca_submit_*`, the engine's starts, which are then the unit's
    (a `start tx[P]` hands port P's loaded transfer to the unit's queue, a `tune` only sets
    TX_CHANNEL: the unit tunes as its route says). `onic_ctrl` alone has none of them."""

    def __init__(self, design_version: int = R.DESIGN_VERSION, unit_port: bool = False
                 ) -> None:
        self.design_version = design_version
        self.unit_port = unit_port
        super().__init__(members(unit_port))

    def _ca_submit(self, m: Module, rw: dict[str, Signal], flag: Any) -> Any:
        """The engine's starts toward the unit's queue: the port's transfer registers, as
        they are (the executor, their one writer, waits while a start is held); taken
        when `ca_submit_ready`, refused (TX_REFUSED) if the queue is full. Returns when
        the engine's next start must wait."""
        valid, port = self.ca_submit_valid, self.ca_submit_port
        with m.If(self.ca_submit_ready):
            m.d.sync += valid.eq(0)  # (the ACT state sets it again for a start there)
        for i, P in enumerate(R.PORTS):
            flag(R.ERROR_BITS[f"TX_REFUSED_{P}"],
                 valid & self.ca_submit_ready & self.ca_submit_full & (port == i))

        def of(name: str) -> Any:
            h, v = (rw[f"TX{P}_{name}"] for P in R.PORTS)
            return Mux(port, v, h)
        m.d.comb += [self.ca_submit_dst.eq(of("DST")), self.ca_submit_bytes.eq(of("BYTES")),
                     self.ca_submit_flow.eq(of("FLOW")),
                     self.ca_submit_hdr.eq(Cat(*(of(f"HDR{k}") for k in range(N_HDR))))]
        return valid & ~self.ca_submit_ready

    # ---------------------------------------------------------------------------------
    def elaborate(self, platform: object) -> Module:
        m = Module()
        np_ = len(R.PORTS)
        ports = [p.lower() for p in R.PORTS]

        def pin(p: str, name: str) -> Signal:
            return getattr(self, f"{p}_{name}")

        # ---- storage ---------------------------------------------------------------
        rw = {r.name: Signal(32, name=r.name.lower(), init=r.reset) for r in R.REGISTERS
              if r.access == "RW" and not r.name.startswith("CA") and r.name != "NODE_ID"}
        node_id, node_id_set = Signal(32), Signal()
        irq_status, error, ts_hi = Signal(32), Signal(32), Signal(32)
        tx_done_count = [Signal(32, name=f"tx{p}_done_count") for p in ports]
        tx_sent = [Signal(64, name=f"tx{p}_sent") for p in ports]
        tune_ns = [Signal(32, name=f"tx{p}_tune_ns") for p in ports]
        rx_bytes = [Signal(64, name=f"rx{p}_bytes") for p in ports]
        rx_keep = {k: [Signal(32, name=f"rx{p}_{k}") for p in ports]
                   for k in ("SRC", "ERRORS", "LAST_FLOW", "LAST_BYTES", "DONE_COUNT", "DST")}
        rx_hdr = [[Signal(32, name=f"rx{p}_hdr{i}") for i in range(N_HDR)] for p in ports]
        # transmitter state
        tuning = [Signal(name=f"{p}_tuning") for p in ports]
        tuned = [Signal(name=f"{p}_tuned") for p in ports]
        sending = [Signal(name=f"{p}_sending") for p in ports]
        channel = [Signal(8, name=f"{p}_channel") for p in ports]
        req_ch = [Signal(8, name=f"{p}_req_ch") for p in ports]
        after_tune = [Signal(name=f"{p}_after_tune") for p in ports]
        tune_from = [Signal(64, name=f"{p}_tune_from") for p in ports]
        inflight = [Signal(32, name=f"{p}_inflight_bytes") for p in ports]
        # count-action modules
        nm, ns = R.N_MODULES, R.N_SLOTS
        ca_ctrl = Array(Signal(2, name=f"ca{i}_ctrl") for i in range(nm))
        ca_target = Array(Signal(32, name=f"ca{i}_target") for i in range(nm))
        ca_count = Array(Signal(32, name=f"ca{i}_count") for i in range(nm))
        ca_fired = Array(Signal(name=f"ca{i}_fired") for i in range(nm))
        ca_nfire = Array(Signal(8, name=f"ca{i}_nfire") for i in range(nm))
        # the slots live in block RAM (module, then SRC or ACT, then k): the host reads
        # them from there, and the engine its next action word, a slot a cycle (a 256-way
        # multiplexer of 32-bit words into the read data and a 128-way one into the action
        # word had been a third of the IP's LUTs, their fan-in from across the chip:
        # routing congestion). The engine compares every SRC at once, so those are
        # flip-flops too, written with their copy; neither is cleared by a reset, so the
        # two always agree (as the route table, a program outlives a reset: the host
        # loads it after one).
        ca_src = [[Signal(32, name=f"ca{i}_src{k}", reset_less=True) for k in range(ns)]
                  for i in range(nm)]
        src_col = [Array(ca_src[i][k] for i in range(nm)) for k in range(ns)]
        slots = Memory(shape=32, depth=nm * 2 * ns, init=[])
        m.submodules.ca_slots = slots
        slots_rd = slots.read_port()
        acts_rd = slots.read_port()  # the engine's
        slots_wr = slots.write_port()
        routes = Memory(shape=32, depth=2 * R.ROUTE_ENTRIES, init=[])
        m.submodules.routes = routes
        route_rd = routes.read_port()
        route_wr = routes.write_port()
        events = fifo.SyncFIFO(width=_EV_WIDTH, depth=EVENT_DEPTH)
        m.submodules.events = events

        # ---- datapath completions, latched until the executor takes them ----------
        pend_lock = [Signal(name=f"{p}_pend_lock") for p in ports]
        pend_txd = [Signal(name=f"{p}_pend_txdone") for p in ports]
        pend_rxd = [Signal(name=f"{p}_pend_rxdone") for p in ports]
        pend_dac, dac_idx = Signal(), Signal(8)
        rx_l = [{k: Signal(len(pin(p, f"rx_{k}")), name=f"{p}_rxl_{k}")
                 for k in ("src", "dst", "flow", "bytes", "hdr", "crc_error")} for p in ports]
        take_lock = [Signal(name=f"{p}_take_lock") for p in ports]
        take_txd = [Signal(name=f"{p}_take_txd") for p in ports]
        take_rxd = [Signal(name=f"{p}_take_rxd") for p in ports]
        take_dac = Signal()
        for i, p in enumerate(ports):
            for pend, strobe, take in ((pend_lock[i], pin(p, "tune_locked"), take_lock[i]),
                                       (pend_txd[i], pin(p, "tx_done"), take_txd[i]),
                                       (pend_rxd[i], pin(p, "rx_done"), take_rxd[i])):
                with m.If(strobe):
                    m.d.sync += pend.eq(1)
                with m.Elif(take):
                    m.d.sync += pend.eq(0)
            with m.If(pin(p, "rx_done")):
                m.d.sync += [v.eq(pin(p, f"rx_{k}")) for k, v in rx_l[i].items()]
        with m.If(self.dac_valid):
            m.d.sync += [pend_dac.eq(1), dac_idx.eq(self.dac_index)]
        with m.Elif(take_dac):
            m.d.sync += pend_dac.eq(0)

        # ---- requests the executor raises; the port blocks below carry them out ----
        irq_set = Signal(32)
        irq_clr = Signal(32)
        err_clr = Signal(32)
        do_tune = [Signal(name=f"{p}_do_tune") for p in ports]
        tune_arg = [Signal(32, name=f"{p}_tune_arg") for p in ports]
        then_start = [Signal(name=f"{p}_then_start") for p in ports]
        do_start = [Signal(name=f"{p}_do_start") for p in ports]
        irq_terms: list[object] = []
        err_terms: list[object] = []

        def flag(err_bit: int, cond: object) -> None:
            err_terms.append(Mux(cond, 1 << err_bit, 0))
            irq_terms.append(Mux(cond, 1 << R.IRQ_BITS["ERROR"], 0))

        # each request is judged the cycle after it is raised (timing: decoding an action,
        # a command or a write, and then checking and taking a tune, are two cycles' work).
        # Requests keep their order; the one raiser that reads what a request does, an
        # action's start after its tune, counts a tune taken but not yet in force.
        q_tune = [Signal(name=f"{p}_q_tune") for p in ports]
        q_bad = [Signal(name=f"{p}_q_bad") for p in ports]
        q_ch = [Signal(8, name=f"{p}_q_ch") for p in ports]
        q_then = [Signal(name=f"{p}_q_then") for p in ports]
        q_start = [Signal(name=f"{p}_q_start") for p in ports]
        taken = [Signal(name=f"{p}_tune_taken") for p in ports]
        for i, p in enumerate(ports):
            P = R.PORTS[i]
            m.d.sync += [q_tune[i].eq(do_tune[i]), q_ch[i].eq(tune_arg[i]),
                         q_bad[i].eq(~self.ports_present[i] | (tune_arg[i] >= self.n_channels)),
                         q_then[i].eq(then_start[i]), q_start[i].eq(do_start[i])]
            m.d.comb += taken[i].eq(q_tune[i] & ~q_bad[i] & ~sending[i])
            flag(R.ERROR_BITS["BAD_CHANNEL"], q_tune[i] & q_bad[i])
            flag(R.ERROR_BITS[f"TX_REFUSED_{P}"], q_tune[i] & ~q_bad[i] & sending[i])
            m.d.sync += [pin(p, "tune_valid").eq(taken[i]), pin(p, "tx_valid").eq(0)]
            with m.If(taken[i]):
                m.d.sync += [tuning[i].eq(1), tuned[i].eq(0), channel[i].eq(0),
                             req_ch[i].eq(q_ch[i]), tune_from[i].eq(self.ts_ns),
                             pin(p, "tune_channel").eq(q_ch[i])]
            with m.If(q_then[i] & (taken[i] | tuning[i])):
                m.d.sync += after_tune[i].eq(1)
            # a start: refused while tuning, sending or dark; a header naming no node misses
            hdr = [rw[f"TX{P}_HDR{k}"] for k in range(N_HDR)]
            dst = rw[f"TX{P}_DST"]
            refused = q_start[i] & (tuning[i] | sending[i] | ~tuned[i])
            miss = q_start[i] & ~refused & ((dst >= self.n_nodes) | (hdr[1] >= self.n_nodes))
            go = q_start[i] & ~refused & ~miss
            flag(R.ERROR_BITS[f"TX_REFUSED_{P}"], refused)
            flag(R.ERROR_BITS["ROUTE_MISS"], miss)
            with m.If(go):
                m.d.sync += [sending[i].eq(1), inflight[i].eq(rw[f"TX{P}_BYTES"]),
                             pin(p, "tx_valid").eq(1), pin(p, "tx_dst").eq(dst),
                             pin(p, "tx_bytes").eq(rw[f"TX{P}_BYTES"]),
                             pin(p, "tx_flow").eq(rw[f"TX{P}_FLOW"]),
                             pin(p, "tx_hdr").eq(Cat(*hdr))]

        # ---- the count-action match: which modules take the current event ----------
        # (timing: the slots' comparators are judged as the event is taken from its queue,
        # into `hits`; a scan cycle then only masks them with the modules armed now, takes
        # the first, and fires it if its count, summed beside every module's in parallel,
        # reaches the target: one carry chain deep, not a compare, a 16-way mux and an add)
        ev_val = Signal(32)  # the value of the event at hand, taken with it

        def slot_hits(word: Any) -> Any:
            """Which modules have a slot that takes event `word` (armed or not)."""
            sig, idx = _ev(word, "sig"), _ev(word, "idx")
            has_src, src1 = _ev(word, "has_src"), _ev(word, "src") + 1  # (filter: src + 1)
            out = []
            for i in range(nm):
                hits = []
                for k in range(ns):
                    w = ca_src[i][k]
                    idx_ok = (w[8:16] == idx) | ((sig == SIG["delivered"])
                                                 & (w[8:16] == ANY_PORT))
                    filt = w[16:32]
                    hits.append((w[0:8] == sig) & idx_ok
                                & ((filt == 0) | (has_src & (filt == src1))))
                out.append(Cat(*hits).any())
            return Cat(*out)

        # of the event at hand, judged when it was taken: the modules after the one the
        # scan has come to (cleared up to it as it goes, not counted from a pointer)
        hits = Signal(nm)
        pending_mods = Signal(nm)
        m.d.comb += pending_mods.eq(hits & Cat(*(ca_ctrl[i][0] for i in range(nm))))
        first_hot = Signal(nm)  # the first of them, one-hot
        m.d.comb += first_hot.eq(pending_mods & (~pending_mods + 1))
        past_first = Signal(nm)  # the modules after the first
        m.d.comb += past_first.eq(~((first_hot << 1) - 1))
        first = Signal(range(nm))
        for i in reversed(range(nm)):
            with m.If(pending_mods[i]):
                m.d.comb += first.eq(i)
        cur, slot = Signal(range(nm)), Signal(range(ns + 1))
        cur_hot = Signal(nm)  # the firing module, one-hot: each module updates itself

        def clear(t: Any) -> list[Any]:  # a module's RESET: count, fired and fire count
            return [ca_count[t].eq(0), ca_fired[t].eq(0), ca_nfire[t].eq(0)]
        # the slot the firing module runs this cycle: read from the slots' memory, its
        # address given the cycle before (a 128-way mux ahead of the action's decode had
        # made the engine's longest path)
        act_word = acts_rd.data
        a, idx, arg = act_word[0:8], act_word[8:16], act_word[16:32]
        fires = Signal(range(FIRE_LIMIT + 1))
        new_count = [Signal(32, name=f"ca{i}_next") for i in range(nm)]
        reaches = Signal(nm)  # each module's count, with the event's value, at its target
        for i in range(nm):
            m.d.comb += [new_count[i].eq(ca_count[i] + ev_val),
                         reaches[i].eq((new_count[i] >= ca_target[i]) & (ca_target[i] != 0))]
        fire_now = Signal()
        m.d.comb += fire_now.eq((first_hot & reaches).any())

        def count_first() -> list[Any]:
            """The first pending module takes the event's value."""
            return [ca_count[i].eq(Mux(first_hot[i], new_count[i], ca_count[i]))
                    for i in range(nm)]

        # ---- the bus ---------------------------------------------------------------
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

        # ---- the executor ------------------------------------------------------------
        busy = Signal()
        m.d.comb += busy.eq(events.r_rdy | Cat(*pend_lock, *pend_txd, *pend_rxd).any()
                            | pend_dac | Cat(*q_tune, *q_start).any())
        m.d.sync += [self.stream_valid.eq(0), self.fired.eq(0)]
        ca_wait = Const(0)  # an engine's start waits: the one before it is not yet taken
        if self.unit_port:
            ca_wait = self._ca_submit(m, rw, flag)

        def push(sig: int, idx: Any, val: Any, src: Any = None) -> list[Any]:
            def wide(v: Any, n: int) -> Any:  # each field at its own width, zero-extended
                return Cat(v, Const(0, n - len(v))) if len(v) < n else v[:n]
            parts = {"sig": Const(sig, 3), "idx": idx, "val": val,
                     "has_src": Const(src is not None, 1),
                     "src": src if src is not None else Const(0, 1)}
            word = Cat(*(wide(parts[f], w) for f, w in _EV_LAYOUT))
            return [events.w_en.eq(1), events.w_data.eq(word)]

        cmd_p, cmd_t = Signal(), Signal()  # the control unit's command, as taken
        with m.FSM(name="executor") as fsm:
            # the work at hand, first come first in this order, picked one-hot (timing: as
            # an if-else chain, the pick and the next state were one long path)
            work = [events.r_rdy, *pend_lock, *pend_txd, *pend_rxd, pend_dac,
                    *([self.cmd_valid] if self.unit_port else []),
                    self.s_axi_awvalid & self.s_axi_wvalid, self.s_axi_arvalid]
            req, pick = Signal(len(work)), Signal(len(work))
            m.d.comb += [req.eq(Cat(*work)), pick.eq(req & (~req + 1))]
            picks = iter(pick)
            with m.State("IDLE"):
                with m.If(~events.r_rdy):
                    m.d.sync += fires.eq(0)
                with m.If(next(picks)):
                    m.d.comb += events.r_en.eq(1)
                    m.d.sync += [ev_val.eq(_ev(events.r_data, "val")),
                                 hits.eq(slot_hits(events.r_data))]
                    m.next = "SCAN"
                for i in range(np_):
                    with m.If(next(picks)):
                        m.d.comb += take_lock[i].eq(1)
                        m.next = f"LOCKED_{i}"
                for i in range(np_):
                    with m.If(next(picks)):
                        m.d.comb += take_txd[i].eq(1)
                        m.next = f"TXDONE_{i}"
                for i in range(np_):
                    with m.If(next(picks)):
                        m.d.comb += take_rxd[i].eq(1)
                        m.next = f"RXDONE_{i}"
                with m.If(next(picks)):
                    m.d.comb += take_dac.eq(1)
                    m.d.comb += push(SIG["dac_valid"], dac_idx, Const(1, 32))
                if self.unit_port:  # the control unit's transfer: as the host's writes
                    with m.If(next(picks)):
                        m.d.comb += self.cmd_ready.eq(1)
                        m.d.sync += [cmd_p.eq(self.cmd_port), cmd_t.eq(self.cmd_tune)]
                        for i, P in enumerate(R.PORTS):
                            with m.If(self.cmd_port == i):
                                m.d.sync += [rw[f"TX{P}_DST"].eq(self.cmd_dst),
                                             rw[f"TX{P}_BYTES"].eq(self.cmd_bytes),
                                             rw[f"TX{P}_FLOW"].eq(self.cmd_flow),
                                             *[rw[f"TX{P}_HDR{k}"].eq(
                                                 self.cmd_hdr[32 * k: 32 * k + 32])
                                               for k in range(N_HDR)]]
                                with m.If(self.cmd_tune):
                                    m.d.sync += rw[f"TX{P}_CHANNEL"].eq(self.cmd_channel)
                        m.next = "COMMAND"
                with m.If(next(picks)):
                    m.d.comb += [self.s_axi_awready.eq(1), self.s_axi_wready.eq(1)]
                    m.d.sync += [waddr.eq(self.s_axi_awaddr & ~3), wdata.eq(self.s_axi_wdata),
                                 wstrb.eq(self.s_axi_wstrb)]
                    m.next = "WRITE"
                with m.If(next(picks)):
                    m.d.comb += self.s_axi_arready.eq(1)
                    m.d.sync += raddr.eq(self.s_axi_araddr & ~3)
                    m.next = "READ"

            if self.unit_port:
                with m.State("COMMAND"):  # its registers loaded: tune then start, or start
                    for i, P in enumerate(R.PORTS):
                        with m.If(cmd_p == i):
                            with m.If(cmd_t):
                                m.d.comb += [do_tune[i].eq(1),
                                             tune_arg[i].eq(rw[f"TX{P}_CHANNEL"]),
                                             then_start[i].eq(1)]
                            with m.Else():
                                m.d.comb += do_start[i].eq(1)
                    m.next = "IDLE"

            for i in range(np_):
                with m.State(f"LOCKED_{i}"):
                    m.d.sync += [tuning[i].eq(0), tuned[i].eq(1), channel[i].eq(req_ch[i]),
                                 tune_ns[i].eq(self.ts_ns - tune_from[i])]
                    irq_terms.append(Mux(fsm.ongoing(f"LOCKED_{i}"),
                                         1 << R.IRQ_BITS[f"TUNED_{R.PORTS[i]}"], 0))
                    m.next = "IDLE"
                    with m.If(after_tune[i]):
                        m.next = f"THEN_START_{i}"
                with m.State(f"THEN_START_{i}"):  # the lock has taken effect: the start goes
                    m.d.sync += after_tune[i].eq(0)
                    m.d.comb += do_start[i].eq(1)
                    m.next = "IDLE"
                with m.State(f"TXDONE_{i}"):
                    m.d.sync += [tx_done_count[i].eq(tx_done_count[i] + 1),
                                 tx_sent[i].eq(tx_sent[i] + inflight[i]), sending[i].eq(0)]
                    irq_terms.append(Mux(fsm.ongoing(f"TXDONE_{i}"),
                                         1 << R.IRQ_BITS[f"TX_DONE_{R.PORTS[i]}"], 0))
                    m.d.comb += push(SIG["tx_done"], Const(i, 8), Const(1, 32))
                    m.next = "IDLE"
                with m.State(f"RXDONE_{i}"):
                    rl = rx_l[i]
                    m.d.sync += [rx_bytes[i].eq(rx_bytes[i] + rl["bytes"]),
                                 rx_keep["SRC"][i].eq(rl["src"]),
                                 rx_keep["LAST_FLOW"][i].eq(rl["flow"]),
                                 rx_keep["DST"][i].eq(rl["dst"]),
                                 rx_keep["LAST_BYTES"][i].eq(rl["bytes"]),
                                 rx_keep["DONE_COUNT"][i].eq(rx_keep["DONE_COUNT"][i] + 1),
                                 *[rx_hdr[i][k].eq(rl["hdr"][32 * k: 32 * k + 32])
                                   for k in range(N_HDR)]]
                    with m.If(rl["crc_error"]):
                        m.d.sync += rx_keep["ERRORS"][i].eq(rx_keep["ERRORS"][i] + 1)
                    irq_terms.append(Mux(fsm.ongoing(f"RXDONE_{i}"),
                                         1 << R.IRQ_BITS[f"RX_DONE_{R.PORTS[i]}"], 0))
                    m.d.comb += push(SIG["rx_bytes"], Const(i, 8), rl["bytes"], rl["src"])
                    m.next = f"RXDONE2_{i}"
                with m.State(f"RXDONE2_{i}"):
                    m.d.comb += push(SIG["rx_transfers"], Const(i, 8), Const(1, 32),
                                     rx_l[i]["src"])
                    m.next = f"RXDONE3_{i}"
                with m.State(f"RXDONE3_{i}"):
                    node = Mux(node_id_set, node_id, self.node_id)
                    with m.If(rx_l[i]["dst"] == node):  # the final leg: this node's step
                        m.d.comb += push(SIG["delivered"], Const(ANY_PORT, 8), rx_l[i]["bytes"],
                                         rx_l[i]["hdr"][32 * 2 + 8: 32 * 3])
                    m.next = "IDLE"

            with m.State("SCAN"):
                flag(R.ERROR_BITS["CA_LOOP"], fsm.ongoing("SCAN") & fire_now
                     & (fires == FIRE_LIMIT))
                with m.If(~pending_mods.any()):
                    m.next = "IDLE"
                with m.Elif(fire_now):
                    m.d.sync += [*count_first(), cur.eq(first), cur_hot.eq(first_hot),
                                 hits.eq(hits & past_first)]
                    with m.If(fires == FIRE_LIMIT):  # a loop: cut it, drop what it queued
                        m.next = "FLUSH"
                    with m.Else():
                        m.next = "FIRE"
                with m.Else():
                    m.d.sync += [*count_first(), hits.eq(hits & past_first)]
            with m.State("FLUSH"):
                m.d.comb += events.r_en.eq(1)
                with m.If(~events.r_rdy):
                    m.next = "IDLE"
            with m.State("FIRE"):
                m.d.sync += [self.fired.eq(1), fires.eq(fires + 1), slot.eq(0)]
                m.d.comb += acts_rd.addr.eq(Cat(Const(0, 3), Const(1, 1), cur))
                # each module updates itself, beside its registers (a count and a target
                # taken through 16-way multiplexers to one subtractor, and back, had tied
                # every module's to one spot of the die: routing congestion)
                for i in range(nm):
                    with m.If(cur_hot[i]):
                        m.d.sync += [ca_fired[i].eq(1), ca_nfire[i].eq(ca_nfire[i] + 1)]
                        with m.If(ca_ctrl[i][1]):  # auto re-arm: keep counting past it
                            m.d.sync += ca_count[i].eq(ca_count[i] - ca_target[i])
                        with m.Else():
                            m.d.sync += ca_ctrl[i].eq(ca_ctrl[i] & 2)
                irq_terms.append(Mux(fsm.ongoing("FIRE"),
                                     Const(1 << R.IRQ_MODULE_SHIFT, 32) << cur, 0))
                m.d.comb += push(SIG["fired"], cur, Const(1, 32))
                m.next = "ACT"
            with m.State("ACT"):
                irq_terms.append(Mux(fsm.ongoing("ACT") & (slot != ns) & (a == ACT["irq"]),
                                     1 << R.IRQ_BITS["CA_FIRED"], 0))
                with m.If(slot == ns):
                    m.next = "SCAN"
                with m.Elif(ca_wait & (a == ACT["start"])):  # the same slot next cycle
                    m.d.comb += acts_rd.addr.eq(Cat(slot[:3], Const(1, 1), cur))
                with m.Else():
                    m.d.sync += slot.eq(slot + 1)
                    m.d.comb += acts_rd.addr.eq(Cat((slot + 1)[:3], Const(1, 1), cur))
                    with m.Switch(a):
                        with m.Case(ACT["tune"]):
                            for i, P in enumerate(R.PORTS):
                                with m.If(idx == i):
                                    m.d.sync += rw[f"TX{P}_CHANNEL"].eq(arg)
                                    if not self.unit_port:  # (else the unit tunes)
                                        m.d.comb += [do_tune[i].eq(1), tune_arg[i].eq(arg)]
                        with m.Case(ACT["start"]):
                            if self.unit_port:  # the loaded transfer goes to the unit
                                with m.If(idx < np_):
                                    m.d.sync += [self.ca_submit_valid.eq(1),
                                                 self.ca_submit_port.eq(idx[0])]
                            else:
                                for i in range(np_):
                                    with m.If(idx == i):
                                        with m.If(tuning[i] | taken[i]):  # once locked
                                            m.d.sync += after_tune[i].eq(1)
                                        with m.Else():
                                            m.d.comb += do_start[i].eq(1)
                        with m.Case(ACT["stream"]):
                            m.d.sync += [self.stream_valid.eq(1), self.stream_dac.eq(idx)]
                        with m.Case(ACT["arm"]), m.If(idx < nm):
                            m.d.sync += ca_ctrl[idx[:4]].eq(ca_ctrl[idx[:4]] | 1)
                        with m.Case(ACT["reset"]), m.If(idx < nm):
                            m.d.sync += clear(idx[:4])

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
            with m.State("RRESP"):
                m.d.comb += self.s_axi_rvalid.eq(1)
                with m.If(self.s_axi_rready):
                    m.next = "IDLE"

        # ---- flags and the interrupt line ------------------------------------------
        def any_of(terms: list[Any]) -> Any:
            out: Any = Const(0, 32)
            for t in terms:
                out = out | t
            return out

        if self.unit_port:
            irq_terms.append(self.irq_raise)
            m.d.comb += self.node.eq(Mux(node_id_set, node_id, self.node_id))
        m.d.comb += irq_set.eq(any_of(irq_terms))
        m.d.sync += irq_status.eq((irq_status & ~irq_clr) | irq_set)
        m.d.sync += error.eq((error & ~err_clr) | any_of(err_terms))
        module_bits = ((1 << nm) - 1) << R.IRQ_MODULE_SHIFT
        m.d.comb += self.irq.eq((irq_status & (rw["IRQ_ENABLE"] | module_bits)).any())
        m.d.comb += self.busy.eq(busy | ~fsm.ongoing("IDLE") | (
            self.ca_submit_valid if self.unit_port else 0))
        m.d.comb += self.strobe.eq(Cat(self.stream_valid, self.fired,
                                       *(pin(p, k) for p in ports
                                         for k in ("tune_valid", "tx_valid"))).any())
        return m

