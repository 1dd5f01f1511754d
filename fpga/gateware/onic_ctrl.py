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

from types import SimpleNamespace
from typing import Any

from amaranth import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import fifo
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from oddl.fpga import regmap as R
from oddl.fpga.gateware.onic_bus import ADDR_BITS, N_HDR, BusParts
from oddl.fpga.gateware.onic_engine import (
    ANY_PORT,
    EV_LAYOUT,
    EV_WIDTH,
    EVENT_DEPTH,
    SIG,
    EngineParts,
    ev_field,
)


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
                # a count-action `start tx[P]`: port P's transfer, word by word (the
                # engine's HANDOVER_WORDS, each valid one cycle), for the unit's queue;
                # `ca_refused`, a port's handover the queue had no room for (flagged
                # TX_REFUSED_P)
                "ca_word_valid": Out(1), "ca_word": Out(32), "ca_word_last": Out(1),
                "ca_word_port": Out(1), "ca_refused": In(len(R.PORTS))}
    return out


class OnicCtrl(EngineParts, BusParts):
    """The IP. Straps (`node_id`, `n_nodes`, `n_channels`, `ports_present`,
    `bitstream_hash`) come from the shell; `ts_ns` from the board's time base.

    `unit_port`: the ports by which the stage-2 control unit beside it (`onic_top`) drives
    the datapath: a transfer command (`cmd_*`: load a port's transfer and start it, tuning
    first if asked), taken by the executor as a host's register writes are, so that no
    register has two writers; `irq_raise`, flags it sets in IRQ_STATUS; `node`, this node's
    index as NODE_ID says it; `ca_word*`, the engine's starts, which are then the unit's (a
    `start tx[P]` hands port P's loaded transfer over, word by word, for the unit's queue; a
    `tune` only sets TX_CHANNEL: the unit tunes as its route says). `onic_ctrl` alone has
    none of them."""

    def __init__(self, design_version: int = R.DESIGN_VERSION, unit_port: bool = False
                 ) -> None:
        self.design_version = design_version
        self.unit_port = unit_port
        super().__init__(members(unit_port))

    # ---------------------------------------------------------------------------------
    def elaborate(self, platform: object) -> Module:
        net = SimpleNamespace()  # the nets each part makes for the parts after it
        m = Module()
        np_ = len(R.PORTS)
        ports = [p.lower() for p in R.PORTS]

        def pin(p: str, name: str) -> Signal:
            return getattr(self, f"{p}_{name}")

        net.np_, net.pin, net.ports = np_, pin, ports

        self._storage(m, net)
        self._completions(m, net)
        self._requests(m, net)
        self._match(m, net)
        self._bus(m, net)
        self._reads(m, net)
        self._executor(m, net)
        self._flags(m, net)
        return m

    def _storage(self, m: Module, net: SimpleNamespace) -> None:
        """The registers, the transmitters' state, the engine's modules and memories."""
        ports = net.ports

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
        events = fifo.SyncFIFO(width=EV_WIDTH, depth=EVENT_DEPTH)
        m.submodules.events = events

        net.acts_rd, net.after_tune, net.ca_count = acts_rd, after_tune, ca_count
        net.ca_ctrl, net.ca_fired, net.ca_nfire, net.ca_src = ca_ctrl, ca_fired, ca_nfire, ca_src
        net.ca_target, net.channel, net.error, net.events = ca_target, channel, error, events
        net.inflight, net.irq_status, net.nm, net.node_id = inflight, irq_status, nm, node_id
        net.node_id_set, net.ns, net.req_ch, net.route_rd = node_id_set, ns, req_ch, route_rd
        net.route_wr, net.rw, net.rx_bytes, net.rx_hdr = route_wr, rw, rx_bytes, rx_hdr
        net.rx_keep, net.sending, net.slots_rd, net.slots_wr = rx_keep, sending, slots_rd, slots_wr
        net.src_col, net.ts_hi, net.tune_from, net.tune_ns = src_col, ts_hi, tune_from, tune_ns
        net.tuned, net.tuning, net.tx_done_count = tuned, tuning, tx_done_count
        net.tx_sent = tx_sent

    def _completions(self, m: Module, net: SimpleNamespace) -> None:
        """The datapath's completions, latched until the executor takes them."""
        pin, ports = net.pin, net.ports

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

        net.dac_idx, net.pend_dac, net.pend_lock = dac_idx, pend_dac, pend_lock
        net.pend_rxd, net.pend_txd, net.rx_l, net.take_dac = pend_rxd, pend_txd, rx_l, take_dac
        net.take_lock, net.take_rxd, net.take_txd = take_lock, take_rxd, take_txd

    def _requests(self, m: Module, net: SimpleNamespace) -> None:
        """The tuning sequencer and transfer handshake of each port, carrying out the
        requests the executor raises (`do_tune`, `do_start`), judged a cycle later."""
        after_tune, channel, inflight, pin = net.after_tune, net.channel, net.inflight, net.pin
        ports, req_ch, rw, sending = net.ports, net.req_ch, net.rw, net.sending
        tune_from, tuned, tuning = net.tune_from, net.tuned, net.tuning

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

        net.do_start, net.do_tune, net.err_clr = do_start, do_tune, err_clr
        net.err_terms, net.flag, net.irq_clr, net.irq_set = err_terms, flag, irq_clr, irq_set
        net.irq_terms, net.q_start, net.q_tune, net.taken = irq_terms, q_start, q_tune, taken
        net.then_start, net.tune_arg = then_start, tune_arg


    def _executor(self, m: Module, net: SimpleNamespace) -> None:
        """The executor: one thing at a time, so that no register has two writers."""
        events, pend_dac, pend_lock = net.events, net.pend_dac, net.pend_lock
        pend_rxd, pend_txd, q_start, q_tune = net.pend_rxd, net.pend_txd, net.q_start, net.q_tune

        busy = Signal()
        m.d.comb += busy.eq(events.r_rdy | Cat(*pend_lock, *pend_txd, *pend_rxd).any()
                            | pend_dac | Cat(*q_tune, *q_start).any())
        m.d.sync += [self.stream_valid.eq(0), self.fired.eq(0)]

        def push(sig: int, idx: Any, val: Any, src: Any = None) -> list[Any]:
            def wide(v: Any, n: int) -> Any:  # each field at its own width, zero-extended
                return Cat(v, Const(0, n - len(v))) if len(v) < n else v[:n]
            parts = {"sig": Const(sig, 3), "idx": idx, "val": val,
                     "has_src": Const(src is not None, 1),
                     "src": src if src is not None else Const(0, 1)}
            word = Cat(*(wide(parts[f], w) for f, w in EV_LAYOUT))
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
            net.busy, net.cmd_p, net.cmd_t, net.fsm = busy, cmd_p, cmd_t, fsm
            net.picks, net.push = picks, push
            self._idle(m, net)
            self._port_states(m, net)
            self._engine_states(m, net)
            self._write_states(m, net)
            self._read_states(m, net)

    def _idle(self, m: Module, net: SimpleNamespace) -> None:
        """Take the work at hand: an engine event, a completion, a command, a bus access."""
        cmd_p, cmd_t, dac_idx, ev_val = net.cmd_p, net.cmd_t, net.dac_idx, net.ev_val
        events, fires, hits, np_, picks = net.events, net.fires, net.hits, net.np_, net.picks
        push, raddr, rw, slot_hits = net.push, net.raddr, net.rw, net.slot_hits
        take_dac, take_lock, take_rxd = net.take_dac, net.take_lock, net.take_rxd
        take_txd, waddr, wdata, wstrb = net.take_txd, net.waddr, net.wdata, net.wstrb

        with m.State("IDLE"):
            with m.If(~events.r_rdy):
                m.d.sync += fires.eq(0)
            with m.If(next(picks)):
                m.d.comb += events.r_en.eq(1)
                m.d.sync += [ev_val.eq(ev_field(events.r_data, "val")),
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

    def _port_states(self, m: Module, net: SimpleNamespace) -> None:
        """A command's start, a lock, a transfer sent or received, as the registers take them."""
        after_tune, channel, cmd_p, cmd_t = net.after_tune, net.channel, net.cmd_p, net.cmd_t
        do_start, do_tune, fsm, inflight = net.do_start, net.do_tune, net.fsm, net.inflight
        irq_terms, node_id, node_id_set, np_ = net.irq_terms, net.node_id, net.node_id_set, net.np_
        push, req_ch, rw, rx_bytes, rx_hdr = net.push, net.req_ch, net.rw, net.rx_bytes, net.rx_hdr
        rx_keep, rx_l, sending, then_start = net.rx_keep, net.rx_l, net.sending, net.then_start
        tune_arg, tune_from, tune_ns, tuned = net.tune_arg, net.tune_from, net.tune_ns, net.tuned
        tuning, tx_done_count, tx_sent = net.tuning, net.tx_done_count, net.tx_sent

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


    def _flags(self, m: Module, net: SimpleNamespace) -> None:
        """The flags, the interrupt line and the co-simulation's outputs."""
        busy, err_clr, err_terms, error = net.busy, net.err_clr, net.err_terms, net.error
        fsm, irq_clr, irq_set, irq_status = net.fsm, net.irq_clr, net.irq_set, net.irq_status
        irq_terms, nm, node_id, node_id_set = net.irq_terms, net.nm, net.node_id, net.node_id_set
        pin, ports, rw = net.pin, net.ports, net.rw

        def any_of(terms: list[Any]) -> Any:
            out: Any = Const(0, 32)
            for t in terms:
                out = out | t
            return out

        if self.unit_port:
            irq_terms.append(self.irq_raise)
            for i, P in enumerate(R.PORTS):
                net.flag(R.ERROR_BITS[f"TX_REFUSED_{P}"], self.ca_refused[i])
            m.d.comb += self.node.eq(Mux(node_id_set, node_id, self.node_id))
        m.d.comb += irq_set.eq(any_of(irq_terms))
        m.d.sync += irq_status.eq((irq_status & ~irq_clr) | irq_set)
        m.d.sync += error.eq((error & ~err_clr) | any_of(err_terms))
        module_bits = ((1 << nm) - 1) << R.IRQ_MODULE_SHIFT
        m.d.comb += self.irq.eq((irq_status & (rw["IRQ_ENABLE"] | module_bits)).any())
        m.d.comb += self.busy.eq(busy | ~fsm.ongoing("IDLE"))
        m.d.comb += self.strobe.eq(Cat(self.stream_valid, self.fired,
                                       *(pin(p, k) for p in ports
                                         for k in ("tune_valid", "tx_valid"))).any())
