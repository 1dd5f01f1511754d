"""What a run reports: each network's result (`NetworkResult`), the run's (`RunResult`,
its JSON and summary.json), and the sum of one job's attempts (`add_attempt`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from oddl.controller.service.backend import JobOutcome


@dataclass
class NetworkResult:
    name: str
    kind: str
    training_time_s: float
    iteration_time_s: float
    iterations: int
    flows: int
    control_messages: int
    invariant_violations: int
    stats: dict[str, Any] = field(default_factory=dict)
    disturbance: dict[str, int] = field(default_factory=dict)  # backend.DISTURBANCES
    disturbed: bool = False  # more of them than the experiment's threshold allows
    faults: list[dict[str, Any]] = field(default_factory=list)  # recovery.FaultRow
    # time the faults cost: from the last iteration before each stop to the resume (in
    # training_time_s too: an iteration cut short and the recovery happened once)
    fault_time_s: float = 0.0
    # several jobs: mean_jct_s, p99_jct_s, makespan_s, utilisation, mean_queued_s
    fabric: dict[str, float] = field(default_factory=dict)
    # the gateware's control units in the loop: their decision latencies in cycles
    control_unit: dict[str, Any] = field(default_factory=dict)
    # its job ended in copies of its repeated iteration: iterations simulated, copies,
    # period_ns (sim/steady.py; in the summary, not the figures: they are the full run's)
    steady: dict[str, int] = field(default_factory=dict)

    def public(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items()
                if k not in ("name", "kind", "stats", "steady")
                and (k not in ("fabric", "control_unit") or v)}


@dataclass
class RunResult:
    experiment: str
    backend: str
    networks: dict[str, NetworkResult]
    ratio: float | None
    invariant_violations: int
    wall_s: float
    compute_ns: int
    calibration: str
    iterations: int
    total_iterations: int
    run_dir: str | None = None
    violations: list[str] = field(default_factory=list)
    # several jobs (docs/multijob.md): job -> network -> admission.JobRecord.public()
    jobs: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "experiment": self.experiment,
            "backend": self.backend,
            "networks": {n: r.public() for n, r in self.networks.items()},
            "ratio": self.ratio,
            "invariant_violations": self.invariant_violations,
            "wall_s": round(self.wall_s, 3),
        } | ({"jobs": self.jobs} if self.jobs else {})

    def summary(self, reference: dict[str, Any]) -> dict[str, Any]:
        """summary.json: the JSON object, how compute was found, the iterations run and
        the workload's, every network's stats, the first violations, the paper's figures."""
        return {**self.to_json_obj(), "compute_ns": self.compute_ns,
                "calibration": self.calibration, "iterations_simulated": self.iterations,
                "iterations_total": self.total_iterations,
                "stats": {n: r.stats for n, r in self.networks.items()},
                "violations": self.violations[:50], "reference": reference,
                "steady_state": {n: r.steady for n, r in self.networks.items() if r.steady}}

    def training_min(self) -> dict[str, float]:
        return {n: r.training_time_s / 60 for n, r in self.networks.items()}


def add_attempt(total: JobOutcome, part: JobOutcome) -> None:
    """Sum the attempts of one job: messages, flows, counters; the latest non-counters."""
    total.control_messages += part.control_messages
    total.flows += part.flows
    for k, v in part.stats.items():
        if isinstance(v, int) and not isinstance(v, bool) and k not in _ABSOLUTE:
            total.stats[k] = total.stats.get(k, 0) + v
        else:
            total.stats[k] = v
    total.violations[:] = part.violations
    total.trace += part.trace
    total.extended = part.extended or total.extended


# counters a back end reports for its whole life, not per job (summing them would count
# the earlier attempts twice)
_ABSOLUTE = ("dropped", "messages_dropped", "messages_delayed", "transfers", "tunes",
             "lost_to_faults", "count_action_fires", "diameter")
