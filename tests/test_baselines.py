"""Baselines against closed forms where they are uncongested (TopoOpt's jumps and routes:
test_jumps.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from oddl.controller.base.clock import Clock
from oddl.controller.base.collectives import check_balanced, halving_doubling, ring, totient_rings
from oddl.controller.base.config import NetworkSpec
from oddl.controller.base.jumps import totient_jumps
from oddl.controller.base.messages import Flow
from oddl.controller.stage2.workloads import CollectiveEngine
from oddl.sim.clock import VirtualClockLoop
from oddl.sim.networks.baselines import build_network
from oddl.sim.networks.sipring import ring_order

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
    # crossing it at full rate. The reduce-scatter tunes a lightpath to each of the 3
    # partners; with 4 transceivers each stays tuned, and the all-gather reuses them
    t, net = allreduce_ns("sipring", N, S, "hd", wavelengths=64, degree=4, reconfig_ns=5_000)
    sizes = [S // 2, S // 4, S // 8]
    steps = [*sizes, *reversed(sizes)]
    assert t == sum(ns(b) + LAT for b in steps) + 3 * 5_000
    assert net.reconfigs == N * 3 and net.max_lightpaths == 3 and net.blocked == 0


def test_sipml_degree_limits_the_lightpaths_a_node_holds() -> None:
    """Two transceivers for three HD partners: the third partner takes the least recently
    used lightpath (retuned), and the all-gather retunes back. Node I/O is the same
    (2 x 50 Gb/s), so the time differs by the retunes only."""
    t2, net2 = allreduce_ns("sipring", N, S, "hd", wavelengths=64, degree=2,
                            reconfig_ns=5_000)
    t4, _ = allreduce_ns("sipring", N, S, "hd", wavelengths=64, degree=4, reconfig_ns=5_000)
    assert net2.max_lightpaths == 2
    # rs0, rs1 tune; rs2 evicts rs0's; ag2 and ag1 reuse; ag0 evicts again
    assert net2.reconfigs == N * 4 and t2 == t4 + 5_000


def test_sipml_places_the_ring_by_traffic() -> None:
    """SiP-ML's placement: halving-doubling's heaviest partners (xor 1, then xor 2) are
    ring neighbours: a Gray code, not the rank order."""
    ranks = [f"h{i}" for i in range(8)]
    sched = halving_doubling(8, S)
    traffic: dict[tuple[str, str], int] = {}
    for r, steps in enumerate(sched):
        for st in steps:
            for d, b in st.sends:
                traffic[(ranks[r], ranks[d])] = traffic.get((ranks[r], ranks[d]), 0) + b
    assert ring_order(ranks, traffic) == [f"h{i}" for i in (0, 1, 3, 2, 6, 7, 5, 4)]
    assert ring_order(ranks, {}) == ranks
    # the ring all-reduce: rank order is already SiP-ML's
    ring_traffic = {(ranks[i], ranks[(i + 1) % 8]): 1 for i in range(8)}
    assert ring_order(ranks, ring_traffic) == ranks


def test_sipocs_has_no_segments_to_share() -> None:
    # one wavelength per fibre starves SiP-Ring's far partners; SiP-OCS's circuits do not
    # cross segments: HD there costs its closed form at the node rate
    ocs, net = allreduce_ns("sipocs", N, S, "hd", degree=4, reconfig_ns=0, wavelengths=1)
    ring1, _ = allreduce_ns("sipring", N, S, "hd", degree=4, reconfig_ns=0, wavelengths=1)
    sizes = [S // 2, S // 4, S // 8]
    assert ocs == sum(ns(b) + LAT for b in [*sizes, *reversed(sizes)]) < ring1
    assert net.hops("h0", "h5") == 1


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




def test_a_count_action_fire_before_the_host_starts_the_iteration_is_kept() -> None:
    """Reproducer (CI, stop 27): a peer that started iteration 0 first sent this rank its
    step-0 bytes, and the O-NIC's count-action fired before the node program had begun the
    iteration: `module_fired` indexed a table not yet built (IndexError in the interrupt
    handler) and the rank never moved. The fire is now kept for the iteration."""
    loop = VirtualClockLoop()
    clock = Clock(loop)
    sent: list[Flow] = []
    sched = ring(2, 2000)
    engine = CollectiveEngine(clock, sched, ["h0", "h1"], sent.append, nic_sync=True,
                              local=["h0"])
    engine.on_delivered(Flow(1, "h1", "h0", sched[0][0].recv_bytes, 0, 0))
    engine.module_fired("h0", 0)
    engine.start_iteration(0, 1000, lambda t: None)
    loop.run_until_complete(asyncio.sleep(2e-6))  # virtual time: past the compute
    loop.close()
    assert [(f.step, f.dst) for f in sent] == [(0, "h1"), (1, "h1")]  # step 0 done here
    assert engine.step[0] == 1
