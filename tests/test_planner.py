"""Stage-1 planning: collision-free tables, every pair routable, the three strategies."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from oddl.app.cli import main
from oddl.controller.base.collectives import build
from oddl.controller.base.config import load_testbed
from oddl.controller.base.topology import Grid
from oddl.controller.stage1.plan import Plan, PlanError
from oddl.controller.stage1.planner import plan_job
from oddl.controller.stage2.workloads import model_spec

from tests.helpers import make_testbed, schedule_for


def _check_plan(plan: Plan, grid: Grid) -> None:
    plan.validate(grid)
    for t in plan.wss:
        assert t.collisions() == []
        for ch in range(len(t.labels)):  # (out, channel) used by at most one input
            outs = [row[ch] for row in t.table if row[ch] is not None]
            assert len(outs) == len(set(outs))
    for src, dst in plan.demand:
        hops = plan.path(grid, src, dst)
        assert hops[0] == src and hops[-1] == dst


def test_prototype_matched_uses_the_two_hd_permutations(root: Path) -> None:
    tb = load_testbed(root / "hw_configs" / "prototype-4node.toml")
    g = Grid.from_testbed(tb)
    p = plan_job(tb, g, build("hd", 4, 1000, 1, 4), strategy="matched")
    _check_plan(p, g)
    (t,) = p.wss
    assert [row for row in t.table] == [[1, 2], [0, 3], [3, 0], [2, 1]]
    assert all(p.path(g, s, d) == [s, d] for s, d in p.demand)  # every HD exchange is one hop


def test_prototype_cyclic_needs_three_wavelengths(root: Path) -> None:
    tb = load_testbed(root / "hw_configs" / "prototype-4node.toml")
    with pytest.raises(PlanError, match=r"cyclic needs P - 1 = 3 wavelengths.*has 2"):
        plan_job(tb, Grid.from_testbed(tb), build("hd", 4, 1000, 1, 4), strategy="cyclic")


@pytest.mark.parametrize("coll", ["hd", "ring", "hier2d"])
@pytest.mark.parametrize("strategy", ["cyclic", "matched", "totientperms"])
def test_grid_plans_valid(coll: str, strategy: str) -> None:
    tb = make_testbed(4, 8, wavelengths=7)
    g = Grid.from_testbed(tb)
    p = plan_job(tb, g, build(coll, 32, 10_000, 4, 8), strategy=strategy)
    _check_plan(p, g)


def test_totientperms_fewer_wavelengths_routes_multihop() -> None:
    tb = make_testbed(1, 12, wavelengths=2)
    g = Grid.from_testbed(tb)
    p = plan_job(tb, g, build("ring", 12, 1200, 1, 12), strategy="totientperms")
    _check_plan(p, g)
    assert p.wss[0].labels == ["shift+1", "shift+11"]


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 5), cols=st.integers(1, 5), data=st.data())
def test_random_demand_is_routable(rows: int, cols: int, data: st.DataObject) -> None:
    if rows * cols < 2:
        return
    n = rows * cols
    pairs = data.draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1))
                               .filter(lambda p: p[0] != p[1]), min_size=1, max_size=20))
    strategy = data.draw(st.sampled_from(["cyclic", "matched"]))
    tb = make_testbed(rows, cols)
    g = Grid.from_testbed(tb)
    p = plan_job(tb, g, schedule_for(g, [(s, d, 100) for s, d in pairs]), strategy=strategy)
    _check_plan(p, g)
    assert set(p.demand) == {(g.nodes[s], g.nodes[d]) for s, d in pairs}


def test_validate_catches_collision_and_bad_route(root: Path) -> None:
    tb = load_testbed(root / "hw_configs" / "prototype-4node.toml")
    g = Grid.from_testbed(tb)
    p = plan_job(tb, g, build("hd", 4, 1000, 1, 4))
    bad = Plan.from_dict(json.loads(p.to_json()))
    bad.wss[0].table[3][0] = 1  # input 3 now also reaches (out 1, ch0), as input 0 does
    with pytest.raises(PlanError, match=r"inputs 0 and 3 both reach \(out 1, channel 0\)"):
        bad.validate(g)
    bad2 = Plan.from_dict(json.loads(p.to_json()))
    r = bad2.routes["n0"]["n1"]
    bad2.routes["n0"]["n1"] = type(r)(r.port, 1, r.next_hop)
    with pytest.raises(PlanError, match="route says H/ch1 -> n1 but wss-row0 sends it to n2"):
        bad2.validate(g)


def test_plan_json_round_trip(root: Path) -> None:
    tb = load_testbed(root / "hw_configs" / "prototype-4node.toml")
    g = Grid.from_testbed(tb)
    p = plan_job(tb, g, build("hd", 4, 1000, 1, 4))
    q = Plan.from_dict(json.loads(p.to_json()))
    assert q.to_json() == p.to_json()
    q.validate(g)


def test_plan_cli_table_and_json(root: Path) -> None:
    r = CliRunner().invoke(main, ["plan", str(root / "hw_configs" / "prototype-4node.toml")])
    assert r.exit_code == 0, r.output
    assert "WSS wss-row0 (row 0, 4 ports)" in r.output
    assert "valid: no collisions, 8 pairs routable" in r.output
    r = CliRunner().invoke(main, ["plan", str(root / "hw_configs" / "prototype-4node.toml"),
                                  "--job", str(root / "experiments" / "table1-resnet50.toml"),
                                  "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["strategy"] == "matched" and d["wss"][0]["table"][0] == [1, 2]
    r = CliRunner().invoke(main, ["plan", str(root / "hw_configs" / "prototype-4node.toml"),
                                  "--strategy", "cyclic"])
    assert r.exit_code == 1 and "cyclic needs" in r.output


def test_the_grid_4096_plan_is_the_same_to_the_last_entry(root: Path) -> None:
    """A golden digest of stage 1 on grid-4096 (HD, ResNet-50, matched): every WSS table,
    label and route. It held when the planner stopped building every detour of every
    route it did not need (4.2 s -> 0.5 s, issue 32)."""
    tb = load_testbed(root / "hw_configs" / "grid-4096.toml")
    sched = build("hd", tb.n_nodes, model_spec("resnet50").grad_bytes(), 64, 64)
    p = plan_job(tb, Grid.from_testbed(tb), sched, strategy="matched")
    digest = hashlib.sha256(json.dumps(p.to_dict(), sort_keys=True).encode()).hexdigest()
    assert digest == "6baee73e4f091386f5064a40c05f0c46a53ad950c99ecd5f2df7fe7c6d749db2"


def test_planning_loads_no_runner(root: Path) -> None:
    """`oddl plan` and `oddl check` stand on the configs and the planner only: the runner
    and what it loads (numpy, matplotlib, httpx, pynq) wait for a run (issue 32: half of
    `oddl plan --json`'s second was imports)."""
    code = ("import sys\n"
            "from oddl.app import api\n"
            "from oddl.app.cli import main\n"
            f"api.plan({str(root / 'hw_configs/prototype-4node.toml')!r})\n"
            "print(sorted(m for m in ('numpy', 'matplotlib', 'httpx', 'pynq') "
            "if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"
    from oddl.app import api
    assert api.RunResult.__name__ == "RunResult" and callable(api.network)  # still there
