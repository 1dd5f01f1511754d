"""Several jobs on one fabric (docs/multijob.md): config, placement, per-job stage 1 beside
running jobs, the checker's isolation invariants, and whole traces on ODDL and a shared
baseline."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from oddl.app.experiments.runner import run_experiment
from oddl.controller.base.collectives import build
from oddl.controller.base.config import ConfigError, load_experiment
from oddl.controller.base.messages import Flow
from oddl.controller.base.topology import Grid
from oddl.controller.service.backend import RunFailed
from oddl.controller.service.jobs import JobRequest
from oddl.controller.stage1.arbiter import ApplyError, Arbiter
from oddl.controller.stage1.placement import place
from oddl.controller.stage2.invariants import TAG_SHIFT, InvariantChecker
from oddl.drivers.wss import WSSDriver
from oddl.sim.backend import SimBackend
from oddl.sim.devices.wss import WSSModel
from oddl.sim.devices.wss_serial import SerialWSS

from tests.helpers import make_testbed

TB = """
[testbed]
name = "g4x4"
[grid]
rows = 4
cols = 4
[optical]
line_rate_gbps = 100
tuning_time_ns = 10.5
wavelength_grid = { start_nm = 1530.33, spacing_ghz = 50, count = 8 }
[control]
latency_ns = 1000
[generate]
nodes = "n{row}-{col}"
wss = true
"""

NETS = """
[[networks]]
name = "oddl"
kind = "oddl"

[[networks]]
name = "fattree"
kind = "fattree"
hosts_per_leaf = 4
spines = 1
oversubscription = 4.0
latency_ns = 500
"""


def experiment(tmp_path: Path, body: str, trace: str | None = None) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "tb.toml").write_text(TB)
    if trace is not None:
        (tmp_path / "jobs.csv").write_text(trace)
    p = tmp_path / "e.toml"
    p.write_text(f'name = "mj"\ntestbed = "tb.toml"\n{body}\n{NETS}')
    return p


def job(name: str, ranks: int, iterations: int = 2, arrival_ms: float = 0, model: str =
        "resnet50", compute_ms: float | None = 1.0, **kw: object) -> str:
    extra = "".join(f"{k} = {json.dumps(v)}\n" for k, v in kw.items())
    comp = f"compute_time_ms = {compute_ms}\n" if compute_ms is not None else ""
    return (f'[[jobs]]\nname = "{name}"\nmodel = "{model}"\nranks = {ranks}\n'
            f"iterations = {iterations}\narrival_ms = {arrival_ms}\n{comp}{extra}")


# --- config -----------------------------------------------------------------------------

@pytest.mark.parametrize(("body", "trace", "where", "why"), [
    (job("big", 17), None, "jobs[0] (job 'big').ranks", "17 ranks but g4x4 has 16 nodes"),
    (job("a", 2) + job("a", 4), None, "jobs[1] (job 'a').name",
     "duplicate job name: jobs[0] has it too"),
    (job("x", 2, model="gpt5"), None, "jobs[0] (job 'x').model", "Input should be"),
    ('jobs_trace = "jobs.csv"\n', "arrival_ms,model,ranks,iterations\n0,resnet50,4,3\n"
     "5,vgg19,four,3\n", "row 2 (job 'jobs-2').ranks", "valid integer"),
    ('jobs_trace = "jobs.csv"\n', "arrival_ms,model,ranks\n0,resnet50,4\n", "header",
     "missing column(s) iterations"),
    ('jobs_trace = "jobs.csv"\n', "arrival_ms,model,ranks,iterations\n", "jobs_trace",
     "no jobs: a multi-job experiment needs at least one"),
    ('jobs_trace = "jobs.csv"\n' + job("a", 2), "name,arrival_ms,model,ranks,iterations\n"
     "a,0,resnet50,2,1\n", "jobs.csv row 1 (job 'a').name", "jobs[0] has it too"),
])
def test_bad_jobs_name_the_job_and_field(tmp_path: Path, body: str, trace: str | None,
                                         where: str, why: str) -> None:
    with pytest.raises(ConfigError) as ei:
        load_experiment(experiment(tmp_path, body, trace))
    msg = str(ei.value)
    assert where in msg and why in msg, msg


def test_a_job_no_rectangle_holds_is_refused_before_anything_runs(tmp_path: Path) -> None:
    ctx = load_experiment(experiment(tmp_path, job("long", 8, shape="row")))
    with pytest.raises(ConfigError, match=r"job 'long'.shape: no row rectangle of 4 x 4 "
                                          r"holds 8 ranks"):
        run_experiment(ctx)


def test_trace_and_jobs_together_and_compute_from_the_model(tmp_path: Path) -> None:
    ctx = load_experiment(experiment(
        tmp_path, 'jobs_trace = "jobs.csv"\n' + job("first", 4, compute_ms=None, model="vgg19"),
        "# a comment\narrival_ms,model,ranks,iterations,shape\n12.5,bert-large,8,3,grid\n"))
    reqs = [JobRequest.of(j) for j in ctx.jobs]
    assert [(r.name, r.ranks, r.arrival_ns, r.shape) for r in reqs] == [
        ("first", 4, 0, "any"), ("jobs-1", 8, 12_500_000, "grid")]
    # batch 32 x 0.863 ms per ResNet-50 image x 19.6 / 4.1 (docs/model.md)
    assert reqs[0].compute_ns == pytest.approx(132e6, rel=1e-3)
    assert reqs[1].compute_ns == pytest.approx(32 * 220.8742 / 256 * 43.5 / 4.1 * 1e6)


# --- placement --------------------------------------------------------------------------

def test_placement_prefers_one_hop_shapes_and_keeps_rectangles() -> None:
    grid = Grid.from_testbed(make_testbed(4, 4))
    free = set(grid.nodes)
    row = place(grid, free, "a", 4)
    assert row is not None and row.shape == "row" and row.ranks == (
        "n0-0", "n0-1", "n0-2", "n0-3")
    free -= set(row.nodes)
    sub = place(grid, free, "b", 8)
    assert sub is not None and (sub.shape, sub.rows, sub.cols) == ("grid", (1, 2), (0, 1, 2, 3))
    free -= set(sub.nodes)
    col = place(grid, free, "c", 3, "col")
    assert col is None  # one row left: no column segment of 3
    spare = place(grid, free, "d", 3)
    assert spare is not None and spare.ranks == ("n3-0", "n3-1", "n3-2") and not spare.spare
    odd = place(Grid.from_testbed(make_testbed(4, 4)), set(grid.nodes), "e", 7, "grid")
    assert odd is not None and len(odd.ranks) == 7 and odd.spare == ("n1-3",)
    assert place(grid, set(grid.nodes), "f", 7, "grid", exact=True) is None


# --- stage 1 beside running jobs --------------------------------------------------------

def test_admitting_a_job_writes_only_its_entries_and_reads_everyone_back() -> None:
    tb = make_testbed(4, 4, 8)
    grid = Grid.from_testbed(tb)
    b = SimBackend(tb, grid)
    arb = Arbiter(tb, grid, b.onics, b.wss)
    size = 1 << 20
    a = place(grid, set(grid.nodes), "a", 8)
    assert a is not None
    plan_a = arb.plan(build("hd", 8, size, 2, 4), "matched", "a", ranks=list(a.ranks),
                      within=frozenset(a.nodes))
    arb.admit(plan_a)
    tables = {w: m.get_table() for w, m in b.wss.items()}
    changes = {w: list(m.changes) for w, m in b.wss.items()}
    bpart = place(grid, set(grid.nodes) - set(a.nodes), "b", 8)
    assert bpart is not None
    plan_b = arb.plan(build("hd", 8, size, 2, 4), "cyclic", "b", ranks=list(bpart.ranks),
                      within=frozenset(bpart.nodes))
    arb.admit(plan_b)
    for w, m in b.wss.items():  # a's rows: the same light, never rewritten
        g = grid.groups[((m.id.startswith("wss-row") and "row") or "col",
                         int(m.id.rsplit("row" if "row" in m.id else "col", 1)[1]))]
        for i, node in enumerate(g.members):
            if node in a.nodes:
                assert m.get_table()[i] == tables[w][i]
                assert m.changes[i] == changes[w][i]
    assert any(m.changes[i] for m in b.wss.values() for i in range(4))
    assert plan_b.conflicts(plan_a, grid) == []
    # a plan that would share a's node is refused before anything is written
    clash = arb.plan(build("hd", 2, size, 1, 2), "matched", "c", ranks=["n0-0", "n2-0"])
    before = {w: m.get_table() for w, m in b.wss.items()}
    with pytest.raises(ApplyError, match="job c is not isolated: c and a both use node n0-0"):
        arb.admit(clash)
    assert {w: m.get_table() for w, m in b.wss.items()} == before
    arb.release("a")
    assert all(b.onics[n].read_routes() == {} for n in a.nodes)
    arb.admit(arb.plan(build("hd", 2, size, 1, 2), "matched", "c", ranks=["n0-0", "n0-1"],
                       within=frozenset({"n0-0", "n0-1"})))
    b.close()


@pytest.mark.realtime
def test_partial_update_over_the_serial_line_touches_named_inputs_only() -> None:
    inst = SerialWSS(WSSModel("wss-row0", 4, 2)).start()
    try:
        d = WSSDriver(inst.path)
        d.set_table([[1, None], [0, None], [None, None], [None, None]])
        inst.log.clear()
        d.set_rows({2: [3, None], 3: [2, None]})
        assert list(inst.log) == ["ROUT:COPY", "ROUT:ROW 2,3,-", "ROUT:ROW 3,2,-", "ROUT:APPL"]
        assert d.get_table() == [[1, None], [0, None], [3, None], [2, None]]
        assert inst.model.changes == [1, 1, 1, 1]
        d.close()
    finally:
        inst.close()


# --- the checker knows jobs -------------------------------------------------------------

def test_checker_flags_cross_job_receivers_relays_and_lights(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("WARNING", "oddl.controller.stage2.invariants")
    c = InvariantChecker(mode="record")
    c.new_job("a", 1, ["n0", "n1"])
    c.new_job("b", 2, ["n2", "n3"])
    fa = Flow(1 << TAG_SHIFT | 5, "n0", "n1", 100)
    fb = Flow(2 << TAG_SHIFT | 5, "n2", "n3", 100)
    c.on_light(0, "w", 1, 0, None, None, fa, "n1")  # its own receiver: fine
    assert c.violations == []
    c.on_light(1, "w", 1, 0, None, None, fb, "n3")  # another job's (out, channel) lit
    c.on_send(2, "n1", "H", None, False, False, fb)  # b relayed by a's node
    c.on_light(3, "w", 2, 1, None, None, fa, "n2")  # a lands on b's node
    assert [v.split(": ", 1)[1] for v in c.violations] == [
        "w: (out 1, channel 0) carries light of jobs a and b: jobs share it [job b]",
        f"n1: sends {fb!r} of job b on a node of job a: jobs share it [job b]",
        f"n1/H: sends {fb!r} without a GRANT for it [job b]",
        f"n2: receives {fa!r} of job a on a node of job b: jobs share it [job a]"]
    assert c.of_job("b") == c.violations[:3]  # each job's own, for its report
    # each logged as it happens: when, what, where, which job (issue 43: a count alone)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 4 and said[2] == f"invariant violation: {c.violations[2]} (3 so far)"
    c.job_left(1, 9)
    assert "job a: 0" not in " ".join(c.violations)


def test_a_job_cut_short_frees_its_lights_and_nodes_for_the_next() -> None:
    """Issue 44: a cancelled job's lights stayed booked (only a finished job's books went),
    so the next job on its WSS ports was counted sharing them: 40 violations in a run
    with none. Its flows are still checked: a straggler of its own arrives as one."""
    c = InvariantChecker(mode="record")
    c.new_job("a", 1, ["n0", "n1"])
    fa = Flow(1 << TAG_SHIFT | 5, "n0", "n1", 100)
    c.on_send(0, "n0", "H", None, False, False, fa)
    c.on_light(0, "w", 1, 0, None, None, fa, "n1")
    c.job_cut(1)  # cancelled: its node programs dropped it
    c.new_job("b", 2, ["n0", "n1"])  # the next job, on the same nodes and ports
    fb = Flow(2 << TAG_SHIFT | 5, "n0", "n1", 100)
    c.on_light(5, "w", 1, 0, None, None, fb, "n1")
    c.on_light(6, "w", 2, 0, None, None, fa, None)  # a's straggler books no light
    c.on_light(7, "w", 2, 0, None, None, fb, None)
    assert [v for v in c.violations if "share" in v] == []


# --- whole traces -----------------------------------------------------------------------

def test_isolated_partitions_keep_their_pace_while_a_shared_fabric_interferes(
        tmp_path: Path) -> None:
    """Two 4-rank jobs, each down a column, b admitted while a runs: on ODDL a is not
    paused and each iterates exactly as fast as alone; on the fat-tree (a leaf per grid
    row, one spine) both cross the same leaf uplinks and slow each other down."""
    two = job("a", 4, 3, model="vgg19", shape="col") + job("b", 4, 3, model="vgg19",
                                                           shape="col", arrival_ms=100)
    both = run_experiment(load_experiment(experiment(tmp_path / "2", two)))
    alone = run_experiment(load_experiment(experiment(
        tmp_path / "1", job("a", 4, 3, model="vgg19", shape="col"))))
    assert both.invariant_violations == 0
    j = both.jobs
    assert j["a"]["oddl"]["queued_s"] == j["b"]["oddl"]["queued_s"] == 0  # side by side
    assert j["a"]["oddl"]["iteration_time_s"] == alone.jobs["a"]["oddl"]["iteration_time_s"]
    assert j["a"]["oddl"]["iteration_p99_s"] == alone.jobs["a"]["oddl"]["iteration_p99_s"]
    assert j["b"]["oddl"]["iteration_time_s"] == alone.jobs["a"]["oddl"]["iteration_time_s"]
    ft, ft1 = j["a"]["fattree"]["iteration_time_s"], alone.jobs["a"]["fattree"]["iteration_time_s"]
    assert ft > ft1 * 1.2
    assert 0.25 < both.networks["oddl"].fabric["utilisation"] < 0.5  # 8 of 16 nodes, not always
    # each job's own control messages, counted once (before: 0 for the network)
    assert both.networks["oddl"].control_messages == \
        2 * alone.networks["oddl"].control_messages > 0


def test_fifo_waits_in_order_and_smallest_first_overtakes(tmp_path: Path) -> None:
    """The grid is full; a 16-rank and then a 4-rank job queue. FIFO starts the 16 first
    (the 4 waits for it); smallest-first starts the 4 first (the 16 waits for it)."""
    trace = (job("big", 16, 2) + job("large", 16, 2, arrival_ms=0.001)
             + job("small", 4, 2, arrival_ms=0.002))
    fifo = run_experiment(load_experiment(experiment(tmp_path / "f", trace)))
    sf = run_experiment(load_experiment(experiment(
        tmp_path / "s", 'policy = "smallest-first"\n' + trace)))
    for net in ("oddl", "fattree"):
        f = {k: v[net] for k, v in fifo.jobs.items()}
        s = {k: v[net] for k, v in sf.jobs.items()}
        end = {k: v["jct_s"] + t for (k, v), t in zip(f.items(), (0, 1e-6, 2e-6), strict=True)}
        assert f["large"]["queued_s"] + 1e-6 == pytest.approx(end["big"], abs=1e-9)
        assert f["small"]["queued_s"] + 2e-6 == pytest.approx(end["large"], abs=1e-9)
        end = {k: v["jct_s"] + t for (k, v), t in zip(s.items(), (0, 1e-6, 2e-6), strict=True)}
        assert s["small"]["queued_s"] + 2e-6 == pytest.approx(end["big"], abs=1e-9)
        assert s["large"]["queued_s"] + 1e-6 == pytest.approx(end["small"], abs=1e-9)
        assert all(v["iterations"] == 2 for v in f.values())
    assert fifo.invariant_violations == sf.invariant_violations == 0


# --- faults beside other jobs -------------------------------------------------------------

def test_a_fault_stops_only_its_job_which_goes_on_elsewhere(tmp_path: Path) -> None:
    """n1-0 dies under job a (column 0) while b runs on column 1. The watch finds it; a
    alone is stopped, gives its column back and goes on from its first iteration not
    recorded on a column of live nodes; b never notices (its iterations as alone)."""
    dead = '[[faults]]\nkind = "dead-board"\ntarget = "n1-0"\nat_ms = 12.0\n'
    res = run_experiment(load_experiment(experiment(
        tmp_path / "2", job("a", 4, 6, shape="col", compute_ms=5.0)
        + job("b", 4, 40, shape="col", compute_ms=5.0) + dead)))
    alone = run_experiment(load_experiment(experiment(
        tmp_path / "1", job("b", 4, 40, shape="col", compute_ms=5.0))))
    a, b = res.jobs["a"]["oddl"], res.jobs["b"]["oddl"]
    assert res.invariant_violations == 0
    assert a["iterations"] == 6 and len(a["stops"]) == 1
    stop = a["stops"][0]
    assert stop["ran_on"] == "a: 4 ranks, col 4 x 1 at row 0, col 0"
    assert stop["resumed_on"] == "a: 4 ranks, col 4 x 1 at row 0, col 2"  # b holds col 1
    assert stop["from_iteration"] == 0 and "n1-0" in stop["why"]
    assert "stops" not in b and b["iterations"] == 40
    assert (b["iteration_time_s"], b["iteration_p99_s"]) == (
        alone.jobs["b"]["oddl"]["iteration_time_s"], alone.jobs["b"]["oddl"]["iteration_p99_s"])
    net = res.networks["oddl"]
    assert net.disturbed and [(f["kind"], f["target"], f["recovered"]) for f in net.faults] \
        == [("dead-board", "n1-0", True)]
    f = net.faults[0]
    assert b["jct_s"] * 1e9 > f["at_ns"] + f["recovered_after_ns"]  # b ran on through it
    assert 0 < net.fault_time_s < 1


def test_a_job_no_live_rectangle_holds_any_more_fails_the_run_naming_it(
        tmp_path: Path) -> None:
    """The whole grid's job loses a board for good: stopped, it cannot be placed again, and
    after waiting `grace_ms` for the board the run says so (it would otherwise wait for
    ever)."""
    dead = '[[faults]]\nkind = "dead-board"\ntarget = "n1-0"\nat_ms = 3.0\n'
    with pytest.raises(RunFailed, match=r"job big: no rectangle of the nodes in service "
                                        r"holds 16 ranks; out of service: n1-0 \(waited "
                                        r"5000 ms for them, grace_ms\)"):
        run_experiment(load_experiment(experiment(tmp_path, job("big", 16, 50) + dead)))


def test_a_job_waits_for_a_board_that_comes_back(tmp_path: Path) -> None:
    """The whole grid's job loses a board for 300 ms: stopped, it waits at the head of the
    queue, and goes on, on the whole grid, when the board beats again. (Before: the run
    failed at once, "no rectangle of the nodes in service holds 16 ranks".)"""
    dead = ('[[faults]]\nkind = "dead-board"\ntarget = "n1-0"\nat_ms = 3.0\n'
            'duration_ms = 300.0\n')
    res = run_experiment(load_experiment(experiment(tmp_path, job("big", 16, 50) + dead)))
    big = res.jobs["big"]["oddl"]
    assert big["iterations"] == 50 and res.invariant_violations == 0
    [stop] = big["stops"]
    assert stop["ran_on"] == stop["resumed_on"] == "big: 16 ranks, grid 4 x 4 at row 0, col 0"
    assert big["jct_s"] > 0.3  # it waited for n1-0
    assert [(f["kind"], f["recovered"]) for f in res.networks["oddl"].faults] == [
        ("dead-board", True)]


def test_a_job_stopped_more_than_max_stops_times_fails_the_run(tmp_path: Path) -> None:
    """A board dies under each column the job moves to: three stops are gone round, the
    fourth fails the run, saying how often and why."""
    faults = "".join(f'[[faults]]\nkind = "dead-board"\ntarget = "n1-{c}"\nat_ms = {t}\n'
                     for c, t in enumerate([12, 500, 1000, 1500]))
    with pytest.raises(RunFailed, match=r"job a: stopped for faults 4 times; the last: "
                                        r"iteration \d+ cut short: .*n1-3"):
        run_experiment(load_experiment(experiment(
            tmp_path, job("a", 4, 200, shape="col", compute_ms=5.0) + faults)))


def test_a_multi_job_fault_is_timed_in_ms(tmp_path: Path) -> None:
    bad = '[[faults]]\nkind = "dead-board"\ntarget = "n1-0"\nat_iteration = 2\n'
    with pytest.raises(ConfigError, match="several jobs have no one iteration count"):
        load_experiment(experiment(tmp_path, job("a", 4) + bad))


# --- the CLI --------------------------------------------------------------------------

def test_cli_run_json_has_jobs_and_a_jct_cdf_and_plan_prints_partitions(tmp_path: Path) -> None:
    from click.testing import CliRunner
    from oddl.app.cli import main
    from oddl.app.experiments.results import read_store

    exp = experiment(tmp_path, job("a", 8, 2, shape="grid") + job("b", 4, 2, arrival_ms=0.5)
                     + job("c", 8, 1, arrival_ms=1))
    r = CliRunner().invoke(main, ["run", str(exp), "--json", "--plot", "--out",
                                  str(tmp_path / "run")])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert set(out["jobs"]) == {"a", "b", "c"}
    assert set(out["jobs"]["c"]) == {"oddl", "fattree"}
    assert {"jct_s", "queued_s", "iterations", "iteration_time_s", "nodes"} <= set(
        out["jobs"]["c"]["oddl"])
    assert out["jobs"]["c"]["oddl"]["queued_s"] > 0  # a and b hold 12 of 16 nodes
    assert out["networks"]["oddl"]["fabric"]["makespan_s"] > 0
    assert (tmp_path / "run" / "jct-cdf.png").stat().st_size > 10_000
    store = read_store(tmp_path / "run" / "results.sqlite")  # every iteration kept
    assert [len(store["oddl"]["jobs"][j]["iterations"]) for j in "abc"] == [2, 2, 1]
    p = CliRunner().invoke(main, ["plan", str(tmp_path / "tb.toml"), "--job", str(exp),
                                  "--plot", str(tmp_path / "parts.png")])
    assert p.exit_code == 0, p.output
    assert "a: 8 ranks, grid 2 x 4 at row 0, col 0" in p.stdout
    assert "b: 4 ranks, row 1 x 4 at row 2, col 0" in p.stdout
    assert "waiting for nodes: c" in p.stdout
    assert (tmp_path / "parts.png").stat().st_size > 5_000


# each kind of docs/faults.md, on the row-1 side of a 4 x 4 grid, where one of three jobs
# runs: for 5 ms, for 100 ms (neither long enough for the watch's 3 periods) and for good
KIND_FAULTS = {
    "dead-board": 'kind = "dead-board"\ntarget = "n1-0"\n',
    "dead-wss": 'kind = "dead-wss"\ntarget = "wss-row1"\n',
    "slow-tx": 'kind = "slow-tx"\ntarget = "n1-0/H"\ntune_ns = 20000\n',
    "wss-route": ('kind = "wss-route"\ntarget = "wss-row1"\ninput = 0\nchannel = 0\n'
                  'output = 1\n'),
    "corrupt-link": 'kind = "corrupt-link"\ntarget = "n1-1/H"\n',
    "control-loss": 'kind = "control-loss"\ntarget = "bus"\ndrop_probability = 0.05\n',
    "broker-restart": 'kind = "broker-restart"\ntarget = "broker"\n',
}


@pytest.mark.parametrize("kind", sorted(KIND_FAULTS))
@pytest.mark.parametrize("duration_ms", [5, 100, None])
def test_each_fault_kind_beside_three_jobs_is_survived(tmp_path: Path, kind: str,
                                                      duration_ms: float | None) -> None:
    """Issue 85: three jobs, one fault: every job runs to its last iteration, no flow is
    lost or doubled, and a job the fault reached was stopped at most once and went on.
    (Before: a WSS dead for 5 or 100 ms swallowed the light of flows in flight, unseen by
    the watch; their receivers revoked the grants, their RELEASEs "matched nothing", and
    the run failed, "the run stalled for 5100 ms". A broker gone for good is the one
    fault no job survives: the run says so.)"""
    fault = f"[[faults]]\n{KIND_FAULTS[kind]}at_ms = 20\n" + (
        f"duration_ms = {duration_ms}\n" if duration_ms else "")
    exp = experiment(tmp_path, "".join(job(n, 4, 20, compute_ms=5.0) for n in "abc") + fault)
    if kind == "broker-restart" and duration_ms is None:
        with pytest.raises(RunFailed, match="the bus did not come back within grace_ms"):
            run_experiment(load_experiment(exp))
        return
    res = run_experiment(load_experiment(exp))
    assert res.invariant_violations == 0
    assert {n: j["oddl"]["iterations"] for n, j in res.jobs.items()} == dict.fromkeys("abc", 20)
    assert all(len(j["oddl"].get("stops", [])) <= 1 for n, j in res.jobs.items()
               if kind != "broker-restart")
    assert [f["kind"] for f in res.networks["oddl"].faults] == [kind]


def test_three_jobs_on_grid_64_survive_a_wss_dead_for_100_ms(tmp_path: Path) -> None:
    """The issue's reproducer: 16, 32 and 8 ranks on grid-64, wss-row1 dead at 200 ms for
    100 ms. The jobs whose light it swallowed are cut short and go on."""
    tb = Path(__file__).resolve().parent.parent / "hw_configs" / "grid-64.toml"
    (tmp_path / "e.toml").write_text(
        f'name = "g64"\ntestbed = "{tb}"\n'
        + job("a", 16, 20, compute_ms=5.0) + job("b", 32, 20, compute_ms=5.0)
        + job("c", 8, 20, compute_ms=5.0)
        + '[[networks]]\nname = "oddl"\nkind = "oddl"\n'
        + '[[faults]]\nkind = "dead-wss"\ntarget = "wss-row1"\nat_ms = 200\n'
          'duration_ms = 100\n')
    res = run_experiment(load_experiment(tmp_path / "e.toml"))
    assert res.invariant_violations == 0
    jobs = {n: j["oddl"] for n, j in res.jobs.items()}
    assert {n: j["iterations"] for n, j in jobs.items()} == {"a": 20, "b": 20, "c": 20}
    stops = [s for j in jobs.values() for s in j.get("stops", [])]
    assert stops and all("no progress for" in s["why"] and "undelivered" in s["why"]
                         for s in stops)


# --- on the emulated testbed --------------------------------------------------------------

@pytest.mark.realtime
def test_several_jobs_and_a_fault_on_the_emulated_testbed(root: Path, tmp_path: Path) -> None:
    """The same admission on emu: the node programs run two jobs at once on disjoint
    columns, each with its own results. A board under a dies (its node program with it);
    a alone is stopped and goes on elsewhere, and b runs to its last iteration. (Before:
    several jobs were refused on emu; and the controller's status going "offline" at the
    end of each job, or attempt, cancelled every other job.)"""
    import os
    import subprocess
    import sys

    from oddl.app.experiments.results import read_store

    dead = '[[faults]]\nkind = "dead-board"\ntarget = "n1-0"\nat_ms = 300\n'
    exp = experiment(tmp_path, job("a", 4, 8, compute_ms=40.0, shape="col")
                     + job("b", 4, 30, compute_ms=40.0, shape="col") + dead)
    r = subprocess.run([sys.executable, "-m", "oddl.app", "run", str(exp),
                        "--backend", "emu", "--json", "--out", str(tmp_path / "run")],
                       cwd=root, capture_output=True, text=True, timeout=300,
                       env=os.environ | {"ODDL_LOG": "info"})
    emulator = (tmp_path / "run" / "emulator.log").read_text()  # kept in the run directory
    assert r.returncode == 0, r.stderr[-3000:] + "\nemulator:\n" + emulator[-3000:]
    # e.g. a broadcast lost in the broker (sim/devices/broker.py)
    assert "Traceback" not in emulator
    out = json.loads(r.stdout)
    assert out["backend"] == "emu" and out["invariant_violations"] == 0
    a, b = out["jobs"]["a"]["oddl"], out["jobs"]["b"]["oddl"]
    assert (a["iterations"], b["iterations"]) == (8, 30)
    assert [(s["ran_on"], s["resumed_on"]) for s in a["stops"]] == [
        ("a: 4 ranks, col 4 x 1 at row 0, col 0", "a: 4 ranks, col 4 x 1 at row 0, col 2")]
    assert "n1-0" in a["stops"][0]["why"] and "stops" not in b
    jobs = read_store(tmp_path / "run" / "results.sqlite")["oddl"]["jobs"]
    assert [i for i, _, _ in jobs["a"]["iterations"]] == list(range(8))
    assert not set(jobs["a"]["nodes"]) & set(jobs["b"]["nodes"])
    assert b["jct_s"] > a["stops"][0]["at_s"]  # b ran on through a's stop
    rows = [(f["kind"], f["recovered"]) for f in out["networks"]["oddl"]["faults"]]
    # on a starved machine (the suite beside two busy processes) every beat can be late at
    # once, which the watch takes for the bus ("broker-restart"), and says so; it passes
    assert ("dead-board", True) in rows and all(k in ("dead-board", "broker-restart") and ok
                                                for k, ok in rows), rows
    for n in jobs["b"]["nodes"]:  # the node programs say so at ODDL_LOG=info (a job id:
        # the experiment, this run's process and time, the network, the job)
        assert re.search(rf"node {n}: job mj-\d+-\d+-oddl-b done", emulator), emulator


@pytest.mark.realtime
def test_three_jobs_survive_a_wss_dead_for_100_ms_on_the_emulated_testbed(
        root: Path, tmp_path: Path) -> None:
    """Issue 85 on emu: wss-row1 dead at 300 ms for 100 ms under one of three jobs; every
    job runs to its last iteration, and the one whose row it was is stopped once at most
    and goes on."""
    import subprocess
    import sys

    fault = ('[[faults]]\nkind = "dead-wss"\ntarget = "wss-row1"\nat_ms = 300\n'
             'duration_ms = 100\n')
    exp = experiment(tmp_path, "".join(job(n, 4, 10, compute_ms=40.0) for n in "abc") + fault)
    r = subprocess.run([sys.executable, "-m", "oddl.app", "run", str(exp), "--backend", "emu",
                        "--json", "--out", str(tmp_path / "run")], cwd=root,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert out["invariant_violations"] == 0
    jobs = {n: j["oddl"] for n, j in out["jobs"].items()}
    assert {n: j["iterations"] for n, j in jobs.items()} == dict.fromkeys("abc", 10)
    assert all(len(j.get("stops", [])) <= 1 for j in jobs.values())
