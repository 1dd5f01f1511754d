"""An emulated QICK RFSoC whose DACs drive Lightning's photonic multiplier.

It is a `qick.QickConfig` with the QickSoc methods a program's `acquire_decimated` calls,
so unmodified qick client code (locally or through `qick.pyro`) compiles and runs
programs on it. The board runs the tProc v1 machine code it is given (the instructions an
AveragerProgram emits: regwi, set, seti, synci, waiti, mathi, memwi, loopnz, end), so the
pulses it plays are the ones the program asked for, at the times it asked for them.

Photonics (seeds/003, the talk): each DAC drives an intensity modulator whose transmission
is 1/ER + (1 - 1/ER) x (amplitude / full scale); the DACs are modulator pairs (0, 1),
(2, 3), ...: the laser is split evenly between the pairs, passes both modulators of its
pair, and the pairs recombine on one photodetector, which so sees the mean over the pairs of
the product of the transmissions (a multiply-accumulate); the ADC adds Gaussian noise and
quantizes. Pulses are const (`style="const"`) or envelopes (`style="arb"`, outsel
"product" at 0 Hz: the envelope's I sample x gain), which is how a stream of values is
played, one value per readout sample. A count-action `synchronized_data_streamer` gates
the DAC streams: a DAC streams only once every playing DAC's valid flag is counted, so a
board with a DAC not ready puts out no light at all rather than a wrong product.

Given a count-action engine (`engine`: what builds one, at the datapath's first use), the
board's fabric also holds Lightning's datapath (sim/devices/lightning_datapath.py),
declared in its config as "lightning": the host loads a model once and plays it a layer a
call (`lightning_load`, `lightning_layer`), the engine pacing the stream beside the DACs
and the ADC.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from oddl.fpga.countaction import Module, streamer
from oddl.sim.devices.lightning_datapath import DatapathSpec, LightningDatapath
from qick import QickConfig
from qick.qick_asm import get_version

REFCLK_MHZ = 245.76
GEN_FS = REFCLK_MHZ * 25  # 6144 Msps DACs, 16 samples per 384 MHz fabric clock
ADC_FS = REFCLK_MHZ * 10  # 2457.6 Msps ADC, decimated by 8 to 307.2 Msps
T_PROC_MHZ = GEN_FS / 16  # tProc v1 timing clock = the generators' fabric clock
MAXV = 2**15 - 2
TRIGGER_BIT0 = 14  # readout k is triggered by bit 14 + k of tProc output port 0


def soc_config(n_dacs: int = 2, n_adcs: int = 1, datapath: DatapathSpec | None = None
               ) -> dict[str, Any]:
    """The emulated board's QICK configuration (what `soc.get_cfg()` returns); with
    `datapath`, the firmware's Lightning datapath under "lightning"."""
    def gen(i: int) -> dict[str, Any]:
        return {"type": "axis_signal_gen_v6", "dac": f"{i // 4}{i % 4}", "fs": GEN_FS,
                "fs_mult": 25, "fs_div": 1, "interpolation": 1, "f_fabric": T_PROC_MHZ,
                "f_dds": GEN_FS, "b_dds": 32, "fdds_div": 1, "samps_per_clk": 16,
                "maxlen": 65536, "complex_env": True, "has_dds": True, "has_mixer": False,
                "maxv": MAXV, "maxv_scale": 1.0, "b_phase": 32, "tproc_ch": i + 1}

    def ro(i: int) -> dict[str, Any]:
        return {"type": "axis_readout_v2", "ro_type": "axis_readout_v2", "adc": f"{i}0",
                "fs": ADC_FS, "fs_mult": 10, "fs_div": 1, "decimation": 1,
                "f_output": ADC_FS / 8, "f_dds": ADC_FS, "b_dds": 32, "fdds_div": 1,
                "buf_maxlen": 16384, "avg_maxlen": 16384, "avgbuf_type": "axis_avg_buffer",
                "avgbuf_version": "v2", "has_edge_counter": False, "has_weights": False,
                "has_outsel": True, "iq_offset": 0.0, "trigger_type": "dport",
                "trigger_port": 0, "trigger_bit": TRIGGER_BIT0 + i, "tproc_ch": i}

    dacs = [gen(i)["dac"] for i in range(n_dacs)]
    adcs = [ro(i)["adc"] for i in range(n_adcs)]
    return {
        "board": "ZCU216", "sw_version": get_version(), "fw_timestamp": "oddl-emulated",
        "refclk_freq": REFCLK_MHZ, "iqs": [], "time_taggers": [],
        "extra_description": ["\n\toddl emulated board: DACs drive Lightning's photonic "
                              "multiplier (sim/devices/qick_soc.py)"],
        "tprocs": [{"type": "axis_tproc64x32_x8", "revision": 1, "f_time": T_PROC_MHZ,
                    "pmem_size": 8192, "dmem_size": 4096, "output_pins": [],
                    "start_pin": None, "stop_pin": None}],
        "gens": [gen(i) for i in range(n_dacs)], "readouts": [ro(i) for i in range(n_adcs)],
        "rf": {"dac_power": "n/a (emulated)", "clk_groups": [],
               "dacs": {d: {"fs": GEN_FS, "fs_mult": 25, "fs_div": 1, "interpolation": 1,
                            "f_fabric": T_PROC_MHZ} for d in dacs},
               "adcs": {a: {"fs": ADC_FS, "fs_mult": 10, "fs_div": 1, "decimation": 1,
                            "f_fabric": ADC_FS / 8, "coupling": "DC"} for a in adcs}},
    } | ({"lightning": datapath.as_config()} if datapath else {})


@functools.lru_cache(maxsize=8)
def _streamer(num_dacs: int) -> Module:
    """The talk's streamer for `num_dacs` DACs, parsed once (every run is gated by it);
    read, never changed."""
    return streamer(num_dacs).modules[0]


def _gen(index: int | str | None) -> int:
    """A count-action program's DAC index (1-based, as the program names it) as the QICK
    generator it is (0-based)."""
    if index is None:
        raise ValueError("a DAC signal of the streamer's program without its index")
    return int(index) - 1


@dataclass
class Photonics:
    """The photonic path's parameters (a testbed's `[qick.photonics]`)."""

    extinction_ratio_db: float = 20.0
    full_scale: float = 0.8  # photodetector output at full transmission, of ADC range
    noise_rms_lsb: float = 2.0  # additive, per ADC sample
    adc_bits: int | None = 14  # None: no quantization
    dark_offset_lsb: float = 30.0  # photodetector dark current + ADC offset
    dac_ready: list[bool] = field(default_factory=lambda: [True, True])
    seed: int = 0
    dead_modulators: frozenset[int] = frozenset()  # DACs whose modulator passes no light

    @classmethod
    def from_config(cls, cfg: Any, dac_ready: list[bool] | None = None, seed: int = 0,
                    dead_modulators: frozenset[int] = frozenset()) -> Photonics:
        """From a testbed's `[qick.photonics]` (controller.config.QickPhotonics)."""
        return cls(cfg.extinction_ratio_db, cfg.full_scale, cfg.noise_rms_lsb, cfg.adc_bits,
                   cfg.dark_offset_lsb, dac_ready or [True, True], seed, dead_modulators)

    def transmission(self, amplitude: np.ndarray) -> np.ndarray:
        e = 10 ** (-self.extinction_ratio_db / 10)
        return e + (1 - e) * np.clip(amplitude, 0.0, 1.0)

    def detector(self, amplitudes: np.ndarray) -> np.ndarray:
        """Noise-free detector level (ADC units) for drive amplitudes (..., n_dacs) in 0..1:
        the laser split over the modulator pairs, each pair's two in series, the pairs
        summed on the photodiode (a dead modulator passes nothing)."""
        full = 2 ** ((self.adc_bits or 16) - 1)
        t = self.transmission(amplitudes)
        for d in self.dead_modulators:
            if d < t.shape[-1]:
                t[..., d] = 0.0
        n = t.shape[-1] - t.shape[-1] % 2 or 1
        pairs = t[..., :n].reshape(*t.shape[:-1], -1, min(2, n))
        light = np.prod(pairs, axis=-1).mean(axis=-1)
        return self.dark_offset_lsb + self.full_scale * full * light

    def adc(self, level: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Additive noise, then quantization and clipping to the ADC's range."""
        x = level + rng.normal(0.0, self.noise_rms_lsb, level.shape) \
            if self.noise_rms_lsb else np.asarray(level, dtype=float)
        if self.adc_bits is not None:
            lim = 2 ** (self.adc_bits - 1)
            x = np.clip(np.round(x), -lim, lim - 1)
        return x


# tProc v1 opcodes (qick/asm_v1.py) and their register fields
_OPS = {0x19: "regwi", 0x13: "seti", 0x51: "set", 0x14: "synci", 0x15: "waiti",
        0x12: "mathi", 0x18: "memwi", 0x30: "loopnz", 0x3F: "end", 0x10: "pushi",
        0x11: "popi", 0x50: "math", 0x52: "sync"}


def _f(w: int, lsb: int, bits: int) -> int:
    return (w >> lsb) & ((1 << bits) - 1)


class ProgramRefused(RuntimeError):
    pass


class EmulatedQickSoc(QickConfig):
    """A QickSoc stand-in; `autoproxy` is empty (nothing else to register with Pyro).
    `engine`: what builds a count-action engine (driver, board) for the fabric's Lightning
    datapath, with `datapath` its parameters; without one, the board has no datapath."""

    def __init__(self, photonics: Photonics | None = None, n_dacs: int = 2, n_adcs: int = 1,
                 engine: Callable[[], tuple[Any, Any]] | None = None,
                 datapath: DatapathSpec | None = None,
                 **_: Any) -> None:
        spec = (datapath or DatapathSpec()) if engine is not None else None
        super().__init__(soc_config(n_dacs, n_adcs, spec))
        self.photonics = photonics or Photonics(dac_ready=[True] * n_dacs)
        if len(self.photonics.dac_ready) < n_dacs:
            raise ValueError(f"dac_ready names {len(self.photonics.dac_ready)} DACs, the "
                             f"board has {n_dacs}")
        self.autoproxy: list[Any] = []
        self.pmem: list[int] = []
        self.dmem = np.zeros(4096, dtype=np.int64)
        self.buf_len = [0] * n_adcs
        self.nqz: dict[int, int] = {}
        self.rng = np.random.default_rng(self.photonics.seed)
        self.pulses: list[tuple[int, int, int, int]] = []  # (t cycles, gen, gain, len cycles)
        self.envelope_of: dict[int, int] = {}  # pulse index -> its envelope's first sample
        self.envelopes = [np.zeros(g["maxlen"], dtype=np.int16) for g in self["gens"]]
        self.triggers: list[tuple[int, int]] = []  # (t cycles, readout)
        self.streamed: list[int] = []  # DACs the streamer let through on the last run
        self.runs = 0
        self._engine, self._spec = engine, spec
        self.datapath: LightningDatapath | None = None

    # --- Lightning's datapath (the firmware's, when it has one) ------------------------
    def _lightning(self) -> LightningDatapath:
        if self._engine is None:
            raise ProgramRefused("this board's firmware has no Lightning datapath (no "
                                 "\"lightning\" in its config)")
        if self.datapath is None:  # (its engine built now: boards that only multiply never)
            self.datapath = LightningDatapath(self.photonics, self.rng, len(self["gens"]),
                                              self._engine(), (MAXV // 255) / MAXV, self._spec)
        return self.datapath

    def lightning_load(self, program: str, layers: list[dict[str, Any]]) -> dict[str, Any]:
        return self._lightning().load(program, layers)

    def lightning_layer(self, k: int, codes: Any) -> dict[str, Any]:
        return self._lightning().layer(k, codes)

    def lightning_status(self) -> dict[str, Any]:
        return self._lightning().status()

    # --- what a program's config_all / acquire call ---------------------------------
    def get_cfg(self) -> dict[str, Any]:
        return self._cfg

    def start_src(self, src: str) -> None:
        if src not in ("internal", "external"):
            raise ValueError(f"start source {src!r}: 'internal' or 'external'")

    def stop_tproc(self, lazy: bool = False) -> None:
        pass

    def set_nyquist(self, ch: int, nqz: int, force: bool = False) -> None:
        if nqz not in (1, 2):
            raise ValueError(f"Nyquist zone {nqz}: 1 or 2")
        self.nqz[ch] = nqz

    def set_mixer_freq(self, *a: Any, **k: Any) -> None:
        raise ValueError("the emulated generators have no mixer")

    def load_envelope(self, ch: int, data: Any, addr: int) -> None:
        """An envelope's I/Q samples into generator `ch`'s memory at `addr` (as the
        generator's AXI-stream loader does; Q must be 0: the drive is intensity)."""
        d = np.asarray(data, dtype=np.int64).reshape(-1, 2)
        if not 0 <= ch < len(self["gens"]):
            raise ValueError(f"generator {ch} does not exist")
        mem = self.envelopes[ch]
        if addr < 0 or addr + len(d) > len(mem):
            raise ValueError(f"generator {ch}: envelope of {len(d)} samples at {addr} "
                             f"exceeds its memory ({len(mem)})")
        if np.any(d[:, 1]) or np.any(np.abs(d[:, 0]) > MAXV):
            raise ValueError(f"generator {ch}: an envelope with Q samples, or beyond "
                             f"+-{MAXV}: the modulator's drive is real")
        mem[addr:addr + len(d)] = d[:, 0]

    def configure_readout(self, ch: int, ro_regs: Any) -> None:
        pass

    def config_avg(self, ch: int, address: int = 0, length: int = 1, **_: Any) -> None:
        pass

    def config_buf(self, ch: int, address: int = 0, length: int = 1) -> None:
        if not 0 < length <= self["readouts"][ch]["buf_maxlen"]:
            raise ValueError(f"readout {ch}: buffer length {length} outside 1.."
                             f"{self['readouts'][ch]['buf_maxlen']}")
        self.buf_len[ch] = length

    def enable_buf(self, ch: int, enable_avg: bool = True, enable_buf: bool = True) -> None:
        pass

    def load_bin_program(self, binprog: list[int], load_mem: bool = True) -> None:
        if len(binprog) > self["tprocs"][0]["pmem_size"]:
            raise ProgramRefused(f"program of {len(binprog)} words > program memory")
        self.pmem = [int(w) for w in binprog]

    def reload_mem(self) -> None:
        pass

    def clear_tproc_counter(self, addr: int) -> None:
        self.dmem[addr] = 0

    def prepare_round(self) -> None:
        pass

    def cleanup_round(self) -> None:
        pass

    def get_tproc_counter(self, addr: int) -> int:
        return int(self.dmem[addr])

    def start_tproc(self) -> None:
        self._execute()
        self.runs += 1

    # --- the tProc v1 --------------------------------------------------------------
    def _execute(self, max_steps: int = 1_000_000) -> None:
        regs = np.zeros((8, 32), dtype=np.int64)
        ref = 0  # the time reference synci advances (tProc cycles)
        self.pulses, self.triggers, self.envelope_of = [], [], {}
        pc = steps = 0
        while pc < len(self.pmem):
            steps += 1
            if steps > max_steps:
                raise ProgramRefused("program did not reach 'end'")
            w = self.pmem[pc]
            op = _OPS.get(w >> 56)
            pc += 1
            if op is None:
                raise ProgramRefused(f"unsupported instruction 0x{w:016x} at {pc - 1}")
            page = _f(w, 53, 3)
            imm = _f(w, 0, 31)
            if op == "end":
                break
            if op == "regwi":
                regs[page, _f(w, 41, 5)] = imm
            elif op == "synci":
                ref += imm
            elif op == "waiti":
                pass  # the emulator has no real-time to wait for
            elif op == "mathi":
                a = int(regs[page, _f(w, 36, 5)])
                o = _f(w, 46, 4)
                regs[page, _f(w, 41, 5)] = {8: a + imm, 9: a - imm, 10: a * imm}[o]
            elif op == "memwi":
                self.dmem[imm] = regs[page, _f(w, 31, 5)]
            elif op == "loopnz":
                r = _f(w, 41, 5)
                if regs[page, r] != 0:
                    regs[page, r] -= 1
                    pc = imm
            elif op == "seti":
                ch, val = _f(w, 50, 3), int(regs[page, _f(w, 36, 5)])
                if ch == 0:  # trigger port: a readout starts on its bit's rising edge
                    for k in range(len(self["readouts"])):
                        if val >> (TRIGGER_BIT0 + k) & 1:
                            self.triggers.append((ref + imm, k))
            elif op == "set":
                ch = _f(w, 50, 3)
                # set ch, page, freq, phase, addr, gain, mode, t: registers at 36, 26,
                # 21, 16, 11 and the time register at 31
                freq = int(regs[page, _f(w, 36, 5)])
                phase = int(regs[page, _f(w, 26, 5)])
                addr = int(regs[page, _f(w, 21, 5)])
                gain = int(regs[page, _f(w, 16, 5)])
                mode = int(regs[page, _f(w, 11, 5)])
                t = int(regs[page, _f(w, 31, 5)])
                gen = ch - 1
                if not 0 <= gen < len(self["gens"]):
                    raise ProgramRefused(f"set on tProc channel {ch}: no generator")
                outsel = (mode >> 16) & 3  # product, dds, input, zero (qick asm_v1)
                if outsel not in (0, 1) or (mode >> 18) & 1:
                    raise ProgramRefused(f"generator {gen}: outsel {outsel} / periodic mode "
                                         "is not emulated (const or a 0 Hz product)")
                if outsel == 0:  # an envelope times the DDS: at 0 Hz and phase 0, x gain
                    if freq or phase:
                        raise ProgramRefused(f"generator {gen}: an envelope at a non-zero "
                                             "frequency or phase (the drive is baseband)")
                    spc = self["gens"][gen]["samps_per_clk"]
                    self.envelope_of[len(self.pulses)] = addr * spc
                self.pulses.append((ref + t, gen, gain, mode & 0xFFFF))
            else:
                raise ProgramRefused(f"instruction {op} is not emulated")

    # --- the photonic path and the ADC ---------------------------------------------
    def _gate(self) -> list[int]:
        """The count-action streamer: count the valid flag of each DAC the program plays;
        at the target (every one of them), stream them. Returns the generators that stream
        (all or none)."""
        playing = sorted({g for _, g, _, _ in self.pulses})
        mod = _streamer(max(len(playing), 1))
        ready = self.photonics.dac_ready
        count = sum(1 for s in mod.counts if s.signal == "DAC.valid"
                    and _gen(s.index) in playing and ready[_gen(s.index)])
        return [_gen(a.index) for a in mod.actions if a.name == "stream"] \
            if count >= mod.target else []

    def get_decimated(self, ch: int, address: int = 0, length: int | None = None
                      ) -> np.ndarray:
        n = length or self.buf_len[ch]
        p = self.photonics
        trig = [t for t, k in self.triggers if k == ch]
        out = np.zeros((n, 2))
        self.streamed = self._gate()
        if trig:
            f_out = self["readouts"][ch]["f_output"]
            t_ns = trig[0] * 1e3 / T_PROC_MHZ + np.arange(n) * 1e3 / f_out
            amps = np.zeros((n, len(self["gens"])))
            mid = t_ns + 0.5e3 / f_out  # a decimated sample: the middle of its window
            for k, (t, g, gain, length_c) in enumerate(self.pulses):
                if g in self.streamed:
                    t0 = t * 1e3 / T_PROC_MHZ
                    on = (mid >= t0) & (mid < t0 + length_c * 1e3 / T_PROC_MHZ)
                    if k not in self.envelope_of:
                        amps[on, g] = gain / MAXV
                        continue
                    # the DAC sample under each readout sample's middle
                    i = ((mid[on] - t0) * GEN_FS / 1e3).astype(np.int64)
                    env = self.envelopes[g][self.envelope_of[k] + i]
                    amps[on, g] = env / MAXV * gain / MAXV
            level = p.detector(amps) if self.streamed else np.full(n, p.dark_offset_lsb)
            out[:, 0] = p.adc(level, self.rng)
            out[:, 1] = p.adc(np.zeros(n), self.rng)
        elif p.adc_bits is not None:
            out = np.round(out)
        return out

    def get_accumulated(self, ch: int, address: int = 0, length: int | None = None
                        ) -> np.ndarray:
        dec = self.get_decimated(ch, 0, self.buf_len[ch])
        return dec.sum(axis=0, keepdims=True).repeat(length or 1, axis=0)
