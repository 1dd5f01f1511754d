"""The talk's table (seeds 003): job combinations on one shared link, fair vs unfair vs
CASSINI-shifted vs MLTCP, beside the talk's speed-ups and verdicts (docs/cassini.md).

    python experiments/cassini_table.py [--iterations N] [--law fluid|dcqcn|tcp] [--overlap]
        [--json]

`--law`: the link shared max-min (the fluid model, default), or by DCQCN or TCP Reno with
queues, marks and losses (sim/networks/congestion.py; `--cc-tick-us` its step).
`--overlap`: each job all-reduces DDP's buckets while its backward runs (docs/model.md).
"""

from __future__ import annotations

import argparse
import json
import time

from oddl.app.experiments.link_study import LAWS, LinkJob, on_one_link

# the talk's combinations, its speed-ups from unfairness, and its verdicts
TALK = [
    (("vgg11", "vgg11"), (1.05, 0.86), False),
    (("dlrm", "dlrm"), (1.3, 1.28), True),
    (("bert", "vgg19"), (1.17, 0.94), False),
    (("vgg19", "vgg16", "resnet50"), (1.18, 1.18, 1.01), True),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=40)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--law", choices=LAWS, default="fluid")
    ap.add_argument("--cc-tick-us", type=float, default=2.0)
    ap.add_argument("--overlap", action="store_true")
    a = ap.parse_args()
    rows = []
    for models, talk, talk_ok in TALK:
        t = time.perf_counter()
        jobs = [LinkJob(f"{m}-{k}" if models.count(m) > 1 else m, m)
                for k, m in enumerate(models, start=1)]
        o = on_one_link(jobs, a.iterations, law=a.law, cc_tick_us=a.cc_tick_us,
                        overlap=a.overlap)
        rows.append({"jobs": [j.name for j in jobs], "law": a.law, "talk_unfair": talk,
                     "talk_compatible": talk_ok, "score": o.score,
                     "compatible": o.compatible(), "shifts_ms": o.shifts_ms,
                     "fair_iteration_ms": {j: round(s * 1e3, 3)
                                           for j, s in o.iteration_s["fair"].items()},
                     **{p: list(o.speedup(p).values()) for p in ("unfair", "cassini", "mltcp")},
                     "wall_s": round(time.perf_counter() - t, 1)})
    if a.json:
        print(json.dumps(rows, indent=1))
        return
    print("| jobs | talk: unfair | ours: unfair | CASSINI | MLTCP | score | talk | ours |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        def f(xs: list[float] | tuple[float, ...]) -> str:
            return " / ".join(f"{x:.2f}x" for x in xs)
        print(f"| {' + '.join(r['jobs'])} | {f(r['talk_unfair'])} | {f(r['unfair'])} | "
              f"{f(r['cassini'])} | {f(r['mltcp'])} | {r['score']:.3f} | "
              f"{'compatible' if r['talk_compatible'] else 'not'} | "
              f"{'compatible' if r['compatible'] else 'not'} |")
    for r in rows:
        print(f"# {' + '.join(r['jobs'])}: fair iteration {r['fair_iteration_ms']} ms, "
              f"CASSINI shifts {r['shifts_ms']} ms, {r['wall_s']} s")


if __name__ == "__main__":
    main()
