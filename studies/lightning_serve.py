"""Lightning's serve time and energy against an A100, an A100X and Brainwave, by
Lightning's own setup (Zhong et al., SIGCOMM 2023, section 9; its public simulator,
lightning-lts `simulation/`), reproduced here from what that setup states:

- the models and their layers as vector-vector products (VVPs): AlexNet, ResNet-18,
  VGG-16, VGG-19, BERT-Large, GPT-2 XL and DLRM, each a DAG of layers (BERT's and GPT-2's
  attention heads in parallel); a layer whose vectors are shorter than the granularity
  (2,048) is packed into VVPs of 2,048 multiplies;
- requests in a random order of the seven models, arriving at the NIC with exponential
  gaps of mean (the model's input bits / the line rate), 60 Mb/s; a run ends when its
  first 100 requests are done, and a model's serve time is the mean over every request
  done by then (arrival to its last layer's end), in ten runs;
- each processor: cores, clock, and a datapath latency a request pays before its first
  layer (the A100's measured per model; Lightning's 115 ns a layer; none for the A100X,
  a DPU-attached A100, or Brainwave); a layer's VVPs start when its inputs are done and
  go to the cores round robin, each VVP taking its length in cycles on its core, after
  what that core already holds (the simulator's preemptive mode, which its runs use);
- energy: a model's multiplies (after packing; Lightning's at granularity 1, on 1,024
  cores) x power / cores / clock: Lightning 91.875 W, A100 250 W, A100X 300 W,
  Brainwave 125 W;
- the published ratios are the largest over the models (its tables' "Max" row).

Only facts are taken from the release (its shapes, parameters and rules); the code is
ours. Our arrivals are drawn by our own seeded generator, or read from the release's own
ten traces (`simulation/sim_scheds/mixed_sched_0.06_Gbps_N.pkl`: lists of (model, arrival
ns) tuples) by an unpickler that refuses every global (`read_release_trace`): a file we
read is data.
"""

from __future__ import annotations

import functools
import heapq
import io
import math
import pickle
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

GRANULARITY = 2048  # run.sh: --gran=2048
LINE_RATE_GBPS = 0.06  # run.sh: 60 Mb/s
REQUESTS = 100  # run.sh: --last_req=100
TRIALS = 10  # run.sh: pkl 1..10
ORDER = 5000  # make_order.py: requests in an order
PUBLISHED = {"serve_time_ratio": {"a100": 337.0, "a100x": 329.0, "brainwave": 42.0},
             "energy_ratio": {"a100": 352.0, "a100x": 419.0, "brainwave": 54.0}}
SOURCE = "lightning-lts simulation/ (sim.py, models.py, run.sh)"

# --- the models: layers as (vector length, VVPs) and the layers each waits for ----------


@dataclass(frozen=True)
class Layer:
    vec: int  # multiplies a VVP (before packing)
    vvps: int
    after: frozenset[int] = frozenset()  # the layers whose outputs it takes


def fc(n_in: int, n_out: int, after: set[int] | frozenset[int] = frozenset()) -> Layer:
    return Layer(n_in, n_out, frozenset(after))


def conv(c_in: int, k: int, c_out: int, hw: int, after: set[int] | frozenset[int] = frozenset()
         ) -> Layer:
    """A convolution as the release counts it: a k x k VVP per input channel, output
    channel and output pixel."""
    return Layer(k * k, c_in * c_out * hw * hw, frozenset(after))


def _chain(layers: list[Layer]) -> dict[int, Layer]:
    """Layers one after the other, numbered from 1."""
    return {i + 1: replace(lay, after=frozenset({i}) if i else frozenset())
            for i, lay in enumerate(layers)}


def _transformer(embed: list[Layer], encoders: int, heads: int, d: int, seq: int, ff: int,
                 head_out: Layer | None = None) -> dict[int, Layer]:
    """BERT / GPT-2: embeddings, then encoders of parallel attention heads (projections of
    Q, K and V; Q K^T; softmax x V), the heads' concatenation x W^O and the feed-forward
    pair; `head_out`, a last layer after them (GPT-2's)."""
    out = {i + 1: lay for i, lay in enumerate(embed)}
    prev, n = frozenset(out), len(out)
    for _ in range(encoders):
        concat = set()
        for _ in range(heads):
            q, k, v, qk, sv = n + 1, n + 2, n + 3, n + 4, n + 5
            proj = fc(d, seq * d // heads, prev)
            out |= {q: proj, k: proj, v: proj, qk: fc(d // heads, seq * seq, {q, k}),
                    sv: fc(seq, seq * d // heads, {v, qk})}
            concat.add(sv)
            n += 5
        out |= {n + 1: fc(d, seq * d, concat), n + 2: fc(d, seq * ff, {n + 1}),
                n + 3: fc(ff, seq * d, {n + 2})}
        prev, n = frozenset({n + 3}), n + 3
    if head_out is not None:
        out[n + 1] = replace(head_out, after=prev)
    return out


_VGG16 = [(3, 64, 224), (64, 64, 224), (64, 128, 112), (128, 128, 112), (128, 256, 56),
          (256, 256, 56), (256, 256, 56), (256, 512, 28), (512, 512, 28), (512, 512, 28),
          (512, 512, 14), (512, 512, 14), (512, 512, 14)]
_VGG19 = [(3, 64, 224), (64, 64, 224), (64, 128, 112), (128, 128, 112), (128, 256, 56),
          *[(256, 256, 56)] * 3, (256, 512, 28), *[(512, 512, 28)] * 3,
          *[(512, 512, 14)] * 4]
_RESNET18 = [(3, 7, 64, 112), *[(64, 3, 64, 56)] * 4, (64, 3, 128, 28), (128, 3, 128, 28),
             (64, 1, 128, 28), (128, 3, 128, 28), (128, 3, 128, 28), (128, 3, 256, 14),
             (256, 3, 256, 14), (128, 1, 256, 14), (256, 3, 256, 14), (256, 3, 256, 14),
             (256, 3, 512, 7), (512, 3, 512, 7), (256, 1, 512, 7), (512, 3, 512, 7),
             (512, 3, 512, 7)]
_DLRM_TABLES = [9980333, 36084, 17217, 7378, 20134, 3, 7112, 1442, 61, 9758201, 1333352,
                313829, 10, 2208, 11156, 122, 4, 970, 14, 11156, 7267859, 9946608, 415421,
                12420, 101, 36]


def _dlrm() -> dict[int, Layer]:
    """26 embedding tables and the bottom MLP in parallel, then the top MLP."""
    out = {i + 1: fc(rows, 64) for i, rows in enumerate(_DLRM_TABLES)}
    out |= {27: fc(13, 512), 28: fc(512, 256, {27}), 29: fc(256, 64, {28}),
            30: fc(415, 512, set(range(1, 27)) | {29}), 31: fc(512, 512, {30}),
            32: fc(512, 256, {31}), 33: fc(256, 1, {32})}
    return out


@dataclass(frozen=True)
class Model:
    name: str
    input_bytes: int  # what arrives at the NIC for one request
    layers: dict[int, Layer] = field(repr=False)

    def packed(self, gran: int) -> dict[int, tuple[int, int]]:
        """Each layer as (VVP length, VVPs): short vectors packed into VVPs of `gran`."""
        return {i: (lay.vec, lay.vvps) if lay.vec >= gran
                else (gran, math.ceil(lay.vec * lay.vvps / gran))
                for i, lay in self.layers.items()}

    def multiplies(self, gran: int) -> int:
        return sum(v * n for v, n in self.packed(gran).values())


IMAGE = 224 * 224 * 3
MODELS: dict[str, Model] = {m.name: m for m in [
    Model("AlexNet", IMAGE, _chain([
        conv(3, 11, 64, 55), conv(64, 5, 192, 27), conv(192, 3, 384, 13),
        conv(384, 3, 256, 13), conv(256, 3, 256, 13), fc(256 * 36, 4096), fc(4096, 4096),
        fc(4096, 1000)])),
    Model("ResNet-18", IMAGE, _chain([*(conv(*c) for c in _RESNET18), fc(512, 1000)])),
    Model("VGG-16", IMAGE, _chain([*(conv(a, 3, b, hw) for a, b, hw in _VGG16),
                                   fc(25088, 4096), fc(4096, 4096), fc(4096, 1000)])),
    Model("VGG-19", IMAGE, _chain([*(conv(a, 3, b, hw) for a, b, hw in _VGG19),
                                   fc(25088, 4096), fc(4096, 4096), fc(4096, 1000)])),
    Model("BERT", 512 * 10, _transformer([fc(29056, 1024)], 24, 16, 1024, 512, 4096)),
    Model("GPT-2", 1024 * 10, _transformer([fc(50257, 1600), fc(1024, 1600)], 48, 25, 1600,
                                           1024, 6400, fc(1600, 1024 * 50257))),
    Model("DLRM", 512 * 10, _dlrm()),
]}

# --- the processors ---------------------------------------------------------------------


@dataclass(frozen=True)
class Processor:
    name: str
    cores: int
    ghz: float
    datapath_ns: dict[str, float]  # paid by a request before its first layer
    watts: float
    energy_cores: int | None = None  # the energy model's, if not `cores` (Lightning's)
    energy_gran: int = GRANULARITY

    def energy_j(self, model: Model) -> float:
        """The release's energy model: multiplies x power / cores / clock."""
        return (model.multiplies(self.energy_gran) * self.watts
                / (self.energy_cores or self.cores) / (self.ghz * 1e9))


_LIGHTNING_LAYERS = {"AlexNet": 8, "ResNet-18": 21, "VGG-16": 16, "VGG-19": 19,
                     "BERT": 1 + 7 * 24, "GPT-2": 2 + 7 * 48, "DLRM": 8}
_A100_NS = {"AlexNet": 581_000, "ResNet-18": 615_000, "VGG-16": 607_000, "VGG-19": 596_000,
            "BERT": 1_176_000, "GPT-2": 6_605_000, "DLRM": 2 * 6_605_000}
PROCESSORS: dict[str, Processor] = {
    "lightning": Processor("Lightning", 576, 97.0,
                           {m: 115.0 * n for m, n in _LIGHTNING_LAYERS.items()}, 91.875,
                           energy_cores=1024, energy_gran=1),
    "a100": Processor("A100", 6912, 1.41, dict(_A100_NS), 250.0),
    "a100x": Processor("A100X", 6912, 1.41, dict.fromkeys(_A100_NS, 0.0), 300.0),
    "brainwave": Processor("Brainwave", 96_000, 0.25, dict.fromkeys(_A100_NS, 0.0), 125.0),
}

# --- arrivals and the simulation ------------------------------------------------------


def arrivals(seed: int, line_rate_gbps: float = LINE_RATE_GBPS, n: int = ORDER,
             models: list[str] | None = None) -> list[tuple[str, int]]:
    """(model, arrival ns) in a random order of `models`, each request arriving an
    exponential gap after the last, of mean its input's bits at the line rate."""
    rng = np.random.default_rng(seed)
    names = models or list(MODELS)
    t, out = 0, []
    for k in rng.integers(len(names), size=n):
        name = names[int(k)]
        t += round(float(rng.exponential(MODELS[name].input_bytes * 8 / line_rate_gbps)))
        out.append((name, t))
    return out


MAX_TRACE_BYTES = 4 << 20  # the release's are 55 kB (5,000 requests)
MAX_TRACE_REQUESTS = 100_000


class TraceError(ValueError):
    """A release trace that cannot be used: its file and why."""


class _DataOnly(pickle.Unpickler):
    """Plain data only: a pickle that names any class or function is refused before it
    is looked up, so reading one runs no code of the file's choosing."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"it names {module}.{name}: a trace is plain data")


def read_release_trace(path: Path) -> list[tuple[str, int]]:
    """A lightning-lts schedule (`sim_scheds/mixed_sched_RATE_Gbps_N.pkl`): its (model,
    arrival ns) requests, checked; TraceError names the file and why."""
    try:
        size = path.stat().st_size
        if not path.is_file():
            raise TraceError(f"{path}: not a regular file")
        if size > MAX_TRACE_BYTES:
            raise TraceError(f"{path}: {size} bytes: a trace is at most {MAX_TRACE_BYTES}")
        with path.open("rb") as f:
            data = _DataOnly(io.BytesIO(f.read(MAX_TRACE_BYTES + 1))).load()
    except TraceError:
        raise
    except OSError as e:
        raise TraceError(f"{path}: {e.strerror or e}") from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError,
            KeyError, AttributeError, MemoryError, RecursionError) as e:
        raise TraceError(f"{path}: not a release trace: {e}") from None
    if not isinstance(data, list) or not 0 < len(data) <= MAX_TRACE_REQUESTS:
        raise TraceError(f"{path}: a trace is a list of 1 to {MAX_TRACE_REQUESTS} (model, "
                         f"arrival ns) pairs")
    last = 0
    for k, item in enumerate(data):
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
                and item[0] in MODELS and
                isinstance(item[1], int) and last <= item[1] < 1 << 62):
            raise TraceError(f"{path}: request {k}: {item!r:.80} is not a (model, arrival "
                             f"ns) pair in time order; models: {', '.join(MODELS)}")
        last = item[1]
    return [(str(m), int(t)) for m, t in data]


class _Cores:
    """The processor's cores, each free from its end time (cycles); VVPs dealt round robin
    from where the last layer's left off."""

    def __init__(self, n: int) -> None:
        self.end = np.zeros(n, dtype=np.int64)
        self.next = 0

    def run(self, t: int, vvps: int, size: int) -> int:
        """`vvps` VVPs of `size` cycles each, from cycle `t`: when the last is done."""
        end, n = self.end, len(self.end)
        p = self.next % n
        self.next += vvps
        q, r = divmod(vvps, n)
        if q:  # every core: q VVPs back to back, then r of them one more
            np.maximum(end, t, out=end)
            end += q * size
            t = 0  # (each core's VVPs now follow what it holds)
        done = int(end.max()) if q else 0
        for lo, hi in ((p, min(p + r, n)), (0, max(p + r - n, 0))):
            if hi > lo:
                seg = end[lo:hi]
                np.maximum(seg, t, out=seg)
                seg += size
                done = max(done, int(seg.max()))
        return done


def simulate(proc: Processor, trace: list[tuple[str, int]], requests: int = REQUESTS,
             gran: int = GRANULARITY) -> dict[str, float]:
    """Mean serve time (ns) by model of every request done when the first `requests` are
    (the release's event order: by time, then request, newer events first)."""
    ghz = proc.ghz
    packed = {name: MODELS[name].packed(gran) for name in {m for m, _ in trace}}
    children: dict[str, dict[int, list[int]]] = {}
    for name in packed:
        kids: dict[int, list[int]] = {i: [] for i in MODELS[name].layers}
        for i, lay in MODELS[name].layers.items():
            for j in sorted(lay.after):
                kids[j].append(i)
        children[name] = kids
    cores = _Cores(proc.cores)
    queue: list[tuple[int, int, int, int, str, int]] = []  # t, req, -batch, k, kind, layer
    batch = 0

    def push(events: list[tuple[int, int, str, int]]) -> None:
        nonlocal batch
        batch += 1
        for k, (t, req, kind, layer) in enumerate(events):
            heapq.heappush(queue, (t, req, -batch, k, kind, layer))

    for req, (_, t_ns) in enumerate(trace):
        push([(math.ceil(t_ns * ghz), req, "request", 0)])
    start: dict[int, int] = {}
    waiting: dict[int, dict[int, set[int]]] = {}
    left: dict[int, int] = {}
    done: dict[str, list[float]] = {}
    outstanding = set(range(min(requests, len(trace))))
    while queue and outstanding:
        t, req, _, _, kind, layer = heapq.heappop(queue)
        name = trace[req][0]
        if kind == "request":
            model = MODELS[name]
            start[req], left[req] = t, len(model.layers)
            waiting[req] = {i: set(lay.after) for i, lay in model.layers.items() if lay.after}
            t0 = t + math.ceil(proc.datapath_ns[name] * ghz)
            push([(t0, req, "layer", i) for i, lay in model.layers.items() if not lay.after])
        elif kind == "layer":
            size, vvps = packed[name][layer]
            push([(cores.run(t, vvps, size), req, "end", layer)])
        else:
            left[req] -= 1
            ready = []
            for c in children[name][layer]:
                waiting[req][c].discard(layer)
                if not waiting[req][c]:
                    ready.append((t, req, "layer", c))
            if ready:
                push(ready)
            elif left[req] == 0:
                done.setdefault(name, []).append((t - start[req]) / ghz)
                outstanding.discard(req)
                del waiting[req]
    return {m: float(np.mean(v)) for m, v in sorted(done.items())}


def serve_time(trials: int = TRIALS, requests: int = REQUESTS, seed: int = 1,
               line_rate_gbps: float = LINE_RATE_GBPS,
               on_trial: Callable[[int], None] = lambda k: None,
               traces: list[list[tuple[str, int]]] | None = None) -> dict[str, Any]:
    """The release's evaluation: per trial (its own arrivals, seeds `seed`, `seed` + 1,
    ...; or `traces`, the release's own), each processor's mean serve time by model and
    its ratio to Lightning's; then by model the ratios' mean over the trials, and over the
    models both the largest (the published figure, its tables' "Max" row) and the mean
    (the abstract's "average inference serve time"), the energy ratios beside them."""
    procs = PROCESSORS
    light = procs["lightning"]
    others = [k for k in procs if k != "lightning"]
    per_trial: list[dict[str, dict[str, float]]] = []
    runs = traces if traces is not None else \
        (arrivals(seed + k, line_rate_gbps) for k in range(trials))
    for k, trace in enumerate(runs):
        per_trial.append({name: simulate(p, trace, requests) for name, p in procs.items()})
        on_trial(k + 1)
    trials = len(per_trial)
    models = sorted(set.intersection(*(set(r["lightning"]) for r in per_trial)))
    ratio = {k: {m: float(np.mean([r[k][m] / r["lightning"][m] for r in per_trial]))
                 for m in models} for k in others}
    serve_ns = {k: {m: float(np.mean([r[k][m] for r in per_trial])) for m in models}
                for k in procs}
    energy = {k: {m: procs[k].energy_j(MODELS[m]) / light.energy_j(MODELS[m])
                  for m in models} for k in others}
    return {
        "trials": trials, "requests": requests, "line_rate_gbps": line_rate_gbps,
        "granularity": GRANULARITY, "models": models, "mean_serve_ns": serve_ns,
        "serve_time_ratio_by_model": ratio, "energy_ratio_by_model": energy,
        "serve_time_ratio": {k: max(v.values()) for k, v in ratio.items()},
        "serve_time_ratio_mean": {k: float(np.mean(list(v.values())))
                                  for k, v in ratio.items()},
        "traces": "the release's" if traces is not None else f"drawn, seeds {seed}..",
        "energy_ratio": {k: max(v.values()) for k, v in energy.items()},
        "published": PUBLISHED, "source": SOURCE,
    }


@functools.cache
def alone() -> dict[str, Any]:
    """Each model's request alone on each processor (no queue: the line rate does not
    matter): serve time, and its ratio to Lightning's and the energy ratio, by model.
    (Computed once a process: it depends on nothing but the setup.)"""
    ns = {k: {m: simulate(p, [(m, 0)], 1)[m] for m in MODELS} for k, p in PROCESSORS.items()}
    light = PROCESSORS["lightning"]
    others = [k for k in PROCESSORS if k != "lightning"]
    return {"serve_ns": ns,
            "serve_time_ratio": {k: {m: ns[k][m] / ns["lightning"][m] for m in MODELS}
                                 for k in others},
            "energy_ratio": {k: {m: PROCESSORS[k].energy_j(MODELS[m])
                                 / light.energy_j(MODELS[m]) for m in MODELS}
                             for k in others},
            "published": PUBLISHED, "source": SOURCE}
