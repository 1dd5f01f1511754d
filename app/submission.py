"""A submission to the arbiter: an experiment's one workload checked as a job for the
testbed, or refused with the HTTP status and why."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any

import msgspec
from oddl.controller.base.config import (
    ConfigError,
    JobEntry,
    Testbed,
    experiment_model,
    field_issues,
    parse_toml,
    validate_experiment,
)
from oddl.controller.base.topology import Grid
from oddl.controller.service.jobs import JobRequest
from oddl.controller.stage1.placement import fits
from pydantic import ValidationError


class Refused(Exception):
    """A request the service refuses: its HTTP status and why."""

    def __init__(self, status: int, why: str) -> None:
        super().__init__(why)
        self.status = status


class Submission(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A POST /jobs body, typed and bounded: the experiment's TOML text, and how it is to
    be queued (each field checked further where it is used: `after` by the dependencies,
    `webhook` by the notices' allow list, `array` by app/arrays.py)."""

    experiment: str
    priority: Annotated[int, msgspec.Meta(ge=-1000, le=1000)] = 0
    time_limit_s: Annotated[float, msgspec.Meta(gt=0, lt=1e9)] | None = None
    after: str | None = None  # "jN", "jN:ok" or "jN:notok"
    webhook: str | None = None
    singleton: bool = False  # after every earlier job of the user's of the same name
    array: str | None = None  # "0-15", "0-15:4", "1,3,9": one task a value


FIELDS = frozenset(Submission.__struct_fields__)
USAGE = ('{"experiment": TOML text, "priority": -1000..1000, "time_limit_s": seconds, '
         '"after": "jN[:ok|:notok]", "webhook": URL, "singleton": true, "array": "0-15"} '
         '(all but the experiment optional)')


def submission(body: dict[str, Any]) -> Submission:
    """A submission's body as its struct: Refused (422) naming a field it does not know
    (one was ignored silently: issue 86), or the field that is not what it must be."""
    if unknown := sorted(map(str, set(body) - FIELDS)):
        raise Refused(422, f"{', '.join(unknown)[:200]}: not a field of a submission "
                           f"(known: {', '.join(sorted(FIELDS))})")
    try:
        return msgspec.convert(body, Submission, strict=True)
    except msgspec.ValidationError as e:
        raise Refused(422, f"{str(e).replace('$.', '')}: a submission is {USAGE}") from None


def job_request(text: str, grid: Grid, tb: Testbed, name: str, priority: int) -> JobRequest:
    """A submitted experiment's one workload as a job for this testbed (its `testbed` and
    `networks` are the arbiter's), checked by the one validation every command uses;
    Refused (422) with each `field: reason` it cannot be one for."""
    source = "the submitted experiment"
    try:
        data = parse_toml(text, source)
        if paths := [k for k in ("jobs_trace", "jobs") if k in data]:
            # (issue 64: a trace's path was read on the arbiter's host, and its error
            # told whether the file was there)
            raise Refused(422, f"{paths[0]}: a submission is one [workload]; the arbiter "
                               f"reads no file a job names")
        exp = experiment_model(Path(source), {
            "networks": [{"name": "oddl", "kind": "oddl"}], **data, "testbed": tb.name})
        validate_experiment(Path(source), exp, tb, placed=True)
    except ConfigError as e:
        raise Refused(422, "; ".join(f"{i.path}: {i.reason}" if i.path else i.reason
                                     for i in e.issues)) from None
    w = exp.workload
    if w is None:
        raise Refused(422, "submit an experiment of one [workload] (a job), not [[jobs]]")
    if w.torch_trace is not None:
        raise Refused(422, "workload.torch_trace: an arbiter runs a model's job, not a trace "
                           "file of yours: run a recorded step with `oddl run`")
    if w.compute_time_ms is None and w.parallelism is None and w.device is None:
        raise Refused(422, "workload.compute_time_ms: give it, or a device (the arbiter "
                           "calibrates nothing)")
    # its batch where it gives one (JobEntry's default otherwise)
    batch: dict[str, Any] = {"batch_per_node": w.batch_per_node} if w.batch_per_node else {}
    try:
        entry = JobEntry(name="job", model=w.label, collective=w.collective,
                         ranks=w.ranks or tb.n_nodes, iterations=exp.iterations,
                         epochs=None if exp.iterations else w.epochs,
                         dataset_samples=None if exp.iterations else w.dataset_samples,
                         bytes_per_param=w.bytes_per_param, compute_time_ms=w.compute_time_ms,
                         parallelism=w.parallelism, device=w.device, overlap=w.overlap,
                         bucket_mb=w.bucket_mb, first_bucket_mb=w.first_bucket_mb,
                         **batch)
    except ValidationError as e:
        raise Refused(422, "; ".join(f"workload.{f}: {why}" for f, why in field_issues(e))
                      ) from None
    req = JobRequest.of(entry)
    limit = exp.time_limit_s
    if not fits(grid, req.ranks, req.shape, req.exact, req.group):
        raise Refused(422, f"no rectangle of {tb.name}'s {tb.grid.rows} x {tb.grid.cols} grid "
                           f"holds {req.ranks} ranks: this job can never run here")
    return dataclasses.replace(req, name=name, priority=priority, title=exp.name,
                               time_limit_ns=round(limit * 1e9) if limit else 0)
