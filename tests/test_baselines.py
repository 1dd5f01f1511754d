"""Baselines against closed forms where they are uncongested, and TopoOpt's routing
against brute force."""

from __future__ import annotations

import itertools
from collections import deque
from typing import Any

import pytest
from oddl.controller.clock import Clock
from oddl.controller.collectives import check_balanced, halving_doubling, ring, totient_rings
from oddl.controller.config import NetworkSpec
from oddl.controller.jumps import totient_jumps
from oddl.controller.workloads import CollectiveEngine
from oddl.sim.baselines import build_network
from oddl.sim.clock import VirtualClockLoop
from oddl.sim.topoopt import jump_routes

RATE = 100.0  # Gb/s: 1 byte = 0.08 ns
LAT = 1000


def allreduce_ns(kind: str, n: int, size: int, collective: str = "ring", **kw: Any
                 ) -> tuple[int, Any]:
    loop = VirtualClockLoop()
    clock = Clock(loop)
    ranks = [f"h{i}" for i in range(n)]
    sched = {"ring": lambda: ring(n, size), "hd": lambda: halving_doubling(n, size),
             "totientrings": lambda: totient_rings(n, size, totient_jumps(n, kw["degree"]))
             }[collective]()
    check_balanced(sched)
    engine: CollectiveEngine
    net = build_network(NetworkSpec(name=kind, kind=kind, latency_ns=LAT, **kw), clock,
                        ranks, RATE, lambda f: engine.on_delivered(f))
    engine = CollectiveEngine(clock, sched, ranks, net.submit)
    done = loop.create_future()
    engine.start_iteration(0, 0, done.set_result)
    t = loop.run_until_complete(done)
    loop.close()
    return t, net


def ns(nbytes: int, gbps: float = RATE) -> int:
    return round(nbytes * 8 / gbps)


N, S = 8, 8 * 125_000  # chunks of 125 kB: 10 us at 100 Gb/s
RING = 2 * (N - 1) * (ns(S // N) + LAT)


def test_electrical_ring_closed_form() -> None:
    assert allreduce_ns("electrical", N, S)[0] == RING


def test_fattree_closed_form_inside_a_leaf_and_across_spines() -> None:
    # all hosts on one leaf: one switch per flow, the same as the ideal switch
    assert allreduce_ns("fattree", N, S, hosts_per_leaf=N, spines=2)[0] == RING
    # one host per leaf, non-blocking: ring neighbours cross leaf-spine-leaf (3 switches)
    # on links nobody else uses
    t, _ = allreduce_ns("fattree", N, S, hosts_per_leaf=1, spines=1)
    assert t == 2 * (N - 1) * (ns(S // N) + 3 * LAT)


def test_fattree_oversubscription_is_the_uplink_share() -> None:
    # 4 hosts per leaf, 1 spine: at 4:1 the uplink is 100 Gb/s for 4 hosts. The ring has
    # one inter-leaf flow per leaf, alone on the uplink: oversubscription costs nothing...
    kw = {"hosts_per_leaf": 4, "spines": 1}
    t1, _ = allreduce_ns("fattree", N, S, **kw, oversubscription=4)
    assert t1 == allreduce_ns("fattree", N, S, **kw, oversubscription=1)[0]
    # ...while HD's step with partners 4 apart sends 4 flows through it: a quarter rate
    # each; 3 steps of the 6 cross leaves, each with S/8 per flow at k=2
    t4, _ = allreduce_ns("fattree", N, S, "hd", **kw, oversubscription=4)
    t1hd, _ = allreduce_ns("fattree", N, S, "hd", **kw, oversubscription=1)
    assert t4 - t1hd == 2 * (ns(S // 8, RATE / 4) - ns(S // 8))


def test_sipring_ring_closed_form() -> None:
    # neighbours adjacent on the ring: one segment each, node I/O = 4 x 25 Gb/s; the micro-
    # rings are tuned once, before the first step
    t, net = allreduce_ns("sipring", N, S, degree=4, reconfig_ns=25_000)
    assert t == 25_000 + RING
    assert net.reconfigs == N


def test_sipring_hd_closed_form_when_segments_have_room() -> None:
    # step k: partner 2^k segments away; 64 x 25 Gb/s per segment carries the <= 4 flows
    # crossing it at full rate. Every step but the turnaround changes partner: retune.
    t, net = allreduce_ns("sipring", N, S, "hd", wavelengths=64, degree=4, reconfig_ns=5_000)
    sizes = [S // 2, S // 4, S // 8]
    steps = [*sizes, *reversed(sizes)]
    assert t == sum(ns(b) + LAT for b in steps) + 5 * 5_000
    assert net.reconfigs == N * 5


def test_sipring_segments_bottleneck_far_partners() -> None:
    # 1 wavelength per fibre: the 4 flows of step 2 (distance 4) share single 25 Gb/s
    # segments, so HD is far slower than on the same ring with 64 wavelengths
    slow, _ = allreduce_ns("sipring", N, S, "hd", wavelengths=1, degree=4, reconfig_ns=0)
    fast, _ = allreduce_ns("sipring", N, S, "hd", wavelengths=64, degree=4, reconfig_ns=0)
    assert slow > 2 * fast


def test_topoopt_ring_closed_form_and_multihop_latency() -> None:
    # d = 2 on 8 nodes: jumps {1, 7}; ring neighbours are one hop on a dedicated link
    t, net = allreduce_ns("topoopt", N, S, degree=2)
    assert net.jumps == [1, 7] and t == RING
    # HD's partner 4 away is 4 hops, every hop a host forwarding (latency per hop), and
    # two flows per link in each direction: slower than the ideal switch
    hd, _ = allreduce_ns("topoopt", N, S, "hd", degree=2)
    assert net.hops("h0", "h4") == 4
    assert hd > allreduce_ns("electrical", N, S, "hd")[0]


def test_topoopt_totient_rings_use_every_link() -> None:
    # d = 4 on 8 nodes: jumps {1, 3, 5, 7}; four rings, each a quarter of the gradient on
    # its own links, one hop per step: the degree-d topology at d x the one-ring speed
    t, net = allreduce_ns("topoopt", N, S, "totientrings", degree=4)
    assert net.jumps == [1, 3, 5, 7]
    assert t == 2 * (N - 1) * (ns(S // N // 4) + LAT)
    one, _ = allreduce_ns("topoopt", N, S, "ring", degree=4)
    assert one == RING and t < one / 3


def brute_distances(n: int, jumps: list[int]) -> list[list[int]]:
    adj = {u: [(u + j) % n for j in jumps] for u in range(n)}
    out = []
    for s in range(n):
        d = [-1] * n
        d[s] = 0
        q = deque([s])
        while q:
            u = q.popleft()
            for v in adj[u]:
                if d[v] < 0:
                    d[v] = d[u] + 1
                    q.append(v)
        out.append(d)
    return out


@pytest.mark.parametrize("n,d", list(itertools.product([5, 8, 12, 16, 21, 30], [1, 2, 3, 4])))
def test_totientperms_routes_match_brute_force(n: int, d: int) -> None:
    jumps = totient_jumps(n, d)
    routes = jump_routes(n, jumps)
    dist = brute_distances(n, jumps)
    for off in range(n):  # every route reaches its offset, in the fewest hops
        assert sum(routes[off]) % n == off
        assert all(dist[s][(s + off) % n] == len(routes[off]) for s in range(n))
    diameter = max(max(row) for row in dist)
    avg = sum(sum(row) for row in dist) / (n * (n - 1))
    assert max(len(r) for r in routes) == diameter
    assert sum(len(r) for r in routes) / (n - 1) == pytest.approx(avg)


def test_totientperms_paper_example_and_diameter_bound() -> None:
    assert totient_jumps(12, 4) == [1, 5, 7, 11]
    assert max(len(r) for r in jump_routes(12, [1, 5, 7, 11])) == 3  # e.g. 3 = 1 + 1 + 1
    # diameter O(d n^(1/d)): at 1024 nodes and d = 4, a handful of hops, not hundreds
    routes = jump_routes(1024, totient_jumps(1024, 4))
    assert max(len(r) for r in routes) <= 4 * round(1024 ** 0.25) + 4
