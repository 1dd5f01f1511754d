"""Hybrid-parallel Transformer training as per-rank steps: tensor, pipeline, data.

Megatron-LM's layout (Shoeybi et al. 2019; Narayanan et al., SC'21): a model of `layers`
Transformer layers is cut into `pipeline` stages of consecutive layers; each stage's
layers are split across `tensor` ranks, which all-reduce the layer's activations twice
forward (after attention, after the MLP) and twice backward; the whole is replicated
`data` times, and each rank all-reduces its share of the gradient with the ranks holding
the same share in the other replicas. Ranks are numbered tensor first, then stage, then
replica (rank = (d * pipeline + p) * tensor + t), so a tensor group is `tensor`
consecutive ranks: on a grid filled row by row, one WSS row when `tensor` divides the row.

Each iteration runs `micro_batches` micro-batches of `micro_batch_size` sequences through
the stages on the 1F1B schedule (PipeDream-Flush, Narayanan et al.): stage p first runs
min(P - p - 1, M) forwards, then alternates one forward and one backward, then drains its
backwards. A stage's forward waits for its input activation, its backward for the gradient
from the next stage; both are flows (b s h elements each way between neighbouring stages,
one per tensor rank). A flow counts at the receiver's step (`Step.at`): 1F1B sends an
activation on before the gradient it waits for comes back, so the stages' steps do not
move in lockstep as a collective's do.

Compute comes from the FLOPs, not from a calibration: a layer's forward is
24 b s h^2 + 4 b s^2 h FLOPs (Narayanan et al., appendix: attention 8 b s h^2 + 4 b s^2 h,
the MLP 16 b s h^2), split over the tensor group, its backward twice that, and the last
stage's logits 2 b s h V, at one GPU rate (docs/model.md). Left out, and said there: the
embedding's own all-reduce and the first and last stages' tied-embedding all-reduce, the
optimizer step, and activation recomputation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated

import msgspec
from oddl.controller.base.catalog import TRANSFORMERS
from oddl.controller.base.collectives import Schedule, Step, build

# NVIDIA A100's dense BF16 tensor-core peak (A100 datasheet); Megatron-LM sustains about
# half of it end to end (163 TFLOP/s, Narayanan et al. SC'21): a workload may say so
A100_TFLOPS = 312.0
ACTIVATION_BYTES = 2  # fp16 / bf16 activations and their gradients
MAX_ITERATION_COMPUTE_S = 86_400.0  # a day: beyond, a rate was given in the wrong unit


def sequence_flops(model: str) -> float:
    """Training FLOPs of one sequence: three times the forward (backward is twice it)."""
    L, h, _a, s, V = TRANSFORMERS[model]
    return 3 * (L * (24 * s * h * h + 4 * s * s * h) + 2 * s * h * V)


Pos = Annotated[int, msgspec.Meta(ge=1, le=1 << 16)]


class Hybrid(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A hybrid-parallel job's split, as the controller hands it to the nodes: each node
    builds the same schedule from it (and the job's data-parallel collective)."""

    model: Annotated[str, msgspec.Meta(max_length=32)]
    tensor: Pos
    pipeline: Pos
    data: Pos
    micro_batches: Pos
    micro_batch_size: Pos
    gpu_tflops: Annotated[float, msgspec.Meta(gt=0, le=1e6)]
    bytes_per_param: Annotated[int, msgspec.Meta(ge=1, le=16)] = 4

    @property
    def ranks(self) -> int:
        return self.tensor * self.pipeline * self.data

    def rank(self, d: int, p: int, t: int) -> int:
        return (d * self.pipeline + p) * self.tensor + t

    def groups(self) -> dict[str, list[list[int]]]:
        """Its tensor groups, pipelines and data-parallel groups, as lists of ranks."""
        T, P, D = self.tensor, self.pipeline, self.data
        return {"tensor": [[self.rank(d, p, t) for t in range(T)]
                           for d in range(D) for p in range(P)],
                "pipeline": [[self.rank(d, p, t) for p in range(P)]
                             for d in range(D) for t in range(T)],
                "data": [[self.rank(d, p, t) for d in range(D)]
                         for p in range(P) for t in range(T)]}

    def problems(self) -> list[tuple[str, str]]:
        """(field, why) for a split the model cannot take; [] if it can."""
        if self.model not in TRANSFORMERS:
            return [("model", f"{self.model!r} is not a Transformer; hybrid parallelism "
                              f"takes one of {', '.join(TRANSFORMERS)}")]
        L, _h, heads, _s, _V = TRANSFORMERS[self.model]
        out = []
        if heads % self.tensor:
            out.append(("tensor", f"{self.model}'s {heads} attention heads do not split "
                                  f"over {self.tensor} tensor ranks"))
        if L % self.pipeline:
            out.append(("pipeline", f"{self.model}'s {L} layers do not split into "
                                    f"{self.pipeline} equal stages"))
        secs = self.rank_compute_s()
        if not secs <= MAX_ITERATION_COMPUTE_S:  # inf and nan too
            out.append(("gpu_tflops", f"at {self.gpu_tflops:g} TFLOP/s a rank computes for "
                                      f"{secs:.3g} s an iteration, more than a day: "
                                      f"give the rate in TFLOP/s (an A100: {A100_TFLOPS:g})"))
        return out

    def rank_compute_s(self) -> float:
        """About how long a rank computes an iteration: its share of the replica's
        micro-batches' FLOPs, at gpu_tflops (what bounds the figures before they are
        built: ns counters, and a silence the watch must not take for a stall)."""
        flops = sequence_flops(self.model) * self.micro_batches * self.micro_batch_size
        return flops / (self.tensor * self.pipeline) / (self.gpu_tflops * 1e12)

    def steps_per_rank(self) -> int:
        """An upper bound on a rank's steps an iteration (its schedule's length): what a
        split may cost to build and to run is bounded before it is built."""
        L = TRANSFORMERS[self.model][0] if self.model in TRANSFORMERS else 0
        ring = 2 * (self.tensor - 1) if self.tensor > 1 else 1
        return 2 * self.micro_batches * (4 * ring * L // self.pipeline + 3) + \
            2 * self.data + 2 * math.ceil(math.log2(self.data)) + 2

    def stage_params(self, p: int) -> int:
        """Parameters one tensor rank of stage p holds (and all-reduces over the data
        group): its layers' share, and the embedding on the first stage and the tied
        output embedding on the last."""
        L, h, _a, s, V = TRANSFORMERS[self.model]
        n = L // self.pipeline * (12 * h * h + 13 * h)
        if p == 0:
            n += (V + s) * h
        if p == self.pipeline - 1 and self.pipeline > 1:
            n += V * h
        return math.ceil(n / self.tensor)

    def mp_peers(self) -> int:
        """The most ranks one rank sends model-parallel traffic to: its tensor ring's next,
        and its pipeline neighbours (one at either end of the pipeline, two between)."""
        return (self.tensor > 1) + min(self.pipeline - 1, 2)

    def dp_ports(self, degree: int) -> int:
        """A degree-`degree` node's ports left for the data-parallel all-reduce once each
        model-parallel peer has its own (TopoOpt's split; TotientPerms' jumps)."""
        return max(1, degree - self.mp_peers())

    def schedule(self, dp_collective: str, degree: int = 4) -> Schedule:
        return hybrid_schedule(self, dp_collective, degree)


@dataclass
class _Op:
    """A stage's step before its ranks are known: `peer` +-1 is the neighbouring stage
    (same replica, same tensor rank), 0 the next rank of the tensor ring."""

    phase: str
    compute_ns: int = 0
    ring: int = -1  # the step of a tensor-ring all-reduce of `nbytes` (-1: none)
    nbytes: int = 0
    peer: int = 0  # a pipeline send to (+1 / -1), or a receive from, the neighbouring stage
    key: tuple[str, int] | None = None  # what a pipeline transfer carries: (F|B, micro-batch)


def _stage_ops(h: Hybrid, p: int) -> list[_Op]:
    """Stage p's steps for one iteration on 1F1B, without the data-parallel all-reduce."""
    L, hid, _a, s, V = TRANSFORMERS[h.model]
    T, P, M, b = h.tensor, h.pipeline, h.micro_batches, h.micro_batch_size
    ns_per_flop = 1e9 / (h.gpu_tflops * 1e12)
    act = b * s * hid * ACTIVATION_BYTES  # a layer's activations, and their gradient
    attn = (8 * b * s * hid * hid + 4 * b * s * s * hid) / T
    mlp = 16 * b * s * hid * hid / T
    head = 2 * b * s * hid * V / T if p == P - 1 else 0.0
    layers = L // P

    def sublayer(ops: list[_Op], flops: float, name: str) -> None:
        ns = round(flops * ns_per_flop)
        if T == 1:
            ops.append(_Op(name, ns))
            return
        for k in range(2 * (T - 1)):
            ops.append(_Op(f"tp-{name}", ns if k == 0 else 0, k, act))

    def forward(ops: list[_Op], m: int) -> None:
        if p > 0:
            ops.append(_Op("pp-recv-act", nbytes=act, peer=-1, key=("F", m)))
        for _ in range(layers):
            sublayer(ops, attn, "fwd-attn")
            sublayer(ops, mlp, "fwd-mlp")
        if head:
            ops.append(_Op("fwd-logits", round(head * ns_per_flop)))
        if p < P - 1:
            ops.append(_Op("pp-send-act", peer=+1, nbytes=act, key=("F", m)))

    def backward(ops: list[_Op], m: int) -> None:
        if p < P - 1:
            ops.append(_Op("pp-recv-grad", nbytes=act, peer=+1, key=("B", m)))
        if head:
            ops.append(_Op("bwd-logits", round(2 * head * ns_per_flop)))
        for _ in range(layers):
            sublayer(ops, 2 * mlp, "bwd-mlp")
            sublayer(ops, 2 * attn, "bwd-attn")
        if p > 0:
            ops.append(_Op("pp-send-grad", peer=-1, nbytes=act, key=("B", m)))

    ops: list[_Op] = []
    warm = min(P - p - 1, M)
    for m in range(warm):
        forward(ops, m)
    for i in range(M - warm):
        forward(ops, warm + i)
        backward(ops, i)
    for m in range(M - warm, M):
        backward(ops, m)
    return ops


def hybrid_schedule(h: Hybrid, dp_collective: str, degree: int = 4) -> Schedule:
    """Every rank's steps for one iteration: its stage's 1F1B micro-batches (tensor-ring
    all-reduces, pipeline transfers, compute between), then the data-parallel all-reduce
    of its share of the gradient (`dp_collective` over the `data` replicas; TotientPerms'
    rings on the ports a degree-`degree` node has left, `dp_ports`)."""
    problems = h.problems()
    if problems:
        raise ValueError("; ".join(f"{f}: {why}" for f, why in problems))
    T, P, D = h.tensor, h.pipeline, h.data
    stages = [_stage_ops(h, p) for p in range(P)]
    # where each stage receives each transfer: the sender's flow counts there
    recv_at: dict[tuple[int, str, int], int] = {}
    for p, ops in enumerate(stages):
        for i, op in enumerate(ops):
            if op.key is not None and op.phase.startswith("pp-recv"):
                recv_at[(p, *op.key)] = i
    sched: Schedule = [[] for _ in range(h.ranks)]
    memo: dict[tuple[object, ...], Step] = {}  # one object per distinct step

    def step(*key: object) -> Step:
        st = memo.get(key)
        if st is None:
            sends, recv, phase, ns, at = key
            # (type: ignore below: the memo's key is the step's fields)
            st = memo[key] = Step(sends, recv, phase, ns, at)  # type: ignore[arg-type]
        return st

    chunks = {op.nbytes: [op.nbytes // T + (1 if i < op.nbytes % T else 0) for i in range(T)]
              for ops in stages for op in ops if op.ring >= 0}
    for d in range(D):
        for p, ops in enumerate(stages):
            for t in range(T):
                r = h.rank(d, p, t)
                out = sched[r]
                for op in ops:
                    if op.ring >= 0:  # as collectives.ring: rank t sends chunk t - k
                        c = chunks[op.nbytes]
                        out.append(step(((h.rank(d, p, (t + 1) % T), c[(t - op.ring) % T]),),
                                        c[(t - 1 - op.ring) % T], op.phase, op.compute_ns, ()))
                    elif op.key is not None and op.phase.startswith("pp-send"):
                        q = p + op.peer
                        out.append(step(((h.rank(d, q, t), op.nbytes),), 0, op.phase, 0,
                                        (recv_at[(q, *op.key)],)))
                    elif op.key is not None:  # a pipeline receive
                        out.append(step((), op.nbytes, op.phase, 0, ()))
                    else:
                        out.append(step((), 0, op.phase, op.compute_ns, ()))
    for p in range(P if D > 1 else 0):
        grads = build(dp_collective, D, h.stage_params(p) * h.bytes_per_param, 1, D,
                      h.dp_ports(degree))
        for t in range(T):
            members = [h.rank(d, p, t) for d in range(D)]
            for d, r in enumerate(members):
                for st in grads[d]:
                    sched[r].append(step(tuple((members[x], b) for x, b in st.sends),
                                         st.recv_bytes, f"dp-{st.phase}", 0, ()))
    return sched
