"""Golden runs (issue 32): every figure of three runs, held to the nanosecond, so that making
oddl faster cannot move a result. Table 1 at 500 iterations, one 1024-node halving-doubling
iteration with every flow recorded, and a small multi-job run with queueing.

What is held: the run's JSON (every network's figures and stats, the jobs), the results
store (every iteration's start and end, every job's placement and times, the faults and
outcomes) and a digest of every flow row. Wall-clock figures (`wall_s`, the planner's
`plan_s`) are left out: they are what should change; so is the summary's `steady_state`,
which says how the run got its figures: Table 1's run is held both ways, its repeated
iteration's copies written (sim/steady.py) and every iteration simulated.

To rewrite the files after a change that is meant to move a figure (say which in the
commit): `python -m tests.test_golden`.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest
from oddl.app.experiments.results import RunStore, read_store
from oddl.app.experiments.runner import run_experiment
from oddl.controller.base.config import load_experiment

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "data" / "golden"
# golden name -> (experiment, iterations or None for the experiment's own, worker
# processes for the baseline networks: the files were written with none, so the runs with
# workers show that where a network runs changes nothing)
RUNS = {
    "table1-500": (ROOT / "experiments" / "table1-resnet50.toml", 500, 0),
    "grid1024-hd": (GOLDEN / "grid1024-hd.toml", None, 1),
    "multijob-64": (GOLDEN / "multijob-64.toml", None, 2),
}
_WALL = ("wall_s", "plan_s", "steady_state")


def _drop_wall(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _drop_wall(v) for k, v in x.items() if k not in _WALL}
    if isinstance(x, list):
        return [_drop_wall(v) for v in x]
    return x


def figures(name: str, tmp: Path, workers: int = 0, every: bool = True) -> dict[str, Any]:
    """Everything a run reports and stores, as plain JSON-able data (`every`: every
    iteration simulated)."""
    path, iterations, _ = RUNS[name]
    ctx = load_experiment(path)
    db = tmp / f"{name}.sqlite"
    store = RunStore(db)
    try:
        res = run_experiment(ctx, iterations=iterations, store=store, workers=workers,
                             every_iteration=every)
    finally:
        store.close()
    con = sqlite3.connect(db)
    try:
        flows = {}
        for (net,) in con.execute("SELECT DISTINCT network FROM flows ORDER BY network"):
            h = hashlib.sha256()
            for row in con.execute("SELECT iteration, flow, step, src, dst, bytes, hops, "
                                   "t_submit_ns, t_deliver_ns FROM flows WHERE network = ? "
                                   "ORDER BY iteration, flow", (net,)):
                h.update(repr(row).encode())
            flows[net] = h.hexdigest()
    finally:
        con.close()
    stored = read_store(db)
    summary = res.summary(ctx.experiment.reference)
    if name.startswith("table1"):  # (one way: its copies, the other: none)
        assert bool(summary["steady_state"]) != every, summary["steady_state"]
    return json.loads(json.dumps(_drop_wall({
        "summary": summary, "store": stored, "flow_digests": flows})))


@pytest.mark.parametrize(("name", "every"), [(n, True) for n in RUNS] + [("table1-500", False)],
                         ids=[*RUNS, "table1-500-copies"])
def test_golden_figures_do_not_move(name: str, every: bool, tmp_path: Path) -> None:
    want = json.loads((GOLDEN / f"{name}.json").read_text())
    got = figures(name, tmp_path, RUNS[name][2], every)
    for part in want:  # a part at a time: a failure shows where it moved
        assert got[part] == want[part], part
    assert got == want


def main() -> None:
    import tempfile
    for name in sys.argv[1:] or RUNS:
        with tempfile.TemporaryDirectory() as tmp:
            got = figures(name, Path(tmp))
        (GOLDEN / f"{name}.json").write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
        print(f"wrote {GOLDEN / f'{name}.json'}")


if __name__ == "__main__":
    main()
