"""Which split of a Transformer trains fastest on a degree-limited optical fabric.

- TopoOpt (seeds/003): strategy and topology are searched together, alternately. Start
  from pure data parallelism and its topology (`Topology.of`: a fibre per model-parallel
  pair, TotientPerms over each data-parallel group); on that topology, time every split;
  take the fastest, build its topology, and time every split again; stop when the best
  split keeps its place (at most `rounds` rounds). Alternation can stop at a local
  optimum, so a last round times each split on its own topology; the better is the
  answer (`found_by`).
- SiP-ML (seeds/000-001): the split is constrained by the degree: a split whose GPUs need
  more lightpaths at once than they have transceivers is left out, with the reason.

Each time is one iteration of the job on the network's flow model (virtual time, compute
in the steps): a prediction, which `oddl run` of the found split then measures on every
network of an experiment.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import asdict, dataclass, field
from typing import Any

import msgspec
from oddl.controller.base.catalog import TRANSFORMERS
from oddl.controller.base.clock import Clock
from oddl.controller.base.collectives import traffic
from oddl.controller.base.config import NetworkSpec
from oddl.controller.base.parallelism import Hybrid
from oddl.controller.stage2.workloads import CollectiveEngine
from oddl.sim.clock import VirtualClockLoop
from oddl.sim.networks.baselines import build_network
from oddl.sim.networks.topoopt import Topology


@dataclass(frozen=True, order=True)
class Split:
    tensor: int
    pipeline: int
    data: int

    def __str__(self) -> str:
        return f"T{self.tensor} P{self.pipeline} D{self.data}"


@dataclass
class Candidate:
    split: Split
    iteration_ms: float | None  # None: it cannot run here (`why_not`)
    why_not: str = ""


@dataclass
class SearchResult:
    network: str
    kind: str
    degree: int
    best: Split
    iteration_ms: float
    topology: dict[str, Any]
    rounds: list[list[Candidate]] = field(default_factory=list)
    found_by: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"network": self.network, "kind": self.kind, "degree": self.degree,
                "best": asdict(self.best), "iteration_ms": self.iteration_ms,
                "topology": self.topology, "found_by": self.found_by,
                "rounds": [[{**asdict(c.split), "iteration_ms": c.iteration_ms,
                             **({"why_not": c.why_not} if c.why_not else {})}
                            for c in r] for r in self.rounds]}


def splits(model: str, ranks: int, cols: int | None = None) -> list[Split]:
    """Every tensor x pipeline x data = ranks the model takes (heads over tensor, layers
    over pipeline); `cols`: a grid's row, which a tensor group must keep to."""
    layers, _h, heads, _s, _v = TRANSFORMERS[model]
    out = []
    for t in range(1, ranks + 1):
        if ranks % t or heads % t or (cols is not None and t > 1 and cols % t):
            continue
        for p in range(1, ranks // t + 1):
            if (ranks // t) % p == 0 and layers % p == 0:
                out.append(Split(t, p, ranks // (t * p)))
    return out


def lightpaths(h: Hybrid, collective: str, degree: int) -> int:
    """The most peers one GPU sends to in an iteration (a SiP-ML GPU holds a lightpath to
    each at once, or retunes between them)."""
    dp = 0 if h.data == 1 else {"ring": 1, "hd": math.ceil(math.log2(h.data)),
                                "totientrings": h.dp_ports(degree)}.get(collective, 1)
    return h.mp_peers() + dp


def iteration_ns(spec: NetworkSpec, h: Hybrid, collective: str, nodes: list[str],
                 line_rate_gbps: float, links: list[tuple[str, str]] | None = None) -> int:
    """One iteration of the split on the network's flow model (its first `h.ranks`
    nodes); `links`: TopoOpt's topology, if not the split's own."""
    loop = VirtualClockLoop()
    try:
        clock = Clock(loop)
        sched = h.schedule(collective, spec.degree)
        ranks = nodes[:h.ranks]
        engine: CollectiveEngine
        net = build_network(spec, clock, nodes, line_rate_gbps,
                            lambda f: engine.on_delivered(f),
                            {(ranks[a], ranks[b]): n for (a, b), n in traffic(sched).items()},
                            links)
        engine = CollectiveEngine(clock, sched, ranks, net.submit)
        done: asyncio.Future[int] = loop.create_future()
        engine.start_iteration(0, 0, done.set_result)
        return loop.run_until_complete(done)
    finally:
        loop.close()


def _topology(spec: NetworkSpec, h: Hybrid | None, nodes: list[str]
              ) -> tuple[list[tuple[str, str]] | None, dict[str, Any]]:
    if spec.kind != "topoopt" or h is None:
        return None, {}
    topo = Topology.of(h, spec.degree)
    return [(nodes[a], nodes[b]) for a, b in topo.links], topo.describe()


def _why_not(spec: NetworkSpec, h: Hybrid, collective: str) -> str:
    """Why the split cannot run on the network ("" if it can)."""
    need = lightpaths(h, collective, spec.degree)
    if spec.kind in ("sipring", "sipocs") and need > spec.degree:
        return f"needs {need} lightpaths a GPU, more than its {spec.degree} transceivers"
    if spec.kind == "topoopt" and (h.mp_peers() > spec.degree or
                                   (h.mp_peers() == spec.degree and h.data > 1)):
        return f"needs {h.mp_peers()} model-parallel ports of {spec.degree} and a " \
               f"data-parallel one"
    return ""


def search(spec: NetworkSpec, base: Hybrid, collective: str, nodes: list[str],
           line_rate_gbps: float, cols: int | None = None, rounds: int = 3) -> SearchResult:
    """The best split of `base`'s model over its ranks on `spec`'s network; on
    TopoOpt, alternating with its topology; on SiP-ML's networks, within its degree.

    Alternation can stop at a local optimum (a split timed on another split's topology
    pays for the fibres it lacks), so on TopoOpt a last round times every split on its
    own topology, and the best of all is the answer (`found_by` says which)."""
    if spec.kind == "topoopt":
        collective = "totientrings"  # TopoOpt's all-reduce on the data-parallel ports
    cands = [msgspec.structs.replace(base, tensor=s.tensor, pipeline=s.pipeline, data=s.data)
             for s in splits(base.model, base.ranks, cols)]
    if not cands:
        raise ValueError(f"{base.model} has no split over {base.ranks} ranks")
    why = {h: _why_not(spec, h, collective) for h in cands}
    if all(why.values()):
        raise ValueError(f"no split of {base.model} over {base.ranks} ranks runs on "
                         f"{spec.name}: {why[cands[0]]}")

    def time_on(h: Hybrid, on: Hybrid | None) -> float:
        links = _topology(spec, on, nodes)[0] if on is not None else None
        return round(iteration_ns(spec, h, collective, nodes, line_rate_gbps, links) / 1e6, 6)

    def timed(on: Hybrid | None) -> list[Candidate]:
        """Every split, on `on`'s topology (None: each on its own, or the network's)."""
        return [Candidate(Split(h.tensor, h.pipeline, h.data), None, why[h]) if why[h] else
                Candidate(Split(h.tensor, h.pipeline, h.data),
                          time_on(h, on if on is not None or spec.kind != "topoopt" else h))
                for h in cands]

    def fastest(row: list[Candidate]) -> tuple[float, Hybrid]:
        return min(((c.iteration_ms, h) for c, h in zip(row, cands, strict=True)
                    if c.iteration_ms is not None), key=lambda x: (x[0], x[1].tensor,
                                                                   x[1].pipeline))

    out: list[list[Candidate]] = []
    found_by = "every split timed"
    if spec.kind != "topoopt":
        out.append(timed(None))
        best = fastest(out[-1])
    else:
        current = next((h for h in cands if h.tensor == h.pipeline == 1 and not why[h]),
                       next(h for h in cands if not why[h]))
        for _ in range(max(1, rounds)):  # the strategy for the topology, then the topology
            out.append(timed(current))
            h = fastest(out[-1])[1]
            if h == current:
                break
            current = h
        alternation = (time_on(current, current), current)
        out.append(timed(None))
        own = fastest(out[-1])
        best, found_by = (own, "each split on its own topology") \
            if own[0] < alternation[0] else (alternation, "alternation")
    h = best[1]
    return SearchResult(spec.name, spec.kind, spec.degree, Split(h.tensor, h.pipeline,
                                                                 h.data), best[0],
                        _topology(spec, h, nodes)[1], out, found_by)
