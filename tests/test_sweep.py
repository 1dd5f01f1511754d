"""`oddl sweep`: the cross product, the same rows from a process pool and a Dask cluster,
speedups consistent with the table, clear errors for a bad sweep file."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from oddl.app.cli import main
from oddl.app.experiments.sweep import grid_shape, load_sweep, run_sweep, speedups

SWEEP = """
name = "t"
testbed = "{root}/hw_configs/grid-1024.toml"
models = ["resnet50", "vgg19"]
nodes = [4, 16]
line_rates_gbps = [100, 200]
[[networks]]
name = "oddl"
kind = "oddl"
[[networks]]
name = "fattree"
kind = "fattree"
hosts_per_leaf = 2
spines = 1
oversubscription = 2
[[networks]]
name = "ring"
kind = "sipring"
collective = "ring"
"""


def _sweep(root: Path, tmp_path: Path, text: str = SWEEP) -> Path:
    f = tmp_path / "s.toml"
    f.write_text(text.format(root=root))
    return f


def _strip(rows: list[dict]) -> list[dict]:  # type: ignore[type-arg]
    return [{k: v for k, v in r.items() if k not in ("wall_s", "plan_ms")} for r in rows]


def test_sweep_cli_writes_table_speedups_and_plots(root: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = CliRunner().invoke(main, ["sweep", str(_sweep(root, tmp_path)), "--jobs", "2",
                                  "--out", str(out)])
    assert r.exit_code == 0, r.output
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert len(rows) == 3 * 2 * 2 * 2  # networks x models x nodes x rates
    assert {(x["network"], x["collective"]) for x in rows} == {
        ("oddl", "hd"), ("fattree", "hd"), ("ring", "ring")}
    assert all(x["invariant_violations"] == "0" for x in rows)
    # ODDL's control messages are counted; a baseline has none
    assert all(int(x["control_messages"]) > 0 for x in rows if x["network"] == "oddl")
    it = {(x["model"], x["nodes"], x["line_rate_gbps"], x["network"]): float(x["iteration_ms"])
          for x in rows}
    # a faster line makes every network faster
    for (m, n, rate, net), t in it.items():
        if rate == "100.0":
            assert it[(m, n, "200.0", net)] < t
    for s in csv.DictReader((out / "speedups.csv").open()):
        key = (s["model"], s["nodes"], s["line_rate_gbps"])
        assert float(s["speedup"]) == round(it[(*key, s["over"])] / it[(*key, "oddl")], 4)
    for png in ("speedup_vs_nodes.png", "speedup_vs_rate.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "oddl speedup over each network" in r.output


@pytest.mark.realtime
def test_dask_cluster_gives_the_same_rows_as_the_pool(root: Path, tmp_path: Path) -> None:
    from distributed import LocalCluster

    sw, tb = load_sweep(_sweep(root, tmp_path, SWEEP.replace("[4, 16]", "[4]")))
    local = run_sweep(sw, tb, jobs=1)
    # a real scheduler and worker on loopback TCP (the comm a remote cluster uses)
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=True, host="127.0.0.1",
                      dashboard_address=None) as cluster:
        remote = run_sweep(sw, tb, cluster=cluster.scheduler_address)
    assert _strip(remote) == _strip(local)
    assert len(speedups(sw, remote)) == 2 * 2 * 1 * 2  # over 2 networks, per point


def test_bad_sweep_file_names_file_field_and_reason(root: Path, tmp_path: Path) -> None:
    bad = SWEEP.replace("[4, 16]", "[4, 12]").replace('name = "ring"', 'name = "oddl"')
    r = CliRunner().invoke(main, ["sweep", str(_sweep(root, tmp_path, bad))])
    assert r.exit_code == 2
    assert "s.toml" in r.output and "network names must be unique" in r.output
    bad = SWEEP.replace("[4, 16]", "[4, 12]")
    r = CliRunner().invoke(main, ["sweep", str(_sweep(root, tmp_path, bad))])
    assert r.exit_code == 2 and "node count 12: a power of two" in r.output


def test_grid_shapes_are_near_square() -> None:
    assert [grid_shape(n) for n in (2, 4, 8, 1024, 4096)] == [
        (1, 2), (2, 2), (2, 4), (32, 32), (64, 64)]


def test_a_failing_point_names_itself_and_finished_points_are_kept(root: Path,
                                                                   tmp_path: Path) -> None:
    # the prototype's 2 wavelengths cannot hold a cyclic plan on a 4 x 4 grid (3 needed)
    text = f"""
name = "f"
testbed = "{root}/hw_configs/prototype-4node.toml"
models = ["resnet50"]
nodes = [16]
line_rates_gbps = [100]
[[networks]]
name = "electrical"
kind = "electrical"
[[networks]]
name = "oddl"
kind = "oddl"
strategy = "cyclic"
"""
    f = tmp_path / "f.toml"
    f.write_text(text)
    out = tmp_path / "out"
    r = CliRunner().invoke(main, ["sweep", str(f), "--out", str(out)])
    assert r.exit_code == 1
    assert ("sweep point failed: oddl resnet50 16 nodes 100 Gb/s: PlanError: cyclic needs "
            "P - 1 = 3 wavelengths") in r.output
    kept = [json.loads(x) for x in (out / "points.jsonl").read_text().splitlines()]
    assert [k["network"] for k in kept] == ["electrical"]
    assert "1 finished points kept" in r.output
    # fixed and rerun into the same directory: only the missing point runs
    f.write_text(text.replace('strategy = "cyclic"', 'strategy = "matched"'))
    r = CliRunner().invoke(main, ["sweep", str(f), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "resuming: 1 points already in" in r.output
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert sorted(x["network"] for x in rows) == ["electrical", "oddl"]
    journal = [json.loads(x) for x in (out / "points.jsonl").read_text().splitlines()]
    assert [j["network"] for j in journal] == ["electrical", "oddl"]  # electrical ran once


def test_a_sweep_of_one_network_prints_no_empty_speedup_table(root: Path,
                                                               tmp_path: Path) -> None:
    """Reproducer (issue 43): a one-network sweep printed a speed-up table with no row."""
    one = SWEEP.split("[[networks]]\nname = \"fattree\"")[0].replace(
        '["resnet50", "vgg19"]', '["resnet50"]').replace("[4, 16]", "[4]").replace(
        "[100, 200]", "[100]")
    r = CliRunner().invoke(main, ["sweep", str(_sweep(root, tmp_path, one)), "--out",
                                  str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    assert "speedup over each network" not in r.output
    assert "1 points in" in r.output


def test_a_sweep_is_validated_point_by_point_before_any_runs(root: Path,
                                                             tmp_path: Path) -> None:
    """Reproducer (issue 67): `oddl check` refuses an OptINC unit of 4 ports on 64 nodes,
    but `oddl sweep` ran the first points, then failed with a ValueError. Every point is
    validated first; every issue is said at once, with its point."""
    text = SWEEP.replace('["resnet50", "vgg19"]', '["resnet50"]').replace(
        "[4, 16]", "[4, 64]").replace("[100, 200]", "[100]") + """
[[networks]]
name = "optinc"
kind = "optinc"
ports = 4
"""
    f = _sweep(root, tmp_path, text.replace("[4, 64]", "[4, 64, 1024]"))
    out = tmp_path / "out"
    for args in (["check", str(f)], ["sweep", str(f), "--out", str(out)]):
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 2, r.output
        lines = [x for x in r.output.splitlines() if x.startswith("error:")]
        assert len(lines) == 2, r.output  # the largest points first, as they would run
        for line, n in zip(lines, (1024, 64), strict=True):
            assert line.startswith(f"error: {f}: networks[3].ports: {n} servers: ")
            assert line.endswith(f"(at optinc resnet50 {n}n 100G)")
        assert not out.exists()  # no point ran
