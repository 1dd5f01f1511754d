"""The back-end interface: what the control plane needs of a testbed, whichever runs it.

A back end (sim: models in process on a virtual clock; emu and hw: devices reached through
pynq, pyserial and MQTT, stage 2 in `oddl node` beside each O-NIC) gives the arbiter its
O-NICs and WSSs for stage 1 and runs a job's stage 2. It is built in one module per back
end and looked up once, in `app.registry`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from oddl.controller.base.config import FaultSpec
from oddl.controller.base.devices import ONic, WSSDevice
from oddl.controller.base.hostload import LAG_FLOOR_NS
from oddl.controller.service.health import Diagnosis, Health
from oddl.controller.stage1.arbiter import FanOut
from oddl.controller.stage2.invariants import InvariantChecker
from oddl.controller.stage2.job import JobSpec
from oddl.controller.stage2.trace import TraceRow

FlowRow = tuple[int, int, str, str, int, int, int, int]  # id, step, src, dst, B, hops, t0, t1


class RunFailed(RuntimeError):
    """The run could not go on; the message says what failed and where."""


class Stalled(RuntimeError):
    """A virtual-time run with nothing left to happen: every rank waits for something that
    will never come (raised by the virtual clock's loop, caught by the runner by type)."""


class JobStopped(RuntimeError):
    """The job stopped for a fault before its last iteration. Iterations before
    `next_iteration` are recorded; `lost` says whether one was cut short (its flows in
    flight failed, `flows_lost` of them; they run again with the iteration)."""

    def __init__(self, why: str, next_iteration: int, lost: bool, outcome: JobOutcome,
                 flows_lost: int = 0,
                 carry: tuple[int, list[tuple[int, int, int]]] | None = None) -> None:
        """carry: the cut iteration's start and its flows delivered (engine.carry_of):
        where the back end knows them, the iteration goes on from there when every rank
        is still alive, and is not lost."""
        super().__init__(why)
        self.next_iteration = next_iteration
        self.lost = lost
        self.outcome = outcome
        self.flows_lost = flows_lost
        self.carry = carry
        # set when the back end knows whether there is a carry (its ranks must say)
        self.carrying: asyncio.Event | None = None


@dataclass(frozen=True)
class Repeats:
    """A job's iteration `of` repeats exactly (sim/steady.py): each later one is its copy,
    n iterations on later by n periods, each of its flows too, with an id on by n times
    that flow's step (rank r numbers its k-th flow k * ranks + r)."""

    of: int
    period_ns: int
    flows: list[FlowRow]
    id_steps: list[int]

    def flows_of(self, iteration: int) -> list[FlowRow]:
        n = iteration - self.of
        dt = n * self.period_ns
        return [(f[0] + n * d, *f[1:6], f[6] + dt, f[7] + dt)
                for f, d in zip(self.flows, self.id_steps, strict=True)]


@dataclass
class Iteration:
    """One completed iteration, as the job's slowest rank saw it."""

    iteration: int
    t_start: int
    t_end: int
    control_messages: int  # during this iteration
    flows: list[FlowRow] = field(default_factory=list)  # when the back end records them
    trace: list[TraceRow] = field(default_factory=list)  # while the job traces (trace.py)
    # a copy of the job's repeated iteration, written rather than simulated (its flows:
    # `repeats.flows_of(iteration)`, not in `flows`)
    repeats: Repeats | None = None


@dataclass
class JobOutcome:
    control_messages: int
    flows: int
    stats: dict[str, Any]
    violations: list[str]
    trace: list[TraceRow] = field(default_factory=list)  # recorded after the last iteration
    # the job ended in copies of its repeated iteration (sim/steady.py): iterations
    # simulated, copies, period_ns
    extended: dict[str, int] = field(default_factory=dict)


OnIteration = Callable[[Iteration], None]
T = TypeVar("T")


def at_once(work: Callable[[], T], then: Callable[[T | BaseException], None]) -> None:
    """`Backend.off_loop` of models on one clock: the work runs now, and nothing passes
    on the clock meanwhile (the order of events stays what it was)."""
    try:
        got: T | BaseException = work()
    except Exception as e:
        got = e
    then(got)
Announce = Callable[[str, bytes], None]  # a note for the bus's watchers: kind, payload

# what a clean run has none of: junk and forgeries refused, messages lost, flows asked for
# again, grants that lapsed or came too late, transfers nobody granted
DISTURBANCES = ("rejected", "unexpected", "dropped", "retries", "revoked", "stale_grants",
                "unexpected_rx", "requests_refused", "releases_overdue", "stray",
                "board_tampered")


def disturbance(stats: Mapping[str, Any]) -> dict[str, int]:
    """The disturbance counters a run's stats hold (only those that are not zero)."""
    return {k: int(stats[k]) for k in DISTURBANCES if stats.get(k)}


def disturbed(dist: Mapping[str, int], control_messages: int, threshold: float) -> bool:
    """More disturbance than `threshold` a control message (the experiment's
    `disturbance_threshold`); a board's registers changed by another writer is never
    noise, whatever its share."""
    return sum(dist.values()) > threshold * max(control_messages, 1) or \
        bool(dist.get("board_tampered"))


# of an iteration: node programs' loops running this late skew it (two emulators at once
# skewed each other's runs by 20-30 % unsaid)
DISTURBING_LAG = 0.02


def host_disturbance_ms(lags: Mapping[str, int], mean_iteration_ns: float) -> int:
    """How late the node programs' loops ran (ms), where that skews a run's figures: the
    node programs time the iterations, and a loop later than DISTURBING_LAG of an
    iteration (and 5 ms) makes them wrong by as much. 0 where it does not."""
    ns = lags.get("nodes", 0)
    return round(ns / 1e6) if ns > max(5 * LAG_FLOOR_NS, DISTURBING_LAG * mean_iteration_ns) \
        else 0


@dataclass
class Injected:
    """A drill's fault as it happened: when it began (and ended), on the back end's clock,
    and the REQUEST retries the control units made while it lasted."""

    spec: FaultSpec
    at_ns: int
    until_ns: int | None = None
    retries: int = 0


@dataclass(frozen=True)
class StopRule:
    """When a job stops for a fault: the controller's one rule, which every back end applies.
    A fault that concerns the job's nodes, found after it was planned (`since`: the
    diagnoses it was planned round), stops it before its next iteration; if the iteration
    cannot reach its end, `patience_ns` after the fault was found (the iteration is cut
    short and runs again). The back end raises `JobStopped` with `why()`."""

    health: Health
    nodes: frozenset[str]
    since: int
    patience_ns: int

    def pending(self) -> list[Diagnosis]:
        """Everything found since the plan that concerns the job (what explains a failure)."""
        return self.health.pending(self.nodes, self.since)

    def faults(self) -> list[Diagnosis]:
        """What stops it: the pending faults a new plan must go round."""
        return self.health.actionable(self.nodes, self.since)

    def why(self) -> str:
        return "; ".join(map(str, self.faults()))

    def overdue(self, now_ns: int) -> bool:
        """A fault has kept the iteration from its end for `patience_ns`: cut it short."""
        act = self.faults()
        return bool(act) and now_ns - act[0].t_ns >= self.patience_ns


class Backend(Protocol):
    """`run_job` runs iterations spec.start .. spec.iterations - 1 and reports each, and
    stops the job as `stop` says (raising `JobStopped`). `extend`: nothing but its own
    iterations can reach the job (no other job, pause, time limit or trace):
    a model back end may write its repeated iteration's copies rather than simulate them
    (sim/steady.py); a testbed's runs every iteration. Several `run_job`s may run at
    once, for jobs on disjoint nodes (controller/service/admission.py)."""

    # what the orchestration reads of it (read-only: each back end holds its own kinds)
    @property
    def name(self) -> str: ...
    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...
    @property
    def onics(self) -> Mapping[str, ONic]: ...
    @property
    def wss(self) -> Mapping[str, WSSDevice]: ...
    @property
    def monitor(self) -> InvariantChecker:
        """The invariants this back end can watch from the controller."""
    @property
    def health(self) -> Health:
        """The live inventory (`Unwatched` for a model with nothing to watch)."""
    @property
    def injected(self) -> list[Injected]:
        """The drill's faults so far (sim, emu)."""
    @property
    def announce(self) -> Announce | None:
        """Tells the bus's watchers (controller/base/telemetry.py); None: nobody is told."""
    @property
    def cut(self) -> dict[str, JobOutcome]:
        """What each job cancelled (`run_job`'s task cancelled) did before its ranks
        dropped it, by job id, as its ranks said: the orchestration takes it, so that
        every ended job has its record."""

    async def run_job(self, spec: JobSpec, on_iteration: OnIteration,
                      record_flows: bool, stop: StopRule, extend: bool = False
                      ) -> JobOutcome: ...

    def pause(self, job: str, ns: int) -> bool:
        """Delay a running job's next iteration by `ns` (CASSINI re-aligns jobs that share
        links); False where no job shares a link (ODDL's back ends)."""
        ...

    @property
    def fan_out(self) -> FanOut:
        """How stage 1 drives one call per device (controller/stage1/arbiter.py): at once
        where each device has its own connection, one by one where they are models."""
        ...

    def off_loop(self, work: Callable[[], T], then: Callable[[T | BaseException], None]
                 ) -> None:
        """Stage 1's device I/O (a partition set up or released) beside the loop: `then`
        gets its result, or the exception it raised, on the loop. Devices: on one worker
        thread, in order, so that the API, the watch and the running jobs go on meanwhile;
        models: at once (`at_once`)."""
        ...

    def close(self) -> None: ...
