"""Lightning's latency and energy, as the talk accounts them, and its serve time against
electronics (seeds/003; Zhong et al., SIGCOMM 2023, and its public serve-time simulator).

Every parameter says where it comes from: `talk` (seeds/003), `lightning` (the paper or
its open-source release), `spec` (a vendor's data sheet) or `ours` (an assumption of
oddl's, where no source gives the figure). docs/lightning.md explains the differences
from the published ratios; nothing here is tuned toward them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from itertools import pairwise
from math import ceil
from typing import Any

import numpy as np

# (value, source)
DAC_GSPS = (4.055, "lightning: inference at 4.055 GHz end to end (values per second)")
WORD = (16, "lightning: the datapath streams 16 values per word (fabric clock)")
LAYER_NS = (115.0, "lightning: serve-time simulator, 115 ns datapath latency per layer")
AJ_PER_OP = (40.0, "talk: 40 atto-joules per operation [Science'22]")
POWER_W = {  # the talk's table: the parts of a stop-and-go photonic system
    "digital computer": (250.0, "talk"),
    "arbitrary waveform generator": (220.0, "talk"),
    "photonic modulators": (0.001, "talk"),
    "digitizer": (1350.0, "talk"),
}
DATAPATH_W = (25.0, "ours: an RFSoC board running the count-action datapath (DACs, ADC, "
                    "fabric); no source gives Lightning's own figure")


def layer_cycles(layers: list[int], word: int = WORD[0]) -> list[int]:
    """Datapath cycles of each fully connected layer: inputs x outputs / values a word
    (Lightning's: 784 x 300 / 16 = 14,700 for LeNet-300-100's first)."""
    return [ceil(a * b / word) for a, b in pairwise(layers)]


def operations(layers: list[int]) -> int:
    return sum(a * b for a, b in pairwise(layers))


def count_action(layers: list[int]) -> dict[str, Any]:
    """One inference run by the count-action datapath: the photonics fed at the DAC rate,
    the electronics in the NIC's fabric; no host in the loop."""
    cycles = layer_cycles(layers)
    ns_per_cycle = WORD[0] / DAC_GSPS[0]
    latency_ns = sum(c * ns_per_cycle + LAYER_NS[0] for c in cycles)
    s = latency_ns * 1e-9
    parts = {"photonic operations": operations(layers) * AJ_PER_OP[0] * 1e-18,
             "photonic modulators": POWER_W["photonic modulators"][0] * s,
             "datapath (RFSoC)": DATAPATH_W[0] * s}
    return {"latency_ns": latency_ns, "cycles_per_layer": cycles,
            "energy_j": sum(parts.values()), "energy_breakdown_j": parts}


def stop_and_go(layers: list[int], measured_s: float) -> dict[str, Any]:
    """The same inference with a host in the loop: each layer's stream as round trips
    through the QICK API (program, play, capture, decode); its latency is the time those
    round trips take here (`measured_s`, on the emulated board; when the datapath paced
    the run, one inference played again by the host), its power the talk's table."""
    parts = {k: w * measured_s for k, (w, _) in POWER_W.items()}
    parts["photonic operations"] = operations(layers) * AJ_PER_OP[0] * 1e-18
    return {"latency_ns": measured_s * 1e9, "energy_j": sum(parts.values()),
            "energy_breakdown_j": parts}


# --- serve time against electronics ---------------------------------------------------

@dataclass(frozen=True)
class Layer:
    """A layer as vector-vector products: `vvps` of `size` multiplies each."""

    vvps: int
    size: int


def conv(c_in: int, k: int, c_out: int, hw: int) -> Layer:
    return Layer(c_out * hw * hw, c_in * k * k)


def fc(n_in: int, n_out: int) -> Layer:
    return Layer(n_out, n_in)


# the standard architectures' layer shapes (ImageNet inputs, 224 x 224 x 3 bytes)
MODELS: dict[str, list[Layer]] = {
    "AlexNet": [conv(3, 11, 64, 55), conv(64, 5, 192, 27), conv(192, 3, 384, 13),
                conv(384, 3, 256, 13), conv(256, 3, 256, 13), fc(256 * 36, 4096),
                fc(4096, 4096), fc(4096, 1000)],
    "VGG-16": [conv(3, 3, 64, 224), conv(64, 3, 64, 224), conv(64, 3, 128, 112),
               conv(128, 3, 128, 112), conv(128, 3, 256, 56), *[conv(256, 3, 256, 56)] * 2,
               conv(256, 3, 512, 28), *[conv(512, 3, 512, 28)] * 2,
               *[conv(512, 3, 512, 14)] * 3, fc(25088, 4096), fc(4096, 4096),
               fc(4096, 1000)],
}
INPUT_BYTES = 224 * 224 * 3


@dataclass(frozen=True)
class Processor:
    name: str
    cores: int
    ghz: float
    datapath_ns: dict[str, float]  # per request, by model
    watts: float
    sources: dict[str, str] = field(default_factory=dict)

    def compute_ns(self, model: str) -> float:
        """Each core does one multiply a cycle; a layer's VVPs spread over the cores."""
        return sum(ceil(lay.vvps / self.cores) * lay.size for lay in MODELS[model]) / self.ghz

    def energy_j(self, model: str) -> float:
        return self.watts * self.compute_ns(model) * 1e-9


PUB = "lightning: serve-time simulator (sim.py)"
PROCESSORS = {
    "lightning": Processor("Lightning", 576, 97.0,
                           {m: LAYER_NS[0] * len(v) for m, v in MODELS.items()},
                           DATAPATH_W[0], {"cores, GHz, 115 ns a layer": PUB,
                                           "watts": DATAPATH_W[1]}),
    "a100": Processor("A100", 6912, 1.41, {"AlexNet": 581_000, "VGG-16": 607_000}, 400.0,
                      {"cores, GHz, datapath ns": PUB,
                       "watts": "spec: NVIDIA A100 SXM, 400 W TDP"}),
    "brainwave": Processor("Brainwave", 96_000, 0.25, {"AlexNet": 0, "VGG-16": 0}, 125.0,
                           {"cores, GHz, datapath ns": PUB,
                            "watts": "ours: an FPGA accelerator card's board power, assumed"}),
}
PUBLISHED = {"serve_time_ratio": {"a100": 337.0, "brainwave": 42.0},
             "energy_ratio": {"a100": 352.0, "brainwave": 54.0}}


def serve(proc: Processor, arrivals: list[tuple[float, str]]) -> dict[str, float]:
    """FIFO, one request at a time on all cores: mean serve time (arrival of its last byte
    to its answer) and mean energy a request."""
    free, serve_ns, energy = 0.0, [], []
    for t, model in arrivals:
        start = max(t, free)
        free = start + proc.datapath_ns[model] + proc.compute_ns(model)
        serve_ns.append(free - t)
        energy.append(proc.energy_j(model))
    return {"mean_serve_ns": float(np.mean(serve_ns)), "mean_energy_j": float(np.mean(energy))}


def arrivals(requests: int, line_rate_gbps: float, seed: int = 0) -> list[tuple[float, str]]:
    """A seeded mix of the models' requests, each arriving as its input's packets do at the
    NIC's line rate, back to back."""
    rng = np.random.default_rng(seed)
    names = sorted(MODELS)
    gap_ns = INPUT_BYTES * 8 / line_rate_gbps
    return [((k + 1) * gap_ns, names[int(rng.integers(len(names)))]) for k in range(requests)]


def serve_time_ratios(requests: int = 100, line_rate_gbps: float = 0.06, seed: int = 0
                      ) -> dict[str, Any]:
    """Mean serve time and energy of each processor over one arrival sequence, and
    Lightning's ratios against the others beside the published ones. The default line rate
    is the published simulator's run (60 Mb/s)."""
    arr = arrivals(requests, line_rate_gbps, seed)
    res = {k: serve(p, arr) for k, p in PROCESSORS.items()}
    light = res["lightning"]
    return {
        "requests": requests, "line_rate_gbps": line_rate_gbps, "models": sorted(MODELS),
        "processors": {k: {**asdict(p), **res[k]} for k, p in PROCESSORS.items()},
        "serve_time_ratio": {k: res[k]["mean_serve_ns"] / light["mean_serve_ns"]
                             for k in ("a100", "brainwave")},
        "energy_ratio": {k: res[k]["mean_energy_j"] / light["mean_energy_j"]
                         for k in ("a100", "brainwave")},
        "published": PUBLISHED,
    }


def sources() -> dict[str, str]:
    """Each figure's source, for the report."""
    out = {"dac_gsps": DAC_GSPS[1], "word": WORD[1], "layer_ns": LAYER_NS[1],
           "aj_per_op": AJ_PER_OP[1], "datapath_w": DATAPATH_W[1],
           "stop_and_go latency": "ours: measured, the QICK round trips on the emulated "
                                  "board (one inference paced by the host, when the "
                                  "datapath paced the run)"}
    out |= {f"{k} power": s for k, (_, s) in POWER_W.items()}
    return out
