"""CASSINI's compatibility score and rotations (controller/stage1/compat.py), on hand-worked
circles."""

from __future__ import annotations

from pathlib import Path

import pytest
from oddl.controller.stage1.compat import Profile, compatibility

P = Profile.on_off


@pytest.mark.parametrize(("comm_ms", "score"), [(40, 1.0), (50, 1.0), (60, 0.8), (90, 0.2)])
def test_two_identical_jobs_interleave_under_half_duty_only(comm_ms: float,
                                                            score: float) -> None:
    """Two 100 ms jobs at full link demand: each overlap ms beyond 50 costs 1 % of score
    (excess 2 - 1 over 2 x comm - 100 of 100 ms)."""
    c = compatibility([P("a", 100, comm_ms), P("b", 100, comm_ms)])
    assert c.score == pytest.approx(score)
    assert c.perimeter_ms == 100


def test_shifts_make_half_duty_jobs_take_turns() -> None:
    c = compatibility([P("a", 100, 50), P("b", 100, 50)])
    assert (c.score, c.rotations_deg, c.shifts_ms) == (1.0, (0.0, 180.0), (0.0, 50.0))


def test_unequal_periods_roll_around_the_lcm() -> None:
    """A 100 ms job communicating half the time and a 50 ms one communicating half its
    time: the circle is 100 ms, B communicates twice on it, and whatever the rotation
    one of B's bursts overlaps A's for 25 ms: score 1 - 25/100."""
    c = compatibility([P("a", 100, 50), P("b", 50, 25)])
    assert c.perimeter_ms == 100 and c.score == pytest.approx(0.75)


def test_partial_demands_fit_together_without_shifts() -> None:
    c = compatibility([P("a", 100, 50, 0.5), P("b", 100, 100, 0.5)])
    assert c.score == 1.0 and c.shifts_ms == (0.0, 0.0)


@pytest.mark.parametrize("n", [3, 4])
def test_n_jobs_of_one_nth_duty_fully_interleave(n: int) -> None:
    """Three (exhaustive) or four (coordinate descent) 100 ms jobs, each 100/n ms of
    communication: the best rotations space them evenly."""
    c = compatibility([P(f"j{k}", 100, 100 / n) for k in range(n)])
    assert c.score == pytest.approx(1.0)
    # evenly, to the circle's 1 ms resolution
    assert sorted(c.shifts_ms) == pytest.approx([100 / n * k for k in range(n)], abs=1.0)


def test_bad_profile_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="vgg: need 0 <= comm_ms <= iteration_ms"):
        P("vgg", 100, 120)


def test_oddl_compat_json_plot_and_bad_specs(tmp_path: Path) -> None:
    import json

    from click.testing import CliRunner
    from oddl.app.cli import main

    r = CliRunner().invoke(main, ["compat", "--job", "a:100:60", "--job", "b:100:60:1",
                                  "--json", "--plot", str(tmp_path / "c.png")])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout) == {"score": 0.8, "rotations": {"a": 0.0, "b": 144.0},
                                    "shifts_ms": {"a": 0.0, "b": 40.0}, "perimeter_ms": 100.0}
    assert (tmp_path / "c.png").stat().st_size > 10_000
    for spec, why in [("a:100", "expected NAME:ITER_MS:COMM_MS[:DEMAND]"),
                      ("a:x:1", "are numbers"), ("a:100:10:2", "DEMAND in (0, 1]"),
                      ("a:100:150", "need 0 <= comm_ms <= iteration_ms"),
                      ("a:nan:1", "finite")]:
        r = CliRunner().invoke(main, ["compat", "--job", spec])
        assert r.exit_code == 2 and f"--job {spec!r}" in r.output and why in r.output, r.output


def test_iterations_far_apart_still_get_a_circle() -> None:
    """The bin starts wide enough for the longest iteration (widening it step by step from
    the shortest's 1/200 took ~1e8 steps for these two)."""
    c = compatibility([Profile.on_off("a", 0.001, 0.0005), Profile.on_off("b", 1e7, 1.0)])
    assert c.perimeter_ms == pytest.approx(1e7, rel=1e-3) and c.score == 1.0
