"""What oddl knows by name: models, collectives, planning strategies, networks, back ends.

Each list is written here once; the config types (`Literal`s), the CLI choices and the
builders' dispatch tables derive from it, and tests hold the dispatch tables to it.
"""

from __future__ import annotations

from typing import Literal

# parameters (millions), ODDL-SPEC / the usual published counts
MODELS: dict[str, float] = {
    "resnet50": 25.56,
    "vgg16": 138.36,
    "vgg19": 143.67,
    "bert-large": 340.0,
}
# forward multiply-accumulates per sample, G (the usual published counts: ResNet-50 and VGG
# at 224 x 224; BERT-large: 340 M parameters x a 128-token sequence); a multi-job
# experiment scales the Table 1 calibration by them (docs/model.md, workloads.compute_ms)
MODEL_GMACS: dict[str, float] = {
    "resnet50": 4.1,
    "vgg16": 15.5,
    "vgg19": 19.6,
    "bert-large": 43.5,
}
COLLECTIVES = ("ring", "hd", "hier2d", "totientrings")
IN_NETWORK = "optinc"  # OptINC's all-reduce: a network's own, never a workload's
STRATEGIES = ("cyclic", "matched", "totientperms")
POLICIES = ("fifo", "smallest-first")  # the order queued jobs are admitted in
SHAPES = ("any", "row", "col", "grid")  # a job's placement hint (controller/placement.py)
NETWORK_KINDS = ("oddl", "electrical", "fattree", "sipring", "topoopt", "optinc")
BACKENDS = ("sim", "emu", "hw")

ModelName = Literal[tuple(MODELS)]  # type: ignore[valid-type]
CollectiveName = Literal[COLLECTIVES]  # type: ignore[valid-type]
NetworkCollective = Literal[(*COLLECTIVES, IN_NETWORK)]  # type: ignore[valid-type]
StrategyName = Literal[STRATEGIES]  # type: ignore[valid-type]
NetworkKind = Literal[NETWORK_KINDS]  # type: ignore[valid-type]
BackendName = Literal[BACKENDS]  # type: ignore[valid-type]
PolicyName = Literal[POLICIES]  # type: ignore[valid-type]
ShapeName = Literal[SHAPES]  # type: ignore[valid-type]
