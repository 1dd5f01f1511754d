"""What oddl knows by name: models, collectives, planning strategies, networks, back ends.

Each list is written here once; the config types (`Literal`s), the CLI choices and the
builders' dispatch tables derive from it, and tests hold the dispatch tables to it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, TypeAlias

# GPT-style Transformers: (layers, hidden, heads, sequence length, vocabulary), the
# published configurations (docs/model.md gives the sources); they train data-parallel or
# hybrid-parallel (controller/base/parallelism.py), their compute from their FLOPs
TRANSFORMERS: dict[str, tuple[int, int, int, int, int]] = {
    "gpt2": (12, 768, 12, 1024, 50257),  # GPT-2 small, Radford et al. 2019
    "gpt2-xl": (48, 1600, 25, 1024, 50257),  # GPT-2 1.5 B, Radford et al. 2019
    "gpt3-1.3b": (24, 2048, 24, 2048, 50257),  # GPT-3 XL, Brown et al. 2020, Table 2.1
    "gpt3-6.7b": (32, 4096, 32, 2048, 50257),  # GPT-3 6.7B, Brown et al. 2020, Table 2.1
    "megatron-8.3b": (72, 3072, 32, 1024, 51200),  # Shoeybi et al. 2019, Table 1
}


def transformer_params(model: str) -> int:
    """Parameters of a GPT-style model: 12 l h^2 + 13 l h per layer (weights, biases, layer
    norms) and (V + s) h of embeddings (Narayanan et al. SC'21's count)."""
    L, h, _a, s, V = TRANSFORMERS[model]
    return 12 * L * h * h + 13 * L * h + (V + s) * h


# parameters (millions), ODDL-SPEC / the usual published counts
MODELS: dict[str, float] = {
    "resnet50": 25.56,
    "vgg11": 132.86,
    "vgg16": 138.36,
    "vgg19": 143.67,
    "bert": 110.0,  # BERT-base
    "bert-large": 340.0,
    "dlrm": 2.37,  # the dense MLPs only (all-reduced); its embeddings stay where they are
    **{m: transformer_params(m) / 1e6 for m in TRANSFORMERS},
}
# forward multiply-accumulates per sample, G (the usual published counts: ResNet-50 and VGG
# at 224 x 224; BERT-large: 340 M parameters x a 128-token sequence); a multi-job
# experiment scales the Table 1 calibration by them (docs/model.md, workloads.compute_ms)
MODEL_GMACS: dict[str, float] = {
    "resnet50": 4.1,
    "vgg11": 7.6,
    "vgg16": 15.5,
    "vgg19": 19.6,
    "bert": 14.1,  # 110 M x 128 tokens
    "bert-large": 43.5,
    "dlrm": 0.0024,  # the MLPs and the pairwise interactions (docs/model.md)
}
# bytes each sample's embedding lookups put on the network, each way: DLRM's MLPerf
# configuration, 26 tables of 128-float vectors; the forward all-to-all sends them, the
# backward one their gradients (docs/model.md)
EMBEDDING_BYTES: dict[str, int] = {"dlrm": 26 * 128 * 4}
COLLECTIVES = ("ring", "hd", "hier2d", "totientrings")
IN_NETWORK = "optinc"  # OptINC's all-reduce: a network's own, never a workload's
STRATEGIES = ("cyclic", "matched", "totientperms")
POLICIES = ("fifo", "smallest-first")  # the order queued jobs are admitted in
SHAPES = ("any", "row", "col", "grid")  # a job's placement hint (controller/stage1/placement.py)
# how jobs share a link: fluid (sim/networks/sharing.py) or by a congestion-control law
# (sim/networks/congestion.py), MLTCP on either
SHARINGS = ("fair", "weighted", "mltcp", "dcqcn", "tcp", "mltcp-dcqcn", "mltcp-tcp")
NETWORK_KINDS = ("oddl", "electrical", "fattree", "sipring", "sipocs", "topoopt", "optinc")
BACKENDS = ("sim", "emu", "hw")

# the config's fields take these names: Literals built from the tuples above (one source),
# which pydantic checks at run time; to the type checker each is a str
if TYPE_CHECKING:
    ModelName: TypeAlias = str
    CollectiveName: TypeAlias = str
    NetworkCollective: TypeAlias = str
    StrategyName: TypeAlias = str
    NetworkKind: TypeAlias = str
    BackendName: TypeAlias = str
    PolicyName: TypeAlias = str
    ShapeName: TypeAlias = str
    SharingName: TypeAlias = str
else:
    ModelName = Literal[tuple(MODELS)]
    CollectiveName = Literal[COLLECTIVES]
    NetworkCollective = Literal[(*COLLECTIVES, IN_NETWORK)]
    StrategyName = Literal[STRATEGIES]
    NetworkKind = Literal[NETWORK_KINDS]
    BackendName = Literal[BACKENDS]
    PolicyName = Literal[POLICIES]
    ShapeName = Literal[SHAPES]
    SharingName = Literal[SHARINGS]
