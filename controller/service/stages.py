"""The stage 1 an orchestration applies for each job it starts: ODDL's (the arbiter plans,
applies and reads back the job's WSS rows, routes and count-action programs beside the
others'), or none (a network model has nothing to configure)."""

from __future__ import annotations

import time
from typing import Protocol

from oddl.controller.base.collectives import Schedule
from oddl.controller.base.config import NetworkSpec
from oddl.controller.service.jobs import JobRequest
from oddl.controller.service.placing import WHOLE
from oddl.controller.stage1.arbiter import Arbiter, DeviceFailed
from oddl.controller.stage1.placement import Partition
from oddl.controller.stage1.plan import Plan
from oddl.controller.stage1.planner import NO_FAULTS, Avoid
from oddl.controller.stage2.job import (
    nic_programs,
    wire_routes,
)

Routes = dict[str, dict[str, tuple[str, int, str]]]  # node -> destination -> its route


class Stage1(Protocol):
    """What a network does when a job is placed and when it leaves (ODDL: plan round
    `avoid`, apply and read back its partition; a baseline: nothing to configure)."""

    plan_s: float  # time spent planning, every job's

    def admit(self, req: JobRequest, part: Partition, schedule: Schedule, avoid: Avoid
              ) -> tuple[Routes, bool, Plan | None]: ...
    def release(self, job: str, gone: Avoid = NO_FAULTS) -> list[DeviceFailed]: ...
    def tables(self) -> dict[str, list[list[int | None]]]: ...


class NoStage1:
    plan_s = 0.0

    def admit(self, req: JobRequest, part: Partition, schedule: Schedule, avoid: Avoid
              ) -> tuple[Routes, bool, Plan | None]:
        return {}, False, None

    def release(self, job: str, gone: Avoid = NO_FAULTS) -> list[DeviceFailed]:
        return []

    def tables(self) -> dict[str, list[list[int | None]]]:
        return {}


class OddlStage1:
    """The arbiter per job: plan within the partition, admit beside the running jobs."""

    def __init__(self, arbiter: Arbiter, spec: NetworkSpec) -> None:
        self.arbiter, self.spec = arbiter, spec
        self.plan_s = 0.0

    def admit(self, req: JobRequest, part: Partition, schedule: Schedule, avoid: Avoid
              ) -> tuple[Routes, bool, Plan | None]:
        t = time.perf_counter()
        # a rectangle is closed under relaying; the whole testbed relays anywhere
        within = None if part.shape == WHOLE else frozenset(part.nodes)
        plan = self.arbiter.plan(schedule, self.spec.strategy, job=req.name,
                                 relay=self.spec.relay, ranks=list(part.ranks), avoid=avoid,
                                 within=within)
        self.plan_s += time.perf_counter() - t
        programs = nic_programs(schedule, part.ranks)
        self.arbiter.admit(plan, programs, avoid)
        return wire_routes(plan), programs is not None, plan

    def release(self, job: str, gone: Avoid = NO_FAULTS) -> list[DeviceFailed]:
        return self.arbiter.release(job, gone)

    def tables(self) -> dict[str, list[list[int | None]]]:
        return self.arbiter.tables()
