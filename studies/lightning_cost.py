"""Lightning's latency and energy, as the talk accounts them (seeds/003; Zhong et al.,
SIGCOMM 2023). Its serve time against electronics, by its own setup: lightning_serve.py.

Every parameter says where it comes from: `talk` (seeds/003), `lightning` (the paper or
its open-source release), `spec` (a vendor's data sheet) or `ours` (an assumption of
oddl's, where no source gives the figure). docs/lightning.md explains the differences
from the published ratios; nothing here is tuned toward them.
"""

from __future__ import annotations

from itertools import pairwise
from math import ceil
from typing import Any

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


def sources() -> dict[str, str]:
    """Each figure's source, for the report."""
    out = {"dac_gsps": DAC_GSPS[1], "word": WORD[1], "layer_ns": LAYER_NS[1],
           "aj_per_op": AJ_PER_OP[1], "datapath_w": DATAPATH_W[1],
           "stop_and_go latency": "ours: measured, the QICK round trips on the emulated "
                                  "board (one inference paced by the host, when the "
                                  "datapath paced the run)"}
    out |= {f"{k} power": s for k, (_, s) in POWER_W.items()}
    return out
