"""Lightning's photonic multiply over QICK (seeds/003: the talk's plug-and-play kit).

DAC values set the optical modulators, the light multiplies, an ADC reads the
photodetector, and software decodes an 8-bit fixed-point product:

    product(a, b) = round(a * b / 255)    (a, b and the product are fractions of 255)

A run plays seven segments back to back and reads them in one readout window: the
operands (a, b), then (a, 0), (0, b), (0, 0), and the full-scale references (255, 255),
(255, 0), (0, 255). A modulator never goes fully dark (finite extinction ratio) and the
detector has an offset, so a level is K (e + (1-e) a')(e + (1-e) b') + offset; the
difference X(a,b) - X(a,0) - X(0,b) + X(0,0) = K (1-e)^2 a' b' cancels the leak and the
offset, and the same difference at full scale gives K (1-e)^2: their ratio is a' b'
whatever the laser power, extinction ratio or detector gain. A DAC code v is played at
gain v x (maxv // 255), so full scale is an exact multiple of every code.

Nothing here depends on the soc being emulated: `soc` may be a local QickSoc, a
`qick.pyro.make_proxy` proxy, or the emulated board (`app.registry.open_soc`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field, field_validator
from qick.averager_program import AveragerProgram

FULL = 255
SEGMENTS = ((None, None), (None, 0), (0, None), (0, 0), (FULL, FULL), (FULL, 0), (0, FULL))
SEGMENT_NAMES = ("a*b", "a*0", "0*b", "0*0", "255*255", "255*0", "0*255")


class NoOutput(RuntimeError):
    """No light reached the detector: the streamer gate held (a DAC was not ready)."""


_TALK: dict[str, Any] = {}  # LightningConfig["dac_0"] = 100: the talk's style (below)
_LAST: list[Any] = []  # the soccfg and config of the last LightningControl built


class _ItemStyle(type(BaseModel)):  # type: ignore[misc]
    """`LightningConfig["dac_0"] = 100`, as the talk's slide writes it (seeds/003): the class
    then stands for that config where a config is taken (`LightningControl(soccfg,
    LightningConfig)`). Field names are checked as they are set."""

    def __setitem__(cls, key: str, value: Any) -> None:
        if key not in cls.model_fields:
            raise KeyError(f"LightningConfig has no {key!r} (fields: "
                           f"{', '.join(cls.model_fields)})")
        _TALK[key] = value

    def __getitem__(cls, key: str) -> Any:
        return _TALK[key]


class LightningConfig(BaseModel, metaclass=_ItemStyle):
    """One multiply: the operands and how the board plays and reads them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dac_0: int = Field(ge=0, le=255, description="operand a (8-bit, fraction of 255)")
    dac_1: int = Field(ge=0, le=255, description="operand b (8-bit, fraction of 255)")
    pulse_ns: float = Field(default=200.0, gt=0, le=10_000, description="per segment")
    gap_ns: float = Field(default=50.0, ge=0, description="dark time between segments")
    readout_margin_ns: float = Field(default=20.0, ge=0,
                                     description="readout window beyond the last segment")
    dac_channels: tuple[int, int] = Field(default=(0, 1), description="generator per operand")
    adc_channel: int = Field(default=0, ge=0, description="readout of the photodetector")
    adc_trig_offset: int = Field(default=0, ge=0,
                                 description="tProc cycles from trigger to capture; "
                                             "calibrate on a real board")
    min_contrast_lsb: float = Field(default=50.0, gt=0,
                                    description="full-scale difference below which the "
                                                "run had no light")

    @field_validator("dac_channels")
    @classmethod
    def _distinct(cls, v: tuple[int, int]) -> tuple[int, int]:
        if v[0] == v[1] or min(v) < 0:
            raise ValueError("two distinct, non-negative generator channels")
        return v

    def product(self) -> int:
        """The exact product this run should decode to."""
        return expected_product(self.dac_0, self.dac_1)

    @classmethod
    def given(cls, config: LightningConfig | type[LightningConfig]) -> LightningConfig:
        """A config, or the class after `LightningConfig[...] = ...` (the talk's style)."""
        return cls(**_TALK) if isinstance(config, type) else config


def _iq(waveform: Any) -> NDArray[Any]:
    """A readout window as (samples, 2) I/Q: what `run` returns, or qick's
    `acquire_decimated` list (one (2, samples) array per readout)."""
    w = np.asarray(waveform[0] if isinstance(waveform, list) else waveform, dtype=float)
    return w.T if w.ndim == 2 and w.shape[0] == 2 != w.shape[1] else w


def expected_product(a: int, b: int) -> int:
    # a * b / 255 is never exactly k + 1/2 (2ab is even, 255 (2k + 1) odd): no tie
    return (2 * a * b + FULL) // (2 * FULL)


def _cycles(soccfg: Any, ns: float, gen_ch: int) -> int:
    return int(soccfg.us2cycles(ns / 1e3, gen_ch=gen_ch))


class LightningControl(AveragerProgram):  # type: ignore[misc]  # qick has no type hints
    """The multiply as a qick program: generator pulses on the two DACs, one readout."""

    def __init__(self, soccfg: Any, config: LightningConfig | type[LightningConfig]) -> None:
        config = LightningConfig.given(config)
        _LAST[:] = [soccfg, config]
        gens, ros = soccfg["gens"], soccfg["readouts"]
        for ch in config.dac_channels:
            if ch >= len(gens):
                raise ValueError(f"dac_channels: generator {ch} does not exist "
                                 f"(the board has {len(gens)})")
        if config.adc_channel >= len(ros):
            raise ValueError(f"adc_channel: readout {config.adc_channel} does not exist "
                             f"(the board has {len(ros)})")
        self.config = config
        g0 = config.dac_channels[0]
        self.pulse_c = _cycles(soccfg, config.pulse_ns, g0)
        self.slot_c = _cycles(soccfg, config.pulse_ns + config.gap_ns, g0)
        ro_len = int(soccfg.us2cycles((len(SEGMENTS) * (config.pulse_ns + config.gap_ns)
                                       + config.readout_margin_ns) / 1e3,
                                      ro_ch=config.adc_channel))
        if ro_len > ros[config.adc_channel]["buf_maxlen"]:
            raise ValueError(f"readout window of {ro_len} samples exceeds the buffer "
                             f"({ros[config.adc_channel]['buf_maxlen']}): shorten pulse_ns")
        super().__init__(soccfg, {"reps": 1, "ro_len": ro_len})

    def gain(self, ch: int, code: int) -> int:
        return code * (int(self.soccfg["gens"][ch]["maxv"]) // FULL)

    def initialize(self) -> None:
        c = self.config
        for ch in c.dac_channels:
            self.declare_gen(ch=ch, nqz=1)
        self.declare_readout(ch=c.adc_channel, length=self.cfg["ro_len"], freq=0,
                             gen_ch=c.dac_channels[0])
        self.synci(200)

    def body(self) -> None:
        c = self.config
        self.trigger(adcs=[c.adc_channel], adc_trig_offset=c.adc_trig_offset)
        operands = (c.dac_0, c.dac_1)
        for k, seg in enumerate(SEGMENTS):
            for i, ch in enumerate(c.dac_channels):
                fixed = seg[i]
                code = operands[i] if fixed is None else fixed
                if code == 0:
                    continue  # a dark modulator: no pulse
                self.set_pulse_registers(ch=ch, style="const", freq=0, phase=0,
                                         gain=self.gain(ch, code), length=self.pulse_c)
                self.pulse(ch=ch, t=k * self.slot_c)
        self.wait_all()
        self.sync_all(100)

    def run(self, soc: Any) -> NDArray[Any]:
        """Play it once; the decimated readout window, (samples, 2) I/Q."""
        return _iq(self.acquire_decimated(soc, progress=False))


@dataclass(frozen=True)
class Product:
    a: int
    b: int
    product: int
    fraction: float  # decoded a'b', 0..1
    levels: dict[str, float]  # mean detector level per segment (ADC units)

    def as_dict(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "product": self.product,
                "expected": expected_product(self.a, self.b),
                "decoded_fraction": self.fraction, "raw_product": self.fraction * FULL,
                "levels": self.levels}


class LightningSignalProcessing:
    """Decodes a readout window of a LightningControl run (without arguments: of the last
    LightningControl built, as the talk's snippet uses it)."""

    def __init__(self, soccfg: Any = None,
                 config: LightningConfig | type[LightningConfig] | None = None) -> None:
        if soccfg is None or config is None:
            if not _LAST:
                raise ValueError("no LightningControl built yet: give soccfg and config")
            soccfg, config = soccfg or _LAST[0], config or _LAST[1]
        self.config = LightningConfig.given(config)
        self.last: Product | None = None
        f_out = soccfg["readouts"][config.adc_channel]["f_output"]  # MHz
        self.ns_per_sample = 1e3 / f_out
        # the readout starts with the first segment; trigger offset is in tProc cycles
        self.offset_ns = 0.0

    def segment_slices(self) -> list[slice]:
        c = self.config
        out = []
        for k in range(len(SEGMENTS)):
            t0 = self.offset_ns + k * (c.pulse_ns + c.gap_ns)
            lo = int(np.ceil((t0 + 0.2 * c.pulse_ns) / self.ns_per_sample))
            hi = int(np.floor((t0 + 0.8 * c.pulse_ns) / self.ns_per_sample))
            if hi <= lo:
                raise ValueError(f"pulse_ns {c.pulse_ns} is too short for the readout's "
                                 f"{self.ns_per_sample:.2f} ns samples")
            out.append(slice(lo, hi))
        return out

    @property
    def decode_adc_result(self) -> _Decoder:
        """Call it with a waveform for its `Product`; printed as it is (the talk's snippet
        prints the attribute), it shows the product of the last waveform plotted."""
        return _Decoder(self)

    def decode(self, waveform: Any) -> Product:
        w = _iq(waveform)
        i = w[:, 0] if w.ndim == 2 else w
        lv = [float(i[s].mean()) for s in self.segment_slices()]
        x = dict(zip(SEGMENT_NAMES, lv, strict=True))
        num = x["a*b"] - x["a*0"] - x["0*b"] + x["0*0"]
        den = x["255*255"] - x["255*0"] - x["0*255"] + x["0*0"]
        if den < self.config.min_contrast_lsb:
            raise NoOutput(f"no light on the detector (full-scale contrast {den:.1f} < "
                           f"{self.config.min_contrast_lsb} LSB): a DAC was not ready, so "
                           "the synchronized streamer never fired")
        frac = min(max(num / den, 0.0), 1.0)
        self.last = Product(self.config.dac_0, self.config.dac_1, round(frac * FULL), frac, x)
        return self.last

    def plot_waveform(self, waveform: Any, path: str | Path = "lightning_waveform.png"
                      ) -> Path:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        w = _iq(waveform)
        with contextlib.suppress(NoOutput):
            self.decode(w)  # what `decode_adc_result` then shows
        t = np.arange(len(w)) * self.ns_per_sample
        fig, ax = plt.subplots(figsize=(9, 3.5))
        ax.plot(t, w[:, 0], lw=1, label="photodetector (I)")
        for s, name in zip(self.segment_slices(), SEGMENT_NAMES, strict=True):
            ax.axvspan(s.start * self.ns_per_sample, s.stop * self.ns_per_sample,
                       alpha=0.12, color="tab:orange")
            ax.text((s.start + s.stop) / 2 * self.ns_per_sample, ax.get_ylim()[1] * 0.95,
                    name, ha="center", va="top", fontsize=8)
        c = self.config
        ax.set_title(f"Lightning multiply: a = {c.dac_0}, b = {c.dac_1}")
        ax.set_xlabel("time in readout window (ns)")
        ax.set_ylabel("ADC")
        fig.tight_layout()
        path = Path(path)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path


class _Decoder:
    def __init__(self, sp: LightningSignalProcessing) -> None:
        self.sp = sp

    def __call__(self, waveform: Any) -> Product:
        return self.sp.decode(waveform)

    def __repr__(self) -> str:
        last = self.sp.last
        return str(last.product) if last else "<no waveform decoded yet>"


def multiply(soc: Any, soccfg: Any, config: LightningConfig) -> tuple[Product, NDArray[Any]]:
    """Compile, run and decode one multiply."""
    wave = LightningControl(soccfg, config).run(soc)
    return LightningSignalProcessing(soccfg, config).decode_adc_result(wave), wave


def operand_pairs(samples: int, seed: int = 0) -> list[tuple[int, int]]:
    """All 65,536 pairs, or `samples` random ones (with the corners always in)."""
    if samples >= (FULL + 1) ** 2:
        return [(a, b) for a in range(FULL + 1) for b in range(FULL + 1)]
    rng = np.random.default_rng(seed)
    corners = [(0, 0), (0, FULL), (FULL, 0), (FULL, FULL)]
    rest = [(int(a), int(b)) for a, b in rng.integers(0, FULL + 1, (samples, 2))]
    return (corners + rest)[:samples]


def characterize(soc: Any, soccfg: Any, pairs: list[tuple[int, int]],
                 base: LightningConfig | None = None) -> dict[str, Any]:
    """Run every pair through the board: the share of products exactly right, within one
    LSB, mean and worst error, and the accuracy as Lightning reports it (`rmse_accuracy`,
    the figure its published 99.25% is)."""
    import time

    base = base or LightningConfig(dac_0=0, dac_1=0)
    t0 = time.perf_counter()
    err = np.zeros(len(pairs), dtype=int)
    got = np.zeros(len(pairs))  # the decoded product, normalised to [0, 1]
    no_output = 0
    for k, (a, b) in enumerate(pairs):
        cfg = base.model_copy(update={"dac_0": a, "dac_1": b})
        try:
            p, _ = multiply(soc, soccfg, cfg)
            err[k] = p.product - expected_product(a, b)
            got[k] = p.product / FULL
        except NoOutput:
            no_output += 1
            err[k] = FULL + 1  # counted as wrong
            got[k] = np.nan
    wall = time.perf_counter() - t0
    e = np.abs(err)
    worst = int(np.argmax(e))
    ab = np.array(pairs, dtype=float) / FULL
    want = ab[:, 0] * ab[:, 1]  # the exact product, normalised
    miss = np.where(np.isnan(got), 1.0, got - want)  # no output: the whole range wrong
    rmse = float(np.sqrt(np.mean(miss ** 2)))
    return {"pairs": len(pairs), "exact": float(np.mean(e == 0)),
            # Lightning's own figure (lightning-lts `LightningCompute.decoder`): 100 - 100
            # RMSE of the normalised product, in percent (docs/lightning.md)
            "rmse_accuracy": round(100 - 100 * rmse, 4),
            "within_1_lsb": float(np.mean(e <= 1)), "mean_abs_error_lsb": float(e.mean()),
            "worst_error_lsb": int(e[worst]), "worst_pair": list(pairs[worst]),
            "no_output": no_output, "wall_s": round(wall, 3),
            "pairs_per_s": round(len(pairs) / wall, 1), "errors": err.tolist()}


def plot_accuracy(pairs: list[tuple[int, int]], errors: list[int], path: str | Path,
                  bins: int = 16) -> Path:
    """Heat map of the mean absolute error over (a, b) bins."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tot = np.zeros((bins, bins))
    cnt = np.zeros((bins, bins))
    w = (FULL + 1) / bins
    for (a, b), e in zip(pairs, errors, strict=True):
        tot[int(b // w), int(a // w)] += abs(e)
        cnt[int(b // w), int(a // w)] += 1
    mean = np.divide(tot, cnt, out=np.full_like(tot, np.nan), where=cnt > 0)
    fig, ax = plt.subplots(figsize=(5.5, 4.6))
    im = ax.imshow(mean, origin="lower", extent=(0, FULL + 1, 0, FULL + 1), cmap="magma_r",
                   vmin=0)
    fig.colorbar(im, ax=ax, label="mean |error| (LSB)")
    ax.set_xlabel("a (dac_0)")
    ax.set_ylabel("b (dac_1)")
    ax.set_title(f"Lightning product error, {len(pairs)} pairs")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def open_soc(spec: str, hmac_key: bytes | None = None) -> tuple[Any, Any]:
    """(soc, soccfg) for 'local' (QickSoc on this board) or pyro://HOST:PORT/NAME
    (qick.pyro.make_proxy, as the lab connects to a board; Pyro4 unpickles what the board
    sends: trusted networks only, docs/lightning.md); with `hmac_key`, every message to
    and from the name server and the soc signed with it, as a keyed server demands. Never
    while a cassette plays (its exchanges are the cassette's, app.registry.open_soc): an
    address in it is not reached."""
    from oddl.drivers import cassette

    if isinstance(cassette.active, cassette.Player):
        raise ConnectionError(f"QICK soc {spec}: a replay reaches no device (its exchanges "
                              f"are the cassette's: app.registry.open_soc)")
    if spec == "local":
        from qick import QickSoc  # only on the board itself

        soc = QickSoc()
        return soc, soc
    if spec.startswith("pyro://"):
        import io

        from qick.pyro import make_proxy

        host, _, rest = spec.removeprefix("pyro://").partition(":")
        port, _, name = rest.partition("/")
        if hmac_key is None:
            with contextlib.redirect_stdout(io.StringIO()):  # it lists the name server
                proxy: tuple[Any, Any] = make_proxy(host, int(port), name)
            return proxy
        import Pyro4
        from qick import QickConfig

        # make_proxy's steps, signed (it has no key to give)
        Pyro4.config.SERIALIZER = "pickle"
        Pyro4.config.PICKLE_PROTOCOL_VERSION = 4
        ns = Pyro4.locateNS(host=host, port=int(port), hmac_key=hmac_key)
        soc = Pyro4.Proxy(ns.lookup(name))
        soc._pyroHmacKey = hmac_key
        return soc, QickConfig(soc.get_cfg())
    raise ValueError(f"QICK soc {spec!r}: 'emulated', 'local' or pyro://HOST:PORT/NAME")
