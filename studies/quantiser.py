"""OptINC's trained optical neural network (seeds/004): N servers' B-bit values in, the
B-bit rounded mean out, the quantisation done by the network's own nonlinear elements.

The seed gives the abstract only; the structure below is our design (docs/optinc.md).

- **Lanes.** Each server sends a value v (its gradient as a B-bit unsigned number on the
  scale the servers agree) as B on/off lanes, one per bit.
- **Preprocessing P** (passive, linear): for each bit significance k, a coherent N:1
  combiner adds the N servers' k-th lanes, so P hands on B amplitudes c_k in 0..N. The
  ONN's domain shrinks from 2^(N B) input vectors to (N+1)^B, and, because every
  significance is alike, to one small function learnt once: `Cell`.
- **The cell** takes c_k and the carry from the significance below (0..N-1) and emits
  bit k of the running sum and the carry up: t = c_k + carry, bit t mod 2, carry t div 2.
  It is two weight matrices realised as MZI meshes (studies/onn.py's mesh, attenuators,
  mesh, cut into square blocks as Fig. 4 does) with 2N nonlinear ports between them
  (`hidden`) and two linear bypass ports.
- **The nonlinearity** is detection and re-modulation: a photodiode, a limiting
  transimpedance amplifier (tanh, its gain trained) and a push-pull Mach-Zehnder
  modulator biased at null on a fresh carrier (field sin(pi/2 x)): f(z) = sin(pi/2
  tanh(g Re z)). Saturation is what quantises.
- **Averaging and rounding.** The cells ripple from the least significant bit; the first
  cell's carry input is a constant light of N/2 (so the sum is rounded, not truncated),
  and dividing by N = 2^p drops the p lowest bits: the B output ports carry
  round(sum / N) in binary, read by ordinary on-off receivers (a threshold, not an ADC).
- **Two levels** (Fig. 5, N^2 servers): each first-level unit emits its group's whole
  sum plus g/2 (B + p bits, nothing dropped); the second level adds the G groups' sums and
  drops 2p bits. One rounding, so the cascade is exact too.
- **Hardware-aware training.** Trained ideally, the weights are decomposed into phases
  and used as they are. Trained hardware-aware, each cell's phases and gains are then
  refined through its chip as measured (couplers' errors, loss), by sample-average least
  squares over draws of phase jitter, detector noise and noisy inputs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
from oddl.studies.arrays import Complex, Floats, Ints
from oddl.studies.mzi import Components
from oddl.studies.onn import Realised, realise
from scipy.optimize import least_squares

IN, OUT = 3, 2  # cell ports: (c, carry, constant light) in; (bit, carry) out
SIZES = (4, 8)  # the servers of the shipped units (studies/data/quantiser-n<N>.json)
# Known values sent beside every pass's gradient, so the receivers can tell a disturbed
# pass (`Quantiser.run_checked`): 64 of them against a gradient of thousands.
PILOTS, PILOT_SEED = 64, 4242


def hidden(servers: int) -> int:
    """A cell's nonlinear ports for N servers: 2N (8 at N = 4 trained from 9 of 10 starts;
    the carry takes N values, and the rule gives each a pair)."""
    return 2 * servers


def trained_path(servers: int) -> Path:
    """The shipped unit for `servers` servers."""
    return Path(__file__).with_name("data") / f"quantiser-n{servers}.json"


def _act(z: Floats, g: Floats) -> Floats:
    return cast(Floats, np.sin(np.pi / 2 * np.tanh(g * z)))


@dataclass
class Weights:
    """A cell in weight space: w1 (H+2 x IN), the H amplifiers' gains, w2 (OUT x H+2)."""

    w1: Floats
    gain: Floats
    w2: Floats

    def forward(self, x: Floats) -> Floats:
        z = x @ self.w1.T
        h, k = z.copy(), self.gain.size
        h[:, :k] = _act(z[:, :k], self.gain)
        return h @ self.w2.T


def cell_table(n: int, preprocessed: bool = True) -> tuple[Floats, Floats]:
    """Every input a cell can see with N servers, and what it must emit: ((c/N, carry/N,
    1) rows, (bit, carry_out/N) rows). Without P a cell sees the N lanes themselves:
    (lane_1 .. lane_N, carry/N, 1)."""
    if preprocessed:
        c, r = np.meshgrid(np.arange(n + 1), np.arange(n), indexing="ij")
        t = (c + r).ravel()
        x = np.stack([c.ravel() / n, r.ravel() / n, np.ones(t.size)], axis=1)
    else:
        lanes = (np.arange(2 ** n)[:, None] >> np.arange(n)) & 1
        rows = [(*b, r) for b in lanes for r in range(n)]
        a = np.array(rows, dtype=float)
        t = (a[:, :n].sum(axis=1) + a[:, n]).astype(int)
        x = np.column_stack([a[:, :n], a[:, n] / n, np.ones(len(a))])
    return x, np.stack([t % 2, (t // 2) / n], axis=1)


class _CellFit:
    """The least-squares problem of a cell in weight space: its table `x` -> `y`, `nh`
    nonlinear ports, each residual taken under every one of the fixed draws: the inputs
    as they arrive (`xs`) and the noise before the amplifiers (`shifts`); with its exact
    Jacobian."""

    def __init__(self, xs: list[Floats], y: Floats, nh: int, shifts: list[Any]
                 ) -> None:
        self.xs, self.y, self.nh, self.shifts = xs, y, nh, shifts
        self.width = nh + 2
        self.n1 = self.width * xs[0].shape[1]

    def unpack(self, p: Floats) -> Weights:
        n1, nh = self.n1, self.nh
        return Weights(p[:n1].reshape(self.width, self.xs[0].shape[1]), p[n1:n1 + nh],
                       p[n1 + nh:].reshape(OUT, self.width))

    def resid(self, p: Floats) -> Floats:
        w, nh = self.unpack(p), self.nh
        out = []
        for x, d in zip(self.xs, self.shifts, strict=True):
            z = x @ w.w1.T + d
            z[:, :nh] = _act(z[:, :nh], w.gain)
            out.append((z @ w.w2.T - self.y).ravel())
        return np.concatenate(out)

    def jac(self, p: Floats) -> Floats:
        """The residuals' exact slopes (finite differences cost a pass a parameter)."""
        w, nh, rows = self.unpack(p), self.nh, []
        for x, d in zip(self.xs, self.shifts, strict=True):
            z = x @ w.w1.T + d
            a = np.tanh(w.gain * z[:, :nh])
            slope = np.cos(np.pi / 2 * a) * np.pi / 2 * (1 - a * a)  # d act / d (g z)
            h, dz = z.copy(), np.ones_like(z)
            h[:, :nh] = np.sin(np.pi / 2 * a)
            dz[:, :nh] = slope * w.gain
            back = w.w2[None, :, :] * dz[:, None, :]  # d out[r, o] / d z[r, j]
            j1 = (back[..., None] * x[:, None, None, :]).reshape(len(x) * OUT, -1)
            jg = (w.w2[None, :, :nh] * (slope * z[:, :nh])[:, None, :]).reshape(
                len(x) * OUT, nh)
            j2 = np.einsum("ok,rj->rokj", np.eye(OUT), h).reshape(len(x) * OUT, -1)
            rows.append(np.hstack([j1, jg, j2]))
        return np.vstack(rows)


def train_weights(n: int, seed: int = 0, noise: float = 0.0, restarts: int = 10,
                  preprocessed: bool = True) -> Weights:
    """Least squares from random starts, the amplifiers' gain bound raised step by step
    (a steep tanh from the start leaves gradient descent on a plateau); the first start
    that is exact on the whole table with a margin, else the best, with `noise` injected
    before the amplifiers (8 fixed draws: a smooth objective)."""
    x, y = cell_table(n, preprocessed)
    nh = hidden(n)
    rng0 = np.random.default_rng(0)
    draws = 8 if noise else 1
    fit = _CellFit([x] * draws, y, nh, [rng0.normal(0.0, noise, (x.shape[0], nh + 2))
                                        if noise else 0.0 for _ in range(draws)])
    n1 = fit.n1
    best: tuple[float, Weights] | None = None
    for s in range(restarts):
        rng = np.random.default_rng(seed * 1000 + s)
        p = np.concatenate([rng.normal(0, 1, n1), rng.uniform(0.5, 1, nh),
                            rng.normal(0, 1, OUT * fit.width)])
        for cap in (1, 2, 4, 8, 16, 40):
            lo, hi = np.full(p.size, -np.inf), np.full(p.size, np.inf)
            lo[n1:n1 + nh], hi[n1:n1 + nh] = 0, cap
            p[n1:n1 + nh] = np.minimum(p[n1:n1 + nh] * 2, cap * 0.999)
            p = least_squares(fit.resid, p, jac=fit.jac, bounds=(lo, hi), max_nfev=300).x
        w = fit.unpack(p)
        err = _table_margin(w.forward(x), y, n)
        if best is None or err > best[0]:
            best = (err, w)
        if err > 0.25 / n:  # exact with half the margin a carry can have (0.5 / n)
            break
    assert best is not None
    return best[1]


def _table_margin(out: Floats, want: Floats, n: int) -> float:
    """How far the worst output is from its decision threshold (negative: wrong)."""
    bit = np.where(want[:, 0] > 0.5, out[:, 0] - 0.5, 0.5 - out[:, 0])
    carry = 0.5 / n - np.abs(out[:, 1] - want[:, 1])
    return float(min(bit.min(), carry.min()))


@dataclass
class Cell:
    """A cell on a chip: its two matrices as MZI blocks, and the amplifiers' gains."""

    l1: Realised
    l2: Realised
    gain: Floats

    @classmethod
    def of(cls, w: Weights) -> Cell:
        return cls(realise(w.w1.astype(complex)), realise(w.w2.astype(complex)),
                   w.gain.copy())

    def fabricate(self, comp: Components, rng: np.random.Generator) -> Cell:
        """This design on one chip: every coupler's static error drawn."""
        return Cell(_fab(self.l1, comp, rng), _fab(self.l2, comp, rng), self.gain.copy())

    @property
    def mzis(self) -> int:
        return sum(len(b.v.mzis) + len(b.u.mzis) for b in [*self.l1.blocks,
                                                            *self.l2.blocks])

    @property
    def params(self) -> Floats:
        """Every phase, receiver gain and amplifier gain: what hardware-aware training
        sets."""
        return np.concatenate([b.phases for b in [*self.l1.blocks, *self.l2.blocks]]
                              + [self.gain])

    def with_params(self, p: Floats) -> Cell:
        out, i = [], 0
        for r in (self.l1, self.l2):
            blocks = []
            for b in r.blocks:
                k = b.phases.size
                blocks.append(b.with_phases(p[i:i + k]))
                i += k
            out.append(Realised(r.how, blocks, r.shape))
        return Cell(out[0], out[1], np.array(p[i:], dtype=float))

    def matrices(self, comp: Components, rng: np.random.Generator | None
                 ) -> tuple[Complex, Complex]:
        """One pass's two matrices (DACs, jitter if `rng`, loss, this chip's couplers)."""
        return self.l1.matrix(comp, rng), self.l2.matrix(comp, rng)

    def run(self, x: Complex, m: tuple[Complex, Complex], comp: Components,
            rng: np.random.Generator | None) -> Complex:
        """Fields out (k x 2) for fields in (k x 3), with one pass's matrices."""
        noise = rng.normal(0.0, comp.detector_noise, (len(x), self.gain.size)) \
            if comp.detector_noise and rng is not None else 0.0
        return _through(x, m, self.gain, noise)


def _through(x: Complex, m: tuple[Complex, Complex], gain: Floats,
             noise: Floats | float) -> Complex:
    """A cell's fields out: its first matrix, the detectors (with `noise`) and amplifiers
    on the nonlinear ports, its second matrix."""
    z = x @ m[0].T
    h, k = z.copy(), gain.size
    h[:, :k] = _act(z[:, :k].real + noise, gain)
    return h @ m[1].T


def _fab(r: Realised, comp: Components, rng: np.random.Generator) -> Realised:
    return Realised(r.how, [b.fabricate(comp, rng) for b in r.blocks], r.shape)


class Averager:
    """What a trained unit and a cascade of them share: `servers` B-bit values in, their
    rounded mean out (`run`), checked passes and the measured share of exact outputs."""

    servers: int
    bits: int

    def run(self, values: Ints) -> Ints:
        raise NotImplementedError

    @property
    def pass_ns(self) -> float:
        """One optical pass, light in to bits out."""
        raise NotImplementedError

    def run_checked(self, values: Ints, pilots: int = PILOTS, tries: int = 8
                    ) -> tuple[Ints, int]:
        """A pass with `pilots` known vectors beside the values; while a pilot comes out
        wrong (a disturbed pass: the jitter is drawn anew each pass), the pass is sent
        again, up to `tries` times. The last pass's output, and how many passes."""
        known = np.random.default_rng(PILOT_SEED).integers(
            0, 2 ** self.bits, (self.servers, pilots))
        want = rounded_mean(known)
        v = np.concatenate([np.asarray(values, dtype=np.int64), known], axis=1)
        n = 0
        while True:
            n += 1
            out = self.run(v)
            if (out[-pilots:] == want).all() or n == tries:
                return out[:-pilots], n

    def exact_share(self, samples: int = 20_000, per_pass: int = 250, seed: int = 1,
                    checked: bool = False) -> tuple[float, dict[int, int], float]:
        """Share of random inputs whose output equals the exact rounded mean, the errors'
        histogram (output - exact: count) and the passes a pass took (`checked`: with
        pilots, `run_checked`)."""
        rng = np.random.default_rng(seed)
        diffs, passes = [], []
        for _ in range(max(1, samples // per_pass)):
            v = rng.integers(0, 2 ** self.bits, (self.servers, per_pass))
            out, n = self.run_checked(v) if checked else (self.run(v), 1)
            diffs.append(out - rounded_mean(v))
            passes.append(n)
        d = np.concatenate(diffs)
        errs, counts = np.unique(d[d != 0], return_counts=True)
        return (float((d == 0).mean()), dict(zip(errs.tolist(), counts.tolist(), strict=True)),
                float(np.mean(passes)))


class Quantiser(Averager):
    """The trained unit for `servers` = 2^p servers and `bits`-bit values on one chip:
    P, then bits + p cells in a ripple. It adds `carry_in` (default N/2) and drops the
    `drop` (default p) lowest bits: the rounded mean. A cascade's first level keeps every
    bit (drop 0); its second level drops 2p."""

    def __init__(self, cells: list[Cell], servers: int, bits: int, comp: Components,
                 seed: int = 0, drop: int | None = None, carry_in: int | None = None
                 ) -> None:
        self.p = servers.bit_length() - 1
        if servers != 2 ** self.p or servers < 2:
            raise ValueError(f"{servers} servers: the unit divides by dropping bits, so "
                             "it needs a power of two")
        if len(cells) != bits + self.p:
            raise ValueError(f"{bits} bits for {servers} servers take {bits + self.p} "
                             f"cells, not {len(cells)}")
        self.cells, self.servers, self.bits, self.comp = cells, servers, bits, comp
        self.seed = seed
        self.drop = self.p if drop is None else drop
        self.carry_in = servers // 2 if carry_in is None else carry_in
        if not 0 <= self.carry_in < servers:
            raise ValueError(f"a carry of {self.carry_in} is outside the cell's 0..{servers - 1}")
        self.rng = np.random.default_rng(seed + 10_000)

    @classmethod
    def on_chip(cls, design: Cell, servers: int, bits: int, comp: Components,
                seed: int = 0, drop: int | None = None, carry_in: int | None = None
                ) -> Quantiser:
        """Every cell of the ripple a copy of `design`, fabricated on chip `seed`."""
        rng = np.random.default_rng(seed)
        n = bits + servers.bit_length() - 1
        return cls([design.fabricate(comp, rng) for _ in range(n)], servers, bits, comp,
                   seed, drop, carry_in)

    @property
    def pass_ns(self) -> float:
        return len(self.cells) * cell_ns(self.servers)

    @property
    def mzis(self) -> int:
        """The cells' and P's (a tree of N - 1 MZIs a significance)."""
        return sum(c.mzis for c in self.cells) + self.bits * (self.servers - 1)

    def run(self, values: Ints) -> Ints:
        """values: servers x k integers in 0..2^bits - 1; one optical pass (the phases'
        jitter drawn once: it is thermal, slow beside a symbol); the integers the
        receivers read."""
        n = self.servers
        v = np.asarray(values, dtype=np.int64)
        lanes = (v[..., None] >> np.arange(self.bits)) & 1  # servers x k x bits
        counts = lanes.sum(axis=0)  # P: each significance's lanes combined
        carry = np.full(v.shape[1], self.carry_in / n, dtype=complex)
        out = np.zeros(v.shape[1], dtype=np.int64)
        for k, cell in enumerate(self.cells):
            c = counts[:, k] if k < self.bits else np.zeros(v.shape[1])
            x = np.stack([c / n, carry, np.ones(v.shape[1])], axis=1).astype(complex)
            y = cell.run(x, cell.matrices(self.comp, self.rng), self.comp, self.rng)
            bit = y[:, 0].real
            if self.comp.detector_noise:
                bit = bit + self.rng.normal(0.0, self.comp.detector_noise, bit.shape)
            if k >= self.drop:
                out |= (bit > 0.5).astype(np.int64) << (k - self.drop)
            carry = y[:, 1]
        return out


def rounded_mean(v: Ints) -> Ints:
    """round(mean), halves up: what the unit must emit."""
    n = v.shape[0]
    return cast(Ints, (v.sum(axis=0) + n // 2) // n)


class Cascade(Averager):
    """Fig. 5 with trained units: N groups of N servers. Each first-level unit emits its
    group's sum + N/2 whole (bits + p bits); the second level adds them and drops 2p
    bits, so there is one rounding, as in a flat unit. Each unit is its own chip (seed
    + 1 + i for group i, `seed` for the second level); `tuned`, each chip's cells' phases
    after hardware-aware training in that order, puts them on."""

    def __init__(self, design: Cell, servers: int, bits: int, comp: Components,
                 seed: int = 0, tuned: list[list[Floats]] | None = None) -> None:
        self.g, self.servers, self.bits = servers, servers * servers, bits
        p = servers.bit_length() - 1
        units = [Quantiser.on_chip(design, servers, bits, comp, seed + 1 + i, drop=0)
                 for i in range(servers)]
        units.append(Quantiser.on_chip(design, servers, bits + p, comp, seed, drop=2 * p,
                                       carry_in=0))
        if tuned is not None:
            if len(tuned) != len(units) or any(len(t) != len(u.cells)
                                               for t, u in zip(tuned, units, strict=True)):
                raise ValueError(f"a cascade of {servers} x {servers} takes "
                                 f"{[len(u.cells) for u in units]} tuned cells a chip")
            units = [Quantiser([c.with_params(q) for c, q in zip(u.cells, t, strict=True)],
                               u.servers, u.bits, comp, u.seed, u.drop, u.carry_in)
                     for u, t in zip(units, tuned, strict=True)]
        self.first, self.top = units[:-1], units[-1]

    @property
    def units(self) -> list[Quantiser]:
        return [*self.first, self.top]

    @property
    def mzis(self) -> int:
        return sum(u.mzis for u in self.units)

    @property
    def pass_ns(self) -> float:
        """The two levels one after the other (the light is not detected between)."""
        return self.first[0].pass_ns + self.top.pass_ns

    def run(self, values: Ints) -> Ints:
        """values: N^2 x k; the rounded mean of all of them."""
        g = self.g
        return self.top.run(np.stack([u.run(values[i * g:(i + 1) * g])
                                      for i, u in enumerate(self.first)]))


def hardware_aware(q: Quantiser, draws: int = 12, input_noise: float = 0.02,
                   max_nfev: int = 30, seed: int = 0) -> Quantiser:
    """Every cell of the unit trained through its chip (`tune`)."""
    return Quantiser([tune(c, q.servers, q.comp, draws, input_noise, max_nfev, seed)
                      for c in q.cells], q.servers, q.bits, q.comp, q.seed, q.drop, q.carry_in)


def tune(cell: Cell, servers: int, comp: Components, draws: int = 12,
         input_noise: float = 0.02, max_nfev: int = 30, seed: int = 0) -> Cell:
    """Train one cell through its chip as measured (its couplers' errors and loss):
    least squares on the cell's table, averaged over `draws` passes of phase jitter,
    detector noise and noisy inputs (a carry from the cell below is never exact). The
    DACs' rounding has no gradient: it is left out of the fit and kept in use.

    The draws are fixed (a smooth fit), and each block's matrices are kept while its
    own phases stay: a finite-difference step moves one phase, so it rebuilds one block
    of a cell's dozens."""
    x0, y = cell_table(servers)
    nh = cell.gain.size
    loss = comp.transmission
    blocks = [*cell.l1.blocks, *cell.l2.blocks]
    ends = np.cumsum([0] + [b.phases.size for b in blocks])
    r = np.random.default_rng(seed)
    jitter = [[np.append(r.normal(0.0, comp.phase_noise_rad, b.phases.size - 1), 0.0)
               for b in blocks] for _ in range(draws)]  # (none on a receiver's gain)
    steady = np.array([1, 1, 0])  # the constant light has no error
    xin = [(x0 + r.normal(0.0, input_noise, x0.shape) * steady).astype(complex)
           for _ in range(draws)]
    det = [r.normal(0.0, comp.detector_noise, (len(x0), nh)) for _ in range(draws)]
    kept: dict[int, tuple[bytes, list[Complex]]] = {}

    def block(i: int, q: Floats) -> list[Complex]:
        """Block i's matrix in every draw, at its parameters q (phases, then gain)."""
        key = q.tobytes()
        if i in kept and kept[i][0] == key:
            return kept[i][1]
        ms = [blocks[i].transfer(q + j[i], loss) for j in jitter]
        kept[i] = (key, ms)
        return ms

    def layer(r_: Realised, first: int, p: Floats) -> list[Complex]:
        per = [block(i, p[ends[i]:ends[i + 1]])
               for i in range(first, first + len(r_.blocks))]
        return [r_.assemble([m[d] for m in per]) for d in range(draws)]

    def resid(p: Floats) -> Floats:
        m1 = layer(cell.l1, 0, p)
        m2 = layer(cell.l2, len(cell.l1.blocks), p)
        gain = p[ends[-1]:]
        out = []
        for d in range(draws):
            o = _through(xin[d], (m1[d], m2[d]), gain, det[d])
            out += [(o.real - y).ravel(), o[:, 1].imag]
        return np.concatenate(out)

    return cell.with_params(least_squares(resid, cell.params, max_nfev=max_nfev).x)


@dataclass
class Trained:
    """A trained unit as shipped: the weights, the design's phases (trained ideally), each
    cell's phases after hardware-aware training on chip `chip_seed`, and, where trained,
    a two-level cascade's (N^2 servers, one chip a unit: `Cascade`'s order)."""

    servers: int
    bits: int
    weights: Weights
    design: Floats
    tuned: list[Floats]
    chip_seed: int
    input_noise: float
    cascade: list[list[Floats]] | None = None

    def template(self) -> Cell:
        return Cell.of(self.weights).with_params(self.design)

    def ideal(self) -> Quantiser:
        """The ideally trained unit on ideal components."""
        return Quantiser.on_chip(self.template(), self.servers, self.bits, Components())

    def as_trained(self, comp: Components) -> Quantiser:
        """The ideally trained unit put on chip `chip_seed` as it is."""
        return Quantiser.on_chip(self.template(), self.servers, self.bits, comp,
                                 self.chip_seed)

    def hardware_aware(self, comp: Components) -> Quantiser:
        """The same chip with each cell's phases as hardware-aware training left them."""
        q = self.as_trained(comp)
        return Quantiser([c.with_params(p) for c, p in zip(q.cells, self.tuned, strict=True)],
                         q.servers, q.bits, comp, self.chip_seed)

    def two_level(self, comp: Components, tuned: bool = True) -> Cascade:
        """N^2 servers on N + 1 chips: hardware-aware (`tuned`, as trained) or the
        ideally trained design as it is."""
        if tuned and self.cascade is None:
            raise ValueError(f"the unit for {self.servers} servers has no trained cascade")
        return Cascade(self.template(), self.servers, self.bits, comp, self.chip_seed,
                       self.cascade if tuned else None)


def train(comp: Components, servers: int = 4, bits: int = 8, chip_seed: int = 0,
          seed: int = 0, input_noise: float = 0.03, cascade: bool = False) -> Trained:
    """Both trainings from scratch (minutes; `cascade`: also each chip of a two-level
    cascade through its own chip, N + 1 more units: `oddl optinc onn --retrain FILE`)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):  # small matrices: spinning BLAS threads only cost
        w = train_weights(servers, seed, noise=input_noise)
        design = Cell.of(w)
        q = hardware_aware(Quantiser.on_chip(design, servers, bits, comp, chip_seed))
        two = None
        if cascade:
            c = Cascade(design, servers, bits, comp, chip_seed)
            two = [[cell.params for cell in hardware_aware(u).cells] for u in c.units]
    return Trained(servers, bits, w, design.params, [c.params for c in q.cells], chip_seed,
                   input_noise, two)


def save(t: Trained, path: Path) -> None:
    """JSON, so a retrained unit diffs against the shipped one."""
    doc = {"servers": t.servers, "bits": t.bits, "chip_seed": t.chip_seed,
           "input_noise": t.input_noise,
           "regenerate": f"oddl optinc onn --servers {t.servers} --retrain FILE",
           "weights": {"w1": t.weights.w1.tolist(), "gain": t.weights.gain.tolist(),
                       "w2": t.weights.w2.tolist()},
           "design": t.design.tolist(), "tuned": [p.tolist() for p in t.tuned]}
    if t.cascade is not None:
        doc["cascade"] = [[p.tolist() for p in chip] for chip in t.cascade]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc) + "\n")


def load(path: Path) -> Trained:
    """A trained unit from its file; ValueError naming the file and what is wrong."""
    try:
        d = json.loads(path.read_text())
        w = d["weights"]
        casc = d.get("cascade")
        t = Trained(int(d["servers"]), int(d["bits"]),
                    Weights(np.array(w["w1"], dtype=float), np.array(w["gain"], dtype=float),
                            np.array(w["w2"], dtype=float)),
                    np.array(d["design"], dtype=float),
                    [np.array(p, dtype=float) for p in d["tuned"]],
                    int(d["chip_seed"]), float(d["input_noise"]),
                    None if casc is None else [[np.array(p, dtype=float) for p in chip]
                                               for chip in casc])
        size = t.template().params.size
    except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
        raise ValueError(f"{path}: not a trained unit: {e!r}") from e
    p = t.servers.bit_length() - 1
    cells = t.bits + p
    # a cascade: N first-level chips of `cells` cells, then one of bits + 2p
    chips = [cells] * t.servers + [t.bits + 2 * p]
    if t.design.size != size or len(t.tuned) != cells or \
            any(q.size != size for q in [*t.tuned, *(q for c in t.cascade or [] for q in c)]):
        raise ValueError(f"{path}: not a trained unit: {cells} cells of {size} phases and "
                         "gains expected")
    if t.cascade is not None and [len(c) for c in t.cascade] != chips:
        raise ValueError(f"{path}: not a trained unit: its cascade takes {chips} cells a chip")
    return t


# One cell's delay, for the pass's latency: light crosses each block's two meshes (a
# k x k Clements mesh is k MZIs deep) at MZI_PS an MZI (300 um of silicon waveguide at a
# group index of 4.2), and each nonlinear port's photodiode, limiting amplifier and
# modulator take ACT_PS (a 30 GHz class O-E-O path). Assumptions, not measurements.
MZI_PS = 4.2
ACT_PS = 30.0


def _blocks(a: int, b: int) -> tuple[int, int]:
    """Fig. 4's partition of an a x b matrix: (blocks, their side)."""
    k = min(a, b)
    return -(-max(a, b) // k), k


def cell_mzis(servers: int, preprocessed: bool = True, partitioned: bool = True) -> int:
    """MZIs of one cell with 2N nonlinear ports (8 at N = 4, where it is trained): with
    P its inputs are (c, carry, light); without, the N raw lanes, carry and light."""
    width = hidden(servers) + 2
    shapes = [(width, IN if preprocessed else servers + 2), (OUT, width)]
    if not partitioned:  # each matrix in one square of its longer side
        return sum(max(s) * (max(s) - 1) for s in shapes)
    return sum(n * k * (k - 1) for n, k in (_blocks(*s) for s in shapes))


def mzi_count(servers: int, bits: int, preprocessed: bool = True,
              partitioned: bool = True) -> int:
    """A whole unit: bits + log2 N cells, and P's N:1 combiner trees."""
    p = servers.bit_length() - 1
    return (bits + p) * cell_mzis(servers, preprocessed, partitioned) + \
        (bits * (servers - 1) if preprocessed else 0)


def cascade_mzis(servers: int, bits: int) -> int:
    """N^2 servers in two levels: N first-level units keeping the whole sum (bits + p
    cells), one second-level unit over (bits + p)-bit inputs dropping 2p bits."""
    p = servers.bit_length() - 1
    cell = cell_mzis(servers)
    return servers * ((bits + p) * cell + bits * (servers - 1)) + \
        (bits + 2 * p) * cell + (bits + p) * (servers - 1)


def cell_ns(servers: int) -> float:
    """One cell's delay: its meshes and its O-E-O activation."""
    width = hidden(servers) + 2
    depth = sum(2 * k for _, k in (_blocks(width, IN), _blocks(OUT, width)))
    return (depth * MZI_PS + ACT_PS) / 1000


def pass_ns(servers: int, bits: int) -> float:
    """One optical pass through the ripple: every cell's meshes and O-E-O activation."""
    return (bits + servers.bit_length() - 1) * cell_ns(servers)


def domain(servers: int, bits: int) -> dict[str, int]:
    """How many distinct inputs the function to learn has: without P, with P, and for
    the one cell that P lets every significance share."""
    return {"without_p": 2 ** (servers * bits), "with_p": (servers + 1) ** bits,
            "cell": (servers + 1) * servers}
