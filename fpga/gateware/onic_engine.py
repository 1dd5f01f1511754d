"""The count-action engine's parts of `onic_ctrl` (fpga/gateware/onic_ctrl.py): its
event words, the match of an event against the modules' slots, and the executor's
states that scan, fire and run a module's actions. The semantics are onic_ctrl's
(its docstring); `OnicCtrl` is built of these parts and the bus's."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from oddl.fpga import regmap as R
from oddl.fpga.countaction import ACTIONS, SIGNALS

FIRE_LIMIT = R.CA_FIRE_LIMIT
# queued count-action events: a datapath event queues at most 3, each firing 1
EVENT_DEPTH = FIRE_LIMIT + 4
ANY_PORT = len(R.PORTS)  # index code of rx[any]
# the engine's codes, as fpga/countaction.py compiles them
SIG = {"rx_bytes": SIGNALS["rx", "bytes"], "rx_transfers": SIGNALS["rx", "transfers"],
       "tx_done": SIGNALS["tx", "done"], "dac_valid": SIGNALS["DAC", "valid"],
       "fired": SIGNALS["module", "fired"], "delivered": SIGNALS["rx", "delivered"]}
ACT = ACTIONS
# event entry: sig (3) | index (8) | value (32) | has_src (1) | src (24)
# a queued event's word: its fields and widths, in order
EV_LAYOUT = (("sig", 3), ("idx", 8), ("val", 32), ("has_src", 1), ("src", 24))
EV_WIDTH = sum(w for _, w in EV_LAYOUT)
# a port's transfer registers as onic_top's engine hands them over, in order
HANDOVER_WORDS = ("DST", "BYTES", "FLOW", *(f"HDR{k}" for k in range(len(R.HEADER))))
# each port's first: they follow it a word apart, so a handover reads on by adding 4
HANDOVER_FROM = tuple(R.BY_NAME[f"TX{P}_{HANDOVER_WORDS[0]}"].offset for P in R.PORTS)
assert all(R.BY_NAME[f"TX{P}_{n}"].offset == HANDOVER_FROM[i] + 4 * k
           for i, P in enumerate(R.PORTS) for k, n in enumerate(HANDOVER_WORDS))


def ev_field(word: Any, name: str) -> Any:
    """Field `name` of an event word (`EV_LAYOUT`)."""
    at = 0
    for f, w in EV_LAYOUT:
        if f == name:
            return word[at: at + w]
        at += w
    raise KeyError(name)


class EngineParts(wiring.Component):
    """The engine's part of `OnicCtrl.elaborate` (`net`: the nets the parts share)."""

    def _match(self, m: Module, net: SimpleNamespace) -> None:
        """The count-action match: which modules take the event at hand, the first of
        them, and whether its count reaches its target."""
        acts_rd, ca_count, ca_ctrl, ca_fired = net.acts_rd, net.ca_count, net.ca_ctrl, net.ca_fired
        ca_nfire, ca_src, ca_target, nm = net.ca_nfire, net.ca_src, net.ca_target, net.nm
        ns = net.ns

        # (timing: the slots' comparators are judged as the event is taken from its queue,
        # into `hits`; a scan cycle then only masks them with the modules armed now, takes
        # the first, and fires it if its count, summed beside every module's in parallel,
        # reaches the target: one carry chain deep, not a compare, a 16-way mux and an add)
        ev_val = Signal(32)  # the value of the event at hand, taken with it

        def slot_hits(word: Any) -> Any:
            """Which modules have a slot that takes event `word` (armed or not)."""
            sig, idx = ev_field(word, "sig"), ev_field(word, "idx")
            has_src = ev_field(word, "has_src")
            src1 = ev_field(word, "src") + 1  # (filter: src + 1)
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

        net.a, net.arg, net.clear, net.count_first, net.cur = a, arg, clear, count_first, cur
        net.cur_hot, net.ev_val, net.fire_now, net.fires = cur_hot, ev_val, fire_now, fires
        net.first, net.first_hot, net.hits, net.idx = first, first_hot, hits, idx
        net.past_first, net.pending_mods, net.slot = past_first, pending_mods, slot
        net.slot_hits = slot_hits
        if self.unit_port:
            net.ho = Signal(range(len(HANDOVER_WORDS)))  # the word a handover is at
            net.handing = Signal()  # a handover's reads, not the host's: no answer
            m.d.sync += [self.ca_word_valid.eq(0), self.ca_word_last.eq(0)]

    def _engine_states(self, m: Module, net: SimpleNamespace) -> None:
        """The engine: scan the modules, fire one, run its actions slot by slot."""
        a, acts_rd, after_tune, arg = net.a, net.acts_rd, net.after_tune, net.arg
        ca_count, ca_ctrl, ca_fired = net.ca_count, net.ca_ctrl, net.ca_fired
        ca_nfire, ca_target, clear = net.ca_nfire, net.ca_target, net.clear
        count_first, cur, cur_hot, do_start = net.count_first, net.cur, net.cur_hot, net.do_start
        do_tune, events, fire_now, fires = net.do_tune, net.events, net.fire_now, net.fires
        first, first_hot, flag, fsm, hits = net.first, net.first_hot, net.flag, net.fsm, net.hits
        idx, irq_terms, nm, np_, ns = net.idx, net.irq_terms, net.nm, net.np_, net.ns
        past_first, pending_mods, push, rw = net.past_first, net.pending_mods, net.push, net.rw
        slot, taken, tune_arg, tuning = net.slot, net.taken, net.tune_arg, net.tuning

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
            with m.Else():
                m.d.sync += slot.eq(slot + 1)
                m.d.comb += acts_rd.addr.eq(Cat((slot + 1)[:3], Const(1, 1), cur))
                with m.Switch(a):
                    with m.Case(ACT["tune"]):
                        for i, P in enumerate(R.PORTS):
                            with m.If(idx == i):
                                m.d.sync += rw[f"TX{P}_CHANNEL"].eq(arg)
                                if not self.unit_port:  # (else the unit tunes, as routed)
                                    m.d.comb += [do_tune[i].eq(1), tune_arg[i].eq(arg)]
                    with m.Case(ACT["start"]):
                        if self.unit_port:  # the loaded transfer goes to the unit
                            with m.If(idx < np_):
                                m.d.sync += [self.ca_word_port.eq(idx[0]), net.ho.eq(0),
                                             net.handing.eq(1),
                                             net.raddr.eq(Mux(idx[0], HANDOVER_FROM[1],
                                                                 HANDOVER_FROM[0]))]
                                m.next = "READ"
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
        if self.unit_port:
            self._handover(m, net)

    def _handover(self, m: Module, net: SimpleNamespace) -> None:
        """A `start tx[P]` in onic_top: port P's transfer registers (HANDOVER_WORDS), read
        one by one through the bus's own read multiplexer (READ, READ_DATA, as the host's
        reads) and put out on `ca_word`, for the top's staging register and the unit's
        flow queue; the executor, their one writer, does nothing else meanwhile. Then the
        module's next action. (The whole transfer as one wide word into the queue, and
        then a multiplexer of its own over both ports' registers, had each stopped the
        ECPIX-5 build's router from converging: docs/gateware.md.)"""
        acts_rd, cur, ho, raddr, slot = net.acts_rd, net.cur, net.ho, net.raddr, net.slot
        last = len(HANDOVER_WORDS) - 1
        with m.State("HANDOVER"):  # a word read: out; then the next, or the next action
            m.d.sync += [self.ca_word_valid.eq(1), self.ca_word.eq(net.rdata),
                         self.ca_word_last.eq(ho == last), ho.eq(ho + 1),
                         raddr.eq(raddr + 4)]
            with m.If(ho == last):
                m.d.sync += net.handing.eq(0)
                m.d.comb += acts_rd.addr.eq(Cat(slot[:3], Const(1, 1), cur))  # (its word)
                m.next = "ACT"
            with m.Else():
                m.next = "READ"
