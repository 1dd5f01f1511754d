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

import numpy as np
from oddl.studies.mzi import Components
from oddl.studies.onn import OptINC

Average = Callable[[np.ndarray, float], np.ndarray]  # (workers x P, scale) -> workers x P
HIDDEN = 32


@dataclass
class TrainResult:
    accuracy: list[float] = field(default_factory=list)  # worker 0's, after each epoch
    drift: list[float] = field(default_factory=list)  # max |replica - worker 0's| weight

    @property
    def final(self) -> float:
        return self.accuracy[-1]


def _data(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    d = load_digits()
    x, y = d.data / 16.0, d.target
    order = np.random.default_rng(seed).permutation(len(y))
    cut = int(0.7 * len(y))
    return x[order[:cut]], y[order[:cut]], x[order[cut:]], y[order[cut:]]


def _init(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed + 1)
    w1 = rng.normal(0, np.sqrt(2 / 64), (64, HIDDEN))
    w2 = rng.normal(0, np.sqrt(2 / HIDDEN), (HIDDEN, 10))
    return np.concatenate([w1.ravel(), np.zeros(HIDDEN), w2.ravel(), np.zeros(10)])


def _unpack(p: np.ndarray) -> tuple[np.ndarray, ...]:
    a, b, c = 64 * HIDDEN, 64 * HIDDEN + HIDDEN, 64 * HIDDEN + HIDDEN + HIDDEN * 10
    return p[:a].reshape(64, HIDDEN), p[a:b], p[b:c].reshape(HIDDEN, 10), p[c:]


def _forward(p: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    w1, b1, w2, b2 = _unpack(p)
    h = np.maximum(x @ w1 + b1, 0)
    z = h @ w2 + b2
    z = np.exp(z - z.max(axis=1, keepdims=True))
    return h, z / z.sum(axis=1, keepdims=True)


def _grad(p: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    w2 = _unpack(p)[2]
    h, prob = _forward(p, x)
    dz = prob.copy()
    dz[np.arange(len(y)), y] -= 1
    dz /= len(y)
    dh = (dz @ w2.T) * (h > 0)
    return np.concatenate([(x.T @ dh).ravel(), dh.sum(0), (h.T @ dz).ravel(), dz.sum(0)])


def train(workers: int, average: Average, epochs: int = 30, batch: int = 16,
          lr: float = 0.1, seed: int = 0) -> TrainResult:
    xtr, ytr, xte, yte = _data(seed)
    shards = np.array_split(np.arange(len(ytr)), workers)
    steps = min(len(s) for s in shards) // batch
    if steps < 1:
        raise ValueError(f"{workers} workers leave fewer than {batch} samples each")
    p = np.repeat(_init(seed)[None, :], workers, axis=0)  # each worker's replica
    rng = np.random.default_rng(seed + 2)
    res = TrainResult()
    for _ in range(epochs):
        perm = [rng.permutation(s) for s in shards]
        for k in range(steps):
            g = np.stack([_grad(p[i], xtr[o[k * batch:(k + 1) * batch]],
                                ytr[o[k * batch:(k + 1) * batch]])
                          for i, o in enumerate(perm)])
            scale = float(np.abs(g).max()) or 1.0
            # each worker applies what reached it: optically, its own port's copy
            p = p - lr * average(g, scale)
        res.accuracy.append(float((_forward(p[0], xte)[1].argmax(1) == yte).mean()))
        res.drift.append(float(np.abs(p - p[0]).max()))
    return res


def exact(g: np.ndarray, _scale: float) -> np.ndarray:
    return np.repeat(g.mean(axis=0, keepdims=True), len(g), axis=0)


def compare(workers: int, comp: Components, ports: int = 32, epochs: int = 30,
            seed: int = 0) -> tuple[TrainResult, TrainResult, OptINC]:
    """The same training with exact and optical averaging."""
    fabric = OptINC(workers, ports, comp, seed)
    return (train(workers, exact, epochs, seed=seed),
            train(workers, fabric.average, epochs, seed=seed), fabric)
