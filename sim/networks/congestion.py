"""Congestion control on shared electrical links: DCQCN and TCP Reno as laws, with queues,
ECN marking and loss (docs/congestion.md).

The flow solver's max-min shares (sim/networks/electrical.py) are what congestion control converges
to, reached at once. Here the senders get there, or not, as their law makes them: every
`tick_ns` each connection's sending rate loads the links it crosses, each link's queue
grows by what arrives beyond its capacity and drains at its capacity, a full queue drops
(TCP) or pauses the senders (DCQCN runs over PFC, lossless), and the senders react to
what reached them: ECN marks (DCQCN's CNPs), losses (Reno's halvings).

- **Connections.** A job's flows from one rank to one peer are one connection, as they
  are for the fluid sharing (`per_connection`): a collective keeps one per peer. Its state
  (window, rate, alpha) outlives its flows, as a long-lived connection's does; its flows
  at once split its rate.
- **DCQCN** (Zhu et al., SIGCOMM 2015; `Dcqcn` gives each parameter and its source):
  switches mark with RED on the instantaneous queue (Kmin 5 KB, Kmax 200 KB, Pmax 1%);
  a receiver sends a CNP at most every 50 us while marked packets arrive; a CNP cuts the
  rate, RC = RC (1 - alpha / 2), with alpha the EWMA of CNPs (g = 1/256, every 55 us); the
  rate recovers by the timer (55 us) and byte counter (10 MB): fast recovery for 5 steps,
  then additive, then hyper increase.
- **TCP Reno** (RFC 5681, initial window RFC 6928): a window of segments, W/RTT its rate,
  RTT the path's base round trip plus its queues; each ACK grows W by 1/W (by 1 in slow
  start); a loss halves W, at most once per RTT (fast recovery, no time-outs). Losses are
  the tail drops of full queues, and `random_loss` per segment on top (the Mathis check).
- **Weights** (a job's `weight`, the talk's unfair 60/40) scale a job's increase by its
  weight over the jobs' mean, as MulTCP makes one connection as aggressive as several.
- **MLTCP** (Rajasekaran et al., HotNets 2024) on either: the increase is scaled by
  F = slope x bytes_ratio + intercept, bytes_ratio the bytes the job has sent in this
  iteration over what it sends per iteration (`mltcp`): Reno's W += F / W an ACK, DCQCN's
  additive and hyper steps x F.

Fluid, not packets: within a tick a link serves its capacity, shared in proportion to what
arrives; marks and losses are drawn per tick from their per-segment probabilities, with a
seeded generator (a run is reproducible). Steps are vectorised over the connections, and
compiled where the install built `lawkernel` (the same arithmetic in the same order: the
two are held equal to the bit; ODDL_INTERPRETED=1 runs the numpy tick).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from oddl.controller.base import fixedmath as F
from oddl.controller.stage2.invariants import tag_of
from oddl.sim.networks.sharing import MLTCP, Sharing

try:  # the compiled tick (lawkernel.pyx, built by setup.py): the numpy one, transcribed
    from oddl.sim.networks import lawkernel
except ImportError:  # not built: the numpy tick below
    lawkernel = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from oddl.sim.networks.electrical import FlowNetwork


def _shares(comp: list[Any], goodput: np.ndarray, count: np.ndarray) -> list[float]:
    """`CongestionControl.rates`: each flow's share of its connection's goodput (`count`:
    each connection's active flows; typed where compiled, congestion.pxd: read from the
    arrays as C numbers, where a dict of shares had been built every tick)."""
    return [max(float(goodput[a.slot]) / float(count[a.slot]), 1e-9) for a in comp]


@dataclass(frozen=True)
class Dcqcn:
    """DCQCN's parameters, as Zhu et al. (SIGCOMM 2015) give them."""

    kmin_bytes: float = 5_000  # RED-ECN: no marks below
    kmax_bytes: float = 200_000  # all marked above
    pmax: float = 0.01  # marking probability at Kmax
    g: float = 1 / 256  # alpha's gain
    cnp_ns: int = 50_000  # a receiver's CNPs at most this often (N)
    alpha_ns: int = 55_000  # alpha decays this often without a CNP (K)
    timer_ns: int = 55_000  # rate increase timer (T)
    byte_counter: float = 10e6  # rate increase byte counter (B), bytes
    fast_steps: int = 5  # fast recovery steps (F)
    rai_gbps: float = 0.04  # additive increase, 40 Mb/s
    rhai_gbps: float = 0.4  # hyper increase: 10 x R_AI (htsim's ratio; see docs)
    mtu: int = 1000  # bytes a packet (the paper's RoCE MTU)


@dataclass(frozen=True)
class Reno:
    """TCP Reno's parameters: RFC 5681's segment, RFC 6928's initial window."""

    mss: int = 1460
    initial_window: float = 10.0


# uniform draws taken from the generator at once (`CongestionControl.uniform`)
DRAWS = 4096

# a switch port's buffer: a Trident II's 12 MB shared by 32 ports, as in the DCQCN
# paper's testbed
PORT_BUFFER_BYTES = 375_000


class CongestionControl(Sharing):
    """A link's capacity split by a congestion-control law (`law`: dcqcn or tcp)."""

    controls_rates = True

    def __init__(self, law: str, tick_ns: int = 2_000,
                 buffer_bytes: float = PORT_BUFFER_BYTES, dcqcn: Dcqcn = Dcqcn(),
                 reno: Reno = Reno(), random_loss: float = 0.0, seed: int = 0,
                 mltcp: MLTCP | None = None) -> None:
        if law not in ("dcqcn", "tcp"):
            raise ValueError(f"unknown congestion control {law!r} (dcqcn or tcp)")
        if tick_ns < 1 or not 0 <= random_loss < 1:
            raise ValueError("a tick of at least 1 ns and a random loss in [0, 1)")
        self.name = law if mltcp is None else f"mltcp-{law}"
        self.law, self.tick_ns, self.d, self.r = law, tick_ns, dcqcn, reno
        self.buffer_bits = buffer_bytes * 8
        self.random_loss = random_loss
        self.mltcp = mltcp
        self.rng = np.random.default_rng(seed)
        self._draws, self._at = np.empty(0), 0  # `uniform`'s
        # DCQCN's parameters as the compiled tick reads them (a frozen dataclass's fields
        # cost a lookup each, every tick)
        self.dcqcn_params = (dcqcn.kmin_bytes, dcqcn.kmax_bytes, dcqcn.pmax, dcqcn.g,
                             dcqcn.cnp_ns, dcqcn.alpha_ns, dcqcn.timer_ns,
                             dcqcn.byte_counter, dcqcn.fast_steps, dcqcn.rai_gbps,
                             dcqcn.rhai_gbps, dcqcn.mtu * 8)
        self.weight: dict[int, float] = {}  # job tag -> its weight (`join`)
        self.net: FlowNetwork | None = None
        self.conn: dict[tuple[int, str, str], int] = {}  # connection -> its slot
        self.flows: dict[int, list[Any]] = {}  # slot -> its active flows (_Active)
        n = 64
        self.rate = np.zeros(n)  # sending rate, bits/ns (DCQCN: RC)
        self.target = np.zeros(n)  # DCQCN: RT
        self.alpha = np.ones(n)
        self.window = np.zeros(n)  # Reno: segments
        self.ssthresh = np.full(n, np.inf)
        self.line = np.zeros(n)  # the connection's NIC rate, bits/ns
        self.base_rtt = np.zeros(n)  # ns
        self.clocks = np.zeros((n, 4))  # ns since: CNP, alpha decay, rate timer, loss
        self.sent = np.zeros(n)  # DCQCN: bytes toward the byte counter
        self.counts = np.zeros((n, 2))  # DCQCN: timer and byte-counter steps since a CNP
        self.marked = np.zeros(n, dtype=bool)  # a mark came since the last CNP
        self.cut = np.zeros(n, dtype=bool)  # DCQCN: a CNP came (the increase runs)
        self.goodput = np.zeros(n)  # what reaches the receiver, bits/ns
        self.count = np.zeros(n, dtype=np.int64)  # its active flows
        self.queue: np.ndarray | None = None  # per link, bits
        self._csr: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._tags: tuple[list[int], np.ndarray] | None = None  # `_scale`'s, for `_csr`
        self.stats = {"cnps": 0, "losses": 0, "dropped_bytes": 0.0, "max_queue_bytes": 0.0,
                      "paused_bytes": 0.0}
        self.compiled = lawkernel is not None
        # moves whenever an array above is replaced (grown), so that the compiled tick,
        # which holds them between ticks, takes them again
        self.generation = 0
        self._arrays: Any = None  # the compiled tick's hold on the arrays above (lawkernel)

    def describe(self) -> dict[str, float]:
        """What the law has done so far: CNPs, losses, bytes dropped or paused (counters:
        a job's stats are what they grew by while it ran)."""
        return {k: v for k, v in self.stats.items() if k != "max_queue_bytes"}

    def uniform(self, n: int) -> np.ndarray:
        """The generator's next n uniform draws, as `rng.random(n)` would give them: the
        same stream (PCG64 makes a float64 draw of one 64-bit output, so draws taken
        DRAWS at a time come in the same order), without a call into the generator every
        tick."""
        if self._at + n > len(self._draws):
            self._draws = np.concatenate([self._draws[self._at:],
                                          self.rng.random(max(DRAWS, n))])
            self._at = 0
        u = self._draws[self._at:self._at + n]
        self._at += n
        return u

    # --- the flow solver's side -------------------------------------------------------
    def attach(self, net: FlowNetwork) -> None:
        self.net = net
        self.queue = np.zeros(len(net.capacity))
        self.generation += 1

    def submitted(self, flow: Any) -> None:
        if self.mltcp is not None:
            self.mltcp.submitted(flow)

    def finished(self, flow: Any) -> None:
        if self.mltcp is not None:
            self.mltcp.finished(flow)

    def added(self, a: Any) -> None:
        """A flow joins the network: onto its connection (new: at the law's first rate)."""
        slot = self.conn.get(a.conn)
        if slot is None:
            slot = self.conn[a.conn] = self._slot()
            self._start(slot, a)
        self.flows.setdefault(slot, []).append(a)
        self.count[slot] += 1
        a.slot = slot
        self._csr = None

    def removed(self, a: Any) -> None:
        slot = self.conn[a.conn]
        fl = self.flows[slot]
        fl.remove(a)
        self.count[slot] -= 1
        if not fl:
            del self.flows[slot]  # idle: its state waits for the connection's next flow
        self._csr = None

    def _slot(self) -> int:
        k = len(self.conn)
        if k >= len(self.rate):
            for name in ("rate", "target", "alpha", "window", "ssthresh", "line", "base_rtt",
                         "clocks", "sent", "counts", "marked", "cut", "goodput", "count"):
                arr = getattr(self, name)
                grown = np.resize(arr, (2 * len(arr), *arr.shape[1:]))
                grown[len(arr):] = 0 if name not in ("alpha", "ssthresh") else \
                    (1.0 if name == "alpha" else np.inf)
                setattr(self, name, grown)
            self.generation += 1
        return k

    def _start(self, slot: int, a: Any) -> None:
        assert self.net is not None
        line = min(self.net.capacity[k] for k in a.links)
        self.line[slot] = line
        # a round trip: the path's latency each way (sim/networks/electrical.py's per flow)
        self.base_rtt[slot] = max(1.0, 2.0 * self.net._latency(a.flow))
        if self.law == "dcqcn":  # DCQCN starts at the line rate
            self.rate[slot] = self.target[slot] = line
            self.alpha[slot] = 1.0
        else:
            self.window[slot] = self.r.initial_window
            self.rate[slot] = min(line, self._rate_of_window(slot))
        self.goodput[slot] = self.rate[slot]

    def _rate_of_window(self, slot: int) -> float:
        return float(self.window[slot]) * self.r.mss * 8 / float(self.base_rtt[slot])

    def weights(self, comp: list[Any], active: Iterable[Any], now: int,
                conns: Mapping[Any, int] | None = None) -> list[float] | None:
        return None  # unused: the rates are the law's (`rates`)

    def rates(self, comp: list[Any]) -> list[float]:
        """Each flow's rate now: its connection's goodput, split among its flows."""
        return _shares(comp, self.goodput, self.count)

    # --- a tick -------------------------------------------------------------------------
    def _index(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The active connections, and (connection row, link) pairs of their paths."""
        if self._csr is None:
            assert self.net is not None
            li = self.net.link_index
            slots = np.fromiter(self.flows, dtype=np.int64, count=len(self.flows))
            rows, cols = [], []
            for r, s in enumerate(slots):
                for k in self.flows[int(s)][0].links:
                    rows.append(r)
                    cols.append(li[k])
            self._tags = None
            self._csr = (slots, np.asarray(rows, dtype=np.int64),
                         np.asarray(cols, dtype=np.int64))
        return self._csr

    def step(self, now: int) -> bool:
        """One tick: links load and queue, senders hear marks and losses and react. False
        when nothing will change until a flow comes or goes: every connection sends at
        its line rate, no link is over its capacity, no queue holds anything (the network
        then stops ticking)."""
        assert self.net is not None and self.queue is not None
        if not self.flows:
            return False
        if self.compiled:
            return bool(lawkernel.step(self))
        return self._step()

    def _step(self) -> bool:
        """The tick in numpy (the compiled one is its transcription)."""
        assert self.net is not None and self.queue is not None
        dt = float(self.tick_ns)
        slots, rows, cols = self._index()
        n = len(slots)
        cap = self.net.cap_arr
        x = self.rate[slots]
        arrive = np.bincount(cols, weights=x[rows], minlength=len(cap))  # bits/ns
        if not self.random_loss and not self.queue.any() and \
                (arrive <= cap * (1 + 1e-9)).all() and \
                (x >= self.line[slots] * (1 - 1e-9)).all():
            self.goodput[slots] = x
            return False
        buf = self.buffer_bits
        q = self.queue + (arrive - cap) * dt
        over = np.maximum(q - buf, 0.0)  # beyond the buffer: dropped, or paused (PFC)
        q = np.clip(q, 0.0, buf)
        self.queue[:] = q  # (in place: the compiled tick holds the arrays, `generation`)
        self.stats["max_queue_bytes"] = max(self.stats["max_queue_bytes"], float(q.max()) / 8)
        # a link on an active connection's path has arrivals (no rate is ever 0); one
        # without has none to share, and `over` is 0 there
        seen = np.maximum(arrive, 1e-300)
        lost = over / (seen * dt)  # the share of what arrives that the buffer turns away
        serve = np.where(q > 0, cap, np.minimum(arrive, cap)) / seen
        # a connection's share: what its slowest link serves of it, less what is lost
        through = np.full(n, np.inf)
        np.minimum.at(through, rows, serve[cols])  # over 1: a queue drains
        kept = F.exp(np.bincount(rows, weights=F.log1p(-np.minimum(lost[cols], 1 - 1e-12)),
                                 minlength=n))
        self.goodput[slots] = x * through * kept
        if self.law == "dcqcn":
            self.stats["paused_bytes"] += float((x * (1 - kept)).sum() * dt / 8)
            self._dcqcn(slots, rows, cols, x, q, dt)
        else:
            self.stats["dropped_bytes"] += float((x * (1 - kept)).sum() * dt / 8)
            self._reno(slots, rows, cols, x, kept, q, dt)
        return True

    def join(self, tag: int, weight: float) -> None:
        self.weight[tag] = weight
        self._tags = None

    def _scale(self, slots: np.ndarray) -> np.ndarray:
        """Each connection's increase factor: its job's weight over the jobs' mean (a
        job weighted 0.6 against 0.4 grows 1.2 against 0.8: MulTCP's way of being
        unfair), times MLTCP's F where MLTCP runs."""
        if self._tags is None:  # the same while the connections are (`_index`)
            tags = [tag_of(self.flows[int(s)][0].flow.id) for s in slots]
            mean = sum(self.weight.values()) / len(self.weight) if self.weight else 1.0
            self._tags = tags, np.array([self.weight.get(t, 1.0) / mean for t in tags])
        tags, f = self._tags
        if self.mltcp is None:
            return f
        inflight: dict[int, float] = {}
        for s in slots:
            for a in self.flows[int(s)]:
                tag = tag_of(a.flow.id)
                inflight[tag] = inflight.get(tag, 0.0) + a.flow.nbytes * 8 - a.remaining
        m = self.mltcp
        return f * np.array([m.slope * m.ratio(t, inflight.get(t, 0.0)) + m.intercept
                             for t in tags])

    def _dcqcn(self, slots: np.ndarray, rows: np.ndarray, cols: np.ndarray, x: np.ndarray,
               q: np.ndarray, dt: float) -> None:
        d = self.d
        qb = q / 8
        p = np.where(qb <= d.kmin_bytes, 0.0, np.where(
            qb >= d.kmax_bytes, 1.0, d.pmax * (qb - d.kmin_bytes) / (d.kmax_bytes - d.kmin_bytes)))
        n = len(slots)
        unmarked = F.exp(np.bincount(rows, weights=F.log1p(-np.minimum(p[cols], 1 - 1e-12)),
                                     minlength=n))
        packets = x * dt / (d.mtu * 8)
        hit = self.uniform(n) < 1.0 - F.libm(math.pow, unmarked, packets)
        marked = self.marked[slots] | hit
        clk = self.clocks[slots]
        clk[:, :3] += dt
        cnp = marked & (clk[:, 0] >= d.cnp_ns)
        rc, rt, al = self.rate[slots], self.target[slots], self.alpha[slots]
        cnt = self.counts[slots]
        cut = self.cut[slots]
        if cnp.any():
            self.stats["cnps"] += int(cnp.sum())
            rt = np.where(cnp, rc, rt)
            rc = np.where(cnp, rc * (1 - al / 2), rc)
            al = np.where(cnp, (1 - d.g) * al + d.g, al)
            clk[cnp] = 0.0
            cnt[cnp] = 0.0
            marked = marked & ~cnp
            cut = cut | cnp
        decay = ~cnp & (clk[:, 1] >= d.alpha_ns)
        al = np.where(decay, (1 - d.g) * al, al)
        clk[decay, 1] = 0.0
        # the increase: by the timer and by the byte counter, once cut
        bytes_acc = np.where(cnp, 0.0, self.sent[slots]) + x * dt / 8
        t_ev = cut & (clk[:, 2] >= d.timer_ns)
        b_ev = cut & (bytes_acc >= d.byte_counter)
        clk[t_ev, 2] = 0.0
        bytes_acc = np.where(b_ev, bytes_acc - d.byte_counter, bytes_acc)
        cnt[:, 0] += t_ev
        cnt[:, 1] += b_ev
        ev = t_ev | b_ev
        if ev.any():
            lo, hi = cnt.min(axis=1), cnt.max(axis=1)
            f = self._scale(slots)
            add = np.where(hi < d.fast_steps, 0.0, np.where(
                lo > d.fast_steps, (lo - d.fast_steps) * d.rhai_gbps, d.rai_gbps)) * f
            rt = np.where(ev, np.minimum(rt + add, self.line[slots]), rt)
            rc = np.where(ev, (rt + rc) / 2, rc)
        self.rate[slots] = np.minimum(rc, self.line[slots])
        self.target[slots], self.alpha[slots] = rt, al
        self.clocks[slots], self.counts[slots] = clk, cnt
        self.marked[slots], self.cut[slots] = marked, cut
        self.sent[slots] = bytes_acc

    def _reno(self, slots: np.ndarray, rows: np.ndarray, cols: np.ndarray, x: np.ndarray,
              kept: np.ndarray, q: np.ndarray, dt: float) -> None:
        r = self.r
        n = len(slots)
        seg = r.mss * 8
        assert self.net is not None
        cap = self.net.cap_arr
        delay = np.bincount(rows, weights=(q / cap)[cols], minlength=n)  # queueing, ns
        rtt = self.base_rtt[slots] + delay
        w = self.window[slots]
        sent = x * dt / seg  # segments sent this tick
        p = 1.0 - kept * (1.0 - self.random_loss)  # a segment's chance to be lost
        clk = self.clocks[slots]
        clk[:, 3] += dt
        loss = (self.uniform(n) < 1.0 - F.libm(math.pow, 1.0 - p, sent)) & (clk[:, 3] >= rtt)
        acked = self.goodput[slots] * dt / seg
        ss = w < self.ssthresh[slots]
        grow = np.where(ss, acked, self._scale(slots) * acked / np.maximum(w, 1.0))
        w = np.where(loss, np.maximum(w / 2, 1.0), w + grow)
        self.ssthresh[slots] = np.where(loss, w, self.ssthresh[slots])
        clk[loss, 3] = 0.0
        self.stats["losses"] += int(loss.sum())
        line = self.line[slots]
        w = np.minimum(w, line * rtt / seg)  # no more in flight than the NIC sends an RTT
        self.window[slots] = w
        self.clocks[slots] = clk
        self.rate[slots] = np.minimum(line, w * seg / rtt)
