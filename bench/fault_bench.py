"""Fault drills at scale, in the sim back end: the issue-14 targets, printed (never asserted).

    python bench/fault_bench.py [--quick]

1. detection: a dead board found by heartbeat silence, in heartbeat periods;
2. re-plan + apply + read back for grid-1024 round a dead relay, controller wall time;
3. a 1024-node VGG-19 run (HD) with a node dying at iteration 3 of 10, shrink policy;
4. the Table 1 experiment with control-loss at 5% for its whole (simulated) length:
   flows and violations against the clean run.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from oddl.app.experiments.runner import run_experiment
from oddl.controller.base.collectives import build
from oddl.controller.base.config import (
    Experiment,
    FaultSpec,
    LoadedExperiment,
    load_experiment,
    load_testbed,
)
from oddl.controller.base.topology import Grid
from oddl.controller.stage1.arbiter import Arbiter
from oddl.controller.stage1.planner import Avoid
from oddl.sim.backend import SimBackend

ROOT = Path(__file__).resolve().parent.parent


def with_faults(ctx: LoadedExperiment, faults: list[dict], **exp: object) -> LoadedExperiment:
    e = ctx.experiment.model_copy(update={"faults": [FaultSpec(**f) for f in faults], **exp})
    return LoadedExperiment(ctx.path, e, ctx.testbed_path, ctx.testbed)


def replan_1024() -> None:
    tb = load_testbed(ROOT / "hw_configs" / "grid-1024.toml")
    grid = Grid.from_testbed(tb)
    b = SimBackend(tb, grid)
    arb = Arbiter(tb, grid, b.onics, b.wss)
    sched = build("hd", 1024, 100_000_000, tb.grid.rows, tb.grid.cols)
    arb.apply(arb.plan(sched, "matched"))  # 20 HD steps: more than the 16 modules
    # a dead relay that is no rank: 512 ranks on a checkerboard, so that row-first pairs
    # relay through the other colour; the busiest such relay dies
    ranks = [n for n in grid.nodes if sum(grid.coord[n]) % 2 == 0]
    sched = build("hd", 512, 100_000_000, tb.grid.rows, tb.grid.cols)
    before = arb.plan(sched, "matched", ranks=ranks)
    arb.apply(before)
    hops: dict[str, int] = {}
    for rs in before.routes.values():
        for r in rs.values():
            if r.next_hop not in ranks:
                hops[r.next_hop] = hops.get(r.next_hop, 0) + 1
    dead = max(hops, key=hops.__getitem__)
    t0 = time.perf_counter()
    plan = arb.plan(sched, "matched", ranks=ranks, avoid=Avoid(frozenset({dead})))
    t1 = time.perf_counter()
    arb.apply(plan)
    t2 = time.perf_counter()
    via = sum(1 for rs in plan.routes.values() for r in rs.values() if r.next_hop == dead)
    print(f"re-plan grid-1024 (512-rank HD) round dead relay {dead} ({hops[dead]} routes "
          f"through it): plan {t1 - t0:.3f} s, "
          f"apply + read back {t2 - t1:.3f} s, total {t2 - t0:.3f} s controller time; "
          f"routes through {dead} afterwards: {via}")
    b.close()


def run(ctx: LoadedExperiment, iterations: int) -> None:
    t = time.perf_counter()
    res = run_experiment(ctx, iterations=iterations, checker_mode="record")
    r = res.networks["oddl"]
    print(f"  {ctx.experiment.name}: {r.iterations} iterations, {r.flows} flows, "
          f"{res.invariant_violations} violations, iteration {r.iteration_time_s * 1e3:.3f} ms, "
          f"fault time {r.fault_time_s * 1e3:.1f} ms, wall {time.perf_counter() - t:.1f} s")
    for f in r.faults:
        period = ctx.testbed.monitor.heartbeat_ms * 1e6
        det = f["detected_after_ns"]
        rec = "-" if f["recovered_after_ns"] is None else f"{f['recovered_after_ns'] / 1e6:.1f} ms"
        print(f"    {f['kind']} {f['target']}: detected after "
              f"{'-' if det is None else f'{det / 1e6:.1f} ms ({det / period:.2f} periods)'}, "
              f"recovered after {rec}, "
              f"re-plans {f['replans']}, iterations lost {f['iterations_lost']}, "
              f"flows retried {f['flows_retried']}")


def main() -> None:
    quick = "--quick" in sys.argv
    t1 = load_experiment(ROOT / "experiments" / "table1-resnet50.toml")
    print("1. detection (Table 1 testbed, heartbeat 100 ms; dead board at iteration 3)")
    run(with_faults(t1, [{"kind": "dead-board", "target": "n2", "at_iteration": 3}],
                    recovery="shrink", name="t1-dead-n2"), 8)
    print("2. re-plan + apply")
    replan_1024()
    print("4. Table 1 with control-loss 5% for the whole run")
    n = 20 if quick else 200
    run(with_faults(t1, [], name="t1-clean"), n)
    run(with_faults(t1, [{"kind": "control-loss", "target": "bus",
                          "drop_probability": 0.05}], name="t1-loss5"), n)
    if not quick:
        print("3. 1024-node VGG-19, HD, a node dying at iteration 3 of 10 (shrink)")
        tb_path = ROOT / "hw_configs" / "grid-1024.toml"
        exp = Experiment.model_validate({  # the jocn-1024-vgg19 sweep's ODDL point
            "name": "vgg19-1024-dead", "testbed": str(tb_path), "recovery": "shrink",
            "workload": {"model": "vgg19", "collective": "hd", "epochs": 1,
                         "dataset_samples": 1_281_167, "batch_per_node": 32,
                         "compute_time_ms": 132.0},
            "networks": [{"name": "oddl", "kind": "oddl", "strategy": "matched"}],
            "faults": [{"kind": "dead-board", "target": "n5-7", "at_iteration": 3}]})
        run(LoadedExperiment(tb_path, exp, tb_path, load_testbed(tb_path)), 10)


if __name__ == "__main__":
    main()
