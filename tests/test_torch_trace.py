"""A recorded PyTorch step as a workload (issue 82): a two-rank CPU DDP run (gloo),
profiled, read as the job's schedule and run on the simulated testbed; a bad trace is one
line naming the file, the field and why."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from oddl.app.cli import main
from oddl.controller.base.config import ConfigError
from oddl.controller.base.config.recorded import read_recorded

from tests.helpers import write_experiment

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "experiments" / "ddp-mnist-cpu.json"
PROTO = ROOT / "hw_configs" / "prototype-4node.toml"
# the MNIST network's buckets in gradient order: its linear layers (9216 x 128 + 128, then
# 128 x 10 + 10), then its convolutions (1 x 32 x 3 x 3 + 32, 32 x 64 x 3 x 3 + 64), fp32
BUCKETS = [4 * (9216 * 128 + 128 + 128 * 10 + 10), 4 * (32 * 9 + 32 + 64 * 32 * 9 + 64)]


def _experiment(tmp: Path, trace: Path, **more: object) -> Path:
    wl = {"torch_trace": str(trace), "collective": "hd", "epochs": 1,
          "dataset_samples": 60_000, "batch_per_node": 64, **more}
    return write_experiment(tmp / "e.toml", PROTO, iterations=4, workload=wl)


@pytest.mark.realtime
def test_a_recorded_ddp_step_runs_as_the_jobs_schedule(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="the test extra installs torch")
    trace = tmp_path / "step.json"
    rec = subprocess.run([sys.executable, str(ROOT / "experiments" / "record_ddp.py"),
                          str(trace), "--batch", "16"], capture_output=True, text=True,
                         timeout=240)
    assert rec.returncode == 0, rec.stderr[-2000:]
    r = read_recorded(trace)
    assert (r.backend, r.world_size) == ("gloo", 2)
    assert [c.kind for c in r.collectives] == ["all_reduce", "all_reduce"]
    assert [c.nbytes for c in r.collectives] == BUCKETS
    ov = r.overlap
    # launched while backward ran, in the order their gradients were ready
    assert ov.forward_ns < ov.buckets[0].ready_ns < ov.buckets[1].ready_ns <= ov.compute_ns
    out = tmp_path / "run"
    res = CliRunner().invoke(main, ["run", str(_experiment(tmp_path, trace)), "--out",
                                    str(out), "--no-plot", "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads((out / "summary.json").read_text())
    # compute to backward's end, whatever of the last all-reduce it did not hide, the
    # optimiser
    assert round(summary["networks"]["oddl"]["iteration_time_s"] * 1e9) >= \
        ov.compute_ns + ov.optimizer_ns


def test_the_shipped_trace_is_the_recorders(tmp_path: Path) -> None:
    r = read_recorded(SHIPPED)
    assert [c.nbytes for c in r.collectives] == BUCKETS
    res = CliRunner().invoke(main, ["run", str(ROOT / "experiments" / "ddp-trace-cpu.toml"),
                                    "--out", str(tmp_path / "r"), "--no-plot",
                                    "--iterations", "5"])
    assert res.exit_code == 0, res.output
    assert "2 collectives" in res.output


def _write(tmp: Path, edit: object) -> Path:
    data = json.loads(SHIPPED.read_text())
    if callable(edit):
        edit(data)
        text = json.dumps(data)
    else:
        text = str(edit)
    trace = tmp / "bad.json"
    trace.write_text(text)
    return trace


def _bad(tmp: Path, edit: object) -> str:
    trace = _write(tmp, edit)
    res = CliRunner().invoke(main, ["run", str(_experiment(tmp, trace)), "--out",
                                    str(tmp / "r"), "--no-plot"])
    assert res.exit_code == 2, res.output
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in res.output, res.output
    return lines[0]


def _events(data: dict[str, list[dict[str, object]]], name: str) -> list[dict[str, object]]:
    return [e for e in data["traceEvents"] if e.get("name") == name]


def test_a_bad_trace_is_one_line_naming_it(tmp_path: Path) -> None:
    def no_dims(d: dict) -> None:
        for e in _events(d, "c10d::allreduce_"):
            e["args"].pop("Input Dims")

    def no_steps(d: dict) -> None:
        d["traceEvents"] = [e for e in d["traceEvents"]
                            if not str(e.get("name", "")).startswith("ProfilerStep#")]

    def gather(d: dict) -> None:
        _events(d, "c10d::allreduce_")[-1]["name"] = "c10d::gather_"

    def huge(d: dict) -> None:
        for e in _events(d, "c10d::allreduce_"):
            e["args"]["Input Dims"] = [[[1 << 41]]]

    def odd_info(d: dict) -> None:  # not a failure: what it names is only said
        d["distributedInfo"] = {"world_size": "two", "backend": ["x"]}

    assert read_recorded(_write(tmp_path, odd_info)).world_size == 0
    cases = [(no_dims, "c10d::allreduce_[0]: no tensor shape"),
             (no_steps, "traceEvents: no profiled step"),
             (gather, "collective c10d::gather_ is not one oddl runs"),
             (huge, "no tensor shape"),
             (lambda d: [e["args"].__setitem__("Input Dims", [[[1 << 39]]])
                         for e in _events(d, "c10d::allreduce_")],
              "a collective carries 1 to"),
             ("{not json", "not JSON"),
             ('{"traceEvents": 5}', "not a PyTorch profiler trace")]
    for edit, why in cases:
        line = _bad(tmp_path, edit)
        assert "bad.json" in line and why in line, line


def test_a_trace_gives_the_compute_so_nothing_else_may(tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["check", str(_experiment(tmp_path, SHIPPED,
                                                            compute_time_ms=5.0))])
    assert res.exit_code == 2
    assert "torch_trace: the trace gives the model's compute" in res.output
    with pytest.raises(ConfigError, match="file not found"):
        read_recorded(tmp_path / "none.json")
