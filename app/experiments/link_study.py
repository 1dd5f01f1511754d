"""Jobs that share one link, four ways (the talk's table, docs/cassini.md).

k jobs, each on a 2 x (ranks / 2) block of a 2 x N grid, whose two rows are two racks of a
fat-tree joined by one link of the line rate: each job's ring crosses that link once each
way, so all k jobs share it. The same jobs then run with the link shared

- `fair`: max-min fair;
- `unfair`: by fixed weights (0.6/0.4 for two jobs: the talk's 60/40);
- `cassini`: fair, each job's first iteration shifted as CASSINI's rotations say (from
  profiles measured on the link, `oddl compat`);
- `mltcp`: MLTCP's weights;

every run through the multi-job runner (`run_experiment`), so the admission, time shifts and
flow solver are the ones an experiment uses. Each job's iteration time is the mean of its
second half of iterations (past MLTCP's convergence); a speed-up is the fair iteration time
over the policy's. Jobs under fair and MLTCP start `JITTER_MS` apart (job k at k x 1 ms), as
jobs never start at the same instant: identical jobs that did would stay in lock-step under
any symmetric policy.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oddl.app import registry
from oddl.app.experiments.results import RunStore, read_store
from oddl.app.experiments.runner import run_experiment
from oddl.controller.base.config import (
    Experiment,
    JobEntry,
    LoadedExperiment,
    NetworkSpec,
    grid_testbed,
)
from oddl.controller.stage1.compat import compatibility

JITTER_MS = 1.0
UNFAIR = {2: (0.6, 0.4), 3: (0.5, 0.3, 0.2)}  # the talk's 60/40, and a 3-job analogue


@dataclass(frozen=True)
class LinkJob:
    name: str
    model: str
    ranks: int = 4  # even: half in each rack


@dataclass(frozen=True)
class Outcome:
    """Per job, per policy: the steady iteration time (s); the CASSINI score and shifts."""

    iteration_s: dict[str, dict[str, float]]  # policy -> job -> s
    score: float
    shifts_ms: dict[str, float]

    def speedup(self, policy: str) -> dict[str, float]:
        fair = self.iteration_s["fair"]
        return {j: round(fair[j] / t, 3) for j, t in self.iteration_s[policy].items()}

    def compatible(self) -> bool:
        """The talk's definition: unfairness makes every job of the group faster."""
        return all(s >= 1.0 - 1e-3 for s in self.speedup("unfair").values())


LAWS = ("fluid", "dcqcn", "tcp")  # how the link is shared: max-min, or a law (docs)


def on_one_link(jobs: list[LinkJob], iterations: int = 40, line_rate_gbps: float = 100.0,
                mltcp: tuple[float, float] = (1.0, 1.0), law: str = "fluid",
                cc_tick_us: float = 2.0, overlap: bool = False) -> Outcome:
    """`law`: the link shared max-min (fluid), or by DCQCN or TCP Reno, under which the
    unfair run weights each job's increase and MLTCP scales it (sim/networks/congestion.py).
    `overlap`: each job's DDP buckets all-reduced while its backward runs."""
    if law not in LAWS:
        raise ValueError(f"law {law!r}: one of {', '.join(LAWS)}")
    if any(j.ranks < 2 or j.ranks % 2 for j in jobs):
        raise ValueError("each job needs an even number of ranks, half in each rack")
    cols = sum(j.ranks // 2 for j in jobs)
    tb = grid_testbed(2, cols, line_rate_gbps=line_rate_gbps)
    profiles = registry.profiles_on_a_link([(j.name, j.model, j.ranks) for j in jobs],
                                           line_rate_gbps, overlap)
    c = compatibility(profiles)
    weights = UNFAIR.get(len(jobs), tuple(1.0 / (k + 1) for k in range(len(jobs))))
    jitter = [k * JITTER_MS for k in range(len(jobs))]
    fair = "fair" if law == "fluid" else law
    runs = {"fair": (fair, jitter, None),
            "unfair": ("weighted" if law == "fluid" else law, jitter, weights),
            "cassini": (fair, list(c.shifts_ms), None),
            "mltcp": ("mltcp" if law == "fluid" else f"mltcp-{law}", jitter, None)}
    out: dict[str, dict[str, float]] = {}
    for policy, (sharing, shifts, w) in runs.items():
        entries = [JobEntry(name=j.name, model=j.model, collective="ring", ranks=j.ranks,
                            iterations=iterations, shape="grid", shift_ms=s,
                            weight=w[k] if w else 1.0, overlap=overlap)
                   for k, (j, s) in enumerate(zip(jobs, shifts, strict=True))]
        net = {"name": policy, "kind": "fattree", "hosts_per_leaf": cols, "spines": 1,
               "oversubscription": cols, "sharing": sharing, "mltcp_slope": mltcp[0],
               "mltcp_intercept": mltcp[1], "cc_tick_us": cc_tick_us}
        out[policy] = {j: sum(its) / len(its) / 1e9
                       for j, its in _iterations(tb, entries, net).items()}
    return Outcome(out, c.score, dict(zip((j.name for j in jobs), c.shifts_ms, strict=True)))


def _run(tb: Any, entries: list[JobEntry], net: dict[str, Any]) -> dict[str, list[Any]]:
    """Each job's (iteration, t_start, t_end) rows, as the run's store recorded them."""
    exp = Experiment(name="link", testbed="-", jobs=entries,
                     networks=[NetworkSpec.model_validate(net)])
    with tempfile.TemporaryDirectory() as d:
        store = RunStore(Path(d) / "results.sqlite")
        try:
            run_experiment(LoadedExperiment(Path(d), exp, Path(d), tb, tuple(entries)), store=store)
        finally:
            store.close()
        jobs = read_store(Path(d) / "results.sqlite")[net["name"]]["jobs"]
    return {name: j["iterations"] for name, j in jobs.items()}


def _iterations(tb: Any, entries: list[JobEntry], net: dict[str, Any]) -> dict[str, list[int]]:
    """Each job's iteration times (ns), the second half of its iterations."""
    out = {}
    for name, rows in _run(tb, entries, net).items():
        its = [t1 - t0 for _i, t0, t1 in rows]
        out[name] = its[len(its) // 2:]
    return out


def comm_gaps(entries: list[JobEntry], net: dict[str, Any], tb: Any) -> list[float]:
    """Two jobs: how far apart (ms) their iterations end, iteration by iteration (MLTCP's
    convergence: the gap grows until their communication interleaves)."""
    rows = _run(tb, entries, net)
    a, b = (rows[e.name] for e in entries)
    return [(y[2] - x[2]) / 1e6 for x, y in zip(a, b, strict=False)]
