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

from typing import Any

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, fifo, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from oddl.fpga import regmap as R
from oddl.fpga.frame import BEAT_BITS, FrameFormat, flow_widths

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


def _wrap(at: Any, n: int) -> Any:
    """A ring's index `at` (under 2n) brought under n."""
    return Mux(at >= n, at - n, at)


def _slot(p: int, at: Any, n: int) -> Any:
    """The address of entry `at` (under 2n: brought under n) of port `p`'s ring, in a memory
    that holds each port's n entries in turn. For a power-of-two n (the build's bounds) it
    is bits side by side, with no compare, subtract or add: the address of a memory read
    ends a path through the executor's states (timing)."""
    if n & (n - 1):
        return p * n + _wrap(at, n)
    return Cat(Cat(at)[:n.bit_length() - 1], Const(p, max(p.bit_length(), 1)))


def _fit(v: Any, width: int) -> Any:
    """`v` at `width` bits: cut, or zero-extended."""
    v = Cat(v)
    return v[:width] if len(v) >= width else Cat(v, Const(0, width - len(v)))


class ControlUnitRTL(wiring.Component):
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
        m = Module()
        F, P, W = self.frame, self.ports, self.frame.width
        FLOW, REQ, ROUTE = self.FLOW, self.REQ, self.ROUTE
        txq, rxq, dn = self.txq, self.rxq, self.done
        qbits = max((max(txq, rxq, dn)).bit_length(), 1)

        # --- memories: per port, each in its own region of one memory ------------------
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

        # --- per port state -------------------------------------------------------------
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

        # --- the executor's working registers ----------------------------------------------
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

        clearing = Signal(range(self.nodes))
        with m.FSM(name="exec", init="CLEAR") as fsm:
            with m.State("CLEAR"):  # out of reset: no route is left from before it
                m.d.comb += [r_wr.en.eq(1), r_wr.addr.eq(clearing), r_wr.data.eq(0)]
                m.d.sync += clearing.eq(clearing + 1)
                with m.If(clearing == self.nodes - 1):
                    m.next = "IDLE"
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
                                     t_wr.addr.eq(_slot(p, at, txq))]
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
                        m.d.comb += t_rd.addr.eq(_slot(p, tx_head[p], txq))
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

            # --- a REQUEST ----------------------------------------------------------------
            with m.State("RQ1"):
                def rq1(p: int) -> None:
                    g = granted[p]
                    with m.If(g_ok[p] & (g.flow == q.flow) & (g.hop == q.hop)):
                        # granted already: a poll that crossed the GRANT, or a retry after
                        # a lost one; not answered now (the lease check resends a lost one)
                        m.d.sync += asked[p].eq(1)
                        m.next = "IDLE"
                    with m.Else():
                        m.d.sync += [scan_i.eq(0), found.eq(0), scan_ret.eq(0), scan_vld.eq(0)]
                        m.next = "DSCAN"
                per(rq1)
            with m.State("RQ2"):
                with m.If(found):
                    m.next = "IDLE"
                with m.Else():
                    m.d.sync += [scan_i.eq(0), inq.eq(0), from_src.eq(0), scan_vld.eq(0)]
                    m.next = "QSCAN"
            with m.State("QSCAN"):  # is it queued; how many of its sender's are
                def qscan(p: int) -> None:
                    # pipelined: entry scan_i is read while entry scan_i - 1 is compared
                    e, more = q_rd.data, scan_i != q_count[p]
                    m.d.comb += q_rd.addr.eq(_slot(p, q_head[p] + scan_i, rxq))
                    m.d.sync += scan_vld.eq(more)
                    with m.If(more):
                        m.d.sync += scan_i.eq(scan_i + 1)
                    with m.If(scan_vld):
                        with m.If((e.flow == q.flow) & (e.hop == q.hop)):
                            m.d.sync += inq.eq(1)
                        with m.If(e.src == q.src):
                            m.d.sync += from_src.eq(from_src + 1)
                    with m.If(~more & ~scan_vld):  # its bounds judged here, for RQ3 (timing)
                        m.d.sync += over.eq((q_count[p] >= rxq)
                                            | (from_src >= self.per_sender))
                        m.next = "RQ3"
                per(qscan)
            with m.State("RQ3"):
                def rq3(p: int) -> None:
                    n = q_count[p]
                    wait = dict(flow=q.flow, hop=q.hop, src=self.node_id, dst=q.src, port=p)
                    with m.If(inq), m.If(room):
                        m.d.comb += send("wait", **wait, queue_position=n)
                        m.next = "IDLE"
                    with m.Elif(~g_ok[p]):
                        m.d.sync += after_free.eq(0)
                        m.next = "GRANT"
                    with m.Elif(over):
                        m.d.sync += count("requests_refused")
                        m.next = "IDLE"
                    with m.Elif(room):
                        at = q_head[p] + n
                        m.d.comb += [q_wr.en.eq(1), q_wr.data.eq(q),
                                     q_wr.addr.eq(_slot(p, at, rxq)),
                                     *send("wait", **wait, queue_position=n + 1)]
                        m.d.sync += q_count[p].eq(n + 1)
                        m.next = "IDLE"
                per(rq3)
            with m.State("GRANT"):  # q gets the receiver, with a lease
                def grant(p: int) -> None:
                    with m.If(room):
                        expires = Signal(64, name=f"expires{p}")
                        m.d.comb += [expires.eq(self.ts_ns + self.lease_ns),
                                     *send("grant", flow=q.flow, hop=q.hop, src=self.node_id,
                                           dst=q.src, port=p, channel=q.channel,
                                           expires_ns=expires)]
                        m.d.sync += [granted[p].eq(q), g_ok[p].eq(1), data_done[p].eq(0),
                                     released[p].eq(0), asked[p].eq(0), count("grants")]
                        arm(3 * p + 1, expires + self.propagation_ns + 1)
                        back()
                per(grant)
            with m.State("TMR_LEASE"):
                def lease(p: int) -> None:
                    with m.If(self.rx_receiving[p]):
                        m.next = "IDLE"  # the data is arriving
                    with m.Elif(asked[p]):  # its sender asked again: the GRANT was lost
                        m.d.sync += [count("revoked"), q.eq(granted[p]), after_free.eq(0)]
                        m.next = "GRANT"  # again, a fresh lease; it keeps its turn
                    with m.Else():
                        m.d.sync += [count("revoked"), g_ok[p].eq(0), after_free.eq(0)]
                        m.next = "GNEXT"
                per(lease)
            with m.State("TMR_RELEASE"):
                m.d.sync += [count("releases_overdue"), after_free.eq(0)]
                m.next = "FREE"
            with m.State("FREE"):
                def free(p: int) -> None:
                    m.d.sync += [t_on[3 * p + 2].eq(0), g_ok[p].eq(0)]
                per(free)
                m.next = "GNEXT"
            with m.State("GNEXT"):  # the next waiting REQUEST not yet delivered gets it
                def gnext(p: int) -> None:
                    with m.If(q_count[p] == 0):
                        m.d.sync += g_ok[p].eq(0)
                        back()
                    with m.Else():
                        m.d.comb += q_rd.addr.eq(_slot(p, q_head[p], rxq))
                        m.next = "GNEXT_READ"
                per(gnext)
            with m.State("GNEXT_READ"):  # the waiting REQUEST at the head, read
                def taken(p: int) -> None:
                    nh = q_head[p] + 1
                    m.d.sync += [q.eq(q_rd.data), q_count[p].eq(q_count[p] - 1),
                                 q_head[p].eq(Mux(nh == rxq, 0, nh)),
                                 scan_i.eq(0), found.eq(0), scan_ret.eq(1), scan_vld.eq(0)]
                per(taken)
                m.next = "DSCAN"
            with m.State("GN2"):
                with m.If(found):
                    m.next = "GNEXT"
                with m.Else():
                    m.next = "GRANT"

            # --- the delivered keys: is q's among them ------------------------------------
            with m.State("DSCAN"):
                def dscan(p: int) -> None:
                    # pipelined as QSCAN: entry scan_i read, entry scan_i - 1 compared
                    more = ~found & (scan_i != d_count[p])
                    m.d.comb += d_rd.addr.eq(_slot(p, scan_i, dn))
                    m.d.sync += scan_vld.eq(more)
                    with m.If(more):
                        m.d.sync += scan_i.eq(scan_i + 1)
                    with m.If(scan_vld & (d_rd.data.flow == q.flow) & (d_rd.data.hop == q.hop)):
                        m.d.sync += found.eq(1)
                    with m.If(~more & ~scan_vld), m.Switch(scan_ret):
                        with m.Case(0):
                            m.next = "RQ2"
                        with m.Case(1):
                            m.next = "GN2"
                        with m.Default():
                            m.next = "RXD2"
                per(dscan)

            # --- a transfer received in full ------------------------------------------------
            with m.State("RXD"):
                def rxd(p: int) -> None:
                    g = granted[p]
                    m.d.sync += rx_pend[p].eq(0)
                    with m.If(~g_ok[p] | (g.flow[:32] != rx_pflow[p]) | data_done[p]):
                        m.d.sync += [count("unexpected_rx"), unexpected[p].eq(unexpected[p] + 1)]
                        m.next = "IDLE"
                    with m.Elif(rx_pbytes[p] != g.nbytes):
                        m.d.comb += fail("short", g.flow, 0, rx_pbytes[p])
                        m.next = "IDLE"
                    with m.Else():
                        m.d.sync += [q.eq(g), fin.eq(g), scan_i.eq(0), found.eq(0),
                                     scan_ret.eq(2), scan_vld.eq(0)]
                        m.next = "DSCAN"
                per(rxd)
            with m.State("RXD2"):
                def rxd2(p: int) -> None:
                    with m.If(~found):  # remembered; the oldest forgotten when full
                        m.d.comb += [d_wr.en.eq(1), d_wr.data.eq(Cat(q.flow, q.hop))]
                        with m.If(d_count[p] < dn):
                            m.d.comb += d_wr.addr.eq(_slot(p, d_count[p], dn))
                            m.d.sync += d_count[p].eq(d_count[p] + 1)
                        with m.Else():
                            m.d.comb += d_wr.addr.eq(_slot(p, d_old[p], dn))
                            m.d.sync += d_old[p].eq(Mux(d_old[p] == dn - 1, 0, d_old[p] + 1))
                    m.d.sync += [data_done[p].eq(1), t_on[3 * p + 1].eq(0)]
                    with m.If(released[p]):
                        m.d.sync += after_free.eq(1)
                        m.next = "FREE"
                    with m.Else():
                        arm(3 * p + 2, self.ts_ns + self.release_timeout_ns)
                        m.next = "RXD_TAIL"
                per(rxd2)
            with m.State("RXD_TAIL"):  # delivered here, or relayed on
                flow = Cat(fin.flow, fin.origin, fin.final, fin.nbytes, fin.iteration, fin.step,
                           fin.hop, fin.t_submit)
                m.d.sync += after_free.eq(0)
                with m.If(fin.final == self.node_id):
                    m.d.comb += [self.deliver_valid.eq(1), self.deliver_flow.eq(flow)]
                    m.next = "IDLE"
                with m.Else():
                    m.d.sync += [count("relayed"), fl.eq(flow), fl.hop.eq(fin.hop + 1)]
                    m.next = "SUB_ROUTE"
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
        return m
