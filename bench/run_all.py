"""oddl benchmarks: figures printed, nothing asserted. `python bench/run_all.py [--quick]`.

- simulated events per second (Table 1 ODDL network, model events on the virtual loop)
- wall time of the full 20-epoch Table 1 run (both networks, with the results store)
- one ResNet-50 HD iteration on grid-4096, every flow through the control units
- the stage-1 plan for grid-4096
- control messages per flow at 16, 256 and 4096 nodes
- O-NIC register operations per second through pynq MMIO to the in-process emulated board
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from oddl.app.api import grid_testbed, network, run  # noqa: E402
from oddl.controller.base.collectives import build  # noqa: E402
from oddl.controller.base.config import load_experiment, load_testbed  # noqa: E402
from oddl.controller.base.topology import Grid  # noqa: E402
from oddl.controller.stage2.workloads import model_spec  # noqa: E402

RESNET = model_spec("resnet50").grad_bytes()


def events_per_second(iterations: int) -> dict[str, float]:
    ctx = load_experiment(ROOT / "experiments/table1-resnet50.toml")
    with network(ctx, ctx.experiment.networks[0].name, iterations, 220_000_000) as net:
        t = time.perf_counter()
        net.admission.run()
        wall = time.perf_counter() - t
        ev = net.backend.loop.events  # type: ignore[attr-defined]
    return {"iterations": iterations, "events": ev, "wall_s": wall, "events_per_s": ev / wall}


def table1_full() -> dict[str, float]:
    ctx = load_experiment(ROOT / "experiments/table1-resnet50.toml")
    with tempfile.TemporaryDirectory() as d:
        t = time.perf_counter()
        res = run(ctx, out=Path(d) / "run")
        wall = time.perf_counter() - t
    return {"wall_s": wall, "ratio": res.ratio or 0.0,
            "oddl_min": res.networks["oddl"].training_time_s / 60,
            "electrical_min": res.networks["electrical"].training_time_s / 60,
            "iterations": res.iterations}


def grid4096_iteration() -> dict[str, float]:
    ctx = load_experiment(ROOT / "experiments/grid4096-resnet50-hd.toml")
    t = time.perf_counter()
    with network(ctx, ctx.experiment.networks[0].name, 1, 0) as net:
        setup = time.perf_counter() - t  # the back end and the inventory
        t = time.perf_counter()
        [rec] = net.admission.run().values()  # stage 1 (plan, apply) and one iteration
        wall = time.perf_counter() - t
        return {"setup_s (open, inventory)": setup, "plan_s": net.stage1.plan_s,
                "iteration_wall_s (plan, apply, run)": wall,
                "flows": net.admission.outcomes[0].flows,
                "events": net.backend.loop.events,  # type: ignore[attr-defined]
                "allreduce_ms (virtual)": rec.iteration_ns[0] / 1e6,
                "violations": len(net.backend.monitor.violations)}


def plan4096() -> dict[str, float]:
    from oddl.controller.stage1.planner import plan_job

    tb = load_testbed(ROOT / "hw_configs/grid-4096.toml")
    grid = Grid.from_testbed(tb)
    sched = build("hd", tb.n_nodes, RESNET, 64, 64)
    t = time.perf_counter()
    p = plan_job(tb, grid, sched, strategy="matched")
    plan_s = time.perf_counter() - t
    t = time.perf_counter()
    p.validate(grid)
    val_s = time.perf_counter() - t
    return {"plan_s": plan_s, "validate_s": val_s, "routes": sum(map(len, p.routes.values())),
            "channels": len(p.jobs[0].channels)}


def messages_per_flow(sizes: list[int]) -> list[dict[str, float]]:
    out = []
    for side in sizes:
        tb = grid_testbed(side, side, wavelengths=max(side - 1, 1))
        n = side * side
        for coll in ("hd", "ring"):
            if coll == "ring" and n > 256:
                continue  # ring on 4096 nodes is 8190 steps: not an HD-scale benchmark
            from oddl.controller.base.config import Experiment, LoadedExperiment

            exp = Experiment.model_validate({
                "name": "m", "testbed": "-", "workload": {
                    "model": "resnet50", "collective": coll, "epochs": 1,
                    "dataset_samples": 1, "batch_per_node": 1, "compute_time_ms": 0},
                "networks": [{"name": "oddl", "kind": "oddl", "strategy": "matched"}]})
            ctx = LoadedExperiment(Path("-"), exp, Path("-"), tb)
            with network(ctx, exp.networks[0].name, 1, 0) as net:
                net.admission.run()
                o = net.admission.outcomes[0]
            flows, msgs = o.flows, o.control_messages
            hops = flows + o.stats["relayed"]
            out.append({"nodes": n, "collective": coll, "flows": flows, "hops": hops,
                        "messages": msgs, "per_flow": msgs / flows, "per_hop": msgs / hops,
                        "per_node": msgs / n})
    return out


def register_ops(n: int = 50_000) -> dict[str, float]:
    """pynq MMIO write+read pairs on an emulated board (the sim back end's register path)."""
    from oddl.controller.base.clock import Clock
    from oddl.fpga import regmap as R
    from oddl.sim.backend import build
    from oddl.sim.clock import VirtualClockLoop

    tb = grid_testbed(2, 2)
    world = build(tb, Grid.from_testbed(tb), Clock(VirtualClockLoop()))
    m = world.onics["n0-0"].d.mmio
    off = R.BY_NAME["NODE_ID"].offset
    t = time.perf_counter()
    for i in range(n):
        m.write(off, i)
        m.read(off)
    wall = time.perf_counter() - t
    return {"pairs": n, "ops_per_s": 2 * n / wall, "write_read_pairs_per_s": n / wall}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="skip the full Table 1 run")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    res: dict[str, object] = {}
    print("register operations through pynq MMIO (in-process emulated O-NIC) ...", flush=True)
    res["registers"] = register_ops()
    print(" ", res["registers"], flush=True)
    print("events/s (Table 1 ODDL, 5000 iterations) ...", flush=True)
    res["events"] = events_per_second(5000)
    print(" ", res["events"], flush=True)
    if not a.quick:
        print("full 20-epoch Table 1 run (both networks, with store) ...", flush=True)
        res["table1"] = table1_full()
        print(" ", res["table1"], flush=True)
    print("stage-1 plan, grid-4096 ...", flush=True)
    res["plan4096"] = plan4096()
    print(" ", res["plan4096"], flush=True)
    print("one ResNet-50 HD iteration on grid-4096 through the control units ...", flush=True)
    res["grid4096"] = grid4096_iteration()
    print(" ", res["grid4096"], flush=True)
    print("control messages per flow (HD and ring, one iteration) ...", flush=True)
    res["messages"] = messages_per_flow([4, 16, 64])
    for row in res["messages"]:  # type: ignore[union-attr]
        print("  ", row, flush=True)
    if a.json:
        print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
