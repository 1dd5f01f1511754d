"""Write the layer tables oddl ships (controller/base/layer_tables/*.json) from the models'
own definitions: each layer's parameter tensors and its forward and backward FLOPs per
sample, counted by PyTorch's FLOP counter on the meta device (no weights downloaded, no
memory allocated).

    pip install torch==2.13.0 torchvision==0.28.0 transformers
    python experiments/layer_tables.py [MODEL ...] [--out DIR] [--check]

Models: torchvision's ResNet-50 and VGG-11/16/19 (one 3 x 224 x 224 image a sample);
BERT-base and BERT-large as Hugging Face's `BertForPreTraining` from their configurations
(a 128-token sequence), GPT-2, GPT-2 XL, GPT-3 XL, GPT-3 6.7B and Megatron 8.3B as
`GPT2LMHeadModel` from theirs (one full-context sequence); DLRM's dense part as MLPerf
configures it (defined here: no library ships it). `--check` compares instead of writing.

A layer is a module that owns parameters or computes FLOPs itself (its FLOPs less its
children's); its tensors are listed in registration order, which is the order DDP buckets
them in, reversed. Backward FLOPs are those of forward and backward together less the
forward's. The counter counts matrix products and convolutions only: normalisations,
activations and pooling count 0 (PyTorch's choice, kept).
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent.parent / "controller" / "base" / "layer_tables"
VISION = {"resnet50": "resnet50", "vgg11": "vgg11", "vgg16": "vgg16", "vgg19": "vgg19"}
# (layers, hidden, heads, context, vocabulary): the catalog's (controller/base/catalog.py)
# (GPT-3 XL: Brown et al.'s Table 2.1 gives 24 heads of 128 for a 2,048 model width, which
# no attention can split; 16 heads of 128 here, which changes no parameter or FLOP)
GPT = {"gpt2": (12, 768, 12, 1024, 50257), "gpt2-xl": (48, 1600, 25, 1024, 50257),
       "gpt3-1.3b": (24, 2048, 16, 2048, 50257), "gpt3-6.7b": (32, 4096, 32, 2048, 50257),
       "megatron-8.3b": (72, 3072, 32, 1024, 51200)}
BERT = {"bert": (12, 768, 12), "bert-large": (24, 1024, 16)}  # Devlin et al. 2019
BERT_TOKENS = 128  # pre-training's first phase (Devlin et al. 2019, A.2)
MODELS = (*VISION, *BERT, *GPT, "dlrm")


def _torchvision_models() -> Any:
    """torchvision's model definitions without its compiled operators: the wheel that pip
    pairs with the CPU torch here links CUDA's libraries, and its package init registers
    operators it then cannot load. The definitions are plain Python; none uses them."""
    if "torchvision" not in sys.modules:
        spec = importlib.util.find_spec("torchvision")
        if spec is None or spec.submodule_search_locations is None:
            raise SystemExit("torchvision is not installed: pip install torchvision==0.28.0")
        pkg = types.ModuleType("torchvision")
        pkg.__path__ = list(spec.submodule_search_locations)
        pkg.__spec__ = spec
        sys.modules["torchvision"] = pkg
    import torchvision.models

    return torchvision.models


def _dlrm() -> Any:
    """DLRM's dense part, MLPerf's Criteo Terabyte configuration (facebookresearch/dlrm):
    bottom MLP 13-512-256-128, the 26 embeddings' 351 pairwise dot products with the
    bottom's output (479 wide), top MLP 1024-1024-512-256-1. The embedding tables are
    sharded over the ranks and never all-reduced (docs/model.md), so they are not here;
    their lookups arrive as the 26 input vectors."""
    import torch
    from torch import nn

    def mlp(sizes: list[int]) -> nn.Sequential:
        out: list[nn.Module] = []
        for a, b in itertools.pairwise(sizes):
            out += [nn.Linear(a, b), nn.ReLU()]
        return nn.Sequential(*out)

    class Interaction(nn.Module):
        def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
            t = torch.cat([x.unsqueeze(1), emb], dim=1)  # (b, 27, 128)
            z = torch.bmm(t, t.transpose(1, 2))
            i, j = torch.tril_indices(27, 27, offset=-1)
            return torch.cat([x, z[:, i, j]], dim=1)

    class DenseDLRM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bot = mlp([13, 512, 256, 128])
            self.interact = Interaction()
            self.top = mlp([479, 1024, 1024, 512, 256, 1])

        def forward(self, dense: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
            return self.top(self.interact(self.bot(dense), emb))

    return DenseDLRM()


def build(model: str) -> tuple[Any, Callable[[], tuple[Any, ...]], str, str]:
    """The model on the meta device, its one sample's inputs, where its definition comes
    from, and what a sample is."""
    import torch

    if model in VISION:
        tv = _torchvision_models()
        import torchvision

        m = getattr(tv, VISION[model])()
        return (m, lambda: (torch.randn(1, 3, 224, 224),),
                f"torchvision {_version(torchvision, 'torchvision')}: models.{VISION[model]}()",
                "one 3 x 224 x 224 image")
    if model in BERT:
        import transformers

        L, h, a = BERT[model]
        cfg = transformers.BertConfig(num_hidden_layers=L, hidden_size=h, num_attention_heads=a,
                                      intermediate_size=4 * h, attn_implementation="eager")
        return (transformers.BertForPreTraining(cfg),
                lambda: (torch.zeros(1, BERT_TOKENS, dtype=torch.long),),
                f"transformers {transformers.__version__}: BertForPreTraining(BertConfig("
                f"num_hidden_layers={L}, hidden_size={h}, num_attention_heads={a}))",
                f"one sequence of {BERT_TOKENS} tokens")
    if model in GPT:
        import transformers

        L, h, a, s, V = GPT[model]
        cfg = transformers.GPT2Config(n_layer=L, n_embd=h, n_head=a, n_positions=s,
                                      vocab_size=V, attn_implementation="eager")
        return (transformers.GPT2LMHeadModel(cfg),
                lambda: (torch.zeros(1, s, dtype=torch.long),),
                f"transformers {transformers.__version__}: GPT2LMHeadModel(GPT2Config("
                f"n_layer={L}, n_embd={h}, n_head={a}, n_positions={s}, vocab_size={V}))",
                f"one sequence of {s} tokens")
    if model == "dlrm":
        return (_dlrm(), lambda: (torch.randn(1, 13), torch.randn(1, 26, 128)),
                "MLPerf DLRM (Criteo Terabyte) dense part, defined in experiments/"
                "layer_tables.py", "one sample (13 dense features, 26 embedding lookups)")
    raise SystemExit(f"unknown model {model!r}; known: {', '.join(MODELS)}")


def _version(mod: Any, name: str) -> str:
    return str(getattr(mod, "__version__", "?")) if mod is not None else name


def _own_flops(counts: dict[str, dict[Any, int]]) -> dict[str, int]:
    """Each module's FLOPs less its children's (the counter's names are dotted paths)."""
    total = {k: sum(v.values()) for k, v in counts.items() if k != "Global"}
    own = dict(total)
    for k, v in total.items():
        parent = k
        while "." in parent:  # the nearest ancestor the counter saw (a list is never called)
            parent = parent.rsplit(".", 1)[0]
            if parent in own:
                own[parent] -= v
                break
    return own


def table(model: str) -> dict[str, Any]:
    """A leaf layer's FLOPs are counted on it alone, run again on inputs shaped as in the
    model (and needing a gradient where they did there): the counter's own split by module
    follows backward's hooks, which count an operator in every module of two interleaved
    branches (a residual block's), so only totals and forward splits are taken from it. A
    container's own operators (attention's products) get its forward share of what the
    leaves leave of the totals, and the same share of backward's."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    with torch.device("meta"):
        m, inputs, source, sample = build(model)
        m.train()
        x = inputs()
    root = type(m).__name__
    calls: dict[int, list[tuple[Any, ...]]] = {}

    def seen_call(mod: Any, args: tuple[Any, ...], _out: Any) -> None:
        calls.setdefault(id(mod), []).append(tuple(
            (a.shape, a.dtype, a.requires_grad) if isinstance(a, torch.Tensor) else a
            for a in args))

    leaves = [mod for mod in m.modules() if next(mod.children(), None) is None]
    hooks = [mod.register_forward_hook(seen_call) for mod in leaves]

    def count(fn: Callable[[], Any], backward: bool) -> tuple[int, dict[str, int]]:
        fc = FlopCounterMode(display=False)
        with fc:
            out = fn()
            if backward:
                ys = [out] if isinstance(out, torch.Tensor) else \
                    [y for y in (out.values() if isinstance(out, dict) else out)
                     if isinstance(y, torch.Tensor)]
                y = next(y for y in ys if y.requires_grad)
                y.float().sum().backward()
        counts = fc.get_flop_counts()
        return sum(counts.get("Global", {}).values()), _own_flops(counts)

    fwd_total, fwd_own = count(lambda: m(*x), False)
    for h in hooks:
        h.remove()
    both_total, _ = count(lambda: m(*x), True)

    def alone(mod: Any) -> tuple[int, int]:
        f = b = 0
        for args in calls.get(id(mod), []):
            def run(args: tuple[Any, ...] = args) -> Any:
                with torch.device("meta"):  # (a clone: in-place layers take no leaf)
                    real = [torch.empty(a[0], dtype=a[1], requires_grad=a[2]).clone()
                            if isinstance(a, tuple) and len(a) == 3 and
                            isinstance(a[0], torch.Size) else a for a in args]
                return mod(*real)
            ff, _ = count(run, False)
            needs = any(p.requires_grad for p in mod.parameters()) or \
                any(isinstance(a, tuple) and len(a) == 3 and a[2] for a in args)
            fb = count(run, True)[0] if needs else ff
            f, b = f + ff, b + fb - ff
        return f, b

    seen: set[int] = set()
    rows = []
    for name, mod in m.named_modules():
        key = f"{root}.{name}" if name else root
        tensors = []
        for p in mod.parameters(recurse=False):
            if id(p) not in seen and p.requires_grad:  # a tied weight counts once
                seen.add(id(p))
                tensors.append(p.numel())
        if next(mod.children(), None) is None:
            f, b = alone(mod)
            rows.append([name or root, tensors, f, b, True])
        elif tensors or fwd_own.get(key, 0):
            rows.append([name or root, tensors, fwd_own.get(key, 0), 0, False])
    leaf_f = sum(r[2] for r in rows if r[4])
    leaf_b = sum(r[3] for r in rows if r[4])
    own = sum(r[2] for r in rows if not r[4])
    if own != fwd_total - leaf_f:
        raise SystemExit(f"{model}: forward {fwd_total} = {leaf_f} in layers + {own} in "
                         f"containers does not add up")
    rest = both_total - fwd_total - leaf_b
    if rest < 0 or (rest and not own):
        raise SystemExit(f"{model}: {rest} backward FLOPs outside every layer")
    layers = [[name, tensors, f, b if leaf else round(rest * f / own)]
              for name, tensors, f, b, leaf in rows if tensors or f or b]
    return {"model": model, "source": source + f"; torch {torch.__version__} "
            "FlopCounterMode on the meta device", "sample": sample,
            "params": sum(sum(t) for _n, t, _f, _b in layers), "layers": layers}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", default=list(MODELS))
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--check", action="store_true",
                    help="compare with the tables in --out; exit 1 on a difference")
    args = ap.parse_args()
    bad = 0
    for model in args.models:
        t = table(model)
        path = args.out / f"{model}.json"
        text = json.dumps(t, separators=(",", ":")) + "\n"
        if args.check:
            old = json.loads(path.read_text())
            same = {k: v for k, v in old.items() if k != "source"} == \
                {k: v for k, v in t.items() if k != "source"}
            bad += not same
            print(f"{model}: {'same' if same else 'DIFFERS'}")
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"{model}: {t['params']:,} parameters, {len(t['layers'])} layers, "
              f"{sum(x[2] for x in t['layers']) / 1e9:.2f} GFLOP forward a sample -> {path}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
