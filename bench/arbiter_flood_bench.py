"""How much a flood of API requests slows a job the arbiter runs.

An emulated 2 x 2 grid and `oddl arbiter` on it; a 2-rank job runs alone, then the same
job again while one token sends `--rate` requests a second (GET /jobs, to 127.0.0.1,
bounded in count and time). Prints each run's mean iteration time and the slowdown.

    python bench/arbiter_flood_bench.py [--iterations 200] [--rate 1000]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import tomli_w

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from oddl.app.session import emulated, stop_emulator  # noqa: E402
from oddl.controller.base.config import grid_testbed  # noqa: E402

JOB = """name = "bench"
testbed = "-"
iterations = {n}
[workload]
model = "resnet50"
collective = "ring"
ranks = 2
epochs = 1
dataset_samples = 1000
batch_per_node = 32
compute_time_ms = 10.0
"""


def run_job(url: str, token: str, n: int) -> float:
    """Submit, wait, and the job's mean iteration time (ms)."""
    h = {"Authorization": f"Bearer {token}"}
    job = httpx.post(f"{url}/jobs", json={"experiment": JOB.format(n=n)}, headers=h,
                     timeout=30).json()["job"]
    while (j := httpx.get(f"{url}/jobs/{job}", headers=h, timeout=30).json())["state"] in (
            "queued", "running"):
        time.sleep(0.2)
    assert j["state"] == "finished", j
    return float(j["result"]["iteration_time_s"]) * 1e3


def flood(url: str, token: str, rate: float, stop: threading.Event, sent: list[int]) -> None:
    h = {"Authorization": f"Bearer {token}"}
    with httpx.Client(headers=h, timeout=10) as c:
        t0 = time.monotonic()
        while not stop.is_set() and sent[0] < 600 * rate:  # bounded: 10 min at most
            c.get(f"{url}/jobs")
            sent[0] += 1
            ahead = sent[0] / rate - (time.monotonic() - t0)
            if ahead > 0:
                time.sleep(ahead)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--rate", type=float, default=1000.0, help="requests a second")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tb = Path(d) / "grid2x2.toml"
        tb.write_text(tomli_w.dumps(grid_testbed(2, 2).model_dump(mode="json",
                                                                   exclude_none=True)))
        with emulated(tb, [], Path(d), print) as emu:
            arb = subprocess.Popen([sys.executable, "-m", "oddl.app", "arbiter",
                                    str(emu), "--state", f"{d}/state", "--user", "alice",
                                    "--user", "flood:observer", "--port", "0"],
                                   stdout=subprocess.PIPE, text=True)
            try:
                assert arb.stdout is not None
                url = arb.stdout.readline().strip().removeprefix("ready ")
                alice = (Path(d) / "state/tokens/alice").read_text().strip()
                quiet = run_job(url, alice, args.iterations)
                stop, sent = threading.Event(), [0]
                t = threading.Thread(target=flood, args=(url, (Path(d) / "state/tokens/"
                                     "flood").read_text().strip(), args.rate, stop, sent))
                t0 = time.monotonic()
                t.start()
                loud = run_job(url, alice, args.iterations)
                stop.set()
                t.join()
                achieved = sent[0] / (time.monotonic() - t0)
            finally:
                stop_emulator(arb)
    print(json.dumps({"iterations": args.iterations, "quiet_iteration_ms": round(quiet, 3),
                      "flooded_iteration_ms": round(loud, 3),
                      "requests_per_s": round(achieved, 1),
                      "slowdown_pct": round(100 * (loud / quiet - 1), 2)}))


if __name__ == "__main__":
    main()
