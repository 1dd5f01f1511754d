"""The ideal one-tier electrical switch: non-blocking, one full-duplex link per node.

Flow-level fluid model: each active flow crosses its source's uplink and its destination's
downlink; rates are max-min fair over those links (progressive filling), recomputed only
on the connected component of flows a change touches, so permutation traffic costs O(1)
per flow. A flow's last bit reaches the destination `latency_ns` after it leaves.
A big component is solved by `max_min_arrays`, compiled where the install built
`fillkernel` (the same rates to the bit).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from oddl.controller.base.clock import Clock
from oddl.controller.base.messages import Flow
from oddl.controller.stage2.invariants import tag_of
from oddl.sim.clock import VHandle, VirtualClockLoop
from oddl.sim.networks.sharing import Fair, Sharing


class _Active:
    """A flow on the network (hashed by identity: the solver's dicts are keyed by it)."""

    __slots__ = ("conn", "done", "flow", "handle", "last", "lidx", "links", "rate",
                 "remaining", "slot")

    def __init__(self, flow: Flow, now: int, links: tuple[object, ...]):
        self.flow = flow
        self.remaining = float(flow.nbytes * 8)  # bits
        self.rate = 0.0  # bits per ns
        self.last = now
        self.links = links
        self.lidx: np.ndarray | None = None  # link indices, once a vectorised solve needs them
        self.handle: VHandle | None = None  # its finish event
        self.done = False
        # its connection (sim/networks/sharing.py)
        self.conn = (tag_of(flow.id), flow.src, flow.dst)
        self.slot = -1  # its connection's, where a law keeps their state (congestion.py)


TIE = 1e-9  # relative: shares this close are one water level (floating-point noise)


def max_min_rates(flow_links: list[tuple[object, ...]], capacity: dict[object, float],
                  weights: list[float] | None = None) -> list[float]:
    """Progressive filling: raise all unfrozen rates together until links saturate; with
    weights, flow i's rate is weights[i] x the water level (weighted max-min).

    The water level never falls: a link left with a rounding residue of capacity and an
    unfrozen flow saturates at the current level (in exact arithmetic that flow would
    have frozen with the others), instead of starving the flow at a near-zero rate.
    """
    n = len(flow_links)
    w = weights or [1.0] * n
    rate = [0.0] * n
    frozen = [False] * n
    cap = dict(capacity)
    users: dict[object, list[int]] = {}
    for i, ls in enumerate(flow_links):
        for link in ls:
            users.setdefault(link, []).append(i)
    # unweighted, a link's share divides by its unfrozen users, counted as they freeze
    # (the sum of so many 1.0s, exactly); weighted, their weights summed in order
    count = None if weights else {link: len(u) for link, u in users.items()}

    def share(link: object) -> float | None:
        k = count[link] if count is not None else \
            sum(w[i] for i in users[link] if not frozen[i])
        return cap[link] / k if k > 0 else None

    # each live link's share, in the links' first-seen order (deterministic); a share is
    # computed again only when a flow on the link froze (nothing else changes it)
    shares: dict[object, float] = {}
    for link in users:
        sh = share(link)
        if sh is not None:
            shares[link] = sh
    level = 0.0
    while shares:
        level = max(level, min(shares.values()))
        sat = [link for link, sh in shares.items() if sh <= level * (1 + TIE)]
        touched: dict[object, None] = {}
        for link in sat:
            for i in users[link]:
                if frozen[i]:
                    continue
                frozen[i] = True
                r = rate[i] = w[i] * level
                for other in flow_links[i]:
                    cap[other] -= r
                    if count is not None:
                        count[other] -= 1
                    touched[other] = None
            del shares[link]
        for link in touched:
            if link in shares:
                sh = share(link)
                if sh is None:
                    del shares[link]  # every user frozen: nothing left to share
                else:
                    shares[link] = sh
    return rate


def max_min_arrays(rows: np.ndarray, cols: np.ndarray, nf: int, cap: np.ndarray,
                   weights: np.ndarray | None = None) -> np.ndarray:
    """Progressive filling on an incidence list (entry e: flow rows[e] crosses link
    cols[e]), weighted as `max_min_rates`. Each round saturates every link whose share
    equals the minimum at once, so symmetric traffic takes a few rounds, not one per link."""
    nl = len(cap)
    cap = cap.astype(float)
    # unweighted: a link's users counted (exact integers, as the sum of their 1.0 weights
    # would be) and a frozen flow's rate the level itself: the same numbers, fewer passes
    w = None if weights is None else np.asarray(weights, dtype=float)
    rate = np.zeros(nf)
    live = np.ones(nl, dtype=bool)
    share = np.empty(nl)
    level = 0.0
    while len(rows):
        users = np.bincount(cols, minlength=nl) if w is None else \
            np.bincount(cols, weights=w[rows], minlength=nl)
        ok = live & (users > 0)
        share.fill(np.inf)
        np.divide(cap, users, out=share, where=ok)
        s = level = max(level, float(share.min()))  # the water level never falls
        sat = ok & (share <= s * (1 + TIE))
        frozen = np.zeros(nf, dtype=bool)
        frozen[rows[sat[cols]]] = True
        gone = frozen[rows]
        if w is None:
            rate[frozen] = s
            cap -= s * np.bincount(cols[gone], minlength=nl)
        else:
            rate[frozen] = s * w[frozen]
            cap -= s * np.bincount(cols[gone], weights=w[rows[gone]], minlength=nl)
        live &= ~sat
        keep = ~gone
        rows, cols = rows[keep], cols[keep]  # only unfrozen flows' entries remain
    return rate


try:  # progressive filling compiled (fillkernel.pyx, built by setup.py)
    from oddl.sim.networks import fillkernel
except ImportError:  # not built: numpy's, above
    fillkernel = None  # type: ignore[assignment]
# the solver a big component gets: the same rates either way (tests/test_fattree.py)
fill = max_min_arrays if fillkernel is None else fillkernel.max_min_arrays


def max_min_rates_np(flow_links: list[tuple[object, ...]], capacity: dict[object, float]
                     ) -> list[float]:
    """Progressive filling, vectorised (numpy): the same answer as `max_min_rates`."""
    links = list(capacity)
    idx = {k: i for i, k in enumerate(links)}
    rows = np.repeat(np.arange(len(flow_links)), [len(ls) for ls in flow_links])
    cols = np.fromiter((idx[k] for ls in flow_links for k in ls), dtype=np.int64,
                       count=len(rows))
    cap = np.array([capacity[k] for k in links], dtype=float)
    return max_min_arrays(rows, cols, len(flow_links), cap).tolist()


def _retime(comp: list[_Active], rates: list[float], now: int, next_tick: int | None,
            held: dict[_Active, VHandle], at: Callable[..., VHandle],
            finish: Callable[[_Active], None], vloop: VirtualClockLoop | None) -> None:
    """`FlowNetwork._rebalance`'s loop over the flows (typed where compiled:
    electrical.pxd)."""
    ceil = math.ceil  # (Python's: a finish time stays an int)
    for a, r in zip(comp, rates, strict=True):
        h = a.handle
        if h is not None and abs(r - a.rate) <= TIE * r:
            # unchanged (up to rounding): its finish event stands, held until due
            if held and (next_tick is None or h[0] <= next_tick) and \
                    held.pop(a, None) is not None:
                vloop.schedule(h)  # type: ignore[union-attr]  # (only a virtual loop holds)
            continue
        left = a.remaining - a.rate * (now - a.last)  # progress settled on a change only
        a.remaining, a.last, a.rate = left, now, r
        t_end = now + max(0, ceil(left / r - 1e-6))
        far = next_tick is not None and t_end > next_tick
        if h is not None:
            if not held or held.get(a) is None:
                h.cancel()  # (it is in the heap)
            elif far:  # held still: the same handle, at its new time and place in the order
                vloop.rereserve(h, t_end)  # type: ignore[union-attr]
                continue
            else:
                del held[a]  # (a held one was never in the heap)
        if far:
            a.handle = held[a] = vloop.reserve_at_ns(t_end, finish, a)  # type: ignore[union-attr]
        else:
            a.handle = at(t_end, finish, a)


class FlowNetwork:
    """Flows on fixed link paths, rates max-min fair, recomputed per connected component."""

    name = "flow-network"
    VECTORISE_ABOVE = 64  # flows in a component; below it the plain solver is faster
    GLOBAL_ABOVE = 256  # a component this big: solve every active flow at once (vectorised)

    def __init__(self, clock: Clock, capacity: dict[object, float],
                 path: Callable[[Flow], tuple[object, ...]], latency_ns: float,
                 deliver: Callable[[Flow], None]) -> None:
        self.clock = clock
        self.capacity = capacity  # bits per ns (Gb/s)
        self.path = path
        self.latency_ns = math.ceil(latency_ns)
        self.deliver = deliver
        self.users: dict[object, dict[_Active, None]] = {k: {} for k in capacity}
        self.link_index = {k: i for i, k in enumerate(capacity)}
        self.cap_arr = np.array([capacity[k] for k in capacity], dtype=float)
        self.active: dict[_Active, None] = {}  # insertion-ordered: deterministic
        self.conns: dict[tuple[int, str, str], int] = {}  # active flows per connection
        self.flows = 0
        self._dirty: list[_Active] = []
        self._whole = False  # the last solve found one big component
        self.sharing: Sharing = Fair()  # who gets how much of a shared link
        self._ticking = False
        # flows' finishes reserved but kept out of the loop's heap: each comes after the
        # next tick, which re-times it (a law changes every rate a tick: their events
        # were pushed and cancelled by the million); the tick puts in those it keeps
        self._held: dict[_Active, VHandle] = {}
        self._vloop = clock.loop if isinstance(clock.loop, VirtualClockLoop) else None
        # link -> (t_ns, total rate) each time it changed, for the links being watched
        self.watched: dict[object, list[tuple[int, float]]] = {}

    def watch(self, link: object) -> None:
        """Record `link`'s load over time (a job's communication profile:
        sim/networks/profile.py)."""
        self.watched[link] = [(self.clock.now_ns(), 0.0)]

    def _sample(self, now: int) -> None:
        for link, series in self.watched.items():
            load = sum(a.rate for a in self.users[link])
            if abs(load - series[-1][1]) > TIE * max(load, 1e-12):
                series.append((now, load))

    def _tick(self) -> None:
        """A policy whose weights move as flows progress (MLTCP): re-solve every flow."""
        if not self.active:
            self._ticking = False
            return
        now = self.clock.now_ns()
        busy = self.sharing.step(now)
        # ticking on: what finishes after the next tick is held for it
        self._rebalance(list(self.active), now,
                        now + self.sharing.tick_ns if busy and self._vloop else None)
        if not busy:
            self._ticking = False  # a flow's coming or going starts it again
            return
        self._sample(self.clock.now_ns())
        self.clock.call_later_ns(self.sharing.tick_ns, self._tick)

    def describe(self) -> dict[str, int | float]:
        """What a run reports about the topology beside its timings (none by default)."""
        return {}

    def submit(self, flow: Flow) -> None:
        now = self.clock.now_ns()
        links = self.path(flow)
        a = _Active(flow, now, links)
        for link in links:
            self.users[link][a] = None
        self.active[a] = None
        self.conns[a.conn] = self.conns.get(a.conn, 0) + 1
        self.flows += 1
        self.sharing.submitted(flow)
        self.sharing.added(a)
        self._keep_ticking()
        self._touch(a, now)

    def _keep_ticking(self) -> None:
        """A policy that moves with time (MLTCP, a law) re-solves every tick while flows
        are active; a flow's coming or going starts the ticks again."""
        if self.sharing.tick_ns and self.active and not self._ticking:
            self._ticking = True
            self.clock.call_later_ns(self.sharing.tick_ns, self._tick)

    def _touch(self, a: _Active, now: int) -> None:
        """Mark a's component for re-solving; one solve per instant, after every submit and
        finish of that instant (a collective step starts or ends hundreds of flows at once:
        solving after each would be quadratic)."""
        if not self._dirty:
            self.clock.call_at_ns(now, self._flush)
        self._dirty.append(a)

    def _flush(self) -> None:
        now = self.clock.now_ns()
        seeds, self._dirty = self._dirty, []
        done: set[_Active] = set()
        if self._whole and len(self.active) > self.GLOBAL_ABOVE:
            self._rebalance(list(self.active), now)  # still one big mesh
        else:
            self._whole = False
            for a in seeds:
                if a in done or a.done:
                    continue
                comp = self._component(a, self.GLOBAL_ABOVE)
                if comp is None:  # one big component: the whole network, vectorised
                    self._whole = True
                    self._rebalance(list(self.active), now)
                    break
                done.update(comp)
                self._rebalance(comp, now)
        if self.watched:
            self._sample(now)

    def _latency(self, flow: Flow) -> int:
        return self.latency_ns

    def _rates(self, comp: list[_Active], now: int) -> list[float]:
        if self.sharing.controls_rates:
            return self.sharing.rates(comp)
        if len(comp) == 1:
            return [min(self.capacity[k] for k in comp[0].links)]
        whole = len(comp) == len(self.active)  # every active flow: their counts are kept
        w = self.sharing.weights(comp, self.active, now, self.conns if whole else None)
        if len(comp) > self.VECTORISE_ABOVE:  # on the flows' own link indices: links
            li = self.link_index
            for a in comp:
                if a.lidx is None:
                    a.lidx = np.fromiter((li[k] for k in a.links), dtype=np.int64,
                                         count=len(a.links))
            lens = [len(a.lidx) for a in comp]  # type: ignore[arg-type]  # lidx is set just above
            rows = np.repeat(np.arange(len(comp)), lens)
            cols = np.concatenate([a.lidx for a in comp])
            return fill(rows, cols, len(comp), self.cap_arr,
                                  None if w is None else np.asarray(w)).tolist()
        caps = {link: self.capacity[link] for a in comp for link in a.links}
        return max_min_rates([a.links for a in comp], caps, w)

    def _component(self, seed: _Active, limit: int) -> list[_Active] | None:
        """The flows sharing links with seed, transitively; None once it passes limit."""
        seen = {seed: None}  # insertion-ordered: the component in the order found
        stack = [seed]
        users = self.users
        while stack:
            a = stack.pop()
            for link in a.links:
                for b in users[link]:
                    if b not in seen:
                        seen[b] = None
                        stack.append(b)
                if len(seen) > limit:
                    return None
        return list(seen)

    def _rebalance(self, comp: list[_Active], now: int, next_tick: int | None = None) -> None:
        """comp's rates now, and each changed one's finish re-timed; a finish after
        `next_tick` (the tick's own instant, set when it ticks on) is held, its place in
        the loop's order reserved: the same events run in the same order either way."""
        _retime(comp, self._rates(comp, now), now, next_tick, self._held,
                self.clock.call_at_ns, self._finish, self._vloop)

    def _finish(self, a: _Active) -> None:
        now = self.clock.now_ns()
        a.done = True
        a.handle = None  # (its event holds it: left, the two were a cycle for the collector)
        del self.active[a]
        n = self.conns[a.conn] - 1
        if n:
            self.conns[a.conn] = n
        else:
            del self.conns[a.conn]
        self.sharing.finished(a.flow)
        self.sharing.removed(a)
        self._keep_ticking()
        for link in a.links:
            users = self.users[link]
            del users[a]
            if users:  # its neighbours share the freed capacity
                self._touch(next(iter(users)), now)
        if self.watched:
            self._sample(now)
        self.clock.call_at_ns(now + self._latency(a.flow), self.deliver, a.flow)


class ElectricalSwitch(FlowNetwork):
    """The ideal one-tier switch: a flow crosses only its source's up and destination's
    down link, each at the line rate."""

    name = "electrical"

    def __init__(self, clock: Clock, nodes: list[str], rate_gbps: float, latency_ns: float,
                 deliver: Callable[[Flow], None]) -> None:
        cap: dict[object, float] = {}
        for n in nodes:
            cap[("up", n)] = rate_gbps
            cap[("down", n)] = rate_gbps
        super().__init__(clock, cap, lambda f: (("up", f.src), ("down", f.dst)), latency_ns,
                         deliver)
