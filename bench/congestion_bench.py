"""The congestion-control model (sim/networks/congestion.py, issue 36): what an incast of N flows
into one 100 Gb/s port does under each law, and what the model costs in wall time.

    python bench/congestion_bench.py [--tick-us T]

For N = 2, 8, 32 senders of 4 MB each: the completion of the last against the fluid
ideal (N x 4 MB at the line rate), the first's, the law's reactions, the deepest queue,
and the wall time per simulated millisecond. Printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from oddl.controller.base.clock import Clock
from oddl.controller.base.messages import Flow
from oddl.sim.clock import VirtualClockLoop
from oddl.sim.networks.congestion import CongestionControl
from oddl.sim.networks.electrical import ElectricalSwitch

RATE = 100.0
SIZE = 4_000_000


def incast(law: str, n: int, tick_ns: int) -> dict[str, float]:
    loop = VirtualClockLoop()
    clock = Clock(loop)
    net = ElectricalSwitch(clock, [f"h{i}" for i in range(n + 1)], RATE, 1000.0,
                           lambda f: None)
    cc = CongestionControl(law, tick_ns, seed=1)
    net.sharing = cc
    cc.attach(net)
    done: dict[int, int] = {}
    net.deliver = lambda f: done.setdefault(f.id, clock.now_ns())  # type: ignore[method-assign]
    for i in range(n):
        net.submit(Flow(i, f"h{i}", f"h{n}", SIZE))
    t = time.perf_counter()
    loop.run_until_complete(loop.create_task(asyncio.sleep(0.05)))
    wall = time.perf_counter() - t
    loop.close()
    ideal = n * SIZE * 8 / RATE
    last = max(done.values())
    return {"last_vs_ideal": last / ideal, "first_vs_last": min(done.values()) / last,
            "cnps": cc.stats["cnps"], "losses": cc.stats["losses"],
            "max_queue_kb": cc.stats["max_queue_bytes"] / 1e3,
            "wall_ms_per_sim_ms": wall * 1e3 / (last / 1e6)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tick-us", type=float, default=2.0)
    a = ap.parse_args()
    tick = round(a.tick_us * 1e3)
    print(f"incast of N x {SIZE // 1_000_000} MB into one {RATE:.0f} Gb/s port, "
          f"{a.tick_us} us step")
    print("| law | N | last / fluid ideal | first / last | CNPs | losses | deepest queue | "
          "wall ms per simulated ms |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for law in ("tcp", "dcqcn"):
        for n in (2, 8, 32):
            r = incast(law, n, tick)
            print(f"| {law} | {n} | {r['last_vs_ideal']:.2f}x | {r['first_vs_last']:.2f} | "
                  f"{r['cnps']:.0f} | {r['losses']:.0f} | {r['max_queue_kb']:.0f} KB | "
                  f"{r['wall_ms_per_sim_ms']:.0f} |")


if __name__ == "__main__":
    main()
