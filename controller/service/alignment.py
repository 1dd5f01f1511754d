"""CASSINI in the orchestration: where a job starts among candidate rectangles, its start
delay against the jobs running now, and the pauses that re-align running jobs, each
where it scores better than what runs (controller/stage1/compat.py has the geometry).

Without a profiler (a run without `cassini = true`) a job's start delay is its own
`shift_ms`, and nothing is measured or moved.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from oddl.controller.base.clock import Clock
from oddl.controller.base.collectives import Schedule
from oddl.controller.base.config import NetworkSpec
from oddl.controller.base.topology import Grid
from oddl.controller.service.jobs import JobRecord, JobRequest
from oddl.controller.service.placing import schedule_of
from oddl.controller.stage1.compat import (
    Arrival,
    Profile,
    Realignment,
    best_placement,
    on_links,
    phase_score,
    realign,
    shift_against,
)
from oddl.controller.stage1.placement import Partition, candidates

PLACEMENTS = 4  # the candidate placements a job's demand is measured on

# a job's demand on each link it uses, measured alone (sim/networks/profile.py): name, ranks'
# nodes, schedule, compute per iteration (ns)
Profiler = Callable[[str, Sequence[str], Schedule, int], dict[object, Profile]]

# pause a running job's next iteration by ns (the back end's; False: it cannot)
Pause = Callable[[str, int], bool]


class Alignment:
    """The running jobs' phases, and what CASSINI does with them as jobs come and go."""

    def __init__(self, grid: Grid, spec: NetworkSpec, clock: Clock,
                 profiler: Profiler | None, pause: Pause,
                 records: dict[str, JobRecord]) -> None:
        self.grid, self.spec, self.clock, self.profiler = grid, spec, clock, profiler
        self._pause_job, self._records = pause, records
        self._profiles: dict[str, dict[object, Profile]] = {}  # the running jobs'
        self._began: dict[str, int] = {}  # when each running job's latest iteration began
        self._pending_pause: dict[str, int] = {}  # job -> ns its next iteration waits
        self._measured: dict[str, dict[object, Profile]] = {}  # placed by its profile
        self._starting: dict[str, int] = {}  # job -> its start delay (ns), while in it
        self._ids: dict[str, str] = {}  # job -> the id its back end runs it as

    def place(self, req: JobRequest, part: Partition, free: set[str]) -> Partition:
        """CASSINI's placement: of up to PLACEMENTS free rectangles (the first fit among
        them), the one whose shared links are most compatible with the running jobs'
        (`best_placement`, each candidate's demand measured alone on it); its profile is
        kept for its start delay. `part` where nothing is measured or nothing runs."""
        if self.profiler is None or not self._profiles:
            return part
        cands = [part, *(c for c in candidates(
            self.grid, free, req.name, req.ranks, req.shape, req.exact, req.group,
            PLACEMENTS) if c.nodes != part.nodes)][:PLACEMENTS]
        measured = [self.profiler(req.name, c.ranks, schedule_of(req, c, self.spec),
                                  req.compute_ns) for c in cands]
        running = {link: [p for p, _phase in jobs] for link, jobs in on_links(
            self._profiles, self._began, self.clock.now_ns()).items()}
        # (type: ignore below: profiles by link: the same shape)
        k = best_placement(measured, running)  # type: ignore[arg-type]
        self._measured[req.name] = measured[k]
        return cands[k]

    def shift(self, req: JobRequest, part: Partition, schedule: Schedule, rec: JobRecord,
              job_id: str) -> int:
        """The job's start delay (ns): its own `shift_ms`; or, with a profiler, CASSINI's
        against the jobs running now, each at its phase."""
        self._ids[req.name] = job_id
        if self.profiler is None:
            return req.shift_ns
        mine = self._measured.pop(req.name, None) or \
            self.profiler(req.name, part.ranks, schedule, req.compute_ns)
        now = self.clock.now_ns()
        kept = shift_against(mine, on_links(self._profiles, self._began, now))  # the
        # newcomer's best delay, the running jobs unmoved
        self._profiles[req.name] = mine
        moved = self._realign(req.name)
        # re-aligning pauses running jobs: worth it only where it scores better
        if moved is None or min((c.score for c in moved.shifts.links.values()),
                                default=1.0) <= kept.score + 1e-9:
            rec.cassini = kept
            shift_ns = round(kept.shift_ms * 1e6)
        else:
            given = self._pause(moved.pauses_ns)
            shift_ns = moved.delay_ns
            rec.cassini = Arrival(round(shift_ns / 1e6, 6), round(min(
                c.score for c in moved.shifts.links.values()), 9), kept.unshifted_score,
                {j: round(ns / 1e6, 6) for j, ns in given.items()})
        self._began[req.name] = now + shift_ns
        return shift_ns

    async def delay(self, name: str, shift_ns: int) -> None:
        """The job holds its nodes and starts `shift_ns` late, so that its communication
        interleaves with its neighbours' (later still if CASSINI re-aligns it meanwhile)."""
        self._starting[name] = shift_ns
        t0 = self.clock.now_ns()
        while (left := t0 + self._starting[name] - self.clock.now_ns()) > 0:
            await asyncio.sleep(left / 1e9)  # the back end's clock (virtual in sim)
        self._starting.pop(name, None)

    def iterated(self, name: str, t_end: int) -> None:
        """A job's iteration ended: its next one begins now, or after its pause."""
        if name in self._began:
            self._began[name] = t_end + self._pending_pause.pop(name, 0)

    def left(self, name: str) -> str | None:
        """A job stopped running: the jobs left re-align as CASSINI's shifts say, where
        that scores better than they run now. The id it ran as."""
        self._profiles.pop(name, None)
        self._began.pop(name, None)
        self._pending_pause.pop(name, None)
        if self.profiler is not None:
            moved = self._realign(None)
            if moved is not None and min(c.score for c in moved.shifts.links.values()) > \
                    phase_score(self._profiles, self._began, self.clock.now_ns()) + 1e-9:
                self._pause(moved.pauses_ns)
        return self._ids.pop(name, None)

    def _realign(self, joining: str | None) -> Realignment | None:
        """CASSINI's shifts for every job sharing links now, as pauses (None: no two
        jobs share a link, or a loop of the affinity graph asks two shifts of a job:
        CASSINI then moves none)."""
        shared = [j for j, links in self._profiles.items() if any(
            link in other for k, other in self._profiles.items() if k != j for link in links)]
        if len(shared) < 2:
            return None
        r = realign({j: self._profiles[j] for j in shared},
                    {j: t for j, t in self._began.items() if j in shared},
                    self.clock.now_ns(), joining)
        return None if r.shifts.disagree else r

    def _pause(self, pauses_ns: dict[str, int]) -> dict[str, int]:
        """Pause running jobs before their next iteration (ModelBackend: the baselines; a
        job still in its start delay waits that much longer), and count it in each one's
        record; the pauses given."""
        given = {}
        for job, ns in pauses_ns.items():
            if ns <= 0:
                continue
            if job in self._starting:
                self._starting[job] += ns
                self._began[job] += ns
            elif self._pause_job(self._ids[job], ns):
                self._pending_pause[job] = self._pending_pause.get(job, 0) + ns
            else:
                continue
            self._records[job].paused_ms.append(round(ns / 1e6, 6))
            given[job] = ns
        return given
