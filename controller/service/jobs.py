"""A job as the orchestration holds it: the request (what it needs, for how long) and the
record (where and when it ran, each iteration, what it cost)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from oddl.controller.base.config import JobEntry
from oddl.controller.base.ddp import Overlap
from oddl.controller.base.parallelism import Hybrid
from oddl.controller.service.backend import JobOutcome, disturbance
from oddl.controller.stage1.compat import (
    Arrival,
)
from oddl.controller.stage1.placement import Partition
from oddl.controller.stage1.plan import Plan
from oddl.controller.stage2.workloads import alltoall_bytes, compute_ms, model_spec


@dataclass(frozen=True)
class JobRequest:
    """A job as the queue holds it: what it needs, and for how long."""

    name: str
    model: str
    collective: str
    ranks: int
    iterations: int
    compute_ns: int
    arrival_ns: int
    shape: str
    size: int  # gradient bytes
    alltoall: int = 0  # bytes per rank pair per iteration (DLRM's embedding exchange)
    weight: float = 1.0  # its share of a link shared by weight
    shift_ns: int = 0  # its first iteration starts this long after it starts (CASSINI)
    priority: int = 0  # the service's queue: higher first, then by arrival
    hybrid: Hybrid | None = None  # a Transformer's split: its steps hold its compute
    overlap: Overlap | None = None  # DDP's buckets, all-reduced while backward runs
    user: str = ""  # the service's: who submitted it
    time_limit_ns: int = 0  # the service's: stopped this long after its first start (0: no)
    after: str = ""  # the service's: "jN" (starts once jN has ended), "jN:ok" (finished),
    # "jN:notok" (ended otherwise)
    webhook: str = ""  # the service's: a URL told of its end (app/notices.py)
    title: str = ""  # the service's: the submitted experiment's name
    singleton: bool = False  # the service's: after every earlier job of its user and title

    @classmethod
    def of(cls, e: JobEntry) -> JobRequest:
        hybrid = e.parallelism.hybrid(e.model, e.bytes_per_param) if e.parallelism else None
        ms = e.compute_time_ms if e.compute_time_ms is not None else \
            0.0 if hybrid is not None else compute_ms(e.model, e.batch_per_node)
        ns = e.device_compute_ns(e.model, e.batch_per_node)
        ns = round(ms * 1e6) if ns is None else ns
        overlap = e.ddp(e.model, e.batch_per_node, e.bytes_per_param, ns)
        return cls(e.name, e.model, e.collective, e.ranks, e.total_iterations(),
                   ns, round(e.arrival_ms * 1e6), e.shape,
                   model_spec(e.model).grad_bytes(e.bytes_per_param) if overlap is None
                   else overlap.nbytes,
                   alltoall_bytes(e.model, e.batch_per_node, e.ranks) if hybrid is None
                   else 0, e.weight, round(e.shift_ms * 1e6), hybrid=hybrid,
                   overlap=overlap)

    @property
    def exact(self) -> bool:
        """2-D hierarchical needs its whole rectangle (no spare cells)."""
        return self.collective == "hier2d"

    @property
    def group(self) -> int:
        """Ranks that keep to one WSS row: a hybrid job's tensor group."""
        return self.hybrid.tensor if self.hybrid is not None else 1


@dataclass
class JobRecord:
    """One job's life on one network."""

    name: str
    arrival_ns: int
    partition: Partition | None = None
    start_ns: int | None = None
    end_ns: int | None = None
    iteration_ns: list[int] = field(default_factory=list)
    flows: int = 0
    control_messages: int = 0
    # CASSINI (a network with `cassini`): the start delay chosen against the jobs running
    # at its start, and the worst shared link's score with it and without
    cassini: Arrival | None = None
    placed_ns: int = 0  # when its partition was last given it
    paused_ms: list[float] = field(default_factory=list)  # CASSINI's re-alignments of it
    held_ns: int = 0  # node-ns held on partitions it has left (stopped for a fault)
    # each stop for a fault: when, why, where it ran, the iteration it went on from
    stops: list[dict[str, Any]] = field(default_factory=list)
    plan: Plan | None = None  # its latest stage 1 (ODDL)
    disturbance: dict[str, int] = field(default_factory=dict)  # its attempts', summed
    violations: int = 0  # invariant violations found of its attempts

    def took(self, out: JobOutcome) -> None:
        """An attempt's outcome (a run to its end, or one stopped for a fault) counted."""
        self.flows += out.flows
        self.control_messages += out.control_messages
        for k, v in disturbance(out.stats).items():
            self.disturbance[k] = self.disturbance.get(k, 0) + v

    @property
    def jct_s(self) -> float:
        assert self.end_ns is not None
        return (self.end_ns - self.arrival_ns) / 1e9

    @property
    def queued_s(self) -> float:
        assert self.start_ns is not None
        return (self.start_ns - self.arrival_ns) / 1e9

    def public(self) -> dict[str, Any]:
        its = sorted(self.iteration_ns)
        p = self.partition
        return {"jct_s": round(self.jct_s, 9), "queued_s": round(self.queued_s, 9),
                "iterations": len(its),
                "iteration_time_s": round(sum(its) / len(its) / 1e9, 9) if its else None,
                "iteration_p99_s": round(percentile(its, 99) / 1e9, 9) if its else None,
                "nodes": len(p.nodes) if p else 0, "shape": p.shape if p else None} \
            | ({"cassini": {k: v for k, v in asdict(self.cassini).items()
                            if k != "paused_ms" or v}} if self.cassini else {}) \
            | ({"paused_ms": self.paused_ms} if self.paused_ms else {}) \
            | ({"stops": self.stops} if self.stops else {})

    def node_ns(self) -> int:
        """Node-ns it held its partitions for."""
        p = self.partition
        return self.held_ns + (len(p.nodes) * ((self.end_ns or 0) - self.placed_ns)
                               if p is not None else 0)


def percentile(xs: list[int] | list[float], q: float) -> float:
    """Nearest-rank percentile of sorted values."""
    return xs[max(0, math.ceil(q / 100 * len(xs)) - 1)]
