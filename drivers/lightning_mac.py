"""Lightning's photonic multiply-accumulate over QICK: streams of values on modulator pairs.

The multiply (`drivers/lightning.py`) plays one product as seven const segments. A layer of
a network needs tens of thousands of products, so here each DAC plays an envelope, one
8-bit value per readout sample, and the board's DACs are modulator pairs (0, 1), (2, 3):
light through each pair is the product of its two values, and the pairs add up on the one
photodetector, so each readout sample is one multiply-accumulate, sum_p a_p x b_p.

Decoding is by calibration, as Lightning's public API does it (a fit per board, not per
run): a calibration stream of known operands is played, the detector level is fitted by
least squares to c0 + sum_p (beta_p a_p + gamma_p b_p + delta_p a_p b_p), which is exact
for modulators linear in intensity with a finite extinction ratio and a detector offset
(the leak terms beta, gamma are known from the operands the electronics sent); then a
degree-3 Chebyshev fit takes the remaining non-linearity from the estimate to the truth.
A pair whose product term differs from the others' (a dead or weak modulator) cannot be
decoded: `calibrate` reports the spread and the accuracy shows it.

A board whose firmware holds Lightning's datapath (its config names "lightning": the
emulated board's, sim/devices/lightning_datapath.py) is also driven a model and a layer at
a time (`load_model`, `play_layer`): the count-action engine beside its DACs paces the
stream, and the host decodes the samples it reads with the same calibration.

Nothing here depends on the soc being emulated (a QickSoc, a qick.pyro proxy, or the
emulated board). Every call on the soc is counted (`calls`): on a lab's board each is a
round trip over Pyro.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numpy.polynomial import chebyshev
from numpy.typing import NDArray
from oddl.fpga.datapath import LayerPlayed, LayerStream, ModelLoaded, answer
from qick.averager_program import AveragerProgram

FULL = 255
MIN_SWING_LSB = 50.0  # a pair's product term from dark to full scale, at least


class NoProduct(ValueError):
    """Calibration found a modulator pair whose product does not reach the detector."""


def samples_per_value(soccfg: Any, gen: int, adc: int) -> int:
    """DAC samples under one decimated readout sample: each value is held that long."""
    fs = float(soccfg["gens"][gen]["fs"])
    f_out = float(soccfg["readouts"][adc]["f_output"])
    n = fs / f_out
    if abs(n - round(n)) > 1e-9:
        raise ValueError(f"the DAC rate {fs} MHz is not a whole multiple of the readout's "
                         f"{f_out} MHz: values cannot line up with readout samples")
    return round(n)


def capacity(soccfg: Any, channels: tuple[int, ...], adc: int) -> int:
    """The most values one run can stream (the envelope memory and the readout buffer)."""
    spv = samples_per_value(soccfg, channels[0], adc)
    spc = int(soccfg["gens"][channels[0]]["samps_per_clk"])
    env = min(int(soccfg["gens"][c]["maxlen"]) for c in channels)
    return min((env - spc) // spv, int(soccfg["readouts"][adc]["buf_maxlen"]) - 8)


class MacStream(AveragerProgram):  # type: ignore[misc]  # qick has no type hints
    """One run: every DAC plays its envelope of values; one readout captures the sums."""

    def __init__(self, soccfg: Any, values: NDArray[Any], channels: tuple[int, ...],
                 adc_channel: int = 0, adc_trig_offset: int = 0) -> None:
        """`values`: (n, len(channels)) codes 0..255, column k on generator channels[k]."""
        v = np.asarray(values)
        if v.ndim != 2 or v.shape[1] != len(channels) or len(channels) % 2:
            raise ValueError(f"values of shape {v.shape}: one column per channel of "
                             f"{channels}, channels in pairs")
        if v.size and (v.min() < 0 or v.max() > FULL):
            raise ValueError("values are 8-bit codes, 0..255")
        cap = capacity(soccfg, channels, adc_channel)
        if not 0 < len(v) <= cap:
            raise ValueError(f"{len(v)} values in one run; this board streams 1..{cap}")
        self.values, self.channels = v, channels
        self.spv = samples_per_value(soccfg, channels[0], adc_channel)
        self.adc_channel, self.trig = adc_channel, adc_trig_offset
        super().__init__(soccfg, {"reps": 1, "ro_len": len(v)})

    def initialize(self) -> None:
        spc = int(self.soccfg["gens"][self.channels[0]]["samps_per_clk"])
        # whole fabric clocks, at least the 3 a generator plays
        n = max(-(-len(self.values) * self.spv // spc), 3) * spc
        for k, ch in enumerate(self.channels):
            self.declare_gen(ch=ch, nqz=1)
            step = int(self.soccfg["gens"][ch]["maxv"]) // FULL
            idata = np.zeros(n, dtype=np.int64)
            idata[:len(self.values) * self.spv] = np.repeat(self.values[:, k] * step, self.spv)
            self.add_envelope(ch, "values", idata=idata)
            self.set_pulse_registers(ch=ch, style="arb", freq=0, phase=0, outsel="product",
                                     gain=int(self.soccfg["gens"][ch]["maxv"]),
                                     waveform="values")
        self.declare_readout(ch=self.adc_channel, length=self.cfg["ro_len"], freq=0,
                             gen_ch=self.channels[0])
        self.synci(200)

    def load_envelopes(self, soc: Any) -> None:
        """qick's own turns each envelope into Python lists (for Pyro's serpent); qick.pyro
        pickles, which carries the int16 arrays as they are, 20x faster for a long stream.
        (The readout has no weights to load.)"""
        for ch, gen in enumerate(self.envelopes):
            for env in gen["envs"].values():
                soc.load_envelope(ch, data=env["data"], addr=env["addr"])

    def body(self) -> None:
        self.trigger(adcs=[self.adc_channel], adc_trig_offset=self.trig)
        for ch in self.channels:
            self.pulse(ch=ch, t=0)
        self.wait_all()
        self.sync_all(100)

    def levels(self, soc: Any) -> NDArray[Any]:
        """Play it once: the detector level (I) under each value, in ADC units."""
        data = np.asarray(self.acquire_decimated(soc, progress=False)[0], dtype=float)
        if data.shape != (2, len(self.values)):  # one rep: (I/Q, sample), qick's contract
            raise ValueError(f"readout of shape {data.shape}, not (2, {len(self.values)})")
        level: NDArray[Any] = data[0]
        return level


@dataclass(frozen=True)
class MacCalibration:
    """The fit that turns a detector level into sum_p a_p b_p (codes squared)."""

    c0: float
    lin: tuple[float, ...]  # beta_0, gamma_0, beta_1, gamma_1, ...: the leak terms
    delta: tuple[float, ...]  # each pair's product term (ADC units per code squared)
    cheb: tuple[float, ...]  # degree-3 correction, on the estimate scaled to [-1, 1]
    scale: float  # the estimate's full scale (codes squared)
    residual_rms: float  # of the calibration set after both fits (codes squared)

    @property
    def pair_spread(self) -> float:
        """How far the pairs' product terms differ (0: alike; a dead modulator: 1)."""
        d = np.abs(np.asarray(self.delta))
        return float((d.max() - d.min()) / d.max()) if d.max() > 0 else 1.0

    def estimate(self, values: NDArray[Any], level: NDArray[Any]) -> NDArray[Any]:
        v = np.asarray(values, dtype=float)
        lin = v @ np.asarray(self.lin)
        raw = (level - self.c0 - lin) / float(np.mean(self.delta))
        x = np.clip(raw / self.scale * 2 - 1, -1.5, 1.5)
        out: NDArray[Any] = (chebyshev.chebval(x, self.cheb) + 1) * self.scale / 2
        return out

    def as_dict(self) -> dict[str, Any]:
        return {"pairs": len(self.delta), "pair_spread": round(self.pair_spread, 5),
                "residual_rms_codes2": round(self.residual_rms, 2)}


def _features(v: NDArray[Any]) -> NDArray[Any]:
    a, b = v[:, 0::2], v[:, 1::2]
    cols = [np.ones(len(v))]
    for p in range(a.shape[1]):
        cols += [a[:, p], b[:, p], a[:, p] * b[:, p]]
    return np.stack(cols, axis=1)


class _Counted:
    """The soc, counting the calls made on it (attributes that are data pass through)."""

    def __init__(self, soc: Any) -> None:
        self._soc, self.calls = soc, 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._soc, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return attr(*args, **kwargs)
        return call


class PhotonicCore:
    """A QICK board's modulator pairs as a multiply-accumulate unit."""

    def __init__(self, soc: Any, soccfg: Any, channels: tuple[int, ...] | None = None,
                 adc_channel: int = 0, adc_trig_offset: int = 0) -> None:
        n = len(soccfg["gens"]) - len(soccfg["gens"]) % 2
        self.channels = channels or tuple(range(n))
        if not self.channels or len(self.channels) % 2:
            raise ValueError(f"generator channels {self.channels}: modulator pairs")
        self.soc, self.soccfg = _Counted(soc), soccfg
        try:  # the firmware's Lightning datapath, if it has one
            self.datapath: dict[str, Any] | None = dict(soccfg["lightning"])
        except KeyError:
            self.datapath = None
        self.adc, self.trig = adc_channel, adc_trig_offset
        self.pairs = len(self.channels) // 2
        self.capacity = capacity(soccfg, self.channels, adc_channel)
        self.calibration: MacCalibration | None = None
        self.runs = 0  # programs played
        self.play_s = 0.0  # wall time in those round trips through the QICK API
        self.products = 0  # products that went through the photonics (padding excluded)

    def play(self, values: NDArray[Any]) -> NDArray[Any]:
        """Detector levels of a stream of any length, in as many runs as it takes."""
        v = np.asarray(values, dtype=np.int64)
        out = np.empty(len(v))
        t0 = time.perf_counter()
        for lo in range(0, len(v), self.capacity):
            chunk = v[lo:lo + self.capacity]
            out[lo:lo + len(chunk)] = MacStream(self.soccfg, chunk, self.channels, self.adc,
                                                self.trig).levels(self.soc)
            self.runs += 1
        self.play_s += time.perf_counter() - t0
        return out

    def calibrate(self, n: int = 2048, seed: int = 0) -> MacCalibration:
        """Play `n` known operand sets (corners and zeros included) and fit the decoder."""
        rng = np.random.default_rng(seed)
        k = len(self.channels)
        v = rng.integers(0, FULL + 1, (n, k))
        v[:4] = [[0] * k, [FULL] * k, [FULL, 0] * (k // 2), [0, FULL] * (k // 2)]
        v[4:n // 8] = 0  # one pair at a time, the others dark, spans each pair's range
        for p in range(self.pairs):
            rows = slice(4 + p * (n // 8 - 4) // self.pairs,
                         4 + (p + 1) * (n // 8 - 4) // self.pairs)
            v[rows, 2 * p:2 * p + 2] = rng.integers(0, FULL + 1, (rows.stop - rows.start, 2))
        level = self.play(v)
        coef, *_ = np.linalg.lstsq(_features(v), level, rcond=None)
        c0, rest = float(coef[0]), coef[1:].reshape(self.pairs, 3)
        lin = tuple(float(x) for x in rest[:, :2].ravel())
        delta = tuple(float(x) for x in rest[:, 2])
        truth = (v[:, 0::2] * v[:, 1::2]).sum(axis=1).astype(float)
        scale = float(self.pairs * FULL * FULL)
        swing = np.asarray(delta) * FULL * FULL  # each pair's full-scale product, ADC
        for p, s in enumerate(swing):
            if s < MIN_SWING_LSB or s < 0.5 * swing.max():
                ch = self.channels[2 * p:2 * p + 2]
                raise NoProduct(f"calibration: modulator pair {p} (DACs {ch[0]}, {ch[1]}) "
                                f"swings {s:.1f} ADC LSB from dark to full scale (the "
                                f"strongest pair {swing.max():.1f}): a modulator passes "
                                "no light, or no light reaches the detector")
        linear = MacCalibration(c0, lin, delta, (0.0, 1.0), scale, 0.0)  # identity Chebyshev
        cheb = chebyshev.chebfit(linear.estimate(v, level) / scale * 2 - 1,
                                 truth / scale * 2 - 1, 3)
        cal = replace(linear, cheb=tuple(float(c) for c in cheb))
        rms = float(np.sqrt(np.mean((cal.estimate(v, level) - truth) ** 2)))
        self.calibration = replace(cal, residual_rms=rms)
        return self.calibration

    @property
    def calls(self) -> int:
        """Calls made on the soc so far."""
        return int(self.soc.calls)

    @property
    def stream_gsps(self) -> float:
        """Values a second a DAC streams (G): the datapath's, else one a readout sample."""
        if self.datapath is not None:
            return float(self.datapath["stream_gsps"])
        return float(self.soccfg["readouts"][self.adc]["f_output"]) / 1e3

    def mac(self, values: NDArray[Any], products: int | None = None) -> NDArray[Any]:
        """sum_p a_p b_p for each row of `values` (codes; row = a_0, b_0, a_1, b_1, ...),
        decoded from the detector. `products`: how many of them are real (not padding)."""
        cal = self.calibration or self.calibrate()
        v = np.asarray(values, dtype=np.int64)
        self.products += v.shape[0] * self.pairs if products is None else products
        return cal.estimate(v, self.play(v))

    def load_model(self, program: str, layers: list[LayerStream]) -> ModelLoaded:
        """Into the board's datapath: the count-action program and each layer's stream."""
        out = self.soc.lightning_load(program, [lay.wire() for lay in layers])
        loaded: ModelLoaded = answer(ModelLoaded, out, "lightning_load")
        return loaded

    def play_layer(self, k: int, codes: NDArray[np.int64], values: NDArray[np.int64],
                   products: int) -> tuple[NDArray[np.float64], LayerPlayed]:
        """Layer `k` on the datapath, fed `codes`: sum_p a_p b_p of each of its samples
        played (`values`: the stream as the host knows it, for the decoder's leak terms),
        and the board's answer (words played, clocks, the engine's modules)."""
        cal = self.calibration or self.calibrate()
        out = dict(self.soc.lightning_layer(k, np.asarray(codes, dtype=np.int64)))
        if "levels" not in out:
            raise ValueError(f"lightning_layer {k + 1}: the board's answer: Object missing "
                             "required field `levels`")
        level = np.asarray(out.pop("levels"), dtype=float)
        played: LayerPlayed = answer(LayerPlayed, out, f"lightning_layer {k + 1}")
        self.products += products if played.played == played.words else 0
        return cal.estimate(np.asarray(values)[:len(level)], level), played
