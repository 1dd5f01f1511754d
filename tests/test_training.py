"""Training as it runs (issue 82): layer tables from the models' own definitions, DDP's
buckets all-reduced while backward runs, the iteration that results; the model without
overlap left as it was (the golden runs hold that)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from oddl.app.cli import main
from oddl.app.experiments.results import RunStore
from oddl.app.experiments.runner import run_experiment
from oddl.controller.base.accelerators import ACCELERATORS
from oddl.controller.base.catalog import TRANSFORMERS, transformer_params
from oddl.controller.base.collectives import bucketed, build, check_balanced
from oddl.controller.base.config import ConfigError, load_experiment
from oddl.controller.base.ddp import MiB, ddp_overlap
from oddl.controller.base.layers import layer_models, layer_table

from tests.helpers import write_experiment

ROOT = Path(__file__).resolve().parent.parent
PROTO = ROOT / "hw_configs" / "prototype-4node.toml"
# each model's parameters as its definition gives them: torchvision's model cards for
# ResNet-50 and VGG; Hugging Face's BertForPreTraining (BERT-base, -large) and
# GPT2LMHeadModel; DLRM's dense MLPs (docs/model.md)
PARAMS = {"resnet50": 25_557_032, "vgg11": 132_863_336, "vgg16": 138_357_544,
          "vgg19": 143_667_240, "bert": 110_106_428, "bert-large": 336_226_108,
          "gpt2": 124_439_808, "gpt2-xl": 1_557_611_200, "gpt3-1.3b": 1_315_723_264,
          "gpt3-6.7b": 6_658_404_352, "megatron-8.3b": 8_317_040_640, "dlrm": 2_368_897}


@pytest.mark.parametrize("model", sorted(PARAMS))
def test_each_table_holds_its_models_parameters(model: str) -> None:
    t = layer_table(model)
    assert t.params == PARAMS[model] == sum(x.params for x in t.layers)
    assert t.bwd_flops > t.fwd_flops > 0
    if model in TRANSFORMERS:  # the catalog's count, and the final layer norm
        assert t.params == transformer_params(model) + 2 * TRANSFORMERS[model][1]


def test_a_table_ships_for_every_model_and_no_more() -> None:
    assert set(layer_models()) == set(PARAMS)


def test_the_tables_are_what_pytorch_counts_from_the_definitions(tmp_path: Path) -> None:
    """ResNet-50 (torchvision) and DLRM (defined in the script) counted again on the meta
    device: the shipped tables are the script's output (the Transformers need Hugging
    Face's transformers, which the suite does not install: `--check` them by hand)."""
    pytest.importorskip("torch", reason="the test extra installs torch")
    out = subprocess.run([sys.executable, str(ROOT / "experiments" / "layer_tables.py"),
                          "resnet50", "dlrm", "--check"], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.split() == ["resnet50:", "same", "dlrm:", "same"]


def test_buckets_are_ddps() -> None:
    """The buckets PyTorch's reducer builds from the gradients in ready order (the layers
    reversed), 1 MiB first and 25 MiB after, for ResNet-50 and VGG-19."""
    torch = pytest.importorskip("torch", reason="the test extra installs torch")
    import torch.distributed as dist

    for model in ("resnet50", "vgg19"):
        t = layer_table(model)
        tensors = [torch.empty(n, device="meta") for x in reversed(t.layers)
                   for n in reversed(x.tensors)]
        got, _limits = dist._compute_bucket_assignment_by_size(
            tensors, [dist._DEFAULT_FIRST_BUCKET_BYTES, 25 * MiB], [False] * len(tensors),
            list(range(len(tensors))))
        theirs = [4 * sum(tensors[i].numel() for i in b) for b in got]
        ours = [b.nbytes for b in ddp_overlap(t, 32, device="a100").buckets]
        assert ours == theirs, model


def test_a_bucket_is_ready_when_backward_has_passed_its_layers() -> None:
    t = layer_table("vgg19")
    ov = ddp_overlap(t, 32, compute_ns=132_000_000)
    assert ov.problems() == []
    assert ov.nbytes == 4 * t.params
    assert ov.forward_ns == pytest.approx(132e6 * t.fwd_flops / (t.fwd_flops + t.bwd_flops),
                                          abs=1)
    # the classifier's gradients come first, right after forward; the first conv's last
    assert ov.buckets[0].ready_ns - ov.forward_ns < 1e6
    assert ov.buckets[-1].ready_ns == ov.compute_ns
    assert [b.ready_ns for b in ov.buckets] == sorted(b.ready_ns for b in ov.buckets)


def test_an_efficiency_reproduces_its_measurement() -> None:
    t = layer_table("resnet50")
    for a in ACCELERATORS.values():
        per_image_s = (t.fwd_flops + t.bwd_flops) / a.flops_per_s
        assert 1 / per_image_s == pytest.approx(a.resnet50_images_s)
        assert 0 < a.efficiency < 1


def test_a_bucketed_schedule_is_balanced_and_waits_for_each_bucket() -> None:
    ov = ddp_overlap(layer_table("resnet50"), 64, compute_ns=50_000_000)
    sched = bucketed(ov, lambda b: build("hd", 4, b, 1, 4), 4)
    check_balanced(sched)
    for steps in sched:
        waits = [st.ready_ns for st in steps if st.ready_ns]
        assert waits == [b.ready_ns for b in ov.buckets] + [ov.compute_ns]
        assert sum(b for st in steps for _d, b in st.sends) == \
            sum(b for s in build("hd", 4, ov.nbytes, 1, 4)[0] for _d, b in s.sends)


def _run(tmp: Path, overlap: bool, network: str, compute_ms: float) -> tuple[list, list]:
    wl = {"model": "resnet50", "collective": "hd", "epochs": 1, "dataset_samples": 1_000_000,
          "batch_per_node": 64, "compute_time_ms": compute_ms, "overlap": overlap}
    path = write_experiment(tmp / f"e-{overlap}-{network}.toml", PROTO, iterations=3,
                            workload=wl)
    text = path.read_text().replace('kind = "oddl"', f'kind = "{network}"')
    path.write_text(text)
    db = tmp / f"r-{overlap}-{network}.sqlite"
    store = RunStore(db)
    try:
        run_experiment(load_experiment(path), store=store, every_iteration=True)
    finally:
        store.close()
    con = sqlite3.connect(db)
    its = con.execute("SELECT iteration, t_start_ns, t_end_ns FROM iterations "
                      "ORDER BY iteration").fetchall()
    flows = con.execute("SELECT iteration, t_submit_ns, t_deliver_ns FROM flows").fetchall()
    con.close()
    return its, flows


def _union(spans: list[tuple[int, int]], lo: int, hi: int) -> int:
    """How long, within [lo, hi), at least one span is open."""
    total, end = 0, lo
    for a, b in sorted(spans):
        a, b = max(a, end), min(b, hi)
        if b > a:
            total += b - a
            end = b
    return total


@pytest.mark.parametrize("network", ["oddl", "electrical"])
def test_buckets_all_reduce_while_backward_runs(network: str, tmp_path: Path) -> None:
    """A bucket's all-reduce starts before backward ends, and the iteration is compute
    plus communication less the part of it that ran under backward."""
    compute = 20_000_000
    its, flows = _run(tmp_path, True, network, compute / 1e6)
    _, off = _run(tmp_path, False, network, 0.0)
    for i, t0, t1 in its:
        spans = [(a, b) for it, a, b in flows if it == i]
        assert min(a for a, _b in spans) < t0 + compute  # before backward ends
        comm = _union(spans, t0, t1)
        hidden = _union(spans, t0, t0 + compute)
        assert 0 < hidden < comm
        assert t1 - t0 == compute + comm - hidden
    # less than compute, then one all-reduce of the whole gradient
    alone = max(b for _i, _a, b in off) - min(a for _i, a, _b in off)
    assert its[-1][2] - its[-1][1] < compute + alone / 3


def test_the_timeline_shows_the_overlap(tmp_path: Path) -> None:
    wl = {"model": "resnet50", "collective": "hd", "epochs": 1, "dataset_samples": 1_000_000,
          "batch_per_node": 64, "compute_time_ms": 20.0, "overlap": True}
    path = write_experiment(tmp_path / "e.toml", PROTO, iterations=2, workload=wl)
    trace = tmp_path / "t.json"
    res = CliRunner().invoke(main, ["run", str(path), "--out", str(tmp_path / "r"),
                                        "--no-plot", "--trace", str(trace)])
    assert res.exit_code == 0, res.output
    ev = json.loads(trace.read_text())
    ev = ev["traceEvents"] if isinstance(ev, dict) else ev
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev if e.get("name") ==
             "thread_name"}
    backward = [e for e in ev if e.get("ph") == "X" and e["name"] == "backward"
                and names[(e["pid"], e["tid"])] == "compute"]
    allreduce = [e for e in ev if e.get("ph") == "X" and e["name"].startswith("hd-")]
    assert backward and allreduce
    assert any(a["pid"] == b["pid"] and b["ts"] < a["ts"] < b["ts"] + b["dur"]
               for b in backward for a in allreduce)


def test_training_fields_are_checked(tmp_path: Path) -> None:
    base = {"model": "resnet50", "collective": "hd", "epochs": 1, "dataset_samples": 1000,
            "batch_per_node": 64}
    bad = [({**base, "device": "a100", "compute_time_ms": 5.0}, "given: compute_time_ms, "
            "device"),
           ({**base, "device": "tpu", }, "device"),
           ({**base, "compute_time_ms": 1.0, "overlap": True, "bucket_mb": 0}, "bucket_mb"),
           ({**base, "model": "gpt2", "overlap": True, "parallelism": {"data": 4}},
            "overlap: a hybrid split")]
    for k, (wl, why) in enumerate(bad):
        if "parallelism" in wl:
            wl = {k2: v for k2, v in wl.items() if k2 != "batch_per_node"}
        p = write_experiment(tmp_path / f"b{k}.toml", PROTO, workload=wl)
        with pytest.raises(ConfigError) as e:
            load_experiment(p)
        assert why in str(e.value), str(e.value)


def test_a_device_gives_the_compute_from_the_table(tmp_path: Path) -> None:
    wl = {"model": "vgg19", "collective": "hd", "epochs": 1, "dataset_samples": 1000,
          "batch_per_node": 32, "device": "v100"}
    ctx = load_experiment(write_experiment(tmp_path / "d.toml", PROTO, iterations=2,
                                           workload=wl))
    res = run_experiment(ctx)
    t = layer_table("vgg19")
    want = 32 * (t.fwd_flops + t.bwd_flops) / ACCELERATORS["v100"].flops_per_s * 1e9
    assert res.compute_ns == round(want)


def test_a_jobs_link_profile_spreads_over_backward_with_overlap() -> None:
    """CASSINI's profile of a job alone on a link: without overlap its demand starts when
    its compute ends; with DDP's buckets, while backward still runs."""
    from oddl.controller.stage2.workloads import compute_ms
    from oddl.sim.networks.profile import on_a_link

    compute_s = compute_ms("vgg11", 32) / 1e3
    for overlap in (False, True):
        (p,) = on_a_link([("vgg11", "vgg11", 4)], 100.0, overlap=overlap)
        first = next(k for k, x in enumerate(p.demand) if x > 0) / len(p.demand)
        assert (first * p.iteration_ms / 1e3 < compute_s * 0.99) == overlap, (overlap, first)


def test_a_sweep_takes_its_compute_from_a_device_and_overlaps(tmp_path: Path) -> None:
    import tomli_w

    base = {"name": "s", "testbed": str(ROOT / "hw_configs" / "grid-64.toml"),
            "models": ["resnet50"], "nodes": [4], "line_rates_gbps": [100],
            "networks": [{"name": "electrical", "kind": "electrical"}], "device": "a100",
            "reference": "electrical"}
    got = {}
    for on in (False, True):
        path = tmp_path / f"s{on}.toml"
        path.write_text(tomli_w.dumps({**base, "overlap": on}))
        res = CliRunner().invoke(main, ["sweep", str(path), "--jobs", "1", "--out",
                                        str(tmp_path / f"o{on}")])
        assert res.exit_code == 0, res.output
        (got[on],) = json.loads((tmp_path / f"o{on}" / "results.json").read_text())["results"]
    t = layer_table("resnet50")
    compute_ms = 32 * (t.fwd_flops + t.bwd_flops) / ACCELERATORS["a100"].flops_per_s * 1e3
    for on in (False, True):
        assert got[on]["iteration_ms"] == pytest.approx(compute_ms + got[on]["comm_ms"],
                                                        abs=1e-5)
    assert 0 < got[True]["comm_ms"] < got[False]["comm_ms"] / 2  # most of it hidden


def test_an_overlapped_run_ends_in_copies_equal_to_every_iteration(tmp_path: Path) -> None:
    """The exact steady state still applies: Table 1 with DDP's buckets (its compute
    calibrated with overlap) and the recorded step, their copies equal to the full runs."""
    from tests.test_steady import assert_same, both_ways

    exp = tmp_path / "t1.toml"
    exp.write_text((ROOT / "experiments" / "table1-resnet50.toml").read_text().replace(
        'testbed = "../hw_configs/', f'testbed = "{ROOT}/hw_configs/').replace(
        "bytes_per_param = 4", "bytes_per_param = 4\noverlap = true"))
    for path, n in ((exp, 60), (ROOT / "experiments" / "ddp-trace-cpu.toml", 40)):
        (tmp_path / path.stem).mkdir()
        copies, every = both_ways(path, tmp_path / path.stem, iterations=n)
        assert_same(copies, every)
        assert copies["summary"]["steady_state"]["oddl"]["copies"] == n - 4
