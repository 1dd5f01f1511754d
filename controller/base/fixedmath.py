"""Arithmetic on arrays that gives the same bits on every x86-64.

numpy picks its loops by the CPU: with AVX-512 its exp, log, pow, tanh, sin and cos are
its own SIMD code (SVML), which differs from the C library's in the last bit; and a matrix
product goes to OpenBLAS, whose kernel (Haswell, SkylakeX, Zen, ...) is chosen per CPU and
sums in its own order, with fused multiply-adds. A figure computed through them moves
with the machine (docs/optinc.md's accuracies differed by a test image or two between a
Zen 4 and an older VM). Here:
- the elementary functions are the C library's (`math`, `cmath`), value by value, as the
  compiled congestion tick (sim/networks/lawkernel.pyx) takes them;
- a matrix product is the products, each rounded (numpy's multiply: IEEE, no FMA), summed
  in index order along the contracted axis (a reduction across an outer axis: one add at
  a time), with no BLAS.
Slower than numpy's own (a 16 x 64 by 64 x 32 product: ~3x), so used where a figure must
not depend on the machine: the studies' training and the congestion laws.
"""

from __future__ import annotations

import cmath
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[np.float64]


def libm(f: Callable[..., float], *args: npt.ArrayLike) -> Array:
    """`f` of the C library applied value by value (map and fromiter: np.vectorize takes
    twice as long), in the shape of the first argument."""
    arrays = np.broadcast_arrays(*(np.asarray(a, dtype=np.float64) for a in args))
    flat = [a.ravel().tolist() for a in arrays]
    n = arrays[0].size
    return np.fromiter(map(f, *flat), np.float64, n).reshape(arrays[0].shape)


def exp(x: npt.ArrayLike) -> Array:
    return libm(math.exp, x)


def log(x: npt.ArrayLike) -> Array:
    return libm(math.log, x)


def log1p(x: npt.ArrayLike) -> Array:
    return libm(math.log1p, x)


def tanh(x: npt.ArrayLike) -> Array:
    return libm(math.tanh, x)


def sin(x: npt.ArrayLike) -> Array:
    return libm(math.sin, x)


def cos(x: npt.ArrayLike) -> Array:
    return libm(math.cos, x)


def expi(x: npt.ArrayLike) -> npt.NDArray[np.complex128]:
    """exp(1j x) for real x, as cos x + 1j sin x of the C library."""
    a = np.asarray(x, dtype=np.float64)
    return np.fromiter(map(lambda v: cmath.exp(1j * v), a.ravel().tolist()),
                       np.complex128, a.size).reshape(a.shape)


def matmul(a: npt.ArrayLike, b: npt.ArrayLike) -> npt.NDArray[Any]:
    """a @ b (2-D by 2-D, or a stack of them by one 2-D), each output the sum of its
    products in index order: the same bits on every CPU (no BLAS, no FMA)."""
    a, b = np.asarray(a), np.asarray(b)
    if b.ndim != 2 or a.ndim < 2:
        raise ValueError(f"matmul of shapes {a.shape} and {b.shape}: a 2-D right operand")
    # (..., rows, k, cols), reduced over k, an outer axis: one add per k, in order
    out: npt.NDArray[Any] = np.add.reduce(a[..., None] * b, axis=-2)
    return out
