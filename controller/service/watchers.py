"""What an orchestration tells the bus's watchers (the dashboard, `oddl watch`) of a run:
its start and end, each job's plan and iterations, the health it has found; and what a
trace keeps of each iteration. A note is built only if the back end tells anybody: this
runs every iteration."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import msgspec
from oddl.controller.base.telemetry import (
    TELEMETRY_VERSION,
    IterationNote,
    RunNote,
    health_note,
)
from oddl.controller.service.backend import Backend, Iteration, host_disturbance_ms
from oddl.controller.stage2.trace import Timeline

# a job's copies of its repeated iteration (sim/steady.py) come all at once, each as the
# one before: the bus's watchers are told the first so many (a short run's watchers see
# every iteration), then one in COPIES_TOLD, and the last (25,036 at once through the
# broker: 20 s)
COPIES_TOLD_EACH = 256
COPIES_TOLD = 4096


class Watchers:
    """The notes of one network's run, and its trace's rows."""

    def __init__(self, backend: Backend, network: str, run_name: str,
                 trace: Timeline | None) -> None:
        self.b, self.network, self.run_name, self.trace = backend, network, run_name, trace
        self._said = (-1, -1)  # diagnoses and injected faults the watchers were told of

    def say(self, kind: str, note: Callable[[], Any]) -> None:
        """Tell the watchers, if the back end tells anybody."""
        if self.b.announce is not None:
            self.b.announce(kind, msgspec.json.encode(note()))

    def run(self, experiment: str, state: Literal["started", "finished", "failed"],
            iterations: int,
            its: list[int] | None = None) -> None:
        """The run started, or ended (`its`: the times of the iterations it ran): an end
        says the node programs' lag where it skews the figures (a disturbed run)."""
        detail, lag_ms = ("", 0) if its is None else (
            f"{len(its)} iterations",
            host_disturbance_ms(self.b.health.max_lag_ns, sum(its) / len(its) if its else 0))
        self.say("run", lambda: RunNote(TELEMETRY_VERSION, experiment, self.network,
                                        self.b.name, state, iterations, detail, lag_ms))

    def health(self) -> None:
        h = self.b.health
        self._said = (len(h.diagnoses), len(self.b.injected))
        self.say("health", lambda: health_note(self.network, h.diagnoses, self.b.injected))

    def iteration(self, job: str, iterations: int, it: Iteration) -> None:
        """A job's iteration has completed (`job`: "" for a run's only job): told (a copy,
        one in many), the health if it changed, and the trace's rows."""
        if it.repeats is not None and it.iteration - it.repeats.of > COPIES_TOLD_EACH and \
                (it.iteration + 1) % COPIES_TOLD and it.iteration + 1 < iterations:
            return  # a copy, as the one before it: the watchers hear one in many
        self.say("iteration", lambda: IterationNote(
            TELEMETRY_VERSION, self.network, it.iteration, (it.t_end - it.t_start) / 1e6,
            it.control_messages, self.run_name, job))
        if (len(self.b.health.diagnoses), len(self.b.injected)) != self._said:
            self.health()
        if self.trace is not None:  # rows come late: the last RELEASEs with the next one
            self.trace.chrome.rows[self.network] += it.trace
            if it.iteration < self.trace.iterations:
                self.trace.chrome.iterations[self.network].append(
                    (it.iteration, it.t_start, it.t_end))
