"""The figures say something: an iteration taken apart, ours beside the paper's, no offset
axes, the WSS tables as they are, the papers' marks on the sweep plots."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from oddl.app.cli import main
from oddl.app.experiments.figures import paper_rows, plan_figure, run_figure, wire_ns
from oddl.app.experiments.sweep import load_sweep
from oddl.controller.base.collectives import build
from oddl.controller.base.config import ConfigError
from oddl.controller.stage1.plan import Plan

TABLE1 = "experiments/table1-resnet50.toml"


def test_wire_time_is_the_busiest_sender_per_step() -> None:
    # a 4-rank ring of 4000 B: 6 steps of one 1000 B chunk each; 8000 bits at 100 Gb/s = 80 ns
    assert wire_ns(build("ring", 4, 4000, 1, 4), 100.0) == 6 * 80
    # HD on 4 ranks: 2000 then 1000 B (halving), 1000 then 2000 B (doubling)
    assert wire_ns(build("hd", 4, 4000, 1, 4), 100.0) == (2000 + 1000 + 1000 + 2000) * 8 // 100


def test_paper_rows_pair_each_figure_with_ours() -> None:
    ref = {"paper": "Li et al., ODDL, Table 1", "oddl_min": 97.8, "electrical_min": 97.3,
           "ratio": 1.005}
    rows = paper_rows(ref, {"oddl": 97.31, "electrical": 97.3}, 97.31 / 97.3)
    by = {r.what: r for r in rows}
    assert set(by) == {"oddl training time", "electrical training time",
                       "ratio oddl / electrical"}
    assert by["oddl training time"].paper == 97.8
    assert by["oddl training time"].difference == f"{(97.31 - 97.8) / 97.8 * 100:+.2f}%"
    assert by["electrical training time"].difference == "+0.00%"


def test_run_figure_has_no_offset_axes_and_the_papers_bars() -> None:
    """Reproducer: the left panel showed two flat lines on an axis labelled `+1.227e1`."""
    nets = {"oddl": {"compute_ms": 220.87, "communication_ms": 12.2727,
                     "control_ms": 0.0082, "training_min": 97.301},
            "electrical": {"compute_ms": 220.87, "communication_ms": 12.2727,
                           "control_ms": 0.004, "training_min": 97.3}}
    paper = paper_rows({"oddl_min": 97.8, "electrical_min": 97.3}, {}, None)
    fig = run_figure("t", nets, paper)
    fig.canvas.draw()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            assert axis.get_major_formatter().get_offset() == "", ax.get_title()
    bars = fig.axes[2].containers
    assert [round(b.get_height(), 3) for b in bars[0]] == [97.301, 97.3]  # ours
    assert [b.get_height() for b in bars[1]] == [97.8, 97.3]  # the paper's
    # the all-reduce panel: communication and control stacked, per network
    _, ctl = fig.axes[1].containers
    assert [round(b.get_width(), 6) for b in ctl] == [0.0082, 0.004]


def test_run_prints_the_reference_as_a_table_and_splits_the_iteration(
        root: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    r = CliRunner().invoke(main, ["run", str(root / TABLE1), "--plot", "--iterations", "3",
                                  "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "{'paper'" not in r.output and "beside the paper" in r.output
    line = next(x for x in r.output.splitlines() if "oddl training time" in x)
    assert "97.8 min" in line and "%" in line
    meta = json.loads((out / "summary.json").read_text())
    assert meta["reference"]["oddl_min"] == 97.8
    assert (out / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plan_plot_draws_each_table_cell(root: Path, tmp_path: Path) -> None:
    png = tmp_path / "plan.png"
    r = CliRunner().invoke(main, ["plan", str(root / "hw_configs/prototype-4node.toml"),
                                  "--json", "--plot", str(png)])
    assert r.exit_code == 0, r.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    plan = Plan.from_dict(json.loads(r.stdout))
    fig = plan_figure(plan)
    for ax, t in zip(fig.axes, plan.wss, strict=False):
        img = ax.get_images()[0].get_array()
        for i, row in enumerate(t.table):
            for c, o in enumerate(row):
                assert (img.mask[i, c] if o is None else img[i, c] == o)


def test_sweep_papers_are_marks_and_name_real_networks(root: Path, tmp_path: Path) -> None:
    sw, _ = load_sweep(root / "experiments/topoopt-vs-fattree.toml")
    assert sw.paper_marks() == {"fattree-1to1": (3.4, True)}
    sw, _ = load_sweep(root / "experiments/jocn-1024-vgg19.toml")
    assert sw.paper_marks() == {"fattree-3to1": (1.6, False), "fattree-3to1-dcqcn": (1.6, False),
                                "fattree-3to1-tcp": (1.6, False), "sipring": (1.7, False),
                                "sipring-lightpath": (1.7, False)}
    bad = tmp_path / "bad.toml"
    bad.write_text((root / "experiments/jocn-1024-vgg19.toml").read_text()
                   .replace('testbed = "../', f'testbed = "{root}/')
                   .replace("oddl_over_fattree-3to1 =", "oddl_over_nosuch ="))
    with pytest.raises(ConfigError, match=r"papers\.oddl_over_nosuch: no network 'nosuch'"):
        load_sweep(bad)


def test_a_one_point_sweep_draws_bars_with_the_papers_marks(root: Path,
                                                            tmp_path: Path) -> None:
    f = tmp_path / "s.toml"
    f.write_text(f'name = "t"\ntestbed = "{root}/hw_configs/grid-1024.toml"\n'
                 'models = ["resnet50"]\nnodes = [4]\nline_rates_gbps = [100]\n'
                 '[papers]\noddl_over_fattree = 1.6\n'
                 '[[networks]]\nname = "oddl"\nkind = "oddl"\n'
                 '[[networks]]\nname = "fattree"\nkind = "fattree"\nhosts_per_leaf = 2\n'
                 'spines = 1\noversubscription = 2\n')
    out = tmp_path / "out"
    r = CliRunner().invoke(main, ["sweep", str(f), "--out", str(out)], terminal_width=200)
    assert r.exit_code == 0, r.output
    assert (out / "speedups.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    row = next(x for x in r.output.splitlines() if "fattree" in x and "x" in x
               and "resnet50" in x and "1.6x" in x)
    assert row.rstrip(" │").endswith("1.6x")


def _docs_figures(root: Path) -> Any:
    """experiments/figures.py, the one command behind the docs' tables."""
    spec = importlib.util.spec_from_file_location("docs_figures", root / "experiments/figures.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclass looks itself up there
    spec.loader.exec_module(mod)
    return mod


def test_every_docs_table_the_command_writes_has_its_place(root: Path) -> None:
    figs = _docs_figures(root)
    assert {"jocn", "optinc-onn", "optinc-cnn"} <= set(figs.SECTIONS)
    for name, s in figs.SECTIONS.items():
        text = s.page.read_text()
        assert text.count(f"<!-- figures:{name} -->") == 1, (s.page, name)
        assert text.index(f"<!-- figures:{name} -->") < text.index(f"<!-- /figures:{name} -->")


def test_the_docs_command_replaces_only_between_the_markers(root: Path, tmp_path: Path) -> None:
    figs = _docs_figures(root)
    page = tmp_path / "p.md"
    page.write_text("head\n<!-- figures:t -->\nold\n<!-- /figures:t -->\ntail\n")
    figs.put(page, "t", "| new |")
    assert page.read_text() == "head\n<!-- figures:t -->\n| new |\n<!-- /figures:t -->\ntail\n"
    with pytest.raises(SystemExit, match=r"p\.md: no markers <!-- figures:u -->"):
        figs.put(page, "u", "x")


def _figure_data() -> dict[str, Any]:
    import dataclasses

    ref = {"oddl_min": 97.8, "electrical_min": 97.3, "ratio": 1.005}
    mins = {"oddl": 97.31, "electrical": 97.3}
    return {"title": "table1 (sim)",
            "networks": {n: {"compute_ms": 220.87, "communication_ms": 12.0,
                             "control_ms": 0.27 if n == "oddl" else 0.0,
                             "training_min": m} for n, m in mins.items()},
            "paper": [dataclasses.asdict(r) for r in paper_rows(ref, mins, 97.31 / 97.3)]}


SPARE_CORE = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2,
                                reason="a figure's helper runs on a spare core: this "
                                       "process has one core")


@SPARE_CORE
def test_the_figures_helper_draws_the_file_this_process_would(tmp_path: Path) -> None:
    """A run's figure is drawn by a helper that imported matplotlib while the run ran
    (app/experiments/plotter.py): the same file, byte for byte, as drawn here."""
    from oddl.app.experiments.figures import draw
    from oddl.app.experiments.plotter import Plotter

    data = _figure_data()
    plotter = Plotter()
    assert plotter.helper is not None
    plotter.draw("run", data, tmp_path / "helper.png")
    assert plotter.by_helper and plotter.helper is None
    draw("run", json.loads(json.dumps(data)), tmp_path / "here.png")
    assert (tmp_path / "helper.png").read_bytes() == (tmp_path / "here.png").read_bytes()


@SPARE_CORE
def test_a_figures_helper_gone_leaves_the_figure_to_this_process(tmp_path: Path) -> None:
    from oddl.app.experiments.plotter import Plotter

    plotter = Plotter()
    assert plotter.helper is not None
    plotter.helper.kill()
    plotter.draw("run", _figure_data(), tmp_path / "plot.png")
    assert not plotter.by_helper
    assert (tmp_path / "plot.png").stat().st_size > 10_000


@SPARE_CORE
def test_a_run_that_ends_without_its_figure_leaves_no_helper() -> None:
    """A failed or stopped run's helper is stopped with it; one whose parent is killed
    (its stdin closes) exits on its own."""
    from oddl.app.experiments.plotter import Plotter, plotting

    with pytest.raises(RuntimeError), plotting(True) as plotter:
        assert plotter is not None and plotter.helper is not None
        helper = plotter.helper
        raise RuntimeError("the run failed")
    assert helper.poll() is not None
    orphan = Plotter().helper
    assert orphan is not None and orphan.stdin is not None
    orphan.stdin.close()  # as a killed parent's end of the pipe closes
    assert orphan.wait(timeout=60) == 0
