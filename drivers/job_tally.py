"""What the controller has heard of one job out (drivers/lab.py): which nodes are ready,
each rank's report of each iteration, the iterations recorded and the "done"s; and of a
job stopped for a fault, what its ranks say afterwards (`Carrying`).

An iteration is recorded once every rank has reported it, each report held to what its
schedule can start and to the controller's own clock: a node's reports are believed only
as far as they could be true. What to wait for, and for how long, is the back end's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable

from oddl.controller.base.collectives import Schedule
from oddl.controller.service.backend import Iteration, JobStopped, OnIteration, RunFailed
from oddl.controller.stage2.job import JobEvent, JobSpec, schedule_of, untrue
from oddl.controller.stage2.trace import TraceRow

log = logging.getLogger(__name__)
CLOCK_SLACK = 0.01  # how far a node's clock may run ahead of this one's (1 %, generous)


class JobTally:
    """One job's reports, as they come; `reject(why)` counts and logs a report dropped."""

    def __init__(self, spec: JobSpec, on_iteration: OnIteration,
                 reject: Callable[[str], None]) -> None:
        self.spec = spec
        self.on_iteration = on_iteration
        self.reject = reject
        self.ready: set[str] = set()
        self.reports: dict[int, dict[str, JobEvent]] = {}
        self.recorded: list[int] = []
        self.sent: dict[str, int] = {}  # each node's control messages, as it last said
        self.flows: dict[str, int] = {}
        self.done: dict[str, JobEvent] = {}
        self.trace: list[TraceRow] = []  # the nodes' timelines, until their iteration is recorded
        self._last_msgs = 0
        self._reported_ns = 0  # the recorded iterations' lengths, as the nodes report them
        self._t_published = time.monotonic_ns()
        # what a rank can truthfully report: the flows its schedule starts an iteration
        sched = schedule_of(spec)
        self._per_iteration = {n: sum(len(st.sends) for st in sched[r])
                               for r, n in enumerate(spec.ranks)}
        # the flows an iteration delivers to each rank: what its flow rows can hold
        inbound = [0] * len(spec.ranks)
        for steps in sched:
            for st in steps:
                for dst, _nbytes in st.sends:
                    inbound[dst] += 1
        self._inbound = dict(zip(spec.ranks, inbound, strict=True))

    def published(self) -> None:
        """The job is out now: no report can describe more time than has passed since."""
        self._t_published = time.monotonic_ns()

    @property
    def next_iteration(self) -> int:
        return self.spec.start + len(self.recorded)

    @property
    def all_ready(self) -> bool:
        return len(self.ready) == len(self.spec.nodes)

    @property
    def finished(self) -> bool:
        return len(self.done) == len(self.spec.nodes)

    def heard(self, ev: JobEvent) -> bool:
        """Take a "ready", "done" or "iteration" event: whether it was news of the job (a
        report recorded once every rank has made it). Raises RunFailed for a node whose
        word cannot be true."""
        if ev.kind == "ready" and ev.node not in self.ready:
            self.ready.add(ev.node)
            return True
        if ev.kind == "done":
            self._done(ev)
            return True
        if ev.kind == "iteration" and ev.node in self.spec.ranks:
            return self._report(ev)
        return False

    def _done(self, ev: JobEvent) -> None:
        spec = self.spec
        if len(self.recorded) < spec.iterations - spec.start:
            raise RunFailed(f"node {ev.node} said its job was done after "
                            f"{len(self.recorded)} of {spec.iterations - spec.start} "
                            f"iterations")
        self.done[ev.node] = ev
        if n_tampered := ev.stats.get("board_tampered", 0):
            log.warning("node %s: another writer changed its board's registers %d times "
                        "during job %s (restored; an open PYNQ.remote port? docs/deploy.md)",
                        ev.node, n_tampered, spec.job)
        self.sent[ev.node] = ev.control_messages
        self.trace += ev.trace

    def _report(self, ev: JobEvent) -> bool:
        spec, i = self.spec, ev.iteration
        if (i in self.reports and ev.node in self.reports[i]) or i in self.recorded or \
                not spec.start <= i < spec.iterations:
            self.reject(f"iteration {i} from {ev.node}: already recorded or out of range")
            return False
        claimed = ev.stats.get("flows", self.flows.get(ev.node, 0))
        if why := untrue(ev, spec.start, self._per_iteration[ev.node], claimed):
            self.reject(f"iteration {i} from {ev.node}: {why}")
            raise RunFailed(f"node {ev.node}: its report of iteration {i} cannot be true "
                            f"({why}): its reports are not to be trusted")
        self.sent[ev.node] = ev.control_messages
        self.flows[ev.node] = claimed
        self.trace += ev.trace
        if len(ev.flows) > self._inbound[ev.node] or any(f[3] != ev.node for f in ev.flows):
            self.reject(f"iteration {i} from {ev.node}: {len(ev.flows)} flow rows, of which "
                        f"some are not delivered to it, or more than its schedule delivers "
                        f"({self._inbound[ev.node]}): its rows dropped")
            ev.flows = []
        got = self.reports.setdefault(i, {})
        got[ev.node] = ev
        if len(got) < len(spec.ranks):
            return True
        del self.reports[i]
        self.recorded.append(i)
        slow = max(got.values(), key=lambda e: e.t_end - e.t_start)
        # iterations follow one another: together they cannot have taken longer than this
        # controller has waited since it sent the job (a resumed job's first began before
        # that: it is not counted)
        if not (spec.carried and i == spec.start):
            self._reported_ns += slow.t_end - slow.t_start
        waited_ns = time.monotonic_ns() - self._t_published
        if self._reported_ns > waited_ns * (1 + CLOCK_SLACK) + 1_000_000:
            self.reject(f"iteration {i} from {slow.node}: too long")
            raise RunFailed(f"node {slow.node}: its reports add up to "
                            f"{self._reported_ns / 1e9:.3f} s of iterations, but the job was "
                            f"sent {waited_ns / 1e9:.3f} s ago: its reports are not to be "
                            f"trusted")
        msgs = sum(self.sent.values())
        self.on_iteration(Iteration(i, slow.t_start, slow.t_end, msgs - self._last_msgs,
                                    [f for r in spec.ranks for f in got[r].flows],
                                    self.trace))
        self.trace = []
        self._last_msgs = msgs
        return True

    def progress(self) -> str:
        """Where a job that is not done stands: who has not said what (a stuck job names
        it)."""
        spec = self.spec
        if not self.all_ready:
            return f"never ready: {', '.join(sorted(set(spec.nodes) - self.ready))}"
        i = self.next_iteration
        if i < spec.iterations:
            have = self.reports.get(i, {})
            return (f"{len(self.recorded)} iterations recorded; iteration {i} not reported "
                    f"by {', '.join(r for r in spec.ranks if r not in have)}")
        late = ", ".join(n for n in spec.nodes if n not in self.done)
        return f'every iteration recorded; no "done" from {late}'


@dataclasses.dataclass
class Carrying:
    """A job stopped for a fault mid-iteration, whose ranks say what the controller may
    have missed. A broker that went away may have taken their last reports with it (every
    rank had reported iteration i and gone on to i + 1; the controller had not heard), so
    each says them again once it hears the controller, then its "failed" event again: what
    the iteration it was in delivered to it (`carry`), and, its part of that one done, what
    came early of the next (`early`). A report completes iteration i once (`tally`), which
    moves the stop on to i + 1. The carry is the union of every rank's share of the
    iteration the stop names; `done` is set then, or once every rank has said all it will
    (no "said again" to come) and some share is missing: that iteration runs in full."""

    stop: JobStopped
    tally: JobTally  # the stopped job's: reports of the iteration it stopped in
    rank: dict[str, int]  # the job's ranks, by node
    sched: Schedule  # the job's: what each rank was sent
    reject: Callable[[str], None]
    told: dict[str, JobEvent] = dataclasses.field(default_factory=dict)  # each rank's last
    done: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)

    def heard(self, ev: JobEvent) -> None:
        log.debug("job %s: heard %s of %s, iteration %d (again %d); the stop names %d",
                  self.tally.spec.job, ev.kind, ev.node, ev.iteration, ev.again,
                  self.stop.next_iteration)
        if self.done.is_set() or ev.node not in self.rank:
            return
        if ev.kind == "iteration":
            self._report(ev)
        elif ev.kind == "failed" and self._true(ev):
            was = self.told.get(ev.node)
            if was is None or ev.again >= was.again:
                self.told[ev.node] = ev
            self._decide()

    def heard_queued(self, events: list[JobEvent]) -> None:
        """What had come in but was not yet tallied when the job stopped (a controller
        whose loop runs late: every rank had gone two iterations on, their reports still
        queued). Taken as heard, reports in iteration order, so that a rank's report of
        i + 1, queued before another's of i, is not passed over."""
        reports = sorted((ev for ev in events if ev.kind == "iteration"),
                         key=lambda ev: ev.iteration)
        for ev in (*reports, *(ev for ev in events if ev.kind != "iteration")):
            self.heard(ev)

    def _report(self, ev: JobEvent) -> None:
        """A report said again: taken once, if it is of the iteration the stop names and
        that rank's report of it has not been heard (else it is no news, quietly)."""
        i, t = self.stop.next_iteration, self.tally
        if ev.iteration != i or ev.node in t.reports.get(i, {}):
            return
        try:
            t.heard(ev)
        except RunFailed as e:  # a report that cannot be true: no carry, the run goes on
            self.reject(str(e))
            self._none("a report that cannot be true")
            return
        if t.next_iteration > i:  # recorded: the cut iteration is the next one
            self.stop.next_iteration = t.next_iteration
            log.info("job %s: iteration %d recorded from the reports said again", t.spec.job,
                     i)
            self._decide()

    def _true(self, ev: JobEvent) -> bool:
        """Every flow a rank says reached it was sent to it by the schedule."""
        rank, sched = self.rank, self.sched
        for r, s, j in (*ev.carry, *ev.early):
            sends = sched[r][s].sends if 0 <= r < len(sched) and 0 <= s < len(sched[r]) \
                else []
            if not 0 <= j < len(sends) or sends[j][0] != rank[ev.node]:
                self.reject(f"{ev.node}: a carry of {(r, s, j)}, no flow of its to report")
                self._none(f"{ev.node}'s carry names a flow not sent to it")
                return False
        return True

    @staticmethod
    def _share(ev: JobEvent, i: int) -> tuple[int, list[tuple[int, int, int]]] | None:
        """A rank's share of iteration i: its carry of the one it was in, or the early
        arrivals of the next, its part of the one before done; None if it has none."""
        if ev.carried and ev.iteration == i:
            return ev.carry_t0, ev.carry
        if ev.done_here and ev.iteration + 1 == i:
            return ev.early_t0, ev.early
        return None

    def _decide(self) -> None:
        i = self.stop.next_iteration
        if self.done.is_set() or len(self.told) < len(self.rank):
            return
        shares = {n: self._share(ev, i) for n, ev in self.told.items()}
        if all(sh is not None for sh in shares.values()):
            got = [sh for sh in shares.values() if sh is not None]
            self.stop.carry = (min(t0 for t0, _c in got),
                               sorted({f for _t0, c in got for f in c}))
            log.info("job %s: iteration %d goes on from what its ranks had delivered",
                     self.tally.spec.job, i)
            self.done.set()
        elif not any(ev.again == 1 for ev in self.told.values()):  # all said, some short
            self._none(", ".join(f"{n} says iteration {ev.iteration}" + (
                " (its part done)" if ev.done_here else "") for n, ev in self.told.items()
                if shares[n] is None))

    def _none(self, why: str) -> None:
        """No carry: the cut iteration runs again in full."""
        log.info("job %s: iteration %d runs again in full: %s", self.tally.spec.job,
                 self.stop.next_iteration, why)
        self.done.set()
