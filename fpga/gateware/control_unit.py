"""`ctrl_unit`, the O-NIC's stage-2 control unit in Amaranth HDL: what
controller/stage2/control_unit.py does, as ODDL built it, beside `onic_ctrl` on the board.

Per port, the transmitter's REQUEST / WAIT / GRANT / RELEASE machine (its flow queue, the
REQUEST time-out and retries, the lease check before it starts) and the receiver's grant
(one sender at a time, a FIFO of waiting REQUESTs, the lease it revokes, the overdue RELEASE,
the delivered keys it remembers to answer repeats). Control messages come and go as one-beat
AXI-Stream frames toward the 100 GbE MAC, in the layout controller/stage2/wire.py derives from
the message structs (`FrameFormat`, passed in: this layer imports no control plane). The host
loads the routes and hands over the flows of its schedule; the unit schedules each by itself,
commanding the transfer engine (`start_*`: tune first or not, then send) and hearing back from
it (`tx_done`, `rx_done`, `rx_receiving`).

One executor handles one event at a time (a completion, a frame, a submitted flow, a timer),
as the Python unit handles one call at a time, and sends what the Python unit sends, in its
order. Timers compare deadlines with the board's `ts_ns` time base, so they count the same
nanoseconds as the Python unit's clock. Where the RTL is bounded and Python is not (the flow
queue, the waiting REQUESTs, the delivered keys, all memories scanned one entry a cycle), the
bounds are parameters (docs/gateware.md says what each costs); a full flow queue fails the
job by name.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, fifo
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from oddl.fpga import regmap as R
from oddl.fpga.frame import BEAT_BITS, FrameFormat, flow_widths
from oddl.fpga.gateware.control_unit_rx import ReceiverStates, ring_slot

STATS = ("requests", "retries", "polls", "grants", "revoked", "waits", "stale_grants",
         "relayed", "releases_overdue", "unexpected_rx", "requests_refused", "stray", "late",
         "bad_frames")
FAILS = {"no_route": 1, "retries": 2, "short": 3, "queue_full": 4}
TIMERS = ("request", "lease", "release")  # per port; timer 3 * port + k
IDLE, REQUESTING, SENDING = 0, 1, 2
# the bounds of a board's build (`oddl gateware synth`): a route per node of the route
# table's 1,024, and 64 flows, waiting REQUESTs and delivered keys a port
BUILD = {"nodes": R.ROUTE_ENTRIES, "txq": 64, "rxq": 64, "done": 64}
_PORT_BITS = 2


def flow_layout(frame: FrameFormat) -> data.StructLayout:
    """A flow as the host hands it over and the unit hands it on (fpga/frame.py's
    FLOW_FIELDS, at the frame's widths; nodes as indices)."""
    return data.StructLayout(dict(flow_widths(frame)))


def _fit(v: Any, width: int) -> Any:
    """`v` at `width` bits: cut, or zero-extended."""
    v = Cat(v)
    return v[:width] if len(v) >= width else Cat(v, Const(0, width - len(v)))


class ControlUnitRTL(ReceiverStates):
    """The unit. Straps: `node_id`, `tag` (the job's, to tell a late message from a stray
    one), the timing (ns) and `max_retries`; `timers_en` is tied high in a shell (the
    co-simulation raises a timer's bit at the model's instant of that timer)."""

    def __init__(self, frame: FrameFormat, ports: int = 2, nodes: int = 4096,
                 txq: int = 64, rxq: int = 64, done: int = 64, per_sender: int = 4) -> None:
        self.frame, self.ports, self.nodes = frame, ports, nodes
        self.txq, self.rxq, self.done, self.per_sender = txq, rxq, done, per_sender
        W = frame.width
        self.FLOW = flow_layout(frame)
        self.REQ = data.StructLayout({k: W(k) for k in (
            "flow", "hop", "src", "channel", "nbytes", "origin", "final", "iteration", "step",
            "t_submit")})
        self.ROUTE = data.StructLayout({"valid": 1, "port": _PORT_BITS, "channel": W("channel"),
                                        "next": W("dst")})
        P, nw, fl = ports, W("src"), self.FLOW.size
        super().__init__({
            "ts_ns": In(64), "node_id": In(nw), "tag": In(16), "halt": In(1),
            "timers_en": In(3 * P),
            "tuning_ns": In(32), "propagation_ns": In(32), "request_timeout_ns": In(32),
            "release_timeout_ns": In(32), "lease_ns": In(32), "max_retries": In(8),
            # the route table: dst node -> port, channel, next hop (written by the host)
            "route_we": In(1), "route_dst": In(nw), "route_valid": In(1),
            "route_port": In(_PORT_BITS), "route_channel": In(W("channel")),
            "route_next": In(nw),
            # the host's flows (a valid/ready handshake)
            "submit_valid": In(1), "submit_ready": Out(1), "submit_flow": In(fl),
            # control frames from and to the MAC (AXI-Stream, one beat a frame)
            "rx_tvalid": In(1), "rx_tready": Out(1), "rx_tdata": In(BEAT_BITS),
            "rx_tlast": In(1),
            "tx_tvalid": Out(1), "tx_tready": In(1), "tx_tdata": Out(BEAT_BITS),
            "tx_tlast": Out(1), "tx_tdest": Out(nw),
            # the transfer engine: a start (tune first, or send on the channel it has), and
            # its reports: sent (per port), received in full, the granted flow's light arriving
            "start_valid": Out(1), "start_port": Out(_PORT_BITS), "start_tune": Out(1),
            "start_channel": Out(W("channel")), "start_flow": Out(fl),
            "tx_done": In(P), "rx_done": In(P), "rx_done_flow": In(32 * P),
            "rx_done_bytes": In(W("nbytes") * P), "rx_receiving": In(P),
            # to the host: a flow delivered here, a failure (code, flow, the peer, bytes)
            "deliver_valid": Out(1), "deliver_flow": Out(fl),
            "fail_valid": Out(1), "fail_code": Out(4), "fail_flow": Out(W("flow")),
            "fail_peer": Out(nw), "fail_bytes": Out(W("nbytes")),
            "stats": Out(32 * len(STATS)), "unexpected": Out(32 * P),
            # the timers, for the co-simulation (armed, when, a strobe when (re)armed)
            "armed": Out(3 * P), "arming": Out(3 * P), "due": Out(64 * 3 * P),
            # each receiver's grant (what its receive path compares the arriving flow with)
            "granted_ok": Out(P), "granted_key": Out((W("flow") + W("hop")) * P),
            # each transmitter's state (IDLE, REQUESTING, SENDING) and queued flows
            "tx_state": Out(2 * P), "tx_queued": Out(16 * P),
            "busy": Out(1),
            "effect": Out(1),  # a frame, start, delivery, failure or arming is out
        })

    def elaborate(self, platform: object) -> Module:
        net = SimpleNamespace()  # the nets each part makes for the parts after it
        m = Module()
        F, P, W = self.frame, self.ports, self.frame.width
        FLOW, REQ, ROUTE = self.FLOW, self.REQ, self.ROUTE
        txq, rxq, dn = self.txq, self.rxq, self.done
        qbits = max((max(txq, rxq, dn)).bit_length(), 1)

        net.F, net.FLOW, net.P, net.REQ, net.ROUTE, net.W, net.dn = F, FLOW, P, REQ, ROUTE, W, dn
        net.qbits, net.rxq, net.txq = qbits, rxq, txq

        self._memories(m, net)
        self._port_state(m, net)
        self._registers(m, net)
        self._executor(m, net)
        self._completions(m, net)
        return m

    def _memories(self, m: Module, net: SimpleNamespace) -> None:
        """The route table, the queues and the delivered keys, per port each in its own
        region of one memory; the frames out."""
        F, FLOW, P, REQ, ROUTE, W, dn = net.F, net.FLOW, net.P, net.REQ, net.ROUTE, net.W, net.dn
        rxq, txq = net.rxq, net.txq

        m.submodules.routes = routes = Memory(shape=ROUTE, depth=self.nodes, init=[])
        m.submodules.txqm = txqm = Memory(shape=FLOW, depth=P * txq, init=[])
        m.submodules.rxqm = rxqm = Memory(shape=REQ, depth=P * rxq, init=[])
        KEY = data.StructLayout({"flow": W("flow"), "hop": W("hop")})
        m.submodules.donem = donem = Memory(shape=KEY, depth=P * dn, init=[])
        # read a cycle after the address (block RAM: on an ECP5 the four fill 21 DP16KDs;
        # read combinationally they took 2,000 LUT RAMs and their read muxes, and the top
        # took 100 minutes to route)
        r_rd, t_rd, q_rd, d_rd = (x.read_port(domain="sync", transparent_for=())
                                  for x in (routes, txqm, rxqm, donem))
        r_wr, t_wr, q_wr, d_wr = (x.write_port() for x in (routes, txqm, rxqm, donem))
        m.d.comb += [r_wr.en.eq(self.route_we), r_wr.addr.eq(self.route_dst),
                     r_wr.data.eq(Cat(self.route_valid, self.route_port, self.route_channel,
                                      self.route_next))]
        # frames out: the executor writes one into a stage, which goes into the queue the
        # cycle after (timing: composing a frame and the queue's level were one path);
        # readable the cycle after that
        m.submodules.out = out = fifo.SyncFIFO(width=BEAT_BITS, depth=4)
        stage, staged = Signal(BEAT_BITS), Signal()
        s_en, s_data = Signal(), Signal(BEAT_BITS)
        # the executor may write a frame: the stage is empty or goes now. Known a cycle
        # ahead, from the stage and the queue's level as they will be (timing again)
        room = Signal(init=1)
        will_stage = s_en | (staged & ~out.w_rdy)
        will_level = out.level + (staged & out.w_rdy) - (out.r_en & out.r_rdy)
        m.d.comb += [out.w_en.eq(staged), out.w_data.eq(stage)]
        m.d.sync += room.eq(~will_stage | (will_level < out.depth))
        with m.If(out.w_rdy):
            m.d.sync += staged.eq(0)
        with m.If(s_en):
            m.d.sync += [staged.eq(1), stage.eq(s_data)]
        dst_at, dst_w = F.common("dst")
        m.d.comb += [self.tx_tvalid.eq(out.r_rdy), self.tx_tdata.eq(out.r_data),
                     self.tx_tlast.eq(1), self.tx_tdest.eq(out.r_data[dst_at:dst_at + dst_w]),
                     out.r_en.eq(self.tx_tready)]

        def pack(kind: str, **v: Any) -> Any:
            """A frame of `kind` with these field values (every field of the message)."""
            fields = F.fields[kind]
            assert set(v) == set(fields), (kind, set(fields) ^ set(v))
            parts, at = [Const(F.version, 8), Const(F.codes[kind], 8)], 16
            for name, (off, width) in sorted(fields.items(), key=lambda kv: kv[1][0]):
                assert off == at
                parts.append(_fit(v[name], width))
                at += width
            return _fit(Cat(*parts), BEAT_BITS)

        def send(kind: str, **v: Any) -> list[Any]:
            return [s_en.eq(1), s_data.eq(pack(kind, **v))]

        net.d_rd, net.d_wr, net.out, net.q_rd, net.q_wr = d_rd, d_wr, out, q_rd, q_wr
        net.r_rd, net.r_wr, net.room, net.send, net.staged = r_rd, r_wr, room, send, staged
        net.t_rd, net.t_wr = t_rd, t_wr

    def _port_state(self, m: Module, net: SimpleNamespace) -> None:
        """Each transmitter's and receiver's state, and the timers."""
        FLOW, P, REQ, ROUTE, W, qbits = net.FLOW, net.P, net.REQ, net.ROUTE, net.W, net.qbits

        def sig(name: str, shape: Any) -> list[Any]:
            return [Signal(shape, name=f"{name}{p}") for p in range(P)]

        tx_state, tx_head = sig("tx_state", 2), sig("tx_head", qbits)
        tx_count = sig("tx_count", qbits + 1)
        tx_cur = [Signal(FLOW, name=f"tx_cur{p}") for p in range(P)]
        tx_route = [Signal(ROUTE, name=f"tx_route{p}") for p in range(P)]
        tx_chan, tx_chan_ok = sig("tx_chan", W("channel")), sig("tx_chan_ok", 1)
        tx_retries, tx_waited = sig("tx_retries", 9), sig("tx_waited", 1)
        granted = [Signal(REQ, name=f"granted{p}") for p in range(P)]
        g_ok, data_done, released = sig("g_ok", 1), sig("data_done", 1), sig("released", 1)
        asked = sig("asked", 1)  # the granted sender asked again during its lease
        q_head, q_count = sig("q_head", qbits), sig("q_count", qbits + 1)
        d_count, d_old = sig("d_count", qbits + 1), sig("d_old", qbits)
        t_on = [Signal(name=f"t_on{i}") for i in range(3 * P)]
        t_due = [Signal(64, name=f"t_due{i}") for i in range(3 * P)]
        rx_pend, rx_pflow = sig("rx_pend", 1), sig("rx_pflow", 32)
        rx_pbytes, tx_pend = sig("rx_pbytes", W("nbytes")), sig("tx_pend", 1)
        stats = {k: Signal(32, name=f"n_{k}") for k in STATS}
        unexpected = sig("unexpected", 32)
        m.d.comb += [self.stats.eq(Cat(*stats.values())), self.unexpected.eq(Cat(*unexpected)),
                     self.armed.eq(Cat(*t_on)), self.due.eq(Cat(*t_due)),
                     self.granted_ok.eq(Cat(*g_ok)), self.tx_state.eq(Cat(*tx_state)),
                     self.tx_queued.eq(Cat(*[_fit(c, 16) for c in tx_count])),
                     self.granted_key.eq(Cat(*[Cat(g.flow, g.hop) for g in granted]))]

        def arm(i: int, when: Any) -> None:
            m.d.sync += [t_on[i].eq(1), t_due[i].eq(when)]
            m.d.comb += self.arming[i].eq(1)

        def count(k: str) -> Any:
            return stats[k].eq(stats[k] + 1)

        net.arm, net.asked, net.count, net.d_count, net.d_old = arm, asked, count, d_count, d_old
        net.data_done, net.g_ok, net.granted, net.q_count = data_done, g_ok, granted, q_count
        net.q_head, net.released, net.rx_pbytes, net.rx_pend = q_head, released, rx_pbytes, rx_pend
        net.rx_pflow, net.stats, net.t_due, net.t_on = rx_pflow, stats, t_due, t_on
        net.tx_chan, net.tx_chan_ok, net.tx_count = tx_chan, tx_chan_ok, tx_count
        net.tx_cur, net.tx_head, net.tx_pend, net.tx_retries = tx_cur, tx_head, tx_pend, tx_retries
        net.tx_route, net.tx_state, net.tx_waited = tx_route, tx_state, tx_waited
        net.unexpected = unexpected

    def _registers(self, m: Module, net: SimpleNamespace) -> None:
        """The executor's working registers, and what its states share."""
        F, FLOW, P, REQ, count, qbits = net.F, net.FLOW, net.P, net.REQ, net.count, net.qbits
        t_due, t_on = net.t_due, net.t_on

        ev = Signal(_PORT_BITS)  # the port of the event at hand
        frame = Signal(BEAT_BITS)
        q = Signal(REQ)  # the REQUEST at hand (received, or the next waiting one)
        fin = Signal(REQ)  # the granted REQUEST whose transfer has just arrived in full
        fl = Signal(FLOW)  # the flow at hand (submitted, or relayed)
        after_free = Signal()  # a FREE from a completion: its delivery or relay follows
        scan_i = Signal(qbits + 1)
        found, inq = Signal(), Signal()
        from_src = Signal(qbits + 1)
        over = Signal()  # the REQUEST at hand would pass a queue's bound
        scan_ret = Signal(2)  # a scan of the delivered keys for: 0 REQUEST, 1 next, 2 completion
        scan_vld = Signal()  # a scan's entry read last cycle: its data is here to compare
        g_late = Signal(2)  # the GRANT at hand expires before its light: [0] tuned, [1] not
        g_same = Signal(P)  # the port is on the GRANT's channel already
        g_hit = Signal(P)  # the GRANT answers this port's REQUEST
        # a timer is compared with the time a cycle before it is taken (timing: the 64-bit
        # compare and the executor's next state were one path), and not in the cycle it is
        # armed, whose compare saw its old due time
        past, past_q = Signal(3 * P), Signal(3 * P)
        due_now = Signal(3 * P)
        m.d.comb += [past.eq(Cat(*[t_on[i] & (self.ts_ns >= t_due[i]) & self.timers_en[i]
                                   for i in range(3 * P)])),
                     due_now.eq(Cat(*[t_on[i] & past_q[i] & self.timers_en[i]
                                      for i in range(3 * P)]))]
        m.d.sync += past_q.eq(past & ~self.arming)

        def field(kind: str, name: str) -> Any:
            off, width = F.fields[kind][name]
            return frame[off:off + width]

        def per(fn: Any) -> None:
            """`fn(p)` for the port of the event at hand."""
            for p in range(P):
                with m.If(ev == p):
                    fn(p)

        def fail(code: str, flow: Any, peer: Any = 0, nbytes: Any = 0) -> list[Any]:
            return [self.fail_valid.eq(1), self.fail_code.eq(FAILS[code]), self.fail_flow.eq(flow),
                    self.fail_peer.eq(peer), self.fail_bytes.eq(nbytes)]

        ver = frame[:8]
        tat, tw = F.type_bits
        code = frame[tat:tat + tw]
        port_at, port_w = F.common("port")
        fport = frame[port_at:port_at + port_w]

        def back() -> None:
            """The end of a FREE's next grant: the completion that freed goes on, or idle."""
            with m.If(after_free):
                m.next = "RXD_TAIL"
            with m.Else():
                m.next = "IDLE"

        def stray(kind: str) -> None:
            with m.If((field(kind, "flow") >> F.tag_shift) != self.tag):
                m.d.sync += count("late")
            with m.Else():
                m.d.sync += count("stray")
            m.next = "IDLE"

        net.after_free, net.back, net.code, net.due_now = after_free, back, code, due_now
        net.ev, net.fail, net.field, net.fin, net.fl, net.found = ev, fail, field, fin, fl, found
        net.fport, net.frame, net.from_src, net.g_hit = fport, frame, from_src, g_hit
        net.g_late, net.g_same, net.inq, net.over, net.past = g_late, g_same, inq, over, past
        net.per, net.q, net.scan_i, net.scan_ret, net.scan_vld = per, q, scan_i, scan_ret, scan_vld
        net.stray, net.ver = stray, ver

    def _executor(self, m: Module, net: SimpleNamespace) -> None:
        """The executor, one state machine: out of reset it clears the route table."""
        r_wr = net.r_wr

        clearing = Signal(range(self.nodes))
        with m.FSM(name="exec", init="CLEAR") as fsm:
            with m.State("CLEAR"):  # out of reset: no route is left from before it
                m.d.comb += [r_wr.en.eq(1), r_wr.addr.eq(clearing), r_wr.data.eq(0)]
                m.d.sync += clearing.eq(clearing + 1)
                with m.If(clearing == self.nodes - 1):
                    m.next = "IDLE"
            net.fsm = fsm
            self._idle(m, net)
            self._sending(m, net)
            self._frames(m, net)
            self._requests(m, net)
            self._grants(m, net)
            self._received(m, net)

    def _idle(self, m: Module, net: SimpleNamespace) -> None:
        """Take the work at hand: a completion, a timer, a frame, a flow handed over."""
        P, due_now, ev, fl, frame = net.P, net.due_now, net.ev, net.fl, net.frame
        rx_pend, t_on, tx_pend = net.rx_pend, net.t_on, net.tx_pend

        with m.State("IDLE"):
            with m.If(self.halt):  # the job is over here: everything is dropped, its
                # timers too (as the Python unit's halt cancels them)
                m.d.comb += [self.rx_tready.eq(1), self.submit_ready.eq(1)]
                m.d.sync += [x.eq(0) for x in (*rx_pend, *tx_pend, *t_on)]
            with m.Elif(Cat(*rx_pend).any()):
                for p in reversed(range(P)):
                    with m.If(rx_pend[p]):
                        m.d.sync += ev.eq(p)
                m.next = "RXD"
            with m.Elif(Cat(*tx_pend).any()):
                for p in reversed(range(P)):
                    with m.If(tx_pend[p]):
                        m.d.sync += ev.eq(p)
                m.next = "TXD"
            with m.Elif(self.rx_tvalid):
                m.d.comb += self.rx_tready.eq(1)
                m.d.sync += frame.eq(self.rx_tdata)
                m.next = "DECODE"
            with m.Elif(self.submit_valid):
                m.d.comb += self.submit_ready.eq(1)
                m.d.sync += fl.eq(self.submit_flow)
                m.next = "SUB_ROUTE"
            with m.Elif(due_now.any()):
                for i in reversed(range(3 * P)):
                    with m.If(due_now[i]):
                        m.d.sync += [ev.eq(i // 3), t_on[i].eq(0)]
                        m.next = ("TMR_REQUEST", "TMR_LEASE", "TMR_RELEASE")[i % 3]

    def _sending(self, m: Module, net: SimpleNamespace) -> None:
        """A flow to send: routed, queued, asked for, timed out, sent."""
        arm, count, ev, fail, fl, per = net.arm, net.count, net.ev, net.fail, net.fl, net.per
        r_rd, room, send, stats, t_rd = net.r_rd, net.room, net.send, net.stats, net.t_rd
        t_wr, tx_count, tx_cur, tx_head = net.t_wr, net.tx_count, net.tx_cur, net.tx_head
        tx_pend, tx_retries, tx_route = net.tx_pend, net.tx_retries, net.tx_route
        tx_state, tx_waited, txq = net.tx_state, net.tx_waited, net.txq

        # --- a flow to send: its route, its transmitter's queue ----------------------
        with m.State("SUB_ROUTE"):  # (its route is read)
            m.d.comb += r_rd.addr.eq(fl.dst)
            m.next = "SUB_ROUTED"
        with m.State("SUB_ROUTED"):
            with m.If(~r_rd.data.valid):
                m.d.comb += fail("no_route", fl.id, fl.dst)
                m.next = "IDLE"
            with m.Else():
                m.d.sync += ev.eq(r_rd.data.port)
                m.next = "SUB_PUSH"
        with m.State("SUB_PUSH"):
            def push(p: int) -> None:
                with m.If(tx_count[p] == txq):
                    m.d.comb += fail("queue_full", fl.id, fl.dst)
                    m.next = "IDLE"
                with m.Else():
                    at = tx_head[p] + tx_count[p]
                    m.d.comb += [t_wr.en.eq(1), t_wr.data.eq(fl),
                                 t_wr.addr.eq(ring_slot(p, at, txq))]
                    m.d.sync += tx_count[p].eq(tx_count[p] + 1)
                    with m.If(tx_state[p] == IDLE):
                        m.next = "TXN"
                    with m.Else():
                        m.next = "IDLE"
            per(push)

        # --- a transmitter takes its next flow and asks for the receiver ---------------
        with m.State("TXN"):
            def nxt(p: int) -> None:
                with m.If(tx_count[p] == 0):
                    m.d.sync += tx_state[p].eq(IDLE)
                    m.next = "IDLE"
                with m.Else():
                    m.d.comb += t_rd.addr.eq(ring_slot(p, tx_head[p], txq))
                    m.next = "TXN_FLOW"
            per(nxt)
        with m.State("TXN_FLOW"):  # the flow at the queue's head; its route is read
            def took(p: int) -> None:
                m.d.comb += r_rd.addr.eq(t_rd.data.dst)
                m.d.sync += tx_cur[p].eq(t_rd.data)
            per(took)
            m.next = "TXN_ROUTE"
        with m.State("TXN_ROUTE"):
            def routed(p: int) -> None:
                m.d.sync += [tx_route[p].eq(r_rd.data), tx_state[p].eq(REQUESTING),
                             tx_retries[p].eq(0)]
            per(routed)
            m.next = "REQ_SEND"
        with m.State("REQ_SEND"):
            def request(p: int) -> None:
                with m.If(room):
                    c, r = tx_cur[p], tx_route[p]
                    m.d.comb += [*send("request", flow=c.id, hop=c.hop, src=self.node_id,
                                       dst=r.next, port=p, channel=r.channel,
                                       nbytes=c.nbytes, origin=c.src, final=c.dst,
                                       iteration=c.iteration, step=c.step,
                                       t_submit=c.t_submit)]
                    m.d.sync += [count("requests"), tx_waited[p].eq(0)]
                    arm(3 * p, self.ts_ns + self.request_timeout_ns)
                    m.next = "IDLE"
            per(request)
        with m.State("TMR_REQUEST"):
            def timeout(p: int) -> None:
                n = tx_retries[p] + 1
                m.d.sync += [tx_retries[p].eq(n),
                             stats["polls"].eq(stats["polls"] + tx_waited[p]),
                             stats["retries"].eq(stats["retries"] + ~tx_waited[p])]
                with m.If(n > self.max_retries):
                    m.d.comb += fail("retries", tx_cur[p].id, tx_route[p].next,
                                     tx_cur[p].nbytes)
                    m.next = "IDLE"
                with m.Else():
                    m.next = "REQ_SEND"
            per(timeout)
        with m.State("TXD"):  # sent: RELEASE, and the next flow
            def sent(p: int) -> None:
                with m.If(room):
                    c, r = tx_cur[p], tx_route[p]
                    m.d.comb += send("release", flow=c.id, hop=c.hop, src=self.node_id,
                                     dst=r.next, port=p)
                    nh = tx_head[p] + 1
                    m.d.sync += [tx_pend[p].eq(0), tx_count[p].eq(tx_count[p] - 1),
                                 tx_head[p].eq(Mux(nh == txq, 0, nh))]
                    m.next = "TXN"
            per(sent)

    def _frames(self, m: Module, net: SimpleNamespace) -> None:
        """A frame: decoded, and a WAIT, GRANT or RELEASE taken."""
        F, P, REQ, after_free, code = net.F, net.P, net.REQ, net.after_free, net.code
        count, data_done, ev, field, fport = net.count, net.data_done, net.ev, net.field, net.fport
        g_hit, g_late, g_ok, g_same = net.g_hit, net.g_late, net.g_ok, net.g_same
        granted, q, released, stray, t_on = net.granted, net.q, net.released, net.stray, net.t_on
        tx_chan, tx_chan_ok, tx_cur = net.tx_chan, net.tx_chan_ok, net.tx_cur
        tx_retries, tx_state, tx_waited, ver = net.tx_retries, net.tx_state, net.tx_waited, net.ver

        # --- a frame ------------------------------------------------------------------
        with m.State("DECODE"):
            m.d.sync += ev.eq(fport)
            # a GRANT is judged here, as it arrives, and acted on in GRANTED (timing:
            # the expiry's sum and compare and the sender's next state in one cycle
            # were the design's longest path)
            exp, gch = field("grant", "expires_ns"), field("grant", "channel")
            # ts + tuning + propagation > expires, as expires - ts < tuning +
            # propagation: one 64-bit subtraction shared by both judgements and two
            # short compares, where two three-operand 64-bit sums had been the densest
            # logic of the placement (routing congestion, docs/gateware.md)
            left = Signal(65)  # expires - ts, its sign bit 64: already past
            m.d.comb += left.eq(exp - self.ts_ns)
            far = left[33:64] != 0  # 2**33 ns or more ahead: beyond any two 32-bit sums
            m.d.sync += g_late.eq(Cat(
                left[64] | (~far & (left[:33] < self.tuning_ns + self.propagation_ns)),
                left[64] | (~far & (left[:33] < self.propagation_ns))))
            for p in range(P):
                c = tx_cur[p]
                m.d.sync += [g_same[p].eq(tx_chan_ok[p] & (tx_chan[p] == gch)),
                             g_hit[p].eq((fport == p) & (tx_state[p] == REQUESTING)
                                         & (c.id == field("grant", "flow"))
                                         & (c.hop == field("grant", "hop")))]
            kinds = {F.codes[k]: k for k in F.codes}
            with m.If((ver != F.version) | ~Cat(*[code == c for c in kinds]).any()):
                m.d.sync += count("bad_frames")
                m.next = "IDLE"
            with m.Elif(code == F.codes["request"]):
                m.d.sync += q.eq(Cat(*[field("request", n) for n in REQ.members]))
                with m.If(fport >= P):
                    m.next = "IDLE"  # a port this board does not have: dropped
                with m.Else():
                    m.next = "RQ1"
            with m.Elif(code == F.codes["grant"]):
                m.next = "GRANTED"
            with m.Elif(code == F.codes["release"]):
                m.next = "RELEASED"
            with m.Else():
                m.next = "WAITED"
        with m.State("WAITED"):
            m.next = "IDLE"
            for p in range(P):
                c = tx_cur[p]
                with m.If((fport == p) & (tx_state[p] != IDLE) & (c.id == field("wait", "flow"))
                          & (c.hop == field("wait", "hop"))):
                    m.d.sync += [count("waits"), tx_retries[p].eq(0), tx_waited[p].eq(1)]
        with m.State("GRANTED"):
            ok = Signal()
            m.d.comb += ok.eq(0)
            for p in range(P):
                c = tx_cur[p]
                with m.If(g_hit[p]):
                    m.d.comb += ok.eq(1)
                    ch, same = field("grant", "channel"), g_same[p]
                    with m.If(Mux(same, g_late[1], g_late[0])):
                        m.d.sync += count("stale_grants")
                    with m.Else():
                        m.d.sync += [t_on[3 * p].eq(0), tx_state[p].eq(SENDING),
                                     tx_chan[p].eq(ch), tx_chan_ok[p].eq(1)]
                        m.d.comb += [self.start_valid.eq(1), self.start_port.eq(p),
                                     self.start_tune.eq(~same), self.start_channel.eq(ch),
                                     self.start_flow.eq(c)]
            with m.If(ok):
                m.next = "IDLE"
            with m.Else():
                stray("grant")
        with m.State("RELEASED"):
            ok = Signal()
            m.d.comb += ok.eq(0)
            for p in range(P):
                g = granted[p]
                with m.If((fport == p) & g_ok[p] & (g.flow == field("release", "flow"))
                          & (g.hop == field("release", "hop"))):
                    m.d.comb += ok.eq(1)
                    m.d.sync += released[p].eq(1)
            with m.If(ok):
                m.next = "IDLE"
                for p in range(P):
                    with m.If((fport == p) & data_done[p]):
                        m.d.sync += after_free.eq(0)
                        m.next = "FREE"
            with m.Else():
                stray("release")

    def _completions(self, m: Module, net: SimpleNamespace) -> None:
        """The datapath's completions, latched after the executor's statements (one that
        comes as the executor takes the last is kept), and the co-simulation's outputs."""
        P, W, fsm, out, past, rx_pbytes = net.P, net.W, net.fsm, net.out, net.past, net.rx_pbytes
        rx_pend, rx_pflow, staged, tx_pend = net.rx_pend, net.rx_pflow, net.staged, net.tx_pend

        # completions are latched until the executor takes them (after the executor's
        # statements: one that comes as the executor takes the last is kept, not cleared)
        for p in range(P):
            with m.If(self.rx_done[p]):
                m.d.sync += [rx_pend[p].eq(1), rx_pflow[p].eq(self.rx_done_flow.word_select(p, 32)),
                             rx_pbytes[p].eq(self.rx_done_bytes.word_select(p, W("nbytes")))]
            with m.If(self.tx_done[p]):
                m.d.sync += tx_pend[p].eq(1)
        m.d.comb += self.effect.eq(out.r_rdy | self.start_valid | self.deliver_valid
                                   | self.fail_valid | self.arming.any())
        m.d.comb += self.busy.eq(Cat(*rx_pend, *tx_pend).any() | self.rx_tvalid
                                 | self.submit_valid | past.any() | out.r_rdy | staged
                                 | ~fsm.ongoing("IDLE"))
