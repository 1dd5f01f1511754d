"""OptINC's optical neural network (seeds/004): weight matrices realised as MZI meshes and
attenuators, and the unit that averages N servers' gradients in flight.

- A weight matrix W = U S V^H is realised as mesh(V^H), attenuators S / s_max (passive,
  so at most 1) and mesh(U), with the gain s_max restored at the receiver (`Block`).
- A non-square W is cut into square sub-matrices (Fig. 4): a wide one horizontally (the
  blocks' outputs add), a tall one vertically (the input fans out to every block), padded
  with zeros to a multiple of the short side (`realise`).
- The averaging unit's W is (1/N) 1 1^T: every output port carries the mean, so each
  server reads its own port (the splitting unit T is W's rows). Inputs and outputs are
  the gradient's B-bit values on a scale the servers share; light carries them as signed
  field amplitudes and the receivers detect coherently (the real part).
- Hardware-aware calibration chooses the phases (and the receiver gain) that bring this
  chip's matrix, couplers' errors and losses included, closest to W, by least squares
  (scipy); what cannot be calibrated away (phase jitter, detector noise, quantisation)
  stays.
- Two levels of units serve N^2 servers (Fig. 5): each first-level unit averages its group
  and sends one output up; the second level averages the groups' means and sends them
  down, where a passive splitter hands each group's mean to its servers.

Where the paper is silent these are our choices; docs/optinc.md lists them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np
from oddl.controller.base.collectives import optinc_levels
from oddl.studies.arrays import Complex, Floats
from oddl.studies.mzi import Components, Mesh, decompose
from scipy.optimize import least_squares

# A plausible chip (docs/optinc.md says where each figure comes from): 12-bit phase DACs,
# 0.01 rad of phase jitter, couplers 0.02 rad (about 1 %) off 50:50, 0.1 dB per MZI, a
# receiver noise of 0.1 % of full scale, and 8-bit gradients.
CHIP = Components(dac_bits=12, phase_noise_rad=0.01, coupler_error_rad=0.02, mzi_loss_db=0.1,
                  detector_noise=0.001, output_bits=8)


@dataclass
class Block:
    """One square W_s = gain * U diag(att) V^H on a chip."""

    v: Mesh  # realises V^H, met first
    att: Floats  # attenuator transmissions, 0..1
    u: Mesh
    gain: float

    @classmethod
    def of(cls, w: Floats) -> Block:
        u, s, vh = np.linalg.svd(w)
        top = float(s.max()) or 1.0
        return cls(decompose(vh), s / top, decompose(u), top)

    def fabricate(self, comp: Components, rng: np.random.Generator) -> Block:
        return Block(self.v.fabricate(comp, rng), self.att.copy(),
                     self.u.fabricate(comp, rng), self.gain)

    def matrix(self, comp: Components | None = None,
               rng: np.random.Generator | None = None) -> Complex:
        comp = comp or Components()
        u = self.u.setting(comp, rng)  # (U's jitter drawn first)
        return self.transfer(np.concatenate([self.v.setting(comp, rng), u, [self.gain]]),
                             comp.transmission)

    def transfer(self, p: Floats, loss: float) -> Complex:
        """The block at parameters `p` as set (`phases`' order: V's, U's, then the gain),
        each MZI transmitting `loss`."""
        nv = 2 * len(self.v.mzis) + len(self.v.screen)
        return cast(Complex, p[-1] * (self.u.transfer(p[nv:-1], loss) * self.att[None, :])
                    @ self.v.transfer(p[:nv], loss))

    @property
    def phases(self) -> Floats:
        return np.concatenate([self.v.phases, self.u.phases, [self.gain]])

    def with_phases(self, p: Floats) -> Block:
        nv = len(self.v.phases)
        nu = len(self.u.phases)
        return Block(self.v.with_phases(p[:nv]), self.att,
                     self.u.with_phases(p[nv:nv + nu]), float(p[nv + nu]))


@dataclass
class Realised:
    """W as square blocks: 'square', 'horizontal' (outputs add) or 'vertical' (stacked)."""

    how: str
    blocks: list[Block]
    shape: tuple[int, int]

    def matrix(self, comp: Components | None = None,
               rng: np.random.Generator | None = None) -> Complex:
        return self.assemble([b.matrix(comp, rng) for b in self.blocks])

    def assemble(self, ms: list[Complex]) -> Complex:
        """W from its blocks' matrices, in `blocks`' order."""
        full = np.hstack(ms) if self.how == "horizontal" else np.vstack(ms)
        return full[: self.shape[0], : self.shape[1]]


def realise(w: Floats) -> Realised:
    """A weight matrix as mesh-attenuator-mesh blocks, partitioned as Fig. 4 does."""
    a, b = w.shape
    k = min(a, b)
    if a == b:
        return Realised("square", [Block.of(w)], (a, b))
    how = "horizontal" if b > a else "vertical"
    n = -(-max(a, b) // k)
    pad = np.zeros((a, n * k) if how == "horizontal" else (n * k, b), dtype=complex)
    pad[:a, :b] = w
    parts = [pad[:, i * k:(i + 1) * k] if how == "horizontal" else pad[i * k:(i + 1) * k, :]
             for i in range(n)]
    return Realised(how, [Block.of(p) for p in parts], (a, b))


def quantise(x: Floats, bits: int | None, scale: float) -> Floats:
    """Symmetric uniform quantisation to `bits` over [-scale, scale] (clipped)."""
    if bits is None:
        return x
    levels = 2 ** (bits - 1) - 1
    return cast(Floats, np.clip(np.round(x / scale * levels), -levels, levels) * scale / levels)


class AveragingUnit:
    """One OptINC unit on one chip: N inputs to N copies of their mean."""

    def __init__(self, n: int, comp: Components | None = None, seed: int = 0,
                 calibrate: bool = True) -> None:
        self.n = n
        self.comp = comp or Components()
        self.target = np.full((n, n), 1.0 / n)
        self.rng = np.random.default_rng(seed)
        self.block = Block.of(self.target).fabricate(self.comp, self.rng)
        self.error_before = self.matrix_error()
        if calibrate and self.error_before > 1e-12:  # an ideal chip needs none
            self.calibrate()
        self.error_after = self.matrix_error()

    def matrix_error(self) -> float:
        """Max |chip - W| over the elements, DAC settings applied, no jitter."""
        return float(np.abs(self.block.matrix(self.comp) - self.target).max())

    def calibrate(self) -> None:
        """Least squares over every phase and the receiver gain, against this chip's
        couplers and losses (what a lab measures once per chip); the DACs then round."""
        # the chip's coupler errors are in its meshes (fabricate): fit with them and the
        # loss, without the DAC rounding and the jitter
        fitted = Components(mzi_loss_db=self.comp.mzi_loss_db)

        def resid(p: Floats) -> Floats:
            d = self.block.with_phases(p).matrix(fitted) - self.target
            return np.concatenate([d.real.ravel(), d.imag.ravel()])

        fit = least_squares(resid, self.block.phases, method="trf", xtol=1e-10, ftol=1e-12)
        self.block = self.block.with_phases(fit.x)

    def field(self, x: Floats, rng: np.random.Generator | None = None) -> Complex:
        """The optical output for inputs x (N x k), before detection."""
        return self.block.matrix(self.comp, rng) @ x


def detect(y: Complex, comp: Components, scale: float, rng: np.random.Generator
           ) -> Floats:
    """Coherent receivers: the real part, detector noise, then the B-bit output."""
    out = y.real
    if comp.detector_noise:
        out = out + rng.normal(0.0, comp.detector_noise * scale, out.shape)
    return quantise(out, comp.output_bits, scale)


class OptINC:
    """The averaging fabric for `servers` servers: one unit, or two levels when there are
    more servers than a unit has ports (groups of `ports`, at most ports^2)."""

    def __init__(self, servers: int, ports: int = 32, comp: Components = CHIP,
                 seed: int = 0, calibrate: bool = True) -> None:
        self.servers, self.comp = servers, comp
        self.levels = optinc_levels(servers, ports)
        if len(self.levels) == 1:
            self.units = [AveragingUnit(servers, self.comp, seed, calibrate)]
            self.top: AveragingUnit | None = None
        else:
            g, n_groups = self.levels
            self.units = [AveragingUnit(g, self.comp, seed + 1 + i, calibrate)
                          for i in range(n_groups)]
            self.top = AveragingUnit(n_groups, self.comp, seed, calibrate)
        self.rng = np.random.default_rng(seed + 10_000)

    def average(self, x: Floats, scale: float) -> Floats:
        """x: servers x k values (each server's B-bit gradient, on a shared scale); what
        every server receives back, servers x k."""
        xq = quantise(x, self.comp.output_bits, scale)
        if self.top is None:
            y = self.units[0].field(xq, self.rng)
        else:
            g = self.levels[0]
            up = np.stack([u.field(xq[i * g:(i + 1) * g], self.rng)[0]
                           for i, u in enumerate(self.units)])
            down = self.top.field(up, self.rng)
            y = np.repeat(down, g, axis=0)  # each group's splitter
        return detect(y, self.comp, scale, self.rng)

    @property
    def matrix_error(self) -> float:
        return max(u.error_after for u in [*self.units, *([self.top] if self.top else [])])
