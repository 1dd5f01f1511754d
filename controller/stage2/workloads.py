"""Training workloads: gradient sizes, compute, iteration counts, the step engine."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from oddl.controller.base.catalog import EMBEDDING_BYTES, MODEL_GMACS, MODELS, TRANSFORMERS
from oddl.controller.base.clock import Clock
from oddl.controller.base.collectives import Schedule, gated
from oddl.controller.base.config import Workload
from oddl.controller.base.messages import Flow
from oddl.controller.base.parallelism import A100_TFLOPS, sequence_flops
from oddl.controller.stage2.invariants import TAG_SHIFT


@dataclass(frozen=True)
class ModelSpec:
    name: str
    params_m: float

    def grad_bytes(self, bytes_per_param: int = 4) -> int:
        return round(self.params_m * 1e6 * bytes_per_param)


def model_spec(name: str) -> ModelSpec:
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    return ModelSpec(name, MODELS[name])


# Table 1's calibration (docs/model.md): 220.8742 ms of compute per iteration of 256
# ResNet-50 images on the paper's GPUs
MS_PER_RESNET50_SAMPLE = 220.8742 / 256


def compute_ms(model: str, batch_per_node: int) -> float:
    """A job's compute per iteration when its config gives none: the Table 1 calibration
    scaled by the model's forward MACs (as experiments/jocn-1024-vgg19.toml derives 132 ms
    for VGG-19 at batch 32); a Transformer's from its FLOPs at one GPU rate, as its
    hybrid-parallel split has it (docs/model.md)."""
    if model in TRANSFORMERS:
        return batch_per_node * sequence_flops(model) / (A100_TFLOPS * 1e9)
    return batch_per_node * MS_PER_RESNET50_SAMPLE * MODEL_GMACS[model] / MODEL_GMACS["resnet50"]


def alltoall_bytes(model: str, batch_per_node: int, ranks: int) -> int:
    """Bytes each rank sends each other per iteration in a model's all-to-all (DLRM: the
    embedding tables spread over the ranks, each rank sends every other the lookups its
    tables did for that rank's batch, forward, and their gradients, backward); 0 for the
    models that only all-reduce."""
    return 2 * math.ceil(batch_per_node * EMBEDDING_BYTES.get(model, 0) / ranks) \
        if ranks > 1 else 0


def iterations_per_epoch(w: Workload, n_nodes: int) -> int:
    return math.ceil(w.dataset_samples / w.samples_per_iteration(n_nodes))


def total_iterations(w: Workload, n_nodes: int) -> int:
    return math.ceil(w.epochs * iterations_per_epoch(w, n_nodes))


def first_flows(schedule: Schedule, ranks: Sequence[str]) -> dict[int, Flow]:
    """A lone job's first iteration as the engine numbers its flows (rank r's k-th flow
    k * n + r, tag 0), by id: what a recorded run's flow ids stand for."""
    out: dict[int, Flow] = {}
    n = len(ranks)
    for r, steps in enumerate(schedule):
        k = 0
        for s, st in enumerate(steps):
            for j, (dst, nbytes) in enumerate(st.sends):
                out[k * n + r] = Flow(k * n + r, ranks[r], ranks[dst], nbytes, 0, st.slot(j, s))
                k += 1
    return out


class CollectiveEngine:
    """Runs iterations: compute, then the schedule's steps, rank by rank.

    A rank's step s+1 starts when every byte it expects in step s has arrived: exactly
    the count-action condition (count received bytes; target: the step's size; action:
    start the next step's transfers), after the step's own compute, if it has any (a
    pipeline's layers between its transfers). An engine drives the ranks its host owns (`local`;
    all of them in process): a node program drives its own rank, and flow ids are unique
    across hosts without a shared counter (rank r numbers its k-th flow k * n + r).
    """

    def __init__(self, clock: Clock, schedule: Schedule, ranks: list[str],
                 submit: Callable[[Flow], None], on_flow_start: Callable[[Flow], None] | None
                 = None, nic_sync: bool = False, local: list[str] | None = None,
                 tag: int = 0) -> None:
        """nic_sync: step completion comes from each O-NIC's count-action engine
        (`module_fired`), not from counting deliveries here."""
        self.clock = clock
        self.schedule = schedule
        self.ranks = ranks
        self.rank_of = {n: i for i, n in enumerate(ranks)}
        self.local = [self.rank_of[n] for n in (ranks if local is None else local)]
        self.submit = submit
        self.on_flow_start = on_flow_start
        self.flows = 0  # started here, all iterations
        self.seq = [0] * len(ranks)
        self.iteration = -1
        self.step: list[int] = [0] * len(ranks)
        self.issued: list[int] = [-1] * len(ranks)
        self.computed: list[int] = [-1] * len(ranks)  # the last step whose compute began
        self.recv: list[list[int]] = []
        self.pending = 0
        self.on_done: Callable[[int], None] | None = None
        self.on_delivered_hook: Callable[[Flow, int], None] | None = None
        self.t_start = 0
        self.t_done = 0  # when the current iteration's part here was done
        self.nic_sync = nic_sync
        self.fired: list[list[bool]] = []
        # what came for the next iteration before this host started it (peers start an
        # iteration when they hear the last rank finish; hearing takes a message)
        self.early: list[Flow] = []
        self.early_fired: list[tuple[int, int]] = []
        self.halted = False  # the job stopped here: no step runs, no flow starts
        self.id_base = tag << TAG_SHIFT  # a job beside others: its flows' ids are its own
        # this iteration's flows delivered here, as (source rank, step, destination rank);
        # the flows a resumed iteration carries, as (rank, step, index in its sends)
        self.got: list[tuple[int, int, int]] = []
        self.carry: frozenset[tuple[int, int, int]] = frozenset()
        # the timeline's phases (`oddl run --trace`): told (rank, phase, t0, t1) as each of
        # a rank's runs of same-named steps, or its compute, ends
        self.on_phase: Callable[[int, str, int, int], None] | None = None
        self._phase: dict[int, tuple[str, int]] = {}

    def start_iteration(self, iteration: int, compute_ns: int,
                        on_done: Callable[[int], None],
                        carry: Iterable[tuple[int, int, int]] = (),
                        t0: int | None = None) -> None:
        """A resumed job's first iteration (`t0`: when it first began): `carry`, the
        flows it delivered before a fault stopped it, count as arrived and are not sent
        again; and the compute goes on as it was (a fault of the network does not stop
        the GPUs): what is left of it from t0, if anything."""
        if gated(self.schedule):  # its steps wait for the compute (DDP's buckets)
            compute_ns = 0
        self.iteration = iteration
        self.on_done = on_done
        for r in self.local:
            self.step[r] = 0
            self.issued[r] = -1
            self.computed[r] = -1
        self.recv = [[0] * len(s) for s in self.schedule]
        self.got.clear()
        self.carry = frozenset(carry)
        if t0 is not None:
            compute_ns = max(0, t0 + compute_ns - self.clock.now_ns())
            local = set(self.local)
            for r, s, j in self.carry:
                st = self.schedule[r][s]
                dst, nbytes = st.sends[j]
                if dst in local:
                    self.recv[dst][st.slot(j, s)] += nbytes
        if self.nic_sync:
            self.fired = [[False] * len(s) for s in self.schedule]
        self.pending = len(self.local)
        self.t_start = self.clock.now_ns() if t0 is None else t0
        early, self.early = self.early, []
        for f in early:
            self.on_delivered(f)
        for r, slot in self.early_fired:
            self.fired[r][slot] = True
        self.early_fired.clear()
        for r in self.local:
            self.clock.call_later_ns(compute_ns, self._run_steps, r)

    def _run_steps(self, r: int) -> None:
        if self.halted:
            return
        steps = self.schedule[r]
        while True:
            s = self.step[r]
            if s >= len(steps):
                if self.on_phase is not None:
                    self._enter(r, "")
                self.pending -= 1
                if self.pending == 0:
                    self.t_done = self.clock.now_ns()
                if self.pending == 0 and self.on_done is not None:
                    self.on_done(self.clock.now_ns())
                return
            if self.issued[r] < s:
                st = steps[s]
                if st.ready_ns and self.clock.now_ns() < self.t_start + st.ready_ns:
                    # a bucket's gradients are still being computed: its all-reduce waits
                    if self.on_phase is not None:
                        self._enter(r, "await-grads")
                    self.clock.call_at_ns(self.t_start + st.ready_ns, self._run_steps, r)
                    return
                if st.compute_ns and self.computed[r] < s and not self._carried(r, s):
                    self.computed[r] = s
                    if self.on_phase is not None:
                        self._enter(r, "compute")
                    self.clock.call_later_ns(st.compute_ns, self._run_steps, r)
                    return
                if self.on_phase is not None:
                    self._enter(r, st.phase)
                self.issued[r] = s
                src = self.ranks[r]
                now = self.clock.now_ns()
                n = len(self.ranks)
                for j, (dst_rank, nbytes) in enumerate(st.sends):
                    if self.carry and (r, s, j) in self.carry:
                        continue  # delivered before the job was stopped
                    f = Flow(self.id_base | (self.seq[r] * n + r), src, self.ranks[dst_rank],
                             nbytes, self.iteration, st.slot(j, s), 0, now)
                    self.seq[r] += 1
                    self.flows += 1
                    if self.on_flow_start is not None:
                        self.on_flow_start(f)
                    self.submit(f)
            if not (self.fired[r][s] if self.nic_sync else
                    self.recv[r][s] >= steps[s].recv_bytes):
                return  # count not reached: wait for the O-NIC (or on_delivered)
            self.step[r] = s + 1

    def _enter(self, r: int, phase: str) -> None:
        """Rank r goes into `phase` ("": it is done): the one it leaves is told."""
        now = self.clock.now_ns()
        was = self._phase.get(r)
        if was is not None and was[0] == phase:
            return
        if was is not None and self.on_phase is not None and now > was[1]:
            self.on_phase(r, was[0], was[1], now)
        if phase:
            self._phase[r] = (phase, now)
        else:
            self._phase.pop(r, None)

    def _carried(self, r: int, s: int) -> bool:
        """Step s of rank r was done before the job stopped (a send of it was carried):
        its compute is not done again."""
        return bool(self.carry) and any((r, s, j) in self.carry
                                        for j in range(len(self.schedule[r][s].sends)))

    def on_delivered(self, flow: Flow) -> None:
        if self.halted:
            return
        if flow.iteration != self.iteration:  # a peer that started the next iteration first
            self.early.append(flow)
            return
        r = self.rank_of[flow.dst]
        s = flow.step
        self.got.append((self.rank_of[flow.src], s, r))
        if self.on_delivered_hook is not None:
            self.on_delivered_hook(flow, self.clock.now_ns())
        got = self.recv[r][s] + flow.nbytes
        self.recv[r][s] = got
        if self.nic_sync:
            return
        if s == self.step[r] and self.issued[r] == s and got >= self.schedule[r][s].recv_bytes:
            self.step[r] = s + 1
            self._run_steps(r)

    def carry_of(self, iteration: int) -> tuple[int, list[tuple[int, int, int]]] | None:
        """What a job stopped in `iteration` may carry into its resumption: when the
        iteration began, and its flows delivered here so far; None if this engine is not
        in that iteration. The iteration after the one it is in counts as its once its own
        part of that one is done (its report made; the peers that heard every report have
        gone on): what has come early of it, from when it was done here."""
        if iteration == self.iteration + 1 and self.iteration >= 0 and self.pending == 0:
            early = [(self.rank_of[f.src], f.step, self.rank_of[f.dst]) for f in self.early
                     if f.iteration == iteration]
            return self.t_done, self._senders(set(), early)
        if self.iteration != iteration:
            return None
        local = set(self.local)
        # what was carried in and reached a rank here, and what reached one since
        got = {(r, s, j) for r, s, j in self.carry if self.schedule[r][s].sends[j][0] in local}
        return self.t_start, self._senders(got, self.got)

    def _senders(self, got: set[tuple[int, int, int]], arrived: list[tuple[int, int, int]]
                 ) -> list[tuple[int, int, int]]:
        """`got` and the flows `arrived` (sender rank, slot, receiver rank) as the senders'
        (rank, step, index in the step's sends)."""
        sent_at: dict[int, dict[tuple[int, int], list[tuple[int, int]]]] = {}
        for r, slot, dst in arrived:
            # the sender's step and index in its sends: the first to that peer, counting in
            # that slot, not counted yet
            index = sent_at.get(r)
            if index is None:
                index = sent_at[r] = {}
                for s, st in enumerate(self.schedule[r]):
                    for j, (d, _b) in enumerate(st.sends):
                        index.setdefault((st.slot(j, s), d), []).append((s, j))
            sj = next((sj for sj in index.get((slot, dst), ()) if (r, *sj) not in got), None)
            if sj is not None:
                got.add((r, *sj))
        return sorted(got)

    def module_fired(self, node: str, slot: int) -> None:
        """The O-NIC of `node` says: every byte of step `slot` has arrived."""
        if self.halted:
            return
        r = self.rank_of[node]
        if self.iteration < 0 or self.step[r] >= len(self.schedule[r]):
            # not begun here, or done here: the next iteration's step
            self.early_fired.append((r, slot))
            return
        if self.recv[r][slot] != self.schedule[r][slot].recv_bytes:
            raise RuntimeError(f"{node}: count-action fired for step {slot} with "
                               f"{self.recv[r][slot]} of {self.schedule[r][slot].recv_bytes} "
                               f"bytes delivered")
        self.fired[r][slot] = True
        if slot == self.step[r] and self.issued[r] == slot:
            self.step[r] = slot + 1
            self._run_steps(r)
