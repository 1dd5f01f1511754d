"""A recorded training step as a workload: the Chrome trace JSON `torch.profiler` writes
(`prof.export_chrome_trace`), of one rank of a real data-parallel run.

What is taken from it, for one profiled step (`ProfilerStep#N`, the last unless told):
- the compute stream: the thread the steps are recorded on; forward ends with
  `DistributedDataParallel.forward` (or where backward begins), backward with its last
  `autograd::engine::evaluate_function`, and the optimiser's `Optimizer.step#...` runs after
  the last collective;
- each collective: its launch on that thread (`c10d::allreduce_`, `c10d::alltoall_`, ...:
  its kind, its order and its time, which is when its bucket was ready) and its tensor's
  elements; its element size, and the stream or thread it ran on, from the backend's own
  record of it (`gloo:all_reduce`, NCCL's `record_param_comms`), matched in order.

Every rank of the job runs that schedule (the trace is one rank's; DDP's ranks run the same
buckets). The collectives run one after another, in launch order, as DDP's buckets do on
one communication stream; a trace whose collectives ran on several streams at once is run
that way too, and `Recorded.streams` says how many it had. The file is data: read bounded
(size, events, nesting) and never executed; a bad field is one line naming it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
from oddl.controller.base.config.fields import ConfigError, ConfigIssue
from oddl.controller.base.ddp import MAX_BUCKETS, Bucket, CollectiveKind, Overlap

MAX_TRACE_BYTES = 256 << 20  # a profiled step of a large model is tens of MB
MAX_EVENTS = 4_000_000
MAX_COLLECTIVE_BYTES = 1 << 40  # a bucket's bound (controller/base/ddp.py)
# c10d's operators, as the profiler names their launch, and the kind each is
KINDS: dict[str, CollectiveKind] = {
    "allreduce_": "all_reduce", "allreduce_coalesced_": "all_reduce",
    "allgather_": "all_gather", "_allgather_base_": "all_gather",
    "allgather_into_tensor_coalesced_": "all_gather",
    "reduce_scatter_": "reduce_scatter", "_reduce_scatter_base_": "reduce_scatter",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "alltoall_": "all_to_all", "alltoall_base_": "all_to_all", "broadcast_": "broadcast"}
DTYPE_BYTES = {"float": 4, "float32": 4, "double": 8, "float64": 8, "half": 2, "float16": 2,
               "bfloat16": 2, "c10::half": 2, "c10::bfloat16": 2, "int": 4, "long int": 8,
               "int64": 8, "long": 8, "int32": 4, "signed char": 1, "unsigned char": 1,
               "int8": 1, "uint8": 1, "bool": 1}
_BACKEND_RECORD = re.compile(r"^(gloo|nccl|mpi|ucc):([a-z_]+)$")


class _Event(msgspec.Struct):
    """A trace event, as far as it is read (everything else is ignored)."""

    name: str = ""
    ph: str = ""
    cat: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float = 0.0
    dur: float = 0.0
    args: dict[str, Any] = {}


class _Trace(msgspec.Struct):
    traceEvents: list[_Event]
    distributedInfo: dict[str, Any] = {}


@dataclass(frozen=True)
class Collective:
    kind: CollectiveKind
    nbytes: int
    ready_ns: int
    stream: str


@dataclass(frozen=True)
class Recorded:
    """One rank's recorded step, as the schedule the job runs."""

    path: str
    step: str
    step_ns: int  # the step as recorded, for comparison
    backend: str
    world_size: int
    collectives: tuple[Collective, ...]
    overlap: Overlap

    @property
    def streams(self) -> int:
        return len({c.stream for c in self.collectives})


def _fail(path: str, field: str, why: str) -> ConfigError:
    return ConfigError([ConfigIssue(path, field, why)])


def read_recorded(path: Path, step: int | None = None) -> Recorded:
    """The trace at `path` as a job's schedule; ConfigError names the file, the field and
    why (missing, too big, not JSON, no profiled step, an unknown collective, ...)."""
    src = str(path)
    try:
        if not path.is_file():
            raise _fail(src, "", "file not found" if not path.exists() else
                        "not a regular file")
        size = path.stat().st_size
        if size > MAX_TRACE_BYTES:
            raise _fail(src, "", f"{size} bytes: a trace is at most {MAX_TRACE_BYTES}")
        with path.open("rb") as f:
            data = f.read(MAX_TRACE_BYTES + 1)
    except OSError as e:
        raise _fail(src, "", e.strerror or str(e)) from None
    try:
        trace = msgspec.json.decode(data, type=_Trace)
    except msgspec.ValidationError as e:
        raise _fail(src, "", f"not a PyTorch profiler trace: {e}") from None
    except msgspec.DecodeError as e:
        raise _fail(src, "", f"not JSON: {e}") from None
    if len(trace.traceEvents) > MAX_EVENTS:
        raise _fail(src, "traceEvents", f"{len(trace.traceEvents)} events: at most "
                    f"{MAX_EVENTS}")
    return _schedule(src, trace, step)


def _span(e: _Event) -> tuple[float, float]:
    return e.ts, e.ts + e.dur


def _schedule(src: str, trace: _Trace, want: int | None) -> Recorded:
    ev = [e for e in trace.traceEvents if e.ph == "X" and math.isfinite(e.ts) and
          math.isfinite(e.dur) and e.dur >= 0]
    steps = [e for e in ev if e.name.startswith("ProfilerStep#")]
    if not steps:
        raise _fail(src, "traceEvents", "no profiled step (ProfilerStep#N): record with "
                    "torch.profiler.profile(schedule=...) and call prof.step() each "
                    "iteration")
    if want is not None:
        steps = [e for e in steps if e.name == f"ProfilerStep#{want}"]
        if not steps:
            raise _fail(src, "torch_trace_step", f"no ProfilerStep#{want} in the trace")
    st = max(steps, key=lambda e: e.ts)
    t0, t1 = _span(st)
    main = (st.pid, st.tid)
    inside = sorted((e for e in ev if (e.pid, e.tid) == main and t0 <= e.ts <= t1),
                    key=lambda e: e.ts)
    launches = [e for e in inside if e.name.startswith("c10d::")]
    unknown = sorted({e.name for e in launches if e.name[6:] not in KINDS})
    if unknown:
        raise _fail(src, st.name, f"collective {unknown[0]} is not one oddl runs; it runs "
                    f"{', '.join(sorted(set(KINDS.values())))}")
    records = sorted((e for e in ev if t0 <= e.ts <= t1 and (e.pid, e.tid) != main and
                      (_BACKEND_RECORD.match(e.name) or e.name == "record_param_comms")),
                     key=lambda e: e.ts)
    backward = [e for e in inside if e.name.startswith("autograd::engine::evaluate_function")]
    if not backward:
        raise _fail(src, st.name, "no backward in the step (autograd::engine::"
                    "evaluate_function): a training step is forward, backward, step")
    bwd_end = max(_span(e)[1] for e in backward) - t0
    fwd = [e for e in inside if e.name == "DistributedDataParallel.forward"]
    fwd_end = _span(fwd[0])[1] - t0 if fwd else min(e.ts for e in backward) - t0
    opt = sum(e.dur for e in inside if e.name.startswith("Optimizer.step#"))
    colls = []
    for k, e in enumerate(launches):
        n = _elements(e)
        if n is None:
            raise _fail(src, f"{st.name}.{e.name}[{k}]", "no tensor shape: record with "
                        "record_shapes=True")
        rec = records[k] if k < len(records) else None
        nbytes = n * _element_bytes(rec)
        if not 0 < nbytes <= MAX_COLLECTIVE_BYTES:
            raise _fail(src, f"{st.name}.{e.name}[{k}]", f"{nbytes} bytes: a collective "
                        f"carries 1 to {MAX_COLLECTIVE_BYTES} here")
        stream = f"stream {rec.args['stream']}" if rec is not None and \
            "stream" in rec.args else str((rec or e).tid)
        colls.append(Collective(KINDS[e.name[6:]], nbytes, round((e.ts - t0) * 1e3),
                                stream[:64]))
    if not colls:
        raise _fail(src, st.name, "no collective in the step (c10d::allreduce_, ...): "
                    "nothing for the network to carry")
    if len(colls) > MAX_BUCKETS:
        raise _fail(src, st.name, f"{len(colls)} collectives: at most {MAX_BUCKETS}")
    end = round(bwd_end * 1e3)
    buckets = tuple(Bucket(c.nbytes, min(c.ready_ns, end), c.kind) for c in colls)
    overlap = Overlap(min(round(fwd_end * 1e3), end), end, buckets, round(opt * 1e3))
    if overlap.problems():
        raise _fail(src, st.name, "; ".join(overlap.problems()))
    info = trace.distributedInfo
    world = info.get("world_size")
    return Recorded(src, st.name, round(st.dur * 1e3), str(info.get("backend", "?"))[:32],
                    world if isinstance(world, int) and not isinstance(world, bool) else 0,
                    tuple(colls), overlap)


def _elements(e: _Event) -> int | None:
    """Elements of a launch's tensors (its first argument: a tensor or a list of them)."""
    dims = e.args.get("Input Dims")
    if not isinstance(dims, list) or not dims:
        return None
    first = dims[0]
    shapes = first if first and isinstance(first[0], list) else [first]
    total = 0
    for shape in shapes:
        if not isinstance(shape, list) or not all(isinstance(d, int) and 0 <= d < 1 << 40
                                                  for d in shape):
            return None
        total += math.prod(shape)
    return total if total < 1 << 40 else None


def _element_bytes(rec: _Event | None) -> int:
    """The element size the backend's record gives (gloo: `Input type`; NCCL: `dtype`);
    4 bytes (fp32 gradients) when it gives none."""
    if rec is None:
        return 4
    t = rec.args.get("dtype") or rec.args.get("Input type")
    if isinstance(t, list):
        t = t[0] if t else ""
    return DTYPE_BYTES.get(str(t).lower()[:32], 4)
