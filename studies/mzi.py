"""Mach-Zehnder meshes (OptINC, seeds/004 Fig. 2): an n x n unitary as an interleaving
(Clements) array of MZIs, each two directional couplers and two phase shifters, and the
array's phases back from a unitary.

One MZI on modes (m, m+1), light entering on the left:

    phase phi on the top arm -> DC -> phase theta on the top arm -> DC

with a DC of splitting angle pi/4 (50:50), 1/sqrt(2) [[1, i], [i, 1]]. Ideal, it is
i e^(i theta/2) [[e^(i phi) sin(theta/2), cos(theta/2)], [e^(i phi) cos(theta/2),
-sin(theta/2)]]. A mesh is its MZIs in the order light meets them, then a screen of
output phase shifters. `decompose` nulls U's lower triangle diagonal by diagonal,
alternately from the right and the left (Clements et al., Optica 3:1460, 2016), then
moves the left-hand MZIs through the diagonal so every MZI precedes the screen.

The devices are not ideal (`Components`): couplers split off 50:50 by a static
fabrication error, phase shifters are set by DACs of finite resolution and jitter, each
MZI loses light. `Mesh.matrix` is what the array does to light under those; a mesh's
phases can be recalibrated against them (studies/onn.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

import numpy as np
from oddl.studies.arrays import Complex, Floats

TWO_PI = 2 * np.pi


@dataclass(frozen=True)
class Components:
    """Non-idealities; the defaults are ideal. Units are the devices' own."""

    dac_bits: int | None = None  # phase-shifter DAC: 2^bits settings over 2 pi
    phase_noise_rad: float = 0.0  # per-use jitter of every phase shifter (thermal), rms
    coupler_error_rad: float = 0.0  # static splitting-angle error of every DC, rms
    mzi_loss_db: float = 0.0  # insertion loss of one MZI
    detector_noise: float = 0.0  # additive, rms, as a fraction of full scale
    output_bits: int | None = None  # the result's quantisation (the gradient's width)

    @property
    def transmission(self) -> float:
        """An MZI's field transmission (its insertion loss)."""
        return float(10 ** (-self.mzi_loss_db / 20))

    def quantise_phase(self, p: Floats) -> Floats:
        if self.dac_bits is None:
            return p
        step = TWO_PI / 2**self.dac_bits
        return cast(Floats, np.round(np.mod(p, TWO_PI) / step) * step)


def mzi(theta: float, phi: float, dc: tuple[float, float] = (np.pi / 4, np.pi / 4)
        ) -> Complex:
    """The 2 x 2 transfer of one MZI, built from its parts."""
    def coupler(a: float) -> Complex:
        return np.array([[np.cos(a), 1j * np.sin(a)], [1j * np.sin(a), np.cos(a)]])

    return cast(Complex, coupler(dc[1]) @ np.diag([np.exp(1j * theta), 1.0]) @ coupler(dc[0])
                @ np.diag([np.exp(1j * phi), 1.0]))


@dataclass
class Mesh:
    """An n-mode interleaving MZI array: `mzis[k]` = (top mode, theta, phi), in the order
    light meets them, then the output phase screen."""

    n: int
    mzis: list[tuple[int, float, float]]
    screen: Floats
    # static per-device errors, drawn once (a chip's fabrication): coupler angles
    dc_error: Floats = field(default_factory=lambda: np.zeros((0, 2)))

    @property
    def phases(self) -> Floats:
        """Every programmable phase, MZIs (theta, phi) then the screen: what calibration
        sets."""
        return np.concatenate([np.array([(t, p) for _, t, p in self.mzis]).ravel()
                               if self.mzis else np.zeros(0), self.screen])

    def with_phases(self, ph: Floats) -> Mesh:
        k = len(self.mzis)
        tp = ph[: 2 * k].reshape(k, 2) if k else np.zeros((0, 2))
        return Mesh(self.n, [(m, float(t), float(p)) for (m, _, _), (t, p)
                             in zip(self.mzis, tp, strict=True)],
                    np.array(ph[2 * k:], dtype=float), self.dc_error)

    def fabricate(self, comp: Components, rng: np.random.Generator) -> Mesh:
        """This design on one chip: its couplers' static splitting errors drawn."""
        err = rng.normal(0.0, comp.coupler_error_rad, (len(self.mzis), 2)) \
            if comp.coupler_error_rad else np.zeros((len(self.mzis), 2))
        return Mesh(self.n, list(self.mzis), self.screen.copy(), err)

    def matrix(self, comp: Components | None = None,
               rng: np.random.Generator | None = None) -> Complex:
        """What the array does to light: phases through the DACs (and jitter, if `rng`),
        couplers with this chip's errors, loss in every MZI."""
        comp = comp or Components()
        return self.transfer(self.setting(comp, rng), comp.transmission)

    def setting(self, comp: Components, rng: np.random.Generator | None) -> Floats:
        """The phases as set: through the DACs, with a pass's jitter if `rng`."""
        ph = comp.quantise_phase(self.phases)
        if comp.phase_noise_rad and rng is not None:
            ph = ph + rng.normal(0.0, comp.phase_noise_rad, ph.shape)
        return ph

    def transfer(self, ph: Floats, loss: float) -> Complex:
        """The array's matrix at phases `ph` as set (after DACs and jitter), with this
        chip's couplers and `loss` (field transmission) in every MZI."""
        k = len(self.mzis)
        dce = self.dc_error if len(self.dc_error) == k else np.zeros((k, 2))
        u = np.eye(self.n, dtype=complex)
        for j, (m, _, _) in enumerate(self.mzis):
            t = mzi(ph[2 * j], ph[2 * j + 1], (np.pi / 4 + dce[j, 0], np.pi / 4 + dce[j, 1]))
            u[m:m + 2, :] = loss * (t @ u[m:m + 2, :])
        return cast(Complex, np.exp(1j * ph[2 * k:])[:, None] * u)

    @property
    def depth(self) -> int:
        """Columns of MZIs light crosses (n for a full Clements array)."""
        col = [0] * self.n
        for m, _, _ in self.mzis:
            col[m] = col[m + 1] = max(col[m], col[m + 1]) + 1
        return max(col, default=0)


def _embed(n: int, m: int, t: Complex) -> Complex:
    e = np.eye(n, dtype=complex)
    e[m:m + 2, m:m + 2] = t
    return e


def decompose(u: Complex) -> Mesh:
    """The interleaving mesh whose ideal matrix is the unitary `u` (to rounding)."""
    n = u.shape[0]
    if u.shape != (n, n) or not np.allclose(u.conj().T @ u, np.eye(n), atol=1e-8):
        raise ValueError(f"not a unitary: shape {u.shape}")
    w = np.array(u, dtype=complex)
    right: list[tuple[int, float, float]] = []
    left: list[tuple[int, float, float]] = []
    for i in range(n - 1):
        if i % 2 == 0:  # null w[n-1-j, i-j] with an MZI on columns (i-j, i-j+1)
            for j in range(i + 1):
                r, c = n - 1 - j, i - j
                a, b = w[r, c], w[r, c + 1]
                theta = 2 * np.arctan2(abs(b), abs(a))
                phi = float(np.angle(-a / b)) if abs(b) > 0 else 0.0
                w = w @ _embed(n, c, mzi(theta, phi)).conj().T
                right.append((c, theta, phi))
        else:  # null w[n+j-i-2, j-1] with an MZI on rows (n+j-i-3, n+j-i-2)
            for j in range(1, i + 2):
                r, c = n + j - i - 2, j - 1
                a, b = w[r - 1, c], w[r, c]
                theta = 2 * np.arctan2(abs(a), abs(b))
                phi = float(np.angle(b / a)) if abs(a) > 0 else 0.0
                w = _embed(n, r - 1, mzi(theta, phi)) @ w
                left.append((r - 1, theta, phi))
    d = np.diag(w).copy()
    # u = L1^-1 ... Lk^-1 D R_j ... R_1; T(theta, phi)^-1 diag(d1, d2) =
    # diag(K e^(-i phi) d2, K d2) T(theta, arg(d1 / d2)) with K = -e^(-i theta)
    moved = []
    for m, theta, phi in reversed(left):
        k = -np.exp(-1j * theta)
        d1, d2 = d[m], d[m + 1]
        moved.append((m, theta, float(np.angle(d1 / d2))))
        d[m], d[m + 1] = k * np.exp(-1j * phi) * d2, k * d2
    # light meets R_1 first, then R_j, then the moved Lk ... L1
    return Mesh(n, right + moved, np.angle(d))
