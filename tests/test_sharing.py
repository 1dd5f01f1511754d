"""Jobs sharing a link: weighted max-min, MLTCP's convergence, time shifts as start
offsets, and the job-link affinity graph (issue 16)."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from oddl.app.api import grid_testbed
from oddl.app.experiments.link_study import comm_gaps
from oddl.app.experiments.runner import run_experiment
from oddl.controller.base.config import Experiment, JobEntry, LoadedExperiment, NetworkSpec
from oddl.controller.stage1.compat import Profile, best_placement, shift_against, time_shifts
from oddl.controller.stage2.workloads import model_spec
from oddl.sim.networks.electrical import max_min_rates
from pydantic import ValidationError

TWO_RACKS = {"name": "m", "kind": "fattree", "hosts_per_leaf": 2, "spines": 1,
             "oversubscription": 2, "latency_ns": 0}


def test_weighted_max_min_gives_60_40_and_leaves_the_rest_to_others() -> None:
    links = [("x",), ("x",), ("x", "y")]
    assert max_min_rates(links, {"x": 10.0, "y": 10.0}, [0.6, 0.4, 1.0]) == pytest.approx(
        [3.0, 2.0, 5.0])
    # a flow held elsewhere: the others share what it leaves, by weight
    assert max_min_rates([("x",), ("x",), ("x", "y")], {"x": 10.0, "y": 1.0},
                         [3.0, 1.0, 1.0]) == pytest.approx([6.75, 2.25, 1.0])


def _pair(shifts: tuple[float, float], sharing: str, iterations: int,
          weights: tuple[float, float] = (1.0, 1.0)) -> list[float]:
    """Two identical ResNet-50 jobs, one rank in each rack: their iterations' end gaps."""
    es = [JobEntry(name=n, model="resnet50", collective="ring", ranks=2, shape="col",
                   iterations=iterations, shift_ms=s, weight=w)
          for n, s, w in zip("ab", shifts, weights, strict=True)]
    return comm_gaps(es, {**TWO_RACKS, "sharing": sharing}, grid_testbed(2, 2))


def test_mltcp_interleaves_two_identical_jobs_as_its_shift_equation_says() -> None:
    """Fluid MLTCP with F = S r + I: while two identical jobs' communication overlaps, the
    gap d (in units of one job's communication time alone, T) follows
    d' = d (S + I) / (S d + I) (docs/cassini.md derives it); fair sharing keeps d."""
    t_m = model_spec("resnet50").grad_bytes() * 8 / 100.0 / 1e6  # ms: S bytes at 100 Gb/s
    gaps = _pair((0.0, 1.0), "mltcp", 8)
    for d, d_next in itertools.pairwise(gaps):
        if d >= t_m:
            break
        x = d / t_m
        assert d_next == pytest.approx(t_m * x * 2 / (x + 1), abs=0.02 * t_m)
    assert gaps[-1] > 0.9 * t_m  # interleaved: one job's communication after the other's
    fair = _pair((0.0, 1.0), "fair", 6)
    assert fair == pytest.approx([fair[0]] * len(fair), abs=1e-3)  # fair keeps the gap


def test_a_time_shift_delays_the_first_iteration_and_interleaves_half_duty_jobs() -> None:
    """Two jobs whose communication is half their iteration: shifted by half an iteration,
    both run at their pace alone; without, they collide every iteration."""
    es = [JobEntry(name=n, model="resnet50", collective="ring", ranks=2, shape="col",
                   iterations=6, compute_time_ms=8.18, shift_ms=s)
          for n, s in zip("ab", (0.0, 0.0), strict=True)]
    together = comm_gaps(es, {**TWO_RACKS}, grid_testbed(2, 2))
    half = [e.model_copy(update={"shift_ms": 8.18 if e.name == "b" else 0.0}) for e in es]
    shifted = comm_gaps(half, {**TWO_RACKS}, grid_testbed(2, 2))
    assert together == pytest.approx([0.0] * 6, abs=1e-3)  # in lock-step, colliding
    assert shifted == pytest.approx([8.18] * 6, abs=0.05)  # the shift, kept


def test_an_arrival_is_shifted_against_the_running_jobs_phase() -> None:
    """Hand-worked: A runs 8.18 ms compute then 8.18 ms alone on the link (T = 16.36 ms);
    its communication is at [8.18, 16.36) of each period. B, the same, arrives at 3 ms.
    Delayed by d, its communication starts at 3 + d + 8.18: interleaved when that is
    16.36 + 8.18, so d = 5.18 ms; a job with no running job beside it is not delayed."""
    a, b = Profile.on_off("a", 16.36, 8.18), Profile.on_off("b", 16.36, 8.18)
    arr = shift_against({"up": b}, {"up": [(a, 3.0)]})
    assert arr.shift_ms == pytest.approx(5.18, abs=16.36 / 200)
    assert (arr.score, arr.unshifted_score) == (1.0, pytest.approx(1 - 5.18 / 16.36, abs=0.01))
    assert shift_against({"up": b}, {"down": [(a, 3.0)]}).shift_ms == 0.0


def test_the_runner_shifts_an_arriving_job_as_cassini_says() -> None:
    """A network with `cassini`: B, arriving 3 ms into A's first iteration, is delayed as
    measured profiles and A's phase say, and both then run as fast as alone, B's iteration
    ending half a period after A's; without, they collide and both slow down."""
    es = [JobEntry(name=n, model="resnet50", collective="ring", ranks=2, shape="col",
                   iterations=6, compute_time_ms=8.18, arrival_ms=t)
          for n, t in (("a", 0.0), ("b", 3.0))]
    tb = grid_testbed(2, 2)

    def run(cassini: bool) -> dict[str, dict[str, Any]]:
        exp = Experiment(name="c", testbed="-", jobs=es,
                         networks=[{**TWO_RACKS, "cassini": cassini}])
        return run_experiment(LoadedExperiment(Path("."), exp, Path("."), tb, tuple(es))).jobs

    shifted, plain = run(True), run(False)
    assert shifted["a"]["m"]["cassini"] == {"shift_ms": 0.0, "score": 1.0,
                                            "unshifted_score": 1.0}  # alone at its start
    b = shifted["b"]["m"]["cassini"]
    assert b["shift_ms"] == pytest.approx(5.18, abs=0.1) and b["score"] == 1.0
    assert b["unshifted_score"] < 0.8
    alone = 16.36e-3
    for job in "ab":
        assert shifted[job]["m"]["iteration_time_s"] == pytest.approx(alone, rel=0.01)
        assert plain[job]["m"]["iteration_time_s"] > 1.1 * alone
    assert "cassini" not in plain["b"]["m"]


def test_a_loop_in_the_affinity_graph_is_reported() -> None:
    a, b, c = (Profile.on_off(n, 100, 40) for n in "abc")
    s = time_shifts({"l1": [a, b], "l2": [b, c], "l3": [c, a]})
    assert s.loops == ["loop b -l1- a -l3- c -l2- b: shifts for c differ by 20.000 ms"]
    chain = time_shifts({"l1": [a, b], "l2": [b, c]})
    assert chain.loops == [] and chain.shifts_ms == {"a": 0.0, "b": 40.0, "c": 80.0}


def test_placement_prefers_the_links_whose_jobs_are_compatible() -> None:
    running = {"l1": [Profile.on_off("x", 100, 70)], "l2": [Profile.on_off("y", 100, 40)]}
    new = Profile.on_off("new", 100, 40)
    assert best_placement([{"l1": new}, {"l2": new}], running) == 1
    assert best_placement([{"l1": new}, {"l3": new}], running) == 1  # nobody there


def test_sharing_is_refused_on_oddl_and_bad_weights_named() -> None:
    with pytest.raises(ValidationError, match="no link is shared"):
        NetworkSpec(name="o", kind="oddl", sharing="mltcp")
    with pytest.raises(ValidationError, match="cassini: ODDL gives each job its own"):
        NetworkSpec(name="o", kind="oddl", cassini=True)
    with pytest.raises(ValidationError, match="weight"):
        JobEntry(name="a", model="resnet50", ranks=2, iterations=1, weight=0)


def test_compat_measures_model_jobs_and_names_bad_specs(root: Path) -> None:
    def compat(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "oddl.app", "compat", *args],
                              cwd=root, capture_output=True, text=True, timeout=120)

    r = compat("--job", "resnet50:2", "--job", "resnet50:2", "--json")
    assert r.returncode == 0, r.stderr
    assert "resnet50: iteration" in r.stderr and '"score": 1.0' in r.stdout
    for spec, why in [("resnet50:x", "RANKS is a whole number"),
                      ("resnet50:1", "RANKS must be 2 .. 1024")]:
        r = compat("--job", spec)
        assert r.returncode == 2 and spec in r.stderr and why in r.stderr
    r = compat("--job", "resnet50", "--job", "a:100:40")
    assert r.returncode == 2 and "not both" in r.stderr


def _cassini_runs(es: list[JobEntry], hosts_per_leaf: int, cols: int
                  ) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    net = {"name": "m", "kind": "fattree", "hosts_per_leaf": hosts_per_leaf, "spines": 1,
           "oversubscription": hosts_per_leaf, "latency_ns": 0}
    out = []
    for cassini in (True, False):
        exp = Experiment(name="c", testbed="-", jobs=es, networks=[{**net, "cassini": cassini}])
        res = run_experiment(LoadedExperiment(Path("."), exp, Path("."), grid_testbed(2, cols),
                                              tuple(es)))
        out.append({j: d["m"] for j, d in res.jobs.items()})
    return out[0], out[1]


def test_cassini_places_a_job_where_its_links_are_compatible() -> None:
    """Two jobs that spend 67% of their iterations on the link cannot interleave: first
    fit puts the second beside the first (the same leaves' uplinks) and both slow down;
    CASSINI measures the candidate placements and takes one whose links nobody uses."""
    es = [JobEntry(name=n, model="resnet50", collective="ring", ranks=2, shape="col",
                   iterations=6, compute_time_ms=4.0, arrival_ms=t)
          for n, t in (("x", 0.0), ("y", 1.0))]
    cassini, plain = _cassini_runs(es, 2, 4)
    alone = 12.18e-3
    for j in "xy":
        assert cassini[j]["iteration_time_s"] == pytest.approx(alone, rel=0.001)
        assert plain[j]["iteration_time_s"] > 1.5 * alone


def test_cassini_pauses_running_jobs_to_realign_them_as_jobs_come_and_go() -> None:
    """Three jobs on one uplink, 45% of each iteration on it. When c arrives, CASSINI's
    shifts for all three are realised by pausing a and b before their next iterations
    (delaying c alone cannot place three); when c leaves, a and b are re-aligned for two.
    Every job finishes sooner than without CASSINI, where delays alone made it slower."""
    es = [JobEntry(name=n, model="resnet50", collective="ring", ranks=2, shape="col",
                   iterations=it, compute_time_ms=10.0, arrival_ms=t)
          for n, t, it in (("a", 0.0, 16), ("b", 1.0, 16), ("c", 2.0, 4))]
    cassini, plain = _cassini_runs(es, 3, 3)
    assert set(cassini["c"]["cassini"]["paused_ms"]) == {"a", "b"}
    assert len(cassini["a"]["paused_ms"]) == 2  # on c's arrival and on its leaving
    for j in "abc":
        assert cassini[j]["jct_s"] < 0.96 * plain[j]["jct_s"], j
