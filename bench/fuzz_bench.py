"""10^5 generated hostile inputs against every decoder a peer or a file reaches (issues 13
and 33): control messages, job-topic payloads, nodes' reports, count-action text and images
(and their decompile round trip), the arbiter's and the drill endpoint's HTTP bodies,
configs. Prints, per
target: accepted, refused with a clean error, tracebacks (anything else), hangs (an input
that took over 10 s), and the peak memory of the process.

    python bench/fuzz_bench.py [--n 100000] [--seed 0]
    python bench/fuzz_bench.py --each 10000     # as many inputs for every target
"""

from __future__ import annotations

import argparse
import random
import resource
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import msgspec
from oddl.controller.stage2.control_unit import Timing
from oddl.controller.stage2.job import JOB_VERSION, JobSpec

from bench import fuzz_targets as F

HANG_S = 10.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--each", type=int, default=None,
                    help="inputs for every target (instead of shares of --n)")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    tmp = Path(tempfile.mkdtemp(prefix="oddl-fuzz-"))
    (tmp / "tb.toml").write_bytes(F.TESTBED)
    exp_seed = F.EXPERIMENT.replace(b"../hw_configs/prototype-4node.toml", b"tb.toml")
    ctl_seed = F.CORPUS[2][:600]
    # a job the nodes accept, encoded as the controller does: a seed that cannot go stale
    job_seed = msgspec.json.encode(JobSpec(v=JOB_VERSION, job="j", collective="hd", size=10,
                                           rows=1, cols=2, degree=0, bidirectional=False,
                                           ranks=["a", "b"], nodes=["a", "b"], iterations=1,
                                           compute_ns=0, nic_sync=False,
                                           timing=Timing(1, 1, 1, 1, 1, 1, 1), routes={}))
    # (name, share of n, input generator, target)
    plan = [
        ("control message", 0.30, lambda: F.mutate(ctl_seed, rng, 8), F.control_message),
        ("job topics", 0.33, lambda: F.mutate(job_seed, rng, 8), F.job_topic),
        ("count-action text", 0.12, lambda: F.mutate(F.PROGRAM.encode(), rng), F.program_text),
        ("count-action image", 0.05, lambda: F.mutate_image(rng), F.image_json),
        ("image round trip", 0.03, lambda: F.mutate_image(rng), F.image_round_trip),
        ("node report", 0.05, lambda: F.mutate(F.REPORT, rng, 8), F.node_report),
        ("HTTP body", 0.02, lambda: F.mutate(rng.choice((F.SUBMIT, F.FAULT)), rng),
         F.http_body),
        ("testbed config", 0.05, lambda: F.mutate(F.TESTBED, rng),
         lambda raw: F.config_file(raw, tmp / "t", False)),
        ("experiment config", 0.04, lambda: F.mutate(exp_seed, rng),
         lambda raw: F.config_file(raw, tmp, True)),
        ("cassette", 0.01, lambda: F.mutate(F.CASSETTE, rng, 8),
         lambda raw: F.cassette(raw, tmp)),
    ]
    (tmp / "t").mkdir()
    totals = {"inputs": 0, "clean": 0, "tracebacks": 0, "hangs": 0}
    print(f"{'target':<20} {'inputs':>8} {'clean':>8} {'tracebacks':>10} {'hangs':>6} "
          f"{'slowest ms':>10}")
    for name, share, gen, target in plan:
        n = args.each if args.each is not None else round(args.n * share)
        clean = bad = hangs = 0
        slowest = 0.0
        for _ in range(n):
            raw = gen()
            t = time.perf_counter()
            try:
                target(raw)
                clean += 1
            except Exception:
                bad += 1
                if bad <= 3:
                    traceback.print_exc()
            dt = time.perf_counter() - t
            slowest = max(slowest, dt)
            hangs += dt > HANG_S
        print(f"{name:<20} {n:>8} {clean:>8} {bad:>10} {hangs:>6} {slowest * 1e3:>10.1f}")
        totals["inputs"] += n
        totals["clean"] += clean
        totals["tracebacks"] += bad
        totals["hangs"] += hangs
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"total: {totals['inputs']} inputs, {totals['clean']} accepted or refused cleanly, "
          f"{totals['tracebacks']} tracebacks, {totals['hangs']} hangs; peak memory "
          f"{peak:.0f} MB")


if __name__ == "__main__":
    main()
