"""What a run will cost, said before it starts: its wall time and memory on this machine,
from the flows it simulates and the nodes it models.

The figures are this code's, measured on the 2-core machines here (docs/performance.md):
an ODDL flow through the control units and the board models ~60 us, a baseline's flow
~10 us, a congestion-control step ~100 us, a node of an ODDL network ~4 ms (its board,
its plan: grid-4096's iteration 18 s, a 64 x 1000 grid's 7 min), and its heartbeats over
the simulated time, ~18 us each (a hybrid job at 0.001 TFLOP/s computes 6 h an
iteration: 14 M beats of 64 boards, 4 min); the
models of a node ~130 KB (grid-4096: 550 MB). An estimate, not a promise: a run beyond
`LIMIT_S` or the memory the machine has free is refused up front, saying so, unless
forced (`oddl run --force`). Reproducers
(issue 43): a 64 x 1000 grid exhausted 4 GB in a minute; `cc_tick_us = 0.1` on a 200-job
trace ran on with no word of its hours.
"""

from __future__ import annotations

import contextlib
import os
import resource
from dataclasses import dataclass
from pathlib import Path

from oddl.controller.base.config import LoadedExperiment, NetworkSpec
from oddl.controller.service.jobs import JobRequest

ODDL_FLOW_S = 60e-6
MODEL_FLOW_S = 10e-6
ODDL_NODE_S = 4e-3
CC_STEP_S = 100e-6
BEAT_S = 18e-6  # a board's heartbeat in sim (gpt-hybrid-64 at 0.01 TFLOP/s: 1.4 M, 25 s)
NODE_BYTES = 130_000
FLOW_ROW_BYTES = 120  # a recorded flow, held until its iteration is stored
LIMIT_S = 3600.0


@dataclass(frozen=True)
class Estimate:
    seconds: float
    memory_bytes: int
    parts: tuple[str, ...]  # what each figure comes from

    def __str__(self) -> str:
        return (f"about {_duration(self.seconds)} and {self.memory_bytes / 1e9:.1f} GB "
                f"({'; '.join(self.parts)})")


class TooBig(ValueError):
    """A run that would take longer than LIMIT_S or more memory than is free."""


def _duration(s: float) -> str:
    return f"{s / 3600:.1f} h" if s >= 3600 else f"{s / 60:.0f} min" if s >= 60 else \
        f"{s:.0f} s"


def available_bytes() -> int:
    """Memory this process can have now: the machine's free memory (MemAvailable, or its
    total where unknown), within this process's own limits (`ulimit -v`: what it has
    mapped counts; a cgroup's memory.max: what the group uses counts). Reproducer (issue
    62): under `ulimit -v 4000000`, `oddl verify trace` of a 64,000-node grid was not
    refused and ended in MemoryError at 3.7 GB."""
    free = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    with contextlib.suppress(OSError, ValueError):
        free = _field("/proc/meminfo", "MemAvailable:") * 1024
    for limit in (resource.RLIMIT_AS, resource.RLIMIT_DATA):
        soft = resource.getrlimit(limit)[0]
        if soft != resource.RLIM_INFINITY:
            with contextlib.suppress(OSError, ValueError):
                free = min(free, soft - _field("/proc/self/status", "VmSize:") * 1024)
    with contextlib.suppress(OSError, ValueError):
        cap = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if cap != "max":
            used = int(Path("/sys/fs/cgroup/memory.current").read_text())
            free = min(free, int(cap) - used)
    return max(free, 0)


def _field(path: str, name: str) -> int:
    """A `name: N kB` line's N."""
    with open(path) as f:
        for line in f:
            if line.startswith(name):
                return int(line.split()[1])
    raise ValueError(f"{path}: no {name}")


def network_seconds(ctx: LoadedExperiment, spec: NetworkSpec, reqs: list[JobRequest],
                    flows: int) -> tuple[float, str | None]:
    """What one network of the run will take, and what that figure comes from (None: its
    flows, at a model network's cost each)."""
    tb = ctx.testbed
    if spec.kind == "oddl":
        # every board beats every heartbeat_ms of simulated time, computing or not
        beats = tb.n_nodes * sum(r.iterations * _compute_s(r) for r in reqs) / (
            tb.monitor.heartbeat_ms / 1e3)
        return (flows * ODDL_FLOW_S + tb.n_nodes * ODDL_NODE_S + beats * BEAT_S,
                f"{spec.name}: {flows:,} flows through the control units, "
                f"{tb.n_nodes:,} boards" + (f", {beats:,.0f} heartbeats over the simulated "
                                            f"compute" if beats >= 1e5 else ""))
    secs, part = flows * MODEL_FLOW_S, None
    if spec.sharing in ("dcqcn", "tcp", "mltcp-dcqcn", "mltcp-tcp"):
        # the least simulated time: every byte of every job through the links of its
        # ranks, one after the other; each step is the law's tick
        rate = (spec.link_gbps or tb.optical.line_rate_gbps) * 1e9 / 8
        busy_s = sum(r.iterations * 2 * r.size / rate for r in reqs)
        steps = busy_s / (spec.cc_tick_us * 1e-6)
        secs += steps * CC_STEP_S
        part = (f"{spec.name}: {spec.sharing} in {steps:,.0f} steps of "
                f"{spec.cc_tick_us:g} us at least")
    return secs, part


def _compute_s(r: JobRequest) -> float:
    """A job's simulated compute an iteration: its FLOPs at its GPUs' rate (a hybrid
    job's), or its given compute (a calibrated one is not known yet: none)."""
    return r.hybrid.rank_compute_s() if r.hybrid is not None else r.compute_ns / 1e9


def estimate(ctx: LoadedExperiment, reqs: list[JobRequest], flows: int) -> Estimate:
    """A run of `reqs` (`flows` of them in all, each network's) on every network of
    `ctx`'s experiment."""
    exp, tb = ctx.experiment, ctx.testbed
    each = [network_seconds(ctx, spec, reqs, flows) for spec in exp.networks]
    parts = [part for _s, part in each if part is not None]
    per_iteration = flows // max(1, sum(r.iterations for r in reqs))
    memory = tb.n_nodes * NODE_BYTES * (1 + sum(s.kind == "oddl" for s in exp.networks)) \
        + per_iteration * FLOW_ROW_BYTES
    parts.append(f"{tb.n_nodes:,} nodes modelled")
    return Estimate(sum(s for s, _p in each), memory, tuple(parts))


def refuse_if_too_big(est: Estimate) -> None:
    """TooBig, saying why and how to go on anyway."""
    free = available_bytes()
    if est.seconds > LIMIT_S or est.memory_bytes > free:
        what = "longer than an hour" if est.seconds > LIMIT_S else \
            f"more memory than the {free / 1e9:.1f} GB free"
        raise TooBig(f"this run would take {what}: {est}; --force runs it anyway, or "
                     f"--iterations N runs fewer")
