"""What an orchestration knows of each of its jobs, shared by its parts (arrivals and
the queue, starts, stops and releases: controller/service/admission.py): a job's record
and flow tag, where it is in its life, and every id it has run as."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from oddl.controller.service.backend import JobStopped, StopRule
from oddl.controller.service.health import Diagnosis
from oddl.controller.service.jobs import JobRecord, JobRequest
from oddl.controller.stage1.placement import Partition
from oddl.controller.stage2.invariants import MAX_TAG


@dataclass
class Stopped:
    """A job stopped for a fault, until it goes on."""

    t_stop_ns: int
    t_last_ns: int  # its latest iteration recorded before the stop
    stop: JobStopped
    found: list[Diagnosis]
    replan: bool  # something to go round (else: the same plan again, e.g. a bus blink)
    ranks: tuple[str, ...] = ()  # where its ranks were: a carry holds only on the same


class JobTable:
    """Each job's state, by name. A run's jobs are all known from the start; the service's
    arrive as submitted and are forgotten once ended (its ledger keeps them), so a
    long-lived arbiter's memory stays bounded."""

    def __init__(self, requests: list[JobRequest]) -> None:
        self.records = {r.name: JobRecord(r.name, r.arrival_ns) for r in requests}
        # flow ids carry a job's tag, by arrival; 0: the testbed's only job
        first = 0 if len(requests) == 1 else 1
        self.tags = {r.name: k for k, r in enumerate(
            sorted(requests, key=lambda r: (r.arrival_ns, r.name)), start=first)}
        self.tasks: dict[str, asyncio.Task[Any]] = {}  # each running job's
        self.cancelling: dict[str, str] = {}  # job -> who cancels it, while it stops
        self.attempts: dict[str, list[str]] = {}  # job -> every id it has run as
        # jobs whose stage 1 is under way, on the partition they hold
        self.setting_up: dict[str, tuple[JobRequest, Partition]] = {}
        self.resume: dict[str, int] = {}  # a stopped job's first iteration not recorded
        self.stopped: dict[str, Stopped] = {}
        self.rules: dict[str, StopRule] = {}  # each running job's
        self.tries: dict[str, int] = {}  # a job's stage 1s a device failed, in a row
        self.last: dict[str, int] = {}  # when each job's latest iteration was recorded
        self.life: dict[str, int] = {}  # a job queued again: how often (its ids are new)

    def add(self, name: str, arrival_ns: int) -> int | None:
        """A job arrives: its record, and the first tag no job not ended holds (None: all
        MAX_TAG are held)."""
        used = {t for n, t in self.tags.items() if self.records[n].end_ns is None}
        tag = next((k for k in range(1, MAX_TAG + 1) if k not in used), None)
        if tag is not None:
            self.records[name] = JobRecord(name, arrival_ns)
            self.tags[name] = tag
        return tag

    def forget(self, name: str) -> None:
        """An ended job of the service's."""
        for held in (self.records, self.tags, self.rules, self.last, self.resume,
                     self.stopped, self.tries, self.life):
            held.pop(name, None)
