"""What the testbed tells its watchers (`oddl dashboard`) on the bus, besides what it
already says (statuses, jobs, results, heartbeats):

    oddl/<tb>/telemetry/<node>           PortsNote: each port's state and wavelength, the
                                         flows in flight, messages sent (QoS 0, each beat)
    oddl/<tb>/telemetry/oddl-ctl/<kind>  the controller's notes (QoS 0; plan and accept
                                         retained, so a dashboard opened later has them):
        run        RunNote        a network's run began or ended
        plan       PlanNote       the WSS tables stage 1 applied
        iteration  IterationNote  an iteration recorded
        health     HealthNote     the watch's diagnoses and the drill's faults
        accept     AcceptNote     the last acceptance result
        queue      QueueNote      the arbiter's queue (retained)
        ended      EndedNote      the arbiter's latest job to end (retained): a lab's
                                  scripts hear each end as it happens

JSON via msgspec, versioned, every size bounded: a watcher decodes nothing unbounded.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from oddl.controller.base.access import CONTROLLER, NAME_PATTERN, telemetry_topic

TELEMETRY_VERSION = 1
Name = Annotated[str, msgspec.Meta(pattern=NAME_PATTERN, max_length=64)]
Text = Annotated[str, msgspec.Meta(max_length=512)]
Count = Annotated[int, msgspec.Meta(ge=0, le=1 << 62)]
PortState = Literal["idle", "requesting", "waiting for grant", "tuning", "sending"]
NOTES = ("run", "plan", "iteration", "health", "accept", "queue", "ended")
RETAINED = ("plan", "accept", "queue", "ended")
JobState = Literal["queued", "running", "finished", "failed", "cancelled", "timeout",
                   "quarantined"]


def note_topic(tb: str, kind: str) -> tuple[str, bool]:
    """Where the controller's note of `kind` ("ended", or one job's: "ended/j7") goes,
    and whether the broker keeps it."""
    return telemetry_topic(tb, CONTROLLER, kind), kind.partition("/")[0] in RETAINED


class PortView(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    state: PortState
    channel: Annotated[int, msgspec.Meta(ge=-1, le=4096)] = -1  # tuned to; -1: never tuned
    flow: Annotated[int, msgspec.Meta(ge=-1, le=1 << 62)] = -1
    peer: Annotated[str, msgspec.Meta(max_length=64)] = ""
    queued: Annotated[int, msgspec.Meta(ge=0, le=1 << 20)] = 0  # flows waiting behind it


class PortsNote(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    v: int
    node: Name
    job: Annotated[str, msgspec.Meta(max_length=128)] = ""
    ports: Annotated[dict[Annotated[str, msgspec.Meta(pattern="^[HV]$")], PortView],
                     msgspec.Meta(max_length=2)] = {}
    in_flight: Count = 0  # transmitters with a flow, receivers with a grant
    sent: Count = 0  # control messages this node has sent (the watcher takes the rate)


class RunNote(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    v: int
    experiment: Text
    network: Text
    backend: Text
    state: Literal["started", "finished", "failed"]
    iterations: Count = 0  # to run
    detail: Text = ""
    # ended: how late the node programs' loops ran where that skews the figures (a loaded
    # host: the run is disturbed; service/backend.host_disturbance_ms); 0: it did not
    host_lag_ms: Count = 0


class WSSView(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    wss: Name
    axis: Annotated[str, msgspec.Meta(max_length=8)]
    index: Annotated[int, msgspec.Meta(ge=0, le=1 << 16)]
    labels: Annotated[list[Annotated[str, msgspec.Meta(max_length=32)]],
                      msgspec.Meta(max_length=512)]
    # table[in_port][channel] -> out_port or None
    table: Annotated[list[Annotated[list[Annotated[int, msgspec.Meta(ge=0, le=4096)] | None],
                                    msgspec.Meta(max_length=512)]],
                     msgspec.Meta(max_length=4096)]


class PlanNote(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    v: int
    network: Text
    strategy: Text
    wavelengths_nm: Annotated[list[float], msgspec.Meta(max_length=512)]
    wss: Annotated[list[WSSView], msgspec.Meta(max_length=256)]  # the first 256


class IterationNote(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    v: int
    network: Text
    iteration: Count
    time_ms: float
    control_messages: Count = 0
    # which run of the network (its job id): a watcher starts a new series on a new one,
    # whatever order the broker delivers the notes in
    run: Annotated[str, msgspec.Meta(max_length=128)] = ""
    job: Annotated[str, msgspec.Meta(max_length=64)] = ""  # of several: whose (a series each)


class Finding(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    kind: Text
    target: Text
    evidence: Text = ""
    t_ms: float = 0.0


class HealthNote(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    v: int
    network: Text
    diagnoses: Annotated[list[Finding], msgspec.Meta(max_length=100)] = []
    injected: Annotated[list[Finding], msgspec.Meta(max_length=100)] = []


class Check(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: Text
    outcome: Literal["passed", "failed", "skipped", "error"]


class AcceptNote(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    v: int
    testbed: Text
    passed: bool
    checks: Annotated[list[Check], msgspec.Meta(max_length=1000)] = []
    when: Text = ""


class QueuedJob(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    job: Name
    user: Name
    state: JobState
    ranks: Count
    done: Count  # iterations recorded
    iterations: Count
    partition: Text = ""
    priority: float = 0.0  # now (a queued job's: base + age + share)
    held: bool = False
    reason: Text = ""  # why a queued job waits
    nodes: Annotated[list[Name], msgspec.Meta(max_length=4096)] = []  # a running job's


class QueueNote(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The arbiter service's queue (`oddl arbiter`): every job not ended, and the latest
    that have."""

    v: int
    testbed: Text
    jobs: Annotated[list[QueuedJob], msgspec.Meta(max_length=256)] = []


class EndedNote(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A job of the arbiter's has ended."""

    v: int
    testbed: Text
    job: Name
    user: Name
    state: JobState
    why: Text = ""
    done: Count = 0  # iterations recorded
    iterations: Count = 0
    ended: float = 0.0  # Unix time


NOTE_TYPES: dict[str, type[Any]] = {"run": RunNote, "plan": PlanNote,
                                    "iteration": IterationNote, "health": HealthNote,
                                    "accept": AcceptNote, "queue": QueueNote,
                                    "ended": EndedNote}


def ports_note(node: str, ports: tuple[str, ...], runner: Any, sent: int) -> PortsNote:
    """A node's ports as its control units see them (runner: the JobRunner of its job, if
    any; else all idle); what `oddl node` publishes with every heartbeat."""
    cu = runner.units.get(node) if runner is not None else None
    if cu is None:
        return PortsNote(TELEMETRY_VERSION, node, ports={p: PortView("idle") for p in ports},
                         sent=sent)
    return PortsNote(TELEMETRY_VERSION, node, runner.spec.job[:128], cu.ports_view(),
                     cu.in_flight(), sent)


def accept_note(testbed: str, summary: dict[str, Any], when: str) -> AcceptNote:
    """An acceptance report's summary.json (oddl.acceptance.plugin) as a note."""
    outcomes = ("passed", "failed", "skipped", "error")
    checks = [Check(str(c["check"])[:512], c["outcome"] if c["outcome"] in outcomes
                    else "error") for c in summary["checks"][:1000]]
    return AcceptNote(TELEMETRY_VERSION, testbed, summary["verdict"] == "PASS", checks,
                      when[:512])


def plan_note(network: str, plan: Any) -> PlanNote:
    """The WSS tables a plan (controller/stage1/plan.py) applies, the first 256."""
    return PlanNote(TELEMETRY_VERSION, network, plan.strategy, plan.wavelengths_nm,
                    [WSSView(t.wss, t.axis, t.index, t.labels, t.table) for t in plan.wss[:256]])


def health_note(network: str, diagnoses: list[Any], injected: list[Any]) -> HealthNote:
    """The watch's diagnoses (health.Diagnosis) and the drill's faults (backend.Injected),
    the last 100 of each."""
    return HealthNote(
        TELEMETRY_VERSION, network,
        [Finding(d.kind, d.target[:512], d.evidence[:512], d.t_ns / 1e6)
         for d in diagnoses[-100:]],
        [Finding(x.spec.kind, x.spec.target, "ended" if x.until_ns is not None else "",
                 x.at_ns / 1e6) for x in injected[-100:]])
