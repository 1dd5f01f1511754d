"""README's test command, run N times in a row: which tests failed, in how many runs.

    python bench/soak.py [-n 10] [--busy [N]] [--out DIR] [-- PYTEST ARGS]

Each run is `python -m pytest -q` (README's second command, after its install), with a
JUnit report per run in `--out` (default soak-<time>/); `--busy N` keeps N extra
processes spinning for the whole soak (`--busy 2` on 2 cores: the brief's loaded
machine). It prints every failing or erroring test with the runs it failed in and the
first line of why, and whether its report names the host as the cause (a verdict a late
answer can give must: "the host may be the cause", "host overloaded"), each run's time
and outcome, and writes `soak.json`; exit 0 only if every run passed. A stop (Ctrl-C)
ends the current run and says what was tallied so far.

The first-day commands on a loaded machine (issue 83): the docs tier's blocks of the
README's quick start, the arbiter's quick start and the dashboard's Table 1 on the
emulator, beside two busy processes:

    python bench/soak.py -n 3 --busy 2 -- -n 0 --docs -m docs -k "README or arbiter or dashboard"
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Run:
    index: int
    seconds: float
    exit_code: int
    tests: int
    failed: list[str] = field(default_factory=list)


def _spin(parent: int) -> None:
    """A core kept busy, until the soak that started it is gone (however it went)."""
    while os.getppid() == parent:
        for _ in range(1_000_000):
            pass


@contextlib.contextmanager
def busy(n: int) -> Iterator[None]:
    """`n` processes spinning while inside."""
    ps = [mp.get_context("spawn").Process(target=_spin, args=(os.getpid(),), daemon=True)
          for _ in range(n)]
    for p in ps:
        p.start()
    try:
        yield
    finally:
        for p in ps:
            p.kill()
            p.join()


# what a verdict says when the host, not a device, may be its cause (issue 83)
HOST_NAMED = ("the host may be the cause", "host overloaded", "this host's load")


def failures(report: Path) -> tuple[int, dict[str, str]]:
    """A JUnit report's test count, and each failed or erroring test with why (a line)."""
    if not report.exists():
        return 0, {"(the run wrote no report)": "pytest did not finish"}
    root = ET.parse(report).getroot()
    out: dict[str, str] = {}
    tests = 0
    for case in root.iter("testcase"):
        tests += 1
        for tag in ("failure", "error"):
            bad = case.find(tag)
            if bad is not None:
                name = f"{case.get('classname', '')}::{case.get('name', '')}"
                text = f"{bad.get('message') or ''}\n{bad.text or ''}"
                why = text.strip().splitlines()
                host = any(h in text for h in HOST_NAMED)
                out[name] = ("[names the host] " if host else "") + (why[0][:200] if why
                                                                      else tag)
    return tests, out


def main() -> int:
    ap = argparse.ArgumentParser(description="README's test command, N times: failures "
                                             "tallied by test")
    ap.add_argument("-n", type=int, default=10, help="runs (default 10)")
    ap.add_argument("--busy", type=int, nargs="?", const=1, default=0, metavar="N",
                    help="keep N extra processes spinning (alone: 1)")
    ap.add_argument("--out", type=Path, default=None, help="reports (default soak-<time>)")
    ap.add_argument("pytest_args", nargs="*", help="after --: more pytest arguments")
    args = ap.parse_args()
    out = args.out or ROOT / f"soak-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    runs: list[Run] = []
    why: dict[str, str] = {}
    try:
        with busy(args.busy):
            for i in range(1, args.n + 1):
                report = out / f"run-{i:02d}.xml"
                t0 = time.monotonic()
                rc = subprocess.call([sys.executable, "-m", "pytest", "-q", "-p",
                                      "no:cacheprovider", f"--junitxml={report}",
                                      *args.pytest_args], cwd=ROOT,
                                     stdout=(out / f"run-{i:02d}.log").open("w"),
                                     stderr=subprocess.STDOUT)
                tests, bad = failures(report)
                why.update(bad)
                runs.append(Run(i, round(time.monotonic() - t0, 1), rc, tests, sorted(bad)))
                print(f"run {i}/{args.n}: exit {rc}, {tests} tests, {len(bad)} failed, "
                      f"{runs[-1].seconds:.0f} s", flush=True)
    except KeyboardInterrupt:
        print(f"stopped after {len(runs)} runs", flush=True)
    tally: dict[str, list[int]] = {}
    for r in runs:
        for name in r.failed:
            tally.setdefault(name, []).append(r.index)
    beside = f" beside {args.busy} busy process{'es' * (args.busy > 1)}" if args.busy else ""
    print(f"\n{len(runs)} runs{beside}: "
          f"{sum(r.exit_code == 0 for r in runs)} passed; times "
          f"{min((r.seconds for r in runs), default=0):.0f} to "
          f"{max((r.seconds for r in runs), default=0):.0f} s")
    for name, its in sorted(tally.items(), key=lambda kv: -len(kv[1])):
        print(f"  {len(its)} of {len(runs)}: {name} (runs {', '.join(map(str, its))}): "
              f"{why[name]}")
    (out / "soak.json").write_text(json.dumps(
        {"busy": args.busy, "runs": [asdict(r) for r in runs],
         "failures": {k: {"runs": v, "why": why[k]} for k, v in tally.items()}}, indent=1))
    return 0 if runs and all(r.exit_code == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
