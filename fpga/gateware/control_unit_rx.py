"""The receiver's states of `ctrl_unit` (fpga/gateware/control_unit.py): a REQUEST queued
or refused, a grant with its lease, the next waiting REQUEST granted, a transfer received
in full and delivered here or relayed on; and the rings the unit's memories hold, each
port's entries in its own region."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring


def ring_wrap(at: Any, n: int) -> Any:
    """A ring's index `at` (under 2n) brought under n."""
    return Mux(at >= n, at - n, at)


def ring_slot(p: int, at: Any, n: int) -> Any:
    """The address of entry `at` (under 2n: brought under n) of port `p`'s ring, in a memory
    that holds each port's n entries in turn. For a power-of-two n (the build's bounds) it
    is bits side by side, with no compare, subtract or add: the address of a memory read
    ends a path through the executor's states (timing)."""
    if n & (n - 1):
        return p * n + ring_wrap(at, n)
    return Cat(Cat(at)[:n.bit_length() - 1], Const(p, max(p.bit_length(), 1)))


class ReceiverStates(wiring.Component):
    """The receiver's part of `ControlUnitRTL.elaborate` (`net`: the nets the parts share)."""

    def _requests(self, m: Module, net: SimpleNamespace) -> None:
        """A REQUEST: its route, whether it is queued already, queued."""
        after_free, asked, count, found = net.after_free, net.asked, net.count, net.found
        from_src, g_ok, granted, inq, over = net.from_src, net.g_ok, net.granted, net.inq, net.over
        per, q, q_count, q_head, q_rd = net.per, net.q, net.q_count, net.q_head, net.q_rd
        q_wr, room, rxq, scan_i, scan_ret = net.q_wr, net.room, net.rxq, net.scan_i, net.scan_ret
        scan_vld, send = net.scan_vld, net.send

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
                m.d.comb += q_rd.addr.eq(ring_slot(p, q_head[p] + scan_i, rxq))
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
                                 q_wr.addr.eq(ring_slot(p, at, rxq)),
                                 *send("wait", **wait, queue_position=n + 1)]
                    m.d.sync += q_count[p].eq(n + 1)
                    m.next = "IDLE"
            per(rq3)

    def _grants(self, m: Module, net: SimpleNamespace) -> None:
        """A receiver granted with a lease, freed, and granted to the next."""
        after_free, arm, asked, back = net.after_free, net.arm, net.asked, net.back
        count, data_done, found, g_ok = net.count, net.data_done, net.found, net.g_ok
        granted, per, q, q_count, q_head = net.granted, net.per, net.q, net.q_count, net.q_head
        q_rd, released, room, rxq, scan_i = net.q_rd, net.released, net.room, net.rxq, net.scan_i
        scan_ret, scan_vld, send, t_on = net.scan_ret, net.scan_vld, net.send, net.t_on

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
                    m.d.comb += q_rd.addr.eq(ring_slot(p, q_head[p], rxq))
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

    def _received(self, m: Module, net: SimpleNamespace) -> None:
        """A transfer received in full: the delivered keys, delivered here or relayed on."""
        after_free, arm, count, d_count = net.after_free, net.arm, net.count, net.d_count
        d_old, d_rd, d_wr, data_done, dn = net.d_old, net.d_rd, net.d_wr, net.data_done, net.dn
        fail, fin, fl, found, g_ok = net.fail, net.fin, net.fl, net.found, net.g_ok
        granted, per, q, released = net.granted, net.per, net.q, net.released
        rx_pbytes, rx_pend, rx_pflow, scan_i = net.rx_pbytes, net.rx_pend, net.rx_pflow, net.scan_i
        scan_ret, scan_vld, t_on, unexpected = net.scan_ret, net.scan_vld, net.t_on, net.unexpected

        # --- the delivered keys: is q's among them ------------------------------------
        with m.State("DSCAN"):
            def dscan(p: int) -> None:
                # pipelined as QSCAN: entry scan_i read, entry scan_i - 1 compared
                more = ~found & (scan_i != d_count[p])
                m.d.comb += d_rd.addr.eq(ring_slot(p, scan_i, dn))
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
                        m.d.comb += d_wr.addr.eq(ring_slot(p, d_count[p], dn))
                        m.d.sync += d_count[p].eq(d_count[p] + 1)
                    with m.Else():
                        m.d.comb += d_wr.addr.eq(ring_slot(p, d_old[p], dn))
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
