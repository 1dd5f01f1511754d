"""A job's communication profile on each link it uses, measured from a simulated run.

The job runs alone on the network model (the same collective engine and flow solver as a
run), for two iterations; the links its flows cross are watched, and the second
iteration's load on each, as a fraction of the link, is its profile (controller/stage1/compat.py):
an iteration that starts as every later one does, not the first.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from oddl.controller.base.clock import Clock
from oddl.controller.base.collectives import Schedule
from oddl.controller.base.config import NetworkSpec
from oddl.controller.base.messages import Flow
from oddl.controller.stage1.compat import Profile
from oddl.controller.stage2.workloads import CollectiveEngine
from oddl.sim.clock import VirtualClockLoop
from oddl.sim.networks.baselines import build_network

SLOTS = 1000  # a profile's resolution: slots per iteration


def link_profiles(spec: NetworkSpec, nodes: list[str], line_rate_gbps: float, name: str,
                  ranks: Sequence[str], schedule: Schedule, compute_ns: int
                  ) -> dict[object, Profile]:
    """Each link the job's flows cross, and the job's demand on it over one iteration.
    The job runs on a virtual clock of its own, in a thread of its own: the multi-job
    runner asks from inside its running loop (its clock stands still meanwhile)."""
    with ThreadPoolExecutor(1, thread_name_prefix="oddl-profile") as ex:
        return ex.submit(_measure, spec, nodes, line_rate_gbps, name, ranks, schedule,
                         compute_ns).result()


def _measure(spec: NetworkSpec, nodes: list[str], line_rate_gbps: float, name: str,
             ranks: Sequence[str], schedule: Schedule, compute_ns: int
             ) -> dict[object, Profile]:
    loop = VirtualClockLoop()
    try:
        clock = Clock(loop)
        engine: CollectiveEngine
        net = build_network(spec, clock, nodes, line_rate_gbps, lambda f: engine.on_delivered(f))
        engine = CollectiveEngine(clock, schedule, list(ranks), net.submit)
        links = {link for r, steps in enumerate(schedule) for st in steps for d, _b in st.sends
                 for link in net.path(Flow(0, ranks[r], ranks[d], 1, 0, 0, 0, 0))}
        for link in links:
            net.watch(link)
        marks: list[int] = []
        done = loop.create_future()

        def next_iteration(t: int) -> None:
            marks.append(t)
            if len(marks) == 3:
                done.set_result(None)
            else:
                engine.start_iteration(len(marks) - 1, compute_ns, next_iteration)

        async def finished() -> None:  # (bounded: a schedule that never ends raises)
            async with asyncio.timeout(1e6):
                await done

        clock.call_soon(next_iteration, 0)
        loop.run_until_complete(finished())
        t0, t1 = marks[1], marks[2]
        return {link: Profile(name, (t1 - t0) / 1e6,
                              _slots(net.watched[link], t0, t1, net.capacity[link]))
                for link in sorted(links, key=repr)}
    finally:
        loop.close()


def _slots(series: list[tuple[int, float]], t0: int, t1: int, capacity: float
           ) -> tuple[float, ...]:
    """A step function (time, load) averaged over SLOTS equal slots of [t0, t1)."""
    edges = np.linspace(t0, t1, SLOTS + 1)
    times = np.array([t for t, _ in series] + [t1], dtype=float)
    loads = np.array([x for _, x in series], dtype=float)
    # the load's integral at each edge, from the step function
    cum = np.concatenate([[0.0], np.cumsum(loads * np.diff(times))])
    at = np.interp(edges, times, cum)
    return tuple(np.round(np.diff(at) / np.diff(edges) / capacity, 6).tolist())


def on_a_link(jobs: Sequence[tuple[str, str, int]], link_gbps: float,
              collective: str = "ring", batch_per_node: int = 32, overlap: bool = False
              ) -> list[Profile]:
    """`oddl compat --job MODEL[:RANKS] --link-gbps R`: each (name, model, ranks) job alone
    on a two-rack network whose racks are joined by one link of R Gb/s, half its ranks in
    each rack (a ring crosses the link once each way), and its measured demand on that
    link (rack 0 to rack 1). `overlap`: DDP's buckets all-reduced while backward runs
    (controller/base/ddp.py)."""
    from oddl.controller.base.ddp import ddp_overlap
    from oddl.controller.base.layers import layer_table
    from oddl.controller.stage2.job import built_schedule
    from oddl.controller.stage2.workloads import alltoall_bytes, compute_ms, model_spec

    half = max((r + 1) // 2 for _n, _m, r in jobs)
    nodes = [f"r{k}-{i}" for k in (0, 1) for i in range(half)]
    spec = NetworkSpec(name="link", kind="fattree", hosts_per_leaf=half, spines=1,
                       oversubscription=half, latency_ns=0)  # the racks' link: R
    out = []
    for name, model, r in jobs:
        ranks = nodes[:(r + 1) // 2] + nodes[half:half + r // 2]
        compute = round(compute_ms(model, batch_per_node) * 1e6)
        ov = ddp_overlap(layer_table(model), batch_per_node, compute_ns=compute) \
            if overlap else None
        schedule = built_schedule(collective, r, model_spec(model).grad_bytes()
                                  if ov is None else ov.nbytes, 1, r,
                                  spec.degree, spec.bidirectional,
                                  alltoall_bytes(model, batch_per_node, r), overlap=ov)
        measured = link_profiles(spec, nodes, link_gbps, name, ranks, schedule, compute)
        out.append(measured[("l2s", 0, 0)])
    return out
