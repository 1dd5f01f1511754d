"""Hybrid parallelism (issue 35): GPT-style Transformers split tensor x pipeline x data, as
steps every back end runs; checked against the model, the ranks and the grid."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from oddl.app.cli import main
from oddl.app.experiments.runner import run_experiment
from oddl.controller.base.catalog import TRANSFORMERS
from oddl.controller.base.collectives import check_balanced
from oddl.controller.base.config import ConfigError, load_experiment
from oddl.controller.base.messages import Flow
from oddl.controller.base.parallelism import ACTIVATION_BYTES, Hybrid
from oddl.sim.networks.search import splits
from oddl.sim.networks.topoopt import Topology

from tests.helpers import write_experiment

GRID64 = "hw_configs/grid-64.toml"


def gpt(parallelism: dict[str, int] | None = None, model: str = "gpt2",
        collective: str = "ring", **more: object) -> dict[str, object]:
    w: dict[str, object] = {"model": model, "collective": collective, "epochs": 1,
                            "dataset_samples": 1_000_000, **more}
    if parallelism is not None:
        w["parallelism"] = parallelism
    else:
        w |= {"batch_per_node": 8, "compute_time_ms": 0.0}
    return w


@pytest.mark.parametrize("t, p, d, m", [(4, 2, 8, 4), (2, 3, 2, 5), (1, 4, 1, 2),
                                        (3, 1, 2, 1), (1, 1, 4, 1)])
def test_every_byte_a_step_waits_for_is_sent_to_it(t: int, p: int, d: int, m: int) -> None:
    h = Hybrid("gpt2", t, p, d, m, 1, 312.0)
    check_balanced(h.schedule("ring"))
    check_balanced(h.schedule("hd"))


def test_a_stage_runs_1f1b_and_its_compute_is_the_models_flops() -> None:
    """Stage 0 of 2 runs one forward ahead (warm-up), then alternates; stage 1 alternates
    from the start. A rank's compute adds up to three forward passes of its share."""
    L, hid, _a, s, V = TRANSFORMERS["gpt2"]
    h = Hybrid("gpt2", 2, 2, 1, 3, 2, 100.0)
    sched = h.schedule("ring")
    order = []
    for st in sched[0]:  # rank 0: stage 0, tensor 0
        if st.phase.startswith("pp-"):
            order.append(st.phase)
    assert order == ["pp-send-act", "pp-send-act", "pp-recv-grad", "pp-send-act",
                     "pp-recv-grad", "pp-recv-grad"]
    b = 2
    layer = 24 * b * s * hid * hid + 4 * b * s * s * hid
    for r, head in ((0, 0), (2, 2 * b * s * hid * V)):  # stage 0; stage 1 has the logits
        want = 3 * h.micro_batches * (L // 2 * layer + head) / 2 / (100e12) * 1e9
        got = sum(st.compute_ns for st in sched[r])
        assert abs(got - want) / want < 1e-3, (r, got, want)
    # a pipeline send counts at the receiver's receive: after its own, not in lockstep
    sends = [(k, st) for k, st in enumerate(sched[0]) if st.phase == "pp-send-act"]
    assert sends[1][1].at[0] != sends[1][0]
    assert sched[2][sends[1][1].at[0]].recv_bytes == b * s * hid * ACTIVATION_BYTES


def test_gpt_on_grid64_tensor4_pipeline2_data8_runs_clean_with_more_flows(
        root: Path, tmp_path: Path) -> None:
    """The issue's check: 64 ranks, T = 4, P = 2, D = 8, on sim: 0 violations, and more
    flows an iteration than the same model trained data-parallel."""
    par = {"tensor": 4, "pipeline": 2, "data": 8, "micro_batches": 2}
    runs = {}
    for name, w in (("hybrid", gpt(par)), ("data", gpt())):
        exp = write_experiment(tmp_path / f"{name}.toml", root / GRID64, name=name,
                               iterations=1, workload=w)
        runs[name] = run_experiment(load_experiment(exp), iterations=1, checker_mode="raise")
    hyb, dp = runs["hybrid"].networks["oddl"], runs["data"].networks["oddl"]
    assert runs["hybrid"].invariant_violations == 0 and not hyb.disturbed, hyb.disturbance
    assert hyb.flows > dp.flows == 2 * 63 * 64
    # tensor rings (2 x 3 steps, 4 sublayer all-reduces a layer and pass, 6 layers a
    # stage), pipeline transfers, the data-parallel rings of 8
    tp = 64 * 2 * 2 * (2 * 6) * 6
    assert hyb.flows == tp + 2 * 2 * 32 + 64 * 14
    assert "FLOPs" in runs["hybrid"].calibration


def test_plan_reports_every_nodes_degree_and_the_groups(root: Path, tmp_path: Path) -> None:
    exp = write_experiment(tmp_path / "h.toml", root / GRID64, workload=gpt(
        {"tensor": 4, "pipeline": 2, "data": 8}))
    r = CliRunner().invoke(main, ["plan", str(root / GRID64), "--job", str(exp), "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert len(out["degree"]) == 64 and out["over_degree"] == []
    assert 0 < max(out["degree"].values()) <= out["degree_limit"] == 4
    groups = out["parallelism"]
    assert len(groups["tensor"]) == 16 and all(len(g["rows"]) == 1 for g in groups["tensor"])
    assert all(len(g["nodes"]) == 8 for g in groups["data"])
    r = CliRunner().invoke(main, ["plan", str(root / GRID64), "--job", str(exp)])
    assert "optical degree" in r.output and "tensor groups: n0-0 n0-1 n0-2 n0-3 (row 0)" \
        in r.output


@pytest.mark.parametrize("par, model, collective, field, why", [
    ({"tensor": 4, "pipeline": 2, "data": 4}, "gpt2", "ring", "workload.parallelism",
     "= 32 ranks, but the job has 64"),
    ({"tensor": 16, "pipeline": 1, "data": 4}, "gpt2", "ring", "workload.parallelism.tensor",
     "straddle two rows"),
    ({"tensor": 8, "pipeline": 1, "data": 8}, "gpt2", "ring", "workload.parallelism.tensor",
     "12 attention heads do not split over 8"),
    ({"tensor": 2, "pipeline": 2, "data": 16}, "gpt2", "hier2d", "workload.collective",
     "hier2d needs"),
    ({"tensor": 4, "pipeline": 2, "data": 8, "micro_batches": 4096}, "gpt2", "ring",
     "workload.parallelism", "steps an iteration over the ranks"),
])
def test_a_split_that_cannot_be_is_a_config_error_naming_the_field(
        root: Path, tmp_path: Path, par: dict[str, int], model: str, collective: str,
        field: str, why: str) -> None:
    exp = write_experiment(tmp_path / "bad.toml", root / GRID64,
                           workload=gpt(par, model, collective))
    with pytest.raises(ConfigError) as e:
        load_experiment(exp)
    assert any(i.path == field and why in i.reason for i in e.value.issues), e.value.issues


def test_a_split_the_model_cannot_take(root: Path, tmp_path: Path) -> None:
    exp = write_experiment(tmp_path / "p.toml", root / GRID64, workload=gpt(
        {"tensor": 1, "pipeline": 32, "data": 2}, "gpt3-1.3b"))
    with pytest.raises(ConfigError) as e:
        load_experiment(exp)
    assert [(i.path, "24 layers do not split into 32" in i.reason) for i in e.value.issues] \
        == [("workload.parallelism.pipeline", True)]
    exp = write_experiment(tmp_path / "r.toml", root / GRID64, workload=gpt(
        {"data": 64}, "resnet50"))
    with pytest.raises(ConfigError, match="resnet50 is not a Transformer"):
        load_experiment(exp)
    exp = write_experiment(tmp_path / "b.toml", root / GRID64, workload=gpt(
        {"data": 64}, batch_per_node=4))
    with pytest.raises(ConfigError, match="give no batch_per_node"):
        load_experiment(exp)


def test_the_timeline_shows_each_ranks_tensor_pipeline_and_data_phases(
        root: Path, tmp_path: Path) -> None:
    exp = write_experiment(tmp_path / "t.toml", root / GRID64, iterations=1, workload=gpt(
        {"tensor": 2, "pipeline": 2, "data": 2, "micro_batches": 2}, ranks=8))
    out = tmp_path / "trace.json"
    r = CliRunner().invoke(main, ["run", str(exp), "--trace", str(out),
                                  "--trace-iterations", "1"])
    assert r.exit_code == 0, r.output
    events = json.loads(out.read_text())["traceEvents"]
    phases = [e for e in events if e.get("cat") == "phase"]
    assert all(e["dur"] > 0 for e in phases)
    names = {e["name"].split("-")[0] for e in phases}
    assert names == {"compute", "tp", "pp", "dp"}
    threads = {e["pid"] for e in events if e.get("name") == "thread_name"
               and e["args"]["name"] == "phases"}
    assert len(threads) == 8  # one track per rank


def test_topoopt_topology_gives_each_model_parallel_pair_a_fibre() -> None:
    h = Hybrid("gpt2", 4, 2, 2, 2, 1, 312.0)
    topo = Topology.of(h, 4)
    # tensor rings: 4 groups x 4 fibres; pipelines: 8 pairs, both ways; data: 8 groups of
    # 2 on the 2 ports left (4 - tensor - pipeline), where TotientPerms has one jump
    assert topo.mp_ports == 2 and topo.dp_jumps == (1,)
    assert len(topo.links) == 16 + 16 + 16
    with pytest.raises(ValueError, match="none is left for the data-parallel"):
        Topology.of(Hybrid("gpt2", 4, 3, 2, 3, 1, 312.0), 3)


def test_splits_follow_the_model_and_the_row() -> None:
    assert [str(s) for s in splits("gpt2", 8, cols=4)] == [
        "T1 P1 D8", "T1 P2 D4", "T1 P4 D2", "T2 P1 D4", "T2 P2 D2", "T2 P4 D1",
        "T4 P1 D2", "T4 P2 D1"]  # no T8: a group of 8 does not keep to a row of 4


def test_search_finds_a_split_whose_run_takes_the_predicted_time(
        root: Path, tmp_path: Path) -> None:
    """`oddl plan --search`: TopoOpt's best split (every split timed on its own
    topology, and the alternation) and SiP-Ring's within its degree; running the found
    split on TopoOpt takes the time the search predicted."""
    import tomli_w

    exp = tmp_path / "s.toml"
    body = {"name": "s", "testbed": str(root / GRID64), "iterations": 1,
            "workload": gpt({"data": 8, "micro_batches": 2}, ranks=8),
            "networks": [{"name": "topoopt", "kind": "topoopt", "degree": 3,
                          "collective": "totientrings"},
                         {"name": "sipring", "kind": "sipring", "degree": 2}]}
    exp.write_text(tomli_w.dumps(body))
    r = CliRunner().invoke(main, ["plan", str(root / GRID64), "--job", str(exp), "--search",
                                  "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    topo, sip = out["topoopt"], out["sipring"]
    own = topo["rounds"][-1]
    assert topo["iteration_ms"] == min(c["iteration_ms"] for c in own if c["iteration_ms"])
    assert topo["rounds"][0][0] | {"iteration_ms": 0} == {
        "tensor": 1, "pipeline": 1, "data": 8, "iteration_ms": 0}  # it starts from DP
    over = [c for c in sip["rounds"][0] if c["iteration_ms"] is None]
    assert over and all("lightpaths a GPU, more than its 2" in c["why_not"] for c in over)
    assert sip["best"] not in [{k: c[k] for k in ("tensor", "pipeline", "data")}
                               for c in over]
    best = topo["best"]
    body["workload"] = gpt({**best, "micro_batches": 2}, ranks=8)
    body["networks"] = body["networks"][:1]
    exp.write_text(tomli_w.dumps(body))
    res = run_experiment(load_experiment(exp), iterations=1, checker_mode="raise")
    assert res.networks["topoopt"].iteration_time_s * 1e3 == pytest.approx(
        topo["iteration_ms"], abs=1e-5)
    r = CliRunner().invoke(main, ["plan", str(root / GRID64), "--job",
                                  str(root / "experiments/table1-resnet50.toml"), "--search"])
    assert r.exit_code == 2 and "splits a Transformer" in r.output


def test_a_node_refuses_a_split_it_must_not_build() -> None:
    """A job's split comes over the bus: a node builds its schedule only for a split its
    ranks and model allow, within the bound on a schedule's size."""
    import msgspec
    from oddl.controller.stage2.control_unit import Timing
    from oddl.controller.stage2.job import JOB_VERSION, JobSpec, refused

    ranks = [f"n{i}" for i in range(8)]
    spec = JobSpec(v=JOB_VERSION, job="j", collective="ring", size=0, rows=2, cols=4, degree=4,
                   bidirectional=False, ranks=ranks, nodes=ranks, iterations=1, compute_ns=0,
                   nic_sync=False, timing=Timing(11, 2, 50, 1000, 1000, 1000, 3), routes={},
                   hybrid=Hybrid("gpt2", 2, 2, 2, 2, 1, 312.0))
    assert refused(spec) is None
    for h, why in ((Hybrid("gpt2", 2, 2, 4, 2, 1, 312.0), "a split of 16 ranks"),
                   (Hybrid("gpt2", 8, 1, 1, 2, 1, 312.0), "12 attention heads"),
                   (Hybrid("gpt2", 2, 2, 2, 60000, 1, 312.0), "steps an iteration")):
        assert why in (refused(msgspec.structs.replace(spec, hybrid=h)) or "")


def test_the_arbiter_takes_a_hybrid_job_and_refuses_a_split_the_testbed_cannot(
        root: Path) -> None:
    from oddl.app.submission import Refused, job_request
    from oddl.controller.base.config import load_testbed
    from oddl.controller.base.topology import Grid

    tb = load_testbed(root / GRID64)
    grid = Grid.from_testbed(tb)
    text = """name = "h"
iterations = 2
[workload]
model = "gpt2"
collective = "ring"
epochs = 1
dataset_samples = 1000
ranks = 16
parallelism = { tensor = 4, pipeline = 2, data = %d }
"""
    req = job_request(text % 2, grid, tb, "alice-1", 0)
    assert req.hybrid is not None and req.group == 4 and req.compute_ns == 0
    with pytest.raises(Refused, match="= 32 ranks, but the job has 16"):
        job_request(text % 4, grid, tb, "alice-2", 0)


def test_a_hybrid_iteration_cut_short_goes_on_with_what_was_delivered() -> None:
    """Recovery keeps the iteration (issue 34) for a pipeline too, whose flows count at
    the receiver's step, not their sender's: the carry names each delivered flow by its
    sender's step, and the resumed iteration sends only the rest."""
    import asyncio

    from oddl.controller.base.clock import Clock
    from oddl.controller.stage2.workloads import CollectiveEngine
    from oddl.sim.clock import VirtualClockLoop

    h = Hybrid("gpt2", 2, 2, 2, 2, 1, 312.0)
    sched = h.schedule("ring")
    ranks = [f"n{i}" for i in range(h.ranks)]
    total = sum(len(st.sends) for steps in sched for st in steps)

    def engine(clock: Clock) -> tuple[CollectiveEngine, list[int]]:
        sent: list[int] = []
        eng: CollectiveEngine

        def submit(f: Flow) -> None:
            sent.append(f.id)
            clock.call_later_ns(20_000, eng.on_delivered, f)

        eng = CollectiveEngine(clock, sched, ranks, submit)
        return eng, sent

    loop = VirtualClockLoop()
    clock = Clock(loop)
    first, _sent = engine(clock)
    first.start_iteration(0, 0, lambda t: None)
    loop.run_until_complete(asyncio.sleep(0.004))  # cut short mid-iteration
    first.halted = True
    carry = first.carry_of(0)
    assert carry is not None and 0 < len(carry[1]) < total
    done: asyncio.Future[int] = loop.create_future()
    second, sent2 = engine(clock)
    second.start_iteration(0, 0, done.set_result, carry[1], carry[0])
    loop.run_until_complete(done)
    loop.close()
    assert len(sent2) == total - len(carry[1])


def test_a_hybrid_job_among_several_keeps_each_tensor_group_in_a_row(
        root: Path, tmp_path: Path) -> None:
    """[[jobs]]: a hybrid job's rectangle is as wide as a whole number of its tensor
    groups (the testbed's row need not be), and the job runs."""
    import tomli_w

    exp = tmp_path / "jobs.toml"
    exp.write_text(tomli_w.dumps({
        "name": "mj", "testbed": str(root / GRID64),
        "jobs": [{"name": "gpt", "model": "gpt2", "ranks": 12, "iterations": 2,
                  "parallelism": {"tensor": 3, "pipeline": 2, "data": 2,
                                  "micro_batches": 2}},
                 {"name": "resnet", "model": "resnet50", "ranks": 8, "iterations": 2}],
        "networks": [{"name": "oddl", "kind": "oddl"}]}))
    r = CliRunner().invoke(main, ["plan", str(root / GRID64), "--job", str(exp), "--json"])
    assert r.exit_code == 0, r.output
    jobs = json.loads(r.output)["jobs"]
    assert set(jobs["gpt"]["degree"]) >= set(jobs["gpt"]["partition"]["ranks"])
    gpt = jobs["gpt"]["partition"]
    # 3 x 4 would be squarer; a tensor group of 3 keeps to a row of a 4 x 3 rectangle
    assert (len(gpt["rows"]), len(gpt["cols"])) == (4, 3)
    res = run_experiment(load_experiment(exp), checker_mode="raise")
    assert res.invariant_violations == 0 and res.jobs["gpt"]["oddl"]["iterations"] == 2
