"""Data-parallel SGD on N simulated workers, gradients averaged exactly (ring all-reduce)
or through OptINC's optical unit: does in-network averaging cost accuracy?

The task ships inside scikit-learn (the 8 x 8 digits, 1,797 images), so nothing is
downloaded: a 64-32-10 MLP (ReLU, softmax cross-entropy), a fixed train/test split, each
worker a disjoint shard of the training set. Both runs see the same initial weights and
the same mini-batches in the same order; only the averaging differs. Each step the workers
agree on a scale (the largest |gradient| of any worker: one scalar, a max all-reduce
beside the optical pass) on which every gradient is a B-bit value.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

import numpy as np
from oddl.controller.base import fixedmath as F
from oddl.studies.arrays import Floats, Ints
from oddl.studies.mzi import Components
from oddl.studies.onn import OptINC
from oddl.studies.quantiser import Averager, rounded_mean

Average = Callable[[Floats, float], Floats]  # (workers x P, scale) -> workers x P
HIDDEN = 32


@dataclass
class TrainResult:
    accuracy: list[float] = field(default_factory=list)  # worker 0's, after each epoch
    drift: list[float] = field(default_factory=list)  # max |replica - worker 0's| weight

    @property
    def final(self) -> float:
        return self.accuracy[-1]


def _data(seed: int) -> tuple[Floats, Floats, Floats, Floats]:
    from sklearn.datasets import load_digits

    d = load_digits()
    x, y = d.data / 16.0, d.target
    order = np.random.default_rng(seed).permutation(len(y))
    cut = int(0.7 * len(y))
    return x[order[:cut]], y[order[:cut]], x[order[cut:]], y[order[cut:]]


def _init(seed: int) -> Floats:
    rng = np.random.default_rng(seed + 1)
    w1 = rng.normal(0, np.sqrt(2 / 64), (64, HIDDEN))
    w2 = rng.normal(0, np.sqrt(2 / HIDDEN), (HIDDEN, 10))
    return np.concatenate([w1.ravel(), np.zeros(HIDDEN), w2.ravel(), np.zeros(10)])


def _unpack(p: Floats) -> tuple[Floats, ...]:
    a, b, c = 64 * HIDDEN, 64 * HIDDEN + HIDDEN, 64 * HIDDEN + HIDDEN + HIDDEN * 10
    return p[:a].reshape(64, HIDDEN), p[a:b], p[b:c].reshape(HIDDEN, 10), p[c:]


def _forward(p: Floats, x: Floats) -> tuple[Floats, Floats]:
    w1, b1, w2, b2 = _unpack(p)
    h = np.maximum(F.matmul(x, w1) + b1, 0)
    z = F.matmul(h, w2) + b2
    z = F.exp(z - z.max(axis=1, keepdims=True))
    return h, z / z.sum(axis=1, keepdims=True)


def _grad(p: Floats, x: Floats, y: Floats) -> Floats:
    w2 = _unpack(p)[2]
    h, prob = _forward(p, x)
    dz = prob.copy()
    dz[np.arange(len(y)), y] -= 1
    dz /= len(y)
    dh = F.matmul(dz, w2.T) * (h > 0)
    return np.concatenate([F.matmul(x.T, dh).ravel(), dh.sum(0), F.matmul(h.T, dz).ravel(),
                           dz.sum(0)])


Data = tuple[Floats, Floats, Floats, Floats]  # train x, y; test x, y


def _sgd(workers: int, average: Average, p0: Floats,
         grad: Callable[[Floats, Floats, Floats], Floats], epochs: int,
         batch: int, lr: float, seed: int,
         after_epoch: Callable[[Floats, Data], None]) -> None:
    """Data-parallel SGD: each worker a shard, the same batches in the same order for
    every averaging; each step's gradients averaged by `average` on the scale the workers
    agree (the largest |gradient|). `after_epoch` sees every worker's replica."""
    data = _data(seed)
    xtr, ytr = data[0], data[1]
    shards = np.array_split(np.arange(len(ytr)), workers)
    steps = min(len(s) for s in shards) // batch
    if steps < 1:
        raise ValueError(f"{workers} workers leave fewer than {batch} samples each")
    p = np.repeat(p0[None, :], workers, axis=0)  # each worker's replica
    rng = np.random.default_rng(seed + 2)
    for _ in range(epochs):
        perm = [rng.permutation(s) for s in shards]
        for k in range(steps):
            g = np.stack([grad(p[i], xtr[o[k * batch:(k + 1) * batch]],
                               ytr[o[k * batch:(k + 1) * batch]])
                          for i, o in enumerate(perm)])
            # each worker applies what reached it: optically, its own port's copy
            p = p - lr * average(g, float(np.abs(g).max()) or 1.0)
        after_epoch(p, data)


def train(workers: int, average: Average, epochs: int = 30, batch: int = 16,
          lr: float = 0.1, seed: int = 0) -> TrainResult:
    res = TrainResult()

    def record(p: Floats, d: Data) -> None:
        res.accuracy.append(float((_forward(p[0], d[2])[1].argmax(1) == d[3]).mean()))
        res.drift.append(float(np.abs(p - p[0]).max()))

    _sgd(workers, average, _init(seed), _grad, epochs, batch, lr, seed, record)
    return res


def exact(g: Floats, _scale: float) -> Floats:
    return np.repeat(g.mean(axis=0, keepdims=True), len(g), axis=0)


def compare(workers: int, comp: Components, ports: int = 32, epochs: int = 30,
            seed: int = 0) -> tuple[TrainResult, TrainResult, OptINC]:
    """The same training with exact and optical averaging."""
    fabric = OptINC(workers, ports, comp, seed)
    return (train(workers, exact, epochs, seed=seed),
            train(workers, fabric.average, epochs, seed=seed), fabric)


# --- a small CNN against the ring, with the trained ONN (docs/optinc.md, "A training
# task") --------------------------------------------------------------------------------

FILTERS, DENSE = 16, 32  # conv 3 x 3 x 16, 2 x 2 average pool, dense 144-32-10: 5,130
_SHAPES = [(9, FILTERS), (FILTERS,), (9 * FILTERS, DENSE), (DENSE,), (DENSE, 10), (10,)]


def _cnn_unpack(p: Floats) -> list[Floats]:
    out, i = [], 0
    for s in _SHAPES:
        k = int(np.prod(s))
        out.append(p[i:i + k].reshape(s))
        i += k
    return out


def cnn_init(seed: int) -> Floats:
    rng = np.random.default_rng(seed + 1)
    parts = [rng.normal(0, np.sqrt(2 / s[0]), s) if len(s) == 2 else np.zeros(s)
             for s in _SHAPES]
    return np.concatenate([a.ravel() for a in parts])


# pixel k of patch (r, c) of an 8 x 8 image, flat: the convolution's windows
_WINDOWS = np.array([[(r + k // 3) * 8 + c + k % 3 for k in range(9)]
                     for r in range(6) for c in range(6)])


def _patches(x: Floats) -> Floats:
    """8 x 8 images (flat) to their 36 3 x 3 patches: batch x 36 x 9."""
    return x[:, _WINDOWS]


def _cnn_forward(p: Floats, x: Floats) -> tuple[Floats, ...]:
    wc, bc, w1, b1, w2, b2 = _cnn_unpack(p)
    pt = _patches(x)
    conv = np.maximum(F.matmul(pt, wc) + bc, 0)  # batch x 36 x F
    pool = conv.reshape(-1, 3, 2, 3, 2, FILTERS).mean(axis=(2, 4)).reshape(len(x), -1)
    h = np.maximum(F.matmul(pool, w1) + b1, 0)
    z = F.matmul(h, w2) + b2
    z = F.exp(z - z.max(axis=1, keepdims=True))
    return pt, conv, pool, h, z / z.sum(axis=1, keepdims=True)


def cnn_predict(p: Floats, x: Floats) -> Floats:
    return _cnn_forward(p, x)[-1]


def cnn_grad(p: Floats, x: Floats, y: Floats) -> Floats:
    _, _, w1, _, w2, _ = _cnn_unpack(p)
    pt, conv, pool, h, prob = _cnn_forward(p, x)
    dz = prob.copy()
    dz[np.arange(len(y)), y] -= 1
    dz /= len(y)
    dh = F.matmul(dz, w2.T) * (h > 0)
    dpool = F.matmul(dh, w1.T).reshape(-1, 3, 1, 3, 1, FILTERS) / 4
    dconv = np.broadcast_to(dpool, (len(x), 3, 2, 3, 2, FILTERS)).reshape(len(x), 36, FILTERS)
    dconv = dconv * (conv > 0)
    # (batch x patch) x 9 by (batch x patch) x F: the kernels' gradient
    dwc = F.matmul(pt.reshape(-1, 9).T, dconv.reshape(-1, FILTERS))
    return np.concatenate([dwc.ravel(), dconv.sum((0, 1)), F.matmul(pool.T, dh).ravel(),
                           dh.sum(0), F.matmul(h.T, dz).ravel(), dz.sum(0)])


@dataclass
class Curves:
    """Per epoch: worker 0's test accuracy and its loss on the training set."""

    accuracy: list[float] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)


def train_cnn(workers: int, average: Average, epochs: int = 30, batch: int = 16,
              lr: float = 0.1, seed: int = 0) -> Curves:
    """Data-parallel SGD of the CNN, as `train` does the MLP."""
    out = Curves()

    def record(p: Floats, d: Data) -> None:
        prob = cnn_predict(p[0], d[0])
        out.loss.append(float(-F.log(prob[np.arange(len(d[1])), d[1]] + 1e-12).mean()))
        out.accuracy.append(float((cnn_predict(p[0], d[2]).argmax(1) == d[3]).mean()))

    _sgd(workers, average, cnn_init(seed), cnn_grad, epochs, batch, lr, seed, record)
    return out


def to_levels(g: Floats, scale: float, bits: int) -> Ints:
    """Signed values on [-scale, scale] as unsigned `bits`-bit integers (offset binary)."""
    top = 2 ** bits - 1
    return cast(Ints, np.clip(np.round((g / scale + 1) / 2 * top), 0, top).astype(np.int64))


def from_levels(q: Ints, scale: float, bits: int) -> Floats:
    return cast(Floats, (q / (2 ** bits - 1) * 2 - 1) * scale)


def _on_levels(bits: int, mean: Callable[[Ints], Ints]) -> Average:
    """An averaging of `bits`-bit gradients: each worker's values as levels, `mean` of
    them (servers x k levels to k levels), every worker given the same result."""
    def avg(g: Floats, scale: float) -> Floats:
        m = from_levels(mean(to_levels(g, scale, bits)), scale, bits)
        return np.repeat(m[None, :], len(g), axis=0)

    return avg


def ring(bits: int) -> Average:
    """A ring all-reduce of `bits`-bit gradients: each worker sends its B-bit values, the
    ring adds them exactly (its messages are wide enough for the sum) and the all-gather
    carries the mean rounded to B bits, the function the trained ONN computes."""
    return _on_levels(bits, rounded_mean)


def trained_onn(unit: Averager, passes: list[int] | None = None) -> Average:
    """The trained ONN: one optical pass a step, or with `passes` given, passes checked by
    pilots and sent again when disturbed (each step's count appended); every server reads
    the same output ports (the splitting unit T)."""
    def mean(q: Ints) -> Ints:
        if passes is None:
            return unit.run(q)
        out, n = unit.run_checked(q)
        passes.append(n)
        return out

    return _on_levels(unit.bits, mean)
