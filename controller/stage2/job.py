"""A training job's stage 2: what the controller hands the nodes, and the one job runner.

The controller applies stage 1 (WSS tables, routes, count-action programs, read back), then
hands a `JobSpec` to whoever runs stage 2: the sim back end in process (one runner for
every node), or the node programs beside the O-NICs (`oddl node`, one runner per node,
over MQTT). Either way the same `JobRunner` drives the same control units against the
same O-NIC driver, wires the count-action engine to the collective's steps and accounts
for the iterations.

    oddl/<testbed>/job/run            JobSpec    (QoS 1; the controller's only)
    oddl/<testbed>/job/stop           JobStop    (QoS 1; the controller's only: one job of
                                                  several ends now)
    oddl/<testbed>/job/result/<node>  JobEvent   (QoS 1; "ready", one "iteration" per
                                                  iteration, then "done" or "failed")

JSON via msgspec, versioned, never pickle; every size and count a peer can send is
bounded by the types below (controller/base/access.py says who may publish what).
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Literal, Protocol, TypeVar

import msgspec
from oddl.controller.base.access import NAME_PATTERN
from oddl.controller.base.clock import Clock
from oddl.controller.base.collectives import (
    Schedule,
    bucketed,
    build,
    flows_bound,
    with_alltoall,
)
from oddl.controller.base.config import MAX_FLOWS_PER_ITERATION, Testbed
from oddl.controller.base.ddp import Overlap
from oddl.controller.base.devices import Bus, InterruptLine, ONic
from oddl.controller.base.messages import Flow
from oddl.controller.base.parallelism import Hybrid
from oddl.controller.stage1.plan import Plan, Route
from oddl.controller.stage2.control_unit import ControlUnit, Timing, Unit, UnitFactory
from oddl.controller.stage2.invariants import MAX_TAG, InvariantChecker
from oddl.controller.stage2.trace import MAX_ROWS, Tracer, TraceRow
from oddl.controller.stage2.workloads import CollectiveEngine
from oddl.fpga.countaction import Program
from oddl.fpga.countaction import step_sync as sync_program
from oddl.fpga.regmap import N_MODULES

JOB_VERSION = 10


# what decoding a job-topic payload may raise: msgspec's own errors, and (found by
# bench/fuzz_bench.py) RecursionError on deep nesting and UnicodeDecodeError on bad UTF-8
DECODE_ERRORS = (msgspec.DecodeError, msgspec.ValidationError, RecursionError,
                 UnicodeDecodeError)


class _FromNode(Protocol):
    @property
    def node(self) -> str: ...


M = TypeVar("M", bound=_FromNode)


def from_its_node(decoder: msgspec.json.Decoder[M], topic: str, payload: bytes) -> M | str:
    """A node's message (an event, a heartbeat) decoded and held to the node its topic
    names, since the broker vouches for the topic only; or why it is refused."""
    try:
        msg = decoder.decode(payload)
    except DECODE_ERRORS as e:
        return str(e)
    if msg.node != topic.rpartition("/")[2]:
        return f"{type(msg).__name__} of {msg.node!r} on another's topic"
    return msg


def untrue(ev: JobEvent, start: int, per_iteration: int, claimed: int) -> str | None:
    """Why a rank's report of an iteration cannot be true, or None: `claimed` flows so far
    (its stats) against the `per_iteration` its schedule starts since iteration `start`,
    and its times in order. (Its length against the controller's clock is the caller's.)"""
    if not 0 <= claimed <= per_iteration * (ev.iteration + 1 - start):
        return f"{claimed} flows where its schedule starts {per_iteration} an iteration"
    if ev.t_start > ev.t_end:
        return f"t_start {ev.t_start} after t_end {ev.t_end}"
    return None


MAX_NODES = 1 << 16
MAX_ITERATIONS = 10_000_000
Name = Annotated[str, msgspec.Meta(pattern=NAME_PATTERN, max_length=64)]
Count = Annotated[int, msgspec.Meta(ge=0, le=1 << 62)]
Nodes = Annotated[list[Name], msgspec.Meta(max_length=MAX_NODES)]
Text = Annotated[str, msgspec.Meta(max_length=4096)]
# a flow delivered, as a rank reports it (a run store's flows row)
Hops = Annotated[int, msgspec.Meta(ge=1, le=1 << 16)]
ReportedFlow = tuple[Count, Count, Name, Name, Count, Hops, Count, Count]
MAX_FLOW_ROWS = 1 << 14  # a rank's in one iteration (a 4,096-node ring: 8,190; ~1.2 MB of
# JSON, within the bus's 4 MB a message: beyond it, a report keeps its first rows)
JobId = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")]


def job_id(*parts: object) -> str:
    """A job id from its parts (experiment, network, ...), as the job topics accept it."""
    s = re.sub(r"[^A-Za-z0-9_.-]+", "_", "-".join(str(p) for p in parts)).strip("_.-")
    return (s or "job")[-128:].lstrip("_.-") or "job"


class JobSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    v: int
    job: JobId
    collective: Name
    size: Count
    rows: Annotated[int, msgspec.Meta(ge=1, le=MAX_NODES)]
    cols: Annotated[int, msgspec.Meta(ge=1, le=MAX_NODES)]
    degree: Annotated[int, msgspec.Meta(ge=0, le=MAX_NODES)]
    bidirectional: bool
    ranks: Nodes
    nodes: Nodes
    iterations: Annotated[int, msgspec.Meta(ge=1, le=MAX_ITERATIONS)]
    compute_ns: Count
    nic_sync: bool
    timing: Timing
    # node -> dst -> (port, channel, next hop)
    routes: dict[Name, dict[Name, tuple[Annotated[str, msgspec.Meta(max_length=2)],
                                        Annotated[int, msgspec.Meta(ge=0, le=4096)], Name]]]
    # the first iteration to run (a job resumed after a fault goes on where it stopped);
    # it runs iterations start .. iterations - 1
    start: Annotated[int, msgspec.Meta(ge=0, le=MAX_ITERATIONS)] = 0
    # the control units record a timeline of iterations 0 .. trace_iterations - 1
    # (controller/stage2/trace.py); the nodes send it with their iteration events
    trace_iterations: Annotated[int, msgspec.Meta(ge=0, le=MAX_ITERATIONS)] = 0
    # a job beside others (controller/service/admission.py): its flow ids carry this tag, so the
    # invariant checker tells the jobs' flows apart; 0: the testbed's only job
    tag: Annotated[int, msgspec.Meta(ge=0, le=MAX_TAG)] = 0
    # bytes each rank sends every other before the all-reduce (DLRM's embeddings)
    alltoall: Count = 0
    # its share of a link it shares with other jobs, where the network shares by weight
    weight: Annotated[float, msgspec.Meta(gt=0, le=1000)] = 1.0
    # nodes whose boards the controller cannot reach (board = "local"): each one's node
    # program applies its board's routes and count-action program itself, reads them
    # back, and clears the routes when the job ends (drivers/local_board.py)
    boards: Nodes = []
    # a job resumed after a fault that left every rank alive (`carried`): the flows of
    # iteration `start` already delivered, as (rank, step, index in the step's sends),
    # are not sent again, its compute goes on from its first start (carry_t0, the host's
    # clock), which it keeps: the iteration is not lost, its time holds the recovery
    carried: bool = False
    carry: Annotated[list[tuple[int, int, int]], msgspec.Meta(max_length=1 << 22)] = []
    carry_t0: Annotated[int, msgspec.Meta(ge=0)] = 0
    # a Transformer split tensor x pipeline x data (controller/base/parallelism.py): its
    # steps carry their compute, `collective` is its data-parallel all-reduce
    hybrid: Hybrid | None = None
    # data parallelism as DDP runs it (controller/base/ddp.py): `collective` all-reduces
    # each gradient bucket from its ready time, overlapping backward; compute_ns is
    # forward and backward, and no step waits for it first
    overlap: Overlap | None = None
    # each rank reports the flows delivered to it, with its iteration (the run directory's
    # flows table, as a sim run records it)
    record_flows: bool = False
    # the controller's session that sent it (its status says "online SESSION"): a node
    # drops a job of a controller that a newer one has taken the testbed over from
    controller: Annotated[str, msgspec.Meta(max_length=64)] = ""


class JobStop(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The controller ends one job (a fault, a failure, its run stopping), while its
    others run on: the job's node programs drop it at once."""

    v: int
    job: JobId
    why: Text = ""


EventKind = Literal["ready", "iteration", "done", "failed"]


class JobEvent(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True):
    v: int
    job: JobId
    kind: EventKind
    node: Name
    iteration: Annotated[int, msgspec.Meta(ge=-1, le=MAX_ITERATIONS)] = -1
    t_start: int = 0
    t_end: int = 0
    control_messages: Count = 0
    error: Text = ""
    stats: Annotated[dict[Name, int], msgspec.Meta(max_length=64)] = {}
    # the first few the node's monitor recorded
    violations: Annotated[list[Text], msgspec.Meta(max_length=50)] = []
    trace: Annotated[list[TraceRow], msgspec.Meta(max_length=MAX_ROWS)] = []
    # a job stopped mid-iteration `iteration`: the flows delivered to this rank (rank,
    # step, index in the step's sends) and when the iteration began here; the controller
    # carries them into the job's resumption (JobSpec.carry)
    carried: bool = False
    carry: Annotated[list[tuple[int, int, int]], msgspec.Meta(max_length=1 << 16)] = []
    carry_t0: Annotated[int, msgspec.Meta(ge=0)] = 0
    # its part of `iteration` done (reported), the flows of the next that came early, and
    # when it was done: the next one's share, if the controller has recorded `iteration`
    done_here: bool = False
    early: Annotated[list[tuple[int, int, int]], msgspec.Meta(max_length=1 << 16)] = []
    early_t0: Annotated[int, msgspec.Meta(ge=0)] = 0
    # 1: a failure told while the bus went (said again, after the last reports, once the
    # controller is heard: wait for that); 2: that saying again
    again: Annotated[int, msgspec.Meta(ge=0, le=2)] = 0
    # the flows delivered to this rank in `iteration` (JobSpec.record_flows): flow, step,
    # src, dst (this node), bytes, hops, submitted and delivered (ns)
    flows: Annotated[list[ReportedFlow], msgspec.Meta(max_length=MAX_FLOW_ROWS)] = []


def timing_of(tb: Testbed) -> Timing:
    """The control units' timing, from the testbed config: the one place it is derived."""
    o, c = tb.optical, tb.control
    return Timing(o.tuning_ns, math.ceil(o.guard_time_ns),
                  math.ceil(o.propagation_ns), math.ceil(c.request_timeout_ns),
                  math.ceil(c.request_timeout_ns), math.ceil(c.grant_lease_ns), c.max_retries,
                  c.flow_queue, c.request_queue, c.requests_per_sender, c.delivered_keys)


def wire_routes(plan: Plan) -> dict[str, dict[str, tuple[str, int, str]]]:
    return {n: {d: (r.port, r.channel, r.next_hop) for d, r in routes.items()}
            for n, routes in plan.routes.items()}


@functools.lru_cache(maxsize=64)
def built_schedule(collective: str, n: int, size: int, rows: int, cols: int,
                   degree: int, bidirectional: bool, alltoall: int = 0,
                   hybrid: Hybrid | None = None, overlap: Overlap | None = None) -> Schedule:
    """A job's schedule, built once per shape (several jobs share shapes): its collective,
    its hybrid split with the collective as its data-parallel all-reduce, or its DDP
    buckets each all-reduced by the collective."""
    if hybrid is not None:
        return hybrid.schedule(collective, degree)
    if overlap is not None:
        return with_alltoall(bucketed(overlap, lambda b: build(collective, n, b, rows, cols,
                                                                degree, bidirectional), n),
                             alltoall)
    return with_alltoall(build(collective, n, size, rows, cols, degree, bidirectional),
                         alltoall)


def nic_programs(schedule: Schedule, ranks: Sequence[str]) -> dict[str, Program] | None:
    """Step synchronisation on the O-NICs' count-action engines, a program per rank's
    node, when the schedule fits them; None: the host counts deliveries."""
    if not all(0 < len(s) <= N_MODULES and all(x.recv_bytes > 0 for x in s)
               for s in schedule):
        return None
    return {n: sync_program([x.recv_bytes for x in schedule[r]]) for r, n in enumerate(ranks)}


def refused(spec: JobSpec) -> str | None:
    """Why a node must not build this job's schedule (a hybrid split that its ranks, its
    model or the bound on a schedule's size do not allow), or None."""
    h = spec.hybrid
    ov = spec.overlap
    if ov is not None:
        why = ov.problems()
        if ov.nbytes != spec.size:
            why.append(f"buckets of {ov.nbytes} bytes for a gradient of {spec.size}")
        flows = len(ov.buckets) * flows_bound(spec.collective, len(spec.ranks), spec.degree)
        if flows > MAX_FLOWS_PER_ITERATION:
            why.append(f"{len(ov.buckets)} buckets of {spec.collective} over "
                       f"{len(spec.ranks)} ranks: up to {flows:,} flows an iteration, over "
                       f"{MAX_FLOWS_PER_ITERATION:,}")
        return "; ".join(why) or None
    if h is None:
        return None
    why = [f"{f}: {w}" for f, w in h.problems()]
    if h.ranks != len(spec.ranks):
        why.append(f"a split of {h.ranks} ranks for a job of {len(spec.ranks)}")
    if h.steps_per_rank() * len(spec.ranks) > MAX_FLOWS_PER_ITERATION:
        why.append(f"up to {h.steps_per_rank() * len(spec.ranks):,} steps an iteration")
    return "; ".join(why) or None


def schedule_of(spec: JobSpec) -> Schedule:
    return built_schedule(spec.collective, len(spec.ranks), spec.size, spec.rows, spec.cols,
                          spec.degree, spec.bidirectional, spec.alltoall, spec.hybrid,
                          spec.overlap)


def quiet_ns(spec: JobSpec) -> int:
    """The longest a job's ranks may go on with no message while all is well: a rank's
    compute from one send to its next (a hybrid job's steps, from its FLOPs: a pipeline
    stage computes several in a row; the iteration's given compute otherwise), with the
    iteration's own compute before it. A stall is only what lasts longer than this."""
    longest = 0
    for steps in schedule_of(spec):
        run = spec.compute_ns
        for st in steps:
            run += st.compute_ns
            longest = max(longest, run)
            if st.sends or st.recv_bytes:  # a message out, or one awaited, ends a quiet
                run = 0
    return max(spec.compute_ns, longest)


OnIteration = Callable[[int, int, int], None]  # iteration, t_start, t_end (the host's clock)


class JobRunner:
    """Stage 2 of one job on the ranks and O-NICs one host owns.

    `begin(i)` starts iteration i on the local ranks (compute, then the collective's
    steps); when every local rank has all its bytes, `on_iteration` is told, and the host
    decides when the next iteration begins (at once in process; on a node program, when
    every rank has reported, which it hears on the bus).
    """

    def __init__(self, spec: JobSpec, clock: Clock, monitor: InvariantChecker | None,
                 on_iteration: OnIteration, local: list[str] | None = None) -> None:
        self.spec = spec
        self.clock = clock
        self.monitor = monitor
        self.on_iteration = on_iteration
        self.fail: Callable[[BaseException], None] = self._raise  # the host's, once it runs
        self.submit: Callable[[Flow], None] = self._no_network
        ranks = spec.ranks if local is None else [r for r in spec.ranks if r in local]
        self.engine = CollectiveEngine(clock, schedule_of(spec), spec.ranks,
                                       lambda f: self.submit(f),
                                       monitor.flow_started if monitor is not None else None,
                                       spec.nic_sync, ranks, spec.tag)
        self.units: dict[str, Unit] = {}
        self.trace = Tracer() if spec.trace_iterations else None
        if self.trace is not None:
            self.engine.on_phase = self._phase
        self._lines: list[InterruptLine] = []
        self._onics: list[ONic] = []

    @staticmethod
    def _raise(e: BaseException) -> None:
        raise e

    @staticmethod
    def _no_network(f: Flow) -> None:
        raise RuntimeError(f"{f!r}: the job runner has no network attached")

    def deliver(self, flow: Flow) -> None:
        """A flow's last leg has arrived at its destination. A monitor that does not see
        the light (no fabric model) is told here; one that does, was told by the fabric."""
        m = self.monitor
        if m is not None and not m.sees_light:
            m.on_arrival(self.clock.now_ns(), flow.dst, flow, flow.nbytes)
        self.engine.on_delivered(flow)

    def on_onics(self, bus: Bus, onics: Mapping[str, ONic],
                 lines: Mapping[str, InterruptLine], unit: UnitFactory = ControlUnit
                 ) -> JobRunner:
        """ODDL: a control unit per O-NIC this host owns, on its board's interrupt line;
        each local rank's steps advanced by its count-action engine (or counted here).
        `unit` makes each (the Python unit; a model may put the gateware's in its place)."""
        spec, timing = self.spec, self.spec.timing
        missing = [n for n in spec.nodes if n in onics and n not in lines]
        if missing:
            raise ValueError(f"no interrupt line for {', '.join(missing)}")
        for n in (n for n in spec.nodes if n in onics):
            routes = {d: Route(*r) for d, r in spec.routes.get(n, {}).items()}
            self.units[n] = unit(n, self.clock, bus, onics[n], routes, timing,
                                 self.deliver, lambda e: self.fail(e))
            self.units[n].trace = self.trace
            self.units[n].tag = spec.tag
            lines[n].connect(onics[n].on_interrupt)
            self._lines.append(lines[n])
            self._onics.append(onics[n])
        if spec.nic_sync:
            for n in self.units:
                if n in self.engine.rank_of:
                    onics[n].on_module_fired = functools.partial(self._fired, n)
        units = self.units
        self.submit = lambda f: units[f.src].submit(f)
        return self

    def _phase(self, rank: int, what: str, t0: int, t1: int) -> None:
        tr = self.trace
        if tr is not None and tr.on:
            tr.add(TraceRow("phase", self.spec.ranks[rank], "", what[:32], t0, t1))

    def _fired(self, node: str, slot: int) -> None:
        tr = self.trace
        if tr is not None and tr.on:
            tr.add(TraceRow("fire", node, "", f"slot {slot}", self.clock.now_ns()))
        try:
            self.engine.module_fired(node, slot)
        except RuntimeError as e:  # in an interrupt callback: raised, it would only be logged
            self.fail(e)

    def gone(self, node: str) -> None:
        """`node`'s program died with its board (a drill's dead board): its control unit
        answers nothing, and its O-NIC's count-action fires reach no host."""
        cu = self.units.get(node)
        if cu is not None:
            cu.halt()
            cu.onic.on_module_fired = None

    def on_network(self, submit: Callable[[Flow], None]) -> JobRunner:
        """A flow-level network model (the baselines): it calls `deliver` on arrival."""
        self.submit = submit
        return self

    def begin(self, i: int) -> None:
        tr = self.trace
        if tr is not None:
            if i < self.spec.trace_iterations:
                tr.on = True
            elif tr.on:  # the last RELEASEs of the traced ones land during this compute
                self.clock.call_later_ns(self.spec.compute_ns, setattr, tr, "on", False)
        spec = self.spec
        resumed = spec.carried and i == spec.start
        ov = spec.overlap
        self.engine.start_iteration(i, spec.compute_ns,
                                    lambda t_end: self.on_iteration(i, self.engine.t_start,
                                                                    t_end),
                                    spec.carry if resumed else (),
                                    spec.carry_t0 if resumed else None)
        if ov is not None and tr is not None and tr.on:  # the compute stream, beside
            t0 = self.engine.t_start
            for r in self.engine.local:
                node = spec.ranks[r]
                tr.add(TraceRow("phase", node, "compute", "forward", t0, t0 + ov.forward_ns))
                tr.add(TraceRow("phase", node, "compute", "backward", t0 + ov.forward_ns,
                                t0 + ov.compute_ns))

    def transmitting(self) -> bool:
        """A transmitter here still has a flow (its TX_DONE, and RELEASE, to come)."""
        return any(cu.transmitting() for cu in self.units.values())

    def sent(self) -> int:
        """Control messages this job's units have sent (on a bus that other jobs share)."""
        return sum(cu.sent for cu in self.units.values())

    def stats(self) -> dict[str, int]:
        agg: dict[str, int] = {}
        for cu in self.units.values():
            for k, v in cu.stats.items():
                agg[k] = agg.get(k, 0) + v
        if self.trace is not None and self.trace.dropped:  # a timeline that is not whole
            agg["trace_dropped"] = self.trace.dropped
        return agg

    def close(self) -> None:
        """Stop, and give the boards back: no step runs and no control unit answers any
        more, interrupt lines disconnected, count-action unwired."""
        self.engine.halted = True
        for cu in self.units.values():
            cu.halt()
        for line in self._lines:
            line.disconnect()
        for onic in self._onics:
            onic.on_module_fired = None
        self._lines.clear()
        self._onics.clear()


def step_sync(spec: JobSpec) -> str:
    return "o-nic count-action" if spec.nic_sync else "host"
