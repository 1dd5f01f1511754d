"""CASSINI's geometric compatibility of jobs that share a link (seeds 003, the talk).

Each job's bandwidth demand over one iteration is rolled around a unified circle whose
perimeter is the LCM of the jobs' iteration times; a job's demand repeats perimeter / T
times around it. Rotating a job by an angle is delaying it by a time shift. The
compatibility score of a set of rotations is

    score = 1 - sum over angles a of Excess(demand_a) / (|A| * C),
    Excess(d) = max(0, d - C),

where demand_a is the jobs' summed demand at angle a and C the link's capacity: 1.0 when
the rotations let every job have the link it asks for at every instant. The best rotations
are found exhaustively for two or three jobs (up to EXHAUSTIVE combinations), and by
coordinate descent (each job in turn moved to its best shift against the others, until
nothing improves) beyond that.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
from oddl.controller.base.catalog import MODELS

Demand = npt.NDArray[np.float64]  # a job's demand per bin of the circle

MAX_BINS = 7200  # angles the circle is cut into at most (coarser steps beyond)
PER_ITERATION = 200  # bins in the shortest iteration, at most
CHUNK = 1 << 18  # rotations x bins scored in one matrix (2 MB of floats)
EXHAUSTIVE = 50_000  # rotation combinations tried one by one at most


@dataclass(frozen=True)
class Profile:
    """A job on one link: its iteration, and its demand (a fraction of the link) over the
    iteration, as equal time slots from the iteration's start."""

    name: str
    iteration_ms: float
    demand: tuple[float, ...]

    @classmethod
    def on_off(cls, name: str, iteration_ms: float, comm_ms: float, level: float = 1.0,
               slots: int = 1000) -> Profile:
        """Compute, then `comm_ms` of communication at `level` of the link (our iteration
        model: docs/model.md)."""
        if not iteration_ms > 0 or not 0 <= comm_ms <= iteration_ms or not level >= 0:
            raise ValueError(f"{name}: need 0 <= comm_ms <= iteration_ms, iteration_ms > 0 "
                             f"and level >= 0 (got {iteration_ms}, {comm_ms}, {level})")
        on = round(slots * comm_ms / iteration_ms)
        return cls(name, iteration_ms, (0.0,) * (slots - on) + (level,) * on)


@dataclass(frozen=True)
class Compatibility:
    score: float
    rotations_deg: tuple[float, ...]  # per job, on the unified circle
    shifts_ms: tuple[float, ...]  # per job: delay its start by this much
    perimeter_ms: float


def parse_job(spec: str) -> Profile:
    """`NAME:ITER_MS:COMM_MS[:DEMAND]` (`oddl compat --job`): a ValueError names the spec."""
    parts = spec.split(":")
    if len(parts) not in (3, 4) or not parts[0]:
        raise ValueError(f"--job {spec!r}: expected NAME:ITER_MS:COMM_MS[:DEMAND]")
    try:
        nums = [float(x) for x in parts[1:]]
    except ValueError:
        raise ValueError(f"--job {spec!r}: ITER_MS, COMM_MS and DEMAND are numbers") from None
    if not all(math.isfinite(x) for x in nums) or (len(nums) == 3 and not 0 < nums[2] <= 1):
        raise ValueError(f"--job {spec!r}: numbers must be finite, DEMAND in (0, 1]")
    if not 0 < nums[0] <= 1e7:
        raise ValueError(f"--job {spec!r}: ITER_MS must be in (0, 1e7]")
    try:
        return Profile.on_off(parts[0], nums[0], nums[1], nums[2] if len(nums) == 3 else 1.0)
    except ValueError as e:
        raise ValueError(f"--job {spec!r}: {e}") from None


def parse_model_job(spec: str) -> tuple[str, int] | None:
    """`MODEL[:RANKS]` (`oddl compat --job`, ranks default 4): None when the spec names no
    model (then it is a raw profile); a ValueError names the spec."""
    parts = spec.split(":")
    if parts[0] not in MODELS or len(parts) > 2:
        return None
    try:
        ranks = int(parts[1]) if len(parts) == 2 else 4
    except ValueError:
        raise ValueError(f"--job {spec!r}: RANKS is a whole number") from None
    if not 2 <= ranks <= 1024:
        raise ValueError(f"--job {spec!r}: RANKS must be 2 .. 1024 (a job on a link spans "
                         f"both its ends)")
    return parts[0], ranks


def rolled(profiles: list[Profile], c: Compatibility) -> list[Demand]:
    """Each job's demand around the unified circle, rotated as `c` says (for the plot)."""
    _periods, width, out = _circle(profiles)
    return [np.roll(r, round(s / width)) for r, s in zip(out, c.shifts_ms, strict=True)]


def _circle(profiles: list[Profile]) -> tuple[list[int], float, list[Demand]]:
    """Each job's iteration in bins, the bin width (ms), and each job's demand per bin
    around the unified circle. The width starts at 1/PER_ITERATION of the shortest
    iteration and grows until the LCM of the iterations, in bins, is at most MAX_BINS:
    iteration times are rounded to the width (under half a bin each), so that jobs whose
    times have no small common multiple still get a circle."""
    base = min(p.iteration_ms for p in profiles) / PER_ITERATION
    # the longest iteration must fit in MAX_BINS: start there (a 1 us job beside a
    # 10,000 s one would otherwise widen the bin step by step for hours)
    k = max(1, math.ceil(max(p.iteration_ms for p in profiles) / (base * MAX_BINS)))
    while True:
        width = base * k
        periods = [max(1, round(p.iteration_ms / width)) for p in profiles]
        if math.lcm(*periods) <= MAX_BINS:
            break
        k += 1
    bins = math.lcm(*periods)
    out = []
    for p, n in zip(profiles, periods, strict=True):
        idx = (np.arange(n) * len(p.demand)) // n
        out.append(np.tile(np.asarray(p.demand, dtype=float)[idx], bins // n))
    return periods, width, out


def score_of(demand: Demand, capacity: float = 1.0) -> float:
    return 1.0 - float(np.maximum(demand - capacity, 0).sum()) / (len(demand) * capacity)


def compatibility(profiles: list[Profile], capacity: float = 1.0) -> Compatibility:
    if not profiles:
        raise ValueError("no jobs")
    periods, width, rolled = _circle(profiles)
    bins = len(rolled[0])
    # a job's distinct rotations: one iteration's worth of bins (the rest repeat)
    options = [range(1)] + [range(t) for t in periods[1:]]
    best: tuple[float, tuple[int, ...]] = (-math.inf, (0,) * len(profiles))
    if len(profiles) <= 3 and math.prod(len(o) for o in options) <= EXHAUSTIVE:
        # every rotation of the last job at once (a row of the matrix per rotation), in
        # the order itertools.product would visit them: the first best wins, as before
        last, ks = rolled[-1], np.asarray(options[-1])
        rows = max(1, CHUNK // bins)  # rotations per matrix: memory stays bounded
        for head in itertools.product(*options[:-1]):
            base = sum((np.roll(r, k) for r, k in zip(rolled[:-1], head, strict=True)),
                       np.zeros(bins))
            for lo in range(0, len(ks), rows):
                at = (np.arange(bins)[None, :] - ks[lo:lo + rows, None]) % bins
                excess = np.maximum(base[None, :] + last[at] - capacity, 0).sum(axis=1)
                scores = 1.0 - excess / (bins * capacity)
                for i in np.flatnonzero(scores > best[0] + 1e-12):
                    if scores[i] > best[0] + 1e-12:
                        best = (float(scores[i]), (*head, int(ks[lo + i])))
    else:
        shifts = [0] * len(profiles)
        total = sum(rolled, np.zeros_like(rolled[0]))
        improved = True
        while improved:
            improved = False
            for j in range(1, len(profiles)):
                rest = total - np.roll(rolled[j], shifts[j])
                def fit(k: int, j: int = j, rest: Demand = rest) -> tuple[float, int]:
                    return score_of(rest + np.roll(rolled[j], k), capacity), -k
                cand = max(options[j], key=fit)
                if score_of(rest + np.roll(rolled[j], cand), capacity) > \
                        score_of(total, capacity) + 1e-12:
                    shifts[j] = cand
                    total = rest + np.roll(rolled[j], cand)
                    improved = True
        best = (score_of(total, capacity), tuple(shifts))
    s, best_ks = best
    return Compatibility(round(s, 9), tuple(round(360.0 * k / bins, 6) for k in best_ks),
                         tuple(round(k * width, 6) for k in best_ks),
                         bins * width)


@dataclass(frozen=True)
class Shifts:
    """CASSINI over many links: each job's time shift, each shared link's compatibility,
    and the loops of the job-link affinity graph (where one job's shift is asked for
    twice)."""

    shifts_ms: dict[str, float]
    links: dict[str, Compatibility]  # per shared link (by its name)
    loops: list[str]
    disagree: int = 0  # loops whose two shifts differ (the shifts cannot all hold)


def time_shifts(on_link: dict[str, list[Profile]]) -> Shifts:
    """Per-link rotations turned into one time shift per job, walking the affinity graph
    (jobs and the links they share) breadth-first from each component's first job: a job
    reached over link l from job j is shifted by j's shift plus their offset on l, modulo
    its iteration. An edge that reaches a job already shifted closes a loop: the loop is
    reported, with how far the two shifts it asks for disagree, and the first one kept
    (CASSINI drops placements whose affinity graph has a loop)."""
    shared = {link: ps for link, ps in sorted(on_link.items()) if len(ps) >= 2}
    comp = {link: compatibility(ps) for link, ps in shared.items()}
    period = {p.name: p.iteration_ms for ps in on_link.values() for p in ps}
    links_of: dict[str, list[str]] = {}
    for link, ps in shared.items():
        for p in ps:
            links_of.setdefault(p.name, []).append(link)
    offset = {link: {p.name: s for p, s in zip(ps, comp[link].shifts_ms, strict=True)}
              for link, ps in shared.items()}
    shift: dict[str, float] = {}
    parent: dict[str, tuple[str, str] | None] = {}
    loops: list[str] = []
    disagree = 0
    used: set[str] = set()
    for root in sorted(period):
        if root in shift:
            continue
        shift[root], parent[root] = 0.0, None
        queue = [root]
        while queue:
            j = queue.pop(0)
            for link in links_of.get(j, []):
                if link in used:
                    continue
                used.add(link)
                for k in offset[link]:
                    if k == j:
                        continue
                    want = (shift[j] + offset[link][k] - offset[link][j]) % period[k]
                    if k not in shift:
                        shift[k], parent[k] = want, (j, link)
                        queue.append(k)
                        continue
                    gap = abs(want - shift[k]) % period[k]
                    gap = min(gap, period[k] - gap)
                    disagree += gap >= 1e-6
                    loops.append(f"{_cycle(parent, j, link, k)}: shifts for {k} "
                                 f"{'agree' if gap < 1e-6 else f'differ by {gap:.3f} ms'}")
    return Shifts({j: round(s, 6) for j, s in sorted(shift.items())}, comp, loops, disagree)


def _cycle(parent: dict[str, tuple[str, str] | None], j: str, link: str, k: str) -> str:
    """The loop an edge j -link- k closes through the BFS tree: 'loop j -l1- x -l2- k
    -link- j'."""
    def chain(x: str) -> list[tuple[str, str]]:  # (job, the link to its parent) to the root
        out = []
        while (p := parent[x]) is not None:
            out.append((x, p[1]))
            x = p[0]
        return [*out, (x, "")]

    cj, ck = chain(j), chain(k)
    on_k = [x for x, _ in ck]
    i = next(t for t, (x, _) in enumerate(cj) if x in on_k)  # where the two paths meet
    text = j
    for t in range(i):  # up from j to the meeting job
        text += f" -{cj[t][1]}- {cj[t + 1][0]}"
    for x, lk in reversed(ck[:on_k.index(cj[i][0])]):  # down to k
        text += f" -{lk}- {x}"
    return f"loop {text} -{link}- {j}"


def best_placement(candidates: list[dict[str, Profile]],
                   running: dict[str, list[Profile]]) -> int:
    """CASSINI's placement: of the candidate placements of a new job (its profile on each
    link it would use), the one whose shared links are most compatible (the worst link's
    score, highest first; then the fewest shared links; then the first)."""
    if not candidates:
        raise ValueError("no candidate placement")

    def key(i: int) -> tuple[float, int, int]:
        shared = [link for link in candidates[i] if running.get(link)]
        worst = min((compatibility([*running[link], candidates[i][link]]).score
                     for link in shared), default=1.0)
        return (-worst, len(shared), i)

    return min(range(len(candidates)), key=key)


@dataclass(frozen=True)
class Arrival:
    """CASSINI for a job that arrives beside running ones: its start delay, and the worst
    shared link's score with that delay and with none."""

    shift_ms: float
    score: float
    unshifted_score: float
    # the running jobs it re-aligned, and the pause (ms) each one took (CASSINI's agent
    # pauses them where that scores better than the newcomer's delay alone)
    paused_ms: dict[str, float] = field(default_factory=dict)


def shift_against(new: dict[object, Profile],
                  running: dict[object, list[tuple[Profile, float]]]) -> Arrival:
    """The start delay of a job arriving beside running jobs that keep their phase (a
    running job is not paused to make room): of PER_ITERATION delays spread over the new
    job's iteration, the one that maximises the worst score over the links it shares,
    then the mean, then the earliest. `new`: its profile per link; `running`: per link,
    each running job's profile and its phase now (ms since its latest iteration began)."""
    shared = [link for link in new if running.get(link)]
    if not shared:
        return Arrival(0.0, 1.0, 1.0)
    t_new = next(iter(new.values())).iteration_ms
    delays = np.arange(PER_ITERATION) * (t_new / PER_ITERATION)
    scores = np.empty((len(shared), PER_ITERATION))
    for i, link in enumerate(shared):
        others = running[link]
        _periods, width, rolled = _circle([new[link], *(p for p, _ in others)])
        rest = _at_phase(rolled[1:], [phase for _p, phase in others], width)
        for k, d in enumerate(delays):
            scores[i, k] = score_of(rest + np.roll(rolled[0], round(d / width)))
    worst, mean = scores.min(axis=0), scores.mean(axis=0)
    best = max(range(PER_ITERATION), key=lambda k: (round(worst[k], 9), round(mean[k], 9), -k))
    return Arrival(round(float(delays[best]), 6), round(float(worst[best]), 9),
                   round(float(worst[0]), 9))


@dataclass(frozen=True)
class Realignment:
    """CASSINI's re-alignment of the jobs that share links, when one arrives or leaves:
    each running job's pause before its next iteration, the arriving job's start delay
    (ns), and the affinity graph's shifts they realise."""

    pauses_ns: dict[str, int]
    delay_ns: int
    shifts: Shifts


def realign(profiles: dict[str, dict[object, Profile]], began: dict[str, int], now: int,
            joining: str | None = None, candidates: int = PER_ITERATION) -> Realignment:
    """The pauses that put every job's iterations where `time_shifts` wants them: job j's
    next iteration should begin at T0 + shift_j (mod its iteration). A running job's next
    iteration would begin as its current one ends (its profile's iteration after it
    began, or now); it pauses until the next such instant, the arriving job waits for
    its own. Of `candidates` choices of T0 over one iteration, the one with the shortest
    longest pause, then the least pausing in all, is taken."""
    on_link: dict[str, list[Profile]] = {}
    for _job, links in sorted(profiles.items()):
        for link, p in links.items():
            on_link.setdefault(repr(link), []).append(p)
    sh = time_shifts(on_link)
    period = {j: round(next(iter(links.values())).iteration_ms * 1e6)
              for j, links in profiles.items() if links}
    moving = [j for j in sh.shifts_ms if j in period and j != joining and j in began]
    nxt = {j: max(now, began[j] + period[j]) for j in moving}
    ref = joining if joining in period else (moving[0] if moving else None)
    if ref is None:
        return Realignment({}, 0, sh)
    best: tuple[tuple[int, int], dict[str, int], int] | None = None
    for k in range(candidates):
        t0 = now + k * period[ref] // candidates
        pauses = {j: (t0 + round(sh.shifts_ms[j] * 1e6) - nxt[j]) % period[j] for j in moving}
        delay = (t0 + round(sh.shifts_ms.get(joining, 0.0) * 1e6) - now) % period[joining] \
            if joining in period else 0
        key = (max([*pauses.values(), delay]), sum(pauses.values()) + delay)
        if best is None or key < best[0]:
            best = (key, pauses, delay)
    assert best is not None
    return Realignment({j: ns for j, ns in best[1].items() if ns > 0}, best[2], sh)


def on_links(profiles: dict[str, dict[object, Profile]], began: dict[str, int],
             now: int) -> dict[object, list[tuple[Profile, float]]]:
    """Per link, each job's profile on it and its phase now: ms since its latest
    iteration began (`began`, ns)."""
    out: dict[object, list[tuple[Profile, float]]] = {}
    for job, links in profiles.items():
        for link, p in links.items():
            out.setdefault(link, []).append((p, (now - began[job]) / 1e6))
    return out


def _at_phase(rolled: list[Demand], phases_ms: list[float], width: float) -> Demand:
    """The jobs' demand summed around the circle, each rotated back by its phase."""
    return sum((np.roll(r, -round(ph / width)) for r, ph in zip(rolled, phases_ms,
                                                               strict=True)),
               np.zeros(len(rolled[0])))


def phase_score(profiles: dict[str, dict[object, Profile]], began: dict[str, int],
                now: int) -> float:
    """The worst score, over the links two or more of these jobs share, of the jobs as
    they run now, each one's profile rotated to its phase. 1.0 where nothing is shared."""
    worst = 1.0
    for jobs in on_links(profiles, began, now).values():
        if len(jobs) >= 2:
            _periods, width, rolled = _circle([p for p, _ in jobs])
            worst = min(worst, score_of(_at_phase(rolled, [ph for _p, ph in jobs], width)))
    return round(float(worst), 9)
