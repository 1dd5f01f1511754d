"""All-reduce collectives as per-rank step lists.

Each rank runs its steps in order; a rank's step s+1 starts when every byte it expects in
step s has arrived (the count-action condition). Byte counts are exact integers: chunks
split S as evenly as possible, so every byte of the gradient is accounted for.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec
from oddl.controller.base.ddp import Overlap
from oddl.controller.base.jumps import totient_jumps


class Step(msgspec.Struct, frozen=True, gc=False):
    """One step of a rank: compute for `compute_ns`, start `sends`, then wait until
    `recv_bytes` have arrived for this step. A flow counts at the receiver's step `at[j]`
    (its header's slot); none given, at the sender's own step index, as every collective
    has it (its ranks move in lockstep). A pipeline's stages do not: 1F1B sends an
    activation forward before the gradient it waits for comes back.

    A frozen msgspec struct, out of the collector's sight (it holds ints and tuples of
    them, no cycle): a 4,096-node halving-doubling makes 98,304 of them, at a seventh
    of a frozen dataclass's cost each."""

    sends: tuple[tuple[int, int], ...]  # (dst rank, bytes)
    recv_bytes: int  # bytes this rank must receive before its next step
    phase: str
    compute_ns: int = 0
    at: tuple[int, ...] = ()  # the receiver's step each send counts in (default: this one)
    # not before this long after the iteration starts (a DDP bucket's all-reduce waits for
    # its last gradient while backward runs on: controller/base/ddp.py); 0: no wait
    ready_ns: int = 0

    def slot(self, j: int, s: int) -> int:
        """The receiver's step send j counts in, this being step s of its sender."""
        return self.at[j] if self.at else s


Schedule = list[list[Step]]  # schedule[rank] = that rank's steps


def _split(total: int, parts: int) -> list[int]:
    q, r = divmod(total, parts)
    return [q + (1 if i < r else 0) for i in range(parts)]


def ring(n: int, size: int, members: list[int] | None = None, phase: str = "ring",
         sched: Schedule | None = None, base: int | None = None) -> Schedule:
    """Ring all-reduce: reduce-scatter then all-gather, 2(n-1) steps of S/n."""
    ranks = members if members is not None else list(range(n))
    k = len(ranks)
    sched = sched if sched is not None else [[] for _ in range(n)]
    if k == 1:
        return sched
    chunks = _split(size, k)
    names = (f"{phase}-rs", f"{phase}-ag")
    # steps are immutable values: one object per distinct step (a 1,024-rank ring has
    # 2 M steps but a few thousand distinct ones)
    seen: dict[tuple[int, int, int, str], Step] = {}
    for s in range(2 * (k - 1)):
        name = names[s >= k - 1]
        for i, r in enumerate(ranks):
            key = (ranks[(i + 1) % k], chunks[(i - s) % k], chunks[(i - 1 - s) % k], name)
            st = seen.get(key)
            if st is None:
                st = seen[key] = Step(((key[0], key[1]),), key[2], name)
            sched[r].append(st)
    return sched


def halving_doubling(n: int, size: int) -> Schedule:
    """Recursive halving reduce-scatter, then recursive doubling all-gather (the paper's HD).

    For n not a power of two (a job shrunk round a dead rank), the n - p ranks over the
    largest power of two p first hand their whole gradient to a partner among the first
    n - p (a fold), the p run HD, and the partners hand the result back (an unfold): the
    usual reduction, 2 S more bytes on those pairs. Every rank has the same number of
    steps (empty ones where it waits), since a flow counts at its sender's step index."""
    if n < 1:
        raise ValueError(f"halving-doubling needs at least one rank, got {n}")
    p = 1 << (n.bit_length() - 1)
    if p == n:
        return _hd(n, size)
    core = _hd(p, size)
    idle = [Step((), 0, "hd-wait")] * len(core[0])
    sched: Schedule = []
    for r in range(p):
        folded = r < n - p
        sched.append([Step((), size if folded else 0, "hd-fold"), *core[r],
                      Step(((p + r, size),) if folded else (), 0, "hd-unfold")])
    for e in range(p, n):
        sched.append([Step(((e - p, size),), 0, "hd-fold"), *idle,
                      Step((), size, "hd-unfold")])
    return sched


def _hd(n: int, size: int) -> Schedule:
    logn = n.bit_length() - 1
    sched: Schedule = [[] for _ in range(n)]
    rs_phase = [f"hd-rs{k}" for k in range(logn)]  # (one string each, for every rank)
    ag_phase = [f"hd-ag{k}" for k in range(logn)]
    for r in range(n):
        lo, hi = 0, size  # the segment this rank is responsible for, [lo, hi)
        rs: list[Step] = []
        segs: list[tuple[int, int, int]] = []
        for k in range(logn):
            partner = r ^ (1 << k)
            mid = lo + (hi - lo) // 2
            keep_low = not (r >> k) & 1
            keep = (lo, mid) if keep_low else (mid, hi)
            give = (mid, hi) if keep_low else (lo, mid)
            rs.append(Step(((partner, give[1] - give[0]),), keep[1] - keep[0], rs_phase[k]))
            segs.append((partner, give[1] - give[0], keep[1] - keep[0]))
            lo, hi = keep
        ag = [Step(((p, kept),), gave, ag_phase[k])
              for k, (p, gave, kept) in reversed(list(enumerate(segs)))]
        sched[r] = rs + ag
    return sched


def hierarchical_2d(rows: int, cols: int, size: int) -> Schedule:
    """Row reduce-scatter, column all-reduce of each row-shard, row all-gather (ring based)."""
    n = rows * cols
    sched: Schedule = [[] for _ in range(n)]
    shard = _split(size, cols)
    for r in range(rows):
        members = [r * cols + c for c in range(cols)]
        tmp = ring(n, size, members, "row", None)
        for m in members:
            sched[m] += tmp[m][: cols - 1]  # reduce-scatter half
    for c in range(cols):
        members = [r * cols + c for r in range(rows)]
        # after the row reduce-scatter rank (r, c) owns shard (c + 1) % cols
        ring(n, shard[(c + 1) % cols], members, "col", sched)
    for r in range(rows):
        members = [r * cols + c for c in range(cols)]
        tmp = ring(n, size, members, "row", None)
        for m in members:
            sched[m] += tmp[m][cols - 1:]  # all-gather half
    return sched


def totient_rings(n: int, size: int, jumps: list[int]) -> Schedule:
    """TopoOpt's all-reduce: one ring per TotientPerms jump (rank i sends to i + j), each
    ring reducing its own 1/d of the gradient, all in lockstep: 2(n-1) steps, d sends each,
    so a degree-d direct-connect topology uses all d links, each ring one hop per step."""
    if not jumps:
        raise ValueError("totient rings need at least one jump")
    parts = _split(size, len(jumps))
    sched: Schedule = [[] for _ in range(n)]
    if n == 1:
        return sched
    per_ring = []
    for j, part in zip(jumps, parts, strict=True):
        order = [(k * j) % n for k in range(n)]  # the ring's rank order (gcd(j, n) = 1)
        per_ring.append(ring(n, part, order, f"ring+{j}"))
    for r in range(n):
        for s in range(2 * (n - 1)):
            steps = [sr[r][s] for sr in per_ring]
            sched[r].append(Step(tuple(x for st in steps for x in st.sends),
                                 sum(st.recv_bytes for st in steps), f"totient-{s}"))
    return sched


def in_network(n: int, size: int) -> Schedule:
    """OptINC's all-reduce: one step, every rank streams its whole gradient into the fabric
    and receives the mean. The fabric is not a rank, so the step is written as a send to
    the next rank; only a network that averages in flight (kind optinc) runs it."""
    if n == 1:
        return [[]]
    return [[Step((((r + 1) % n, size),), size, "optinc")] for r in range(n)]


def optinc_levels(servers: int, ports: int) -> list[int]:
    """OptINC's units: [N] when one unit of `ports` serves all N servers; [group size,
    groups] for the two-level cascade of seeds/004 Fig. 5."""
    if servers < 1 or ports < 2:
        raise ValueError(f"{servers} servers, {ports} ports per unit")
    if servers <= ports:
        return [servers]
    if servers % ports or servers // ports > ports:
        raise ValueError(f"{servers} servers: a two-level OptINC of {ports}-port units "
                         f"serves a multiple of {ports} up to {ports * ports}")
    return [ports, servers // ports]


def build(kind: str, n: int, size: int, rows: int, cols: int, degree: int = 4,
          bidirectional: bool = False) -> Schedule:
    if kind == "ring":
        return ring(n, size)
    if kind == "totientrings":
        return totient_rings(n, size, totient_jumps(n, degree, bidirectional=bidirectional))
    if kind == "hd":
        return halving_doubling(n, size)
    if kind == "optinc":
        return in_network(n, size)
    if kind == "hier2d":
        if rows * cols != n:
            raise ValueError(f"hier2d needs the job on the whole {rows} x {cols} grid")
        return hierarchical_2d(rows, cols, size)
    raise ValueError(f"unknown collective {kind!r}")


def flows_bound(kind: str, n: int, degree: int = 4) -> int:
    """At most how many flows one all-reduce of `kind` over n ranks starts: what a
    schedule of many (a DDP job's buckets) may cost is bounded before it is built."""
    if kind == "hd":
        return 2 * n * (max(n - 1, 1).bit_length() + 1)
    if kind == "optinc":
        return n
    return 2 * n * max(n - 1, 0) * (max(degree, 1) if kind == "totientrings" else 1)


def bucketed(overlap: Overlap, build_one: Callable[[int], Schedule], n: int) -> Schedule:
    """DDP's iteration (controller/base/ddp.py): each bucket's all-reduce (`build_one` of
    its bytes; a recorded step's other kinds by ring), one after another, the first step
    of each waiting for the bucket's ready time; then an empty step that waits for
    backward's end, so a rank is never done before its compute, and the optimiser's."""
    sched: Schedule = [[] for _ in range(n)]
    for b in overlap.buckets:
        for r, steps in enumerate(_collective(b.kind, b.nbytes, n, build_one)):
            if steps:
                sched[r].append(msgspec.structs.replace(steps[0], ready_ns=b.ready_ns))
                sched[r] += steps[1:]
    end = Step((), 0, "backward", ready_ns=overlap.compute_ns)
    tail = [end, Step((), 0, "optimizer", overlap.optimizer_ns)] if overlap.optimizer_ns \
        else [end]
    for steps in sched:
        steps += tail
    return sched


def gated(schedule: Schedule) -> bool:
    """Its steps wait for the compute themselves (`bucketed`'s: each rank's last step
    waits for backward's end), so no compute comes before its first step."""
    return bool(schedule and schedule[0] and schedule[0][-1].ready_ns)


def _collective(kind: str, nbytes: int, n: int, all_reduce: Callable[[int], Schedule]
                ) -> Schedule:
    """One collective of `nbytes` per rank (the launch's tensor) over n ranks."""
    if kind == "all_reduce" or n < 2:
        return all_reduce(nbytes) if n > 1 else [[] for _ in range(n)]
    if kind in ("reduce_scatter", "all_gather"):  # ring's halves; a gather's input a shard
        whole = ring(n, nbytes * (n if kind == "all_gather" else 1))
        return [steps[:n - 1] if kind == "reduce_scatter" else steps[n - 1:]
                for steps in whole]
    if kind == "all_to_all":
        per = _split(nbytes, n)
        return [[Step(tuple((d, per[d]) for d in range(n) if d != r),
                      sum(per[r] for _ in range(n - 1)), "all_to_all")] for r in range(n)]
    # broadcast from rank 0: every other rank is sent the tensor
    return [[Step(tuple((d, nbytes) for d in range(1, n)) if r == 0 else (),
                  0 if r == 0 else nbytes, "broadcast")] for r in range(n)]


def with_alltoall(sched: Schedule, per_pair: int) -> Schedule:
    """An all-to-all step before the all-reduce: every rank sends `per_pair` bytes to
    every other (DLRM's embedding exchange, forward and backward together)."""
    n = len(sched)
    if per_pair <= 0 or n < 2:
        return sched
    return [[Step(tuple((d, per_pair) for d in range(n) if d != r), per_pair * (n - 1),
                  "alltoall"), *steps] for r, steps in enumerate(sched)]


def traffic(sched: Schedule) -> dict[tuple[int, int], int]:
    """Bytes each (sender, receiver) rank pair exchanges an iteration: the job's traffic
    matrix, which placements follow (SiP-ML's ring order, TopoOpt's direct links)."""
    out: dict[tuple[int, int], int] = {}
    for r, steps in enumerate(sched):
        for st in steps:
            for dst, b in st.sends:
                out[(r, dst)] = out.get((r, dst), 0) + b
    return out


def check_balanced(sched: Schedule) -> None:
    """Every byte a rank expects in each of its steps is sent to it, for that step, by
    someone (a schedule sanity check)."""
    sent: dict[tuple[int, int], int] = {}
    for steps in sched:
        for s, st in enumerate(steps):
            for j, (dst, b) in enumerate(st.sends):
                key = (dst, st.slot(j, s))
                sent[key] = sent.get(key, 0) + b
    for r, steps in enumerate(sched):
        for s, st in enumerate(steps):
            got = sent.pop((r, s), 0)
            if got != st.recv_bytes:
                raise AssertionError(f"rank {r} step {s} expects {st.recv_bytes} bytes but is "
                                     f"sent {got}")
    if sent:
        (r, s), b = next(iter(sent.items()))
        raise AssertionError(f"rank {r} is sent {b} bytes for step {s}, which it does not have")
