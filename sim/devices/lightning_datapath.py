"""Lightning's datapath in the emulated QICK board's fabric: a count-action engine beside
the DACs and the ADC paces the stream, and the host only loads and reads.

In Lightning (Zhong et al., SIGCOMM 2023; seeds/003) the count-action modules sit beside
the DACs and ADCs: a word of 16 values a DAC reaches the modulators only once the
synchronized streamer has counted every DAC's valid flag, and each layer's module counts
the words streamed and fires when its layer is done. Here that is the emulated board's
firmware (declared in its config under "lightning", as a bitstream's metadata would name
an IP): the host loads the model once (each layer's weight stream and the count-action
program, as text) with `load`, then per layer sends the layer's 8-bit inputs and gets the
detector's samples back with `layer` -- one call a layer, whatever the layer's size.

The engine is an O-NIC count-action engine (the Python board model or the gateware, from
whoever builds the board: `app.registry`), wired as the fabric wires it: each DAC raises
its valid line once a word is in its FIFO (a DAC that is not ready never does), the
engine's `stream` actions open the DACs' gates, and a word whose gates did not all open
is never played: the stream stalls there, as the hardware's would, and the answer says
where. The layer modules gate their layers: a layer streams only while its module counts
and once the layer before's has fired (a DAG missing a layer's edge stalls at the next
layer's first word, saying which module it waits for). Time is the fabric's: a word a
clock at `stream_gsps` / 16, plus the path from DAC to ADC (`latency_ns`), counted by the
board and returned with each layer.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from math import ceil
from typing import Any, Protocol

import msgspec
import numpy as np
from numpy.typing import NDArray
from oddl.fpga import regmap as R
from oddl.fpga.countaction import CountActionError, Program, parse
from oddl.fpga.datapath import DatapathState, LayerPlayed, ModelLoaded, ModuleState

FULL = 255
WORD = 16  # values a DAC streams per fabric clock


class Engine(Protocol):
    """An O-NIC count-action engine behind its register driver (drivers/onic.py)."""

    def load_countaction(self, prog: Program) -> Any: ...

    def ca_status(self, slot: int) -> dict[str, int | bool]: ...


class EngineBoard(Protocol):
    """The engine's board: its DAC valid lines in, its `stream` actions out."""

    streamed: list[tuple[int, int]]

    def set_dac_valid(self, dac: int) -> None: ...


class Photonic(Protocol):
    dac_ready: list[bool]

    def detector(self, amplitudes: NDArray[Any]) -> NDArray[Any]: ...

    def adc(self, level: NDArray[Any], rng: np.random.Generator) -> NDArray[Any]: ...


@dataclass(frozen=True)
class DatapathSpec:
    """What the firmware declares of its datapath (the board's config, "lightning")."""

    stream_gsps: float = 4.055  # values a second per DAC (Lightning's published rate)
    latency_ns: float = 115.0  # DAC to ADC and back into the fabric, per layer
    word: int = WORD
    weight_values: int = 1 << 22  # the weight memory, values (each DAC's stream)
    # argmax resets, and rearm arms, every layer from its action slots (inference_dag)
    layers_max: int = R.N_SLOTS - 1

    @property
    def clock_mhz(self) -> float:
        return self.stream_gsps * 1e3 / self.word

    def as_config(self) -> dict[str, Any]:
        return {**asdict(self), "clock_mhz": self.clock_mhz}


class Refused(ValueError):
    """The datapath refuses a model or a layer it cannot hold or play."""


class LightningDatapath:
    """The fabric block: weight memory, the count-action engine, DACs to ADC."""

    def __init__(self, photonics: Photonic, rng: np.random.Generator, n_dacs: int,
                 engine: tuple[Engine, EngineBoard], amplitude: float,
                 spec: DatapathSpec | None = None) -> None:
        """`amplitude`: a DAC's drive (of full scale) per code, as its generator plays it."""
        if n_dacs % 2:
            raise ValueError(f"{n_dacs} DACs: the datapath drives modulator pairs")
        self.photonics, self.rng, self.n_dacs = photonics, rng, n_dacs
        self.drv, self.board = engine
        self.amplitude = amplitude
        self.spec = spec or DatapathSpec()
        self.layers: list[tuple[NDArray[np.int64], NDArray[np.int64]]] = []
        self.slots: dict[str, int] = {}
        self.targets: dict[str, int] = {}
        self.cycles = 0  # fabric clocks streamed since power-on (words and latency)

    def load(self, program: str, layers: list[dict[str, Any]]) -> dict[str, Any]:
        """A model: the count-action program (text, parsed here: data, never code) and
        each layer's stream, `inputs` (S, pairs) (which input feeds each slot; -1: dark)
        and `mags` (S, pairs) (the weight codes). Replaces what was loaded."""
        try:
            prog = parse(program, source="lightning_load")
        except CountActionError as e:
            raise Refused(f"the count-action program: {e}") from None
        names = [m.name for m in prog.modules]
        missing = {"stream", *(f"layer{k + 1}" for k in range(len(layers)))} - set(names)
        if missing:
            raise Refused(f"the program has no module {', '.join(sorted(missing))}: the "
                          "fabric paces the stream by `stream` and a module a layer")
        if not 0 < len(layers) <= self.spec.layers_max:
            raise Refused(f"{len(layers)} layers: the datapath holds 1..{self.spec.layers_max}")
        pairs, held, total = self.n_dacs // 2, [], 0
        for k, lay in enumerate(layers):
            try:
                inputs = np.asarray(lay["inputs"], dtype=np.int64)
                mags = np.asarray(lay["mags"], dtype=np.int64)
            except (KeyError, TypeError, ValueError) as e:
                raise Refused(f"layer {k + 1}: `inputs` and `mags`, integer arrays ({e})"
                              ) from None
            if inputs.ndim != 2 or inputs.shape[1] != pairs or mags.shape != inputs.shape:
                raise Refused(f"layer {k + 1}: inputs {inputs.shape}, mags {mags.shape}: "
                              f"both (samples, {pairs}), one column a modulator pair")
            if not len(inputs) or inputs.min() < -1 or mags.min() < 0 or mags.max() > FULL:
                raise Refused(f"layer {k + 1}: no samples, an input below -1, or a weight "
                              "code outside 0..255")
            total += inputs.size
            if total > self.spec.weight_values:
                raise Refused(f"the model's streams hold over {self.spec.weight_values:,} "
                              "values a DAC: more than the weight memory")
            held.append((inputs, mags))
        self.drv.load_countaction(prog)
        self.layers, self.slots = held, {n: k for k, n in enumerate(names)}
        self.targets = {m.name: m.target for m in prog.modules}
        return msgspec.to_builtins(ModelLoaded(layers=len(held), values=total,
                                               **self._state()))

    def layer(self, k: int, codes: Any) -> dict[str, Any]:
        """Play layer `k` (0-based) on `codes` (its 8-bit inputs): the detector's sample
        under each of its stream's values, the words streamed (fewer than `words`: the
        stream stalled at the next), the fabric clocks it took and the engine's modules
        after it (their interrupts are the host's answer)."""
        if not 0 <= k < len(self.layers):
            raise Refused(f"layer {k + 1}: the loaded model has {len(self.layers)}")
        inputs, mags = self.layers[k]
        a = np.asarray(codes)
        if a.ndim != 1 or a.dtype.kind not in "iu" \
                or not int(inputs.max()) < len(a) <= self.spec.weight_values \
                or (len(a) and (a.min() < 0 or a.max() > FULL)):
            raise Refused(f"layer {k + 1}: its inputs are {int(inputs.max()) + 1} to "
                          f"{self.spec.weight_values:,} 8-bit codes, 0..255")
        values = np.empty((len(inputs), self.n_dacs), dtype=np.int64)
        values[:, 0::2] = mags
        values[:, 1::2] = np.where(inputs >= 0, a[np.maximum(inputs, 0)], 0)
        words = ceil(len(values) / self.spec.word)
        waits = self._gate(k)
        played = 0 if waits else self._pace(words)
        n = min(played * self.spec.word, len(values))
        level = self.photonics.adc(self.photonics.detector(values[:n] * self.amplitude),
                                   self.rng) if n else np.zeros(0)
        cycles = played + ceil(self.spec.latency_ns * self.spec.clock_mhz / 1e3)
        self.cycles += cycles
        return {"levels": level, **msgspec.to_builtins(LayerPlayed(
            words=words, played=played, cycles=cycles, waits_for=waits, **self._state()))}

    def _gate(self, k: int) -> str:
        """Whether layer k's words may stream: its module still counting (armed, not yet
        fired) and the layer before's fired (its last word counted). The layer modules
        gate the words they pace: a DAG missing a layer's edge stalls the stream here.
        Returns what it waits for ("" if nothing)."""
        if k:
            prev = self.drv.ca_status(self.slots[f"layer{k}"])
            if not prev["fired"]:
                return (f"module layer{k}, which has not fired (it counted {prev['count']} "
                        f"of {self.targets[f'layer{k}']})")
        own = self.drv.ca_status(self.slots[f"layer{k + 1}"])
        if own["fired"] or not own["armed"]:
            return (f"module layer{k + 1}, which is {'fired' if own['fired'] else 'disarmed'}"
                    f" before its layer streamed (its count {own['count']})")
        return ""

    def _pace(self, words: int) -> int:
        """Each word: every ready DAC raises its valid line; the word plays if the
        engine's `stream` opened every DAC's gate. Returns the words played."""
        ready = [d for d in range(1, self.n_dacs + 1) if self.photonics.dac_ready[d - 1]]
        gates, everyone = self.board.streamed, set(range(1, self.n_dacs + 1))
        for w in range(words):
            gates.clear()  # the gates of this word (the board's log, read and emptied)
            for d in ready:
                self.board.set_dac_valid(d)
            if {d for _, d in gates} != everyone:
                return w
        gates.clear()
        return words

    def _state(self) -> dict[str, Any]:
        return {"modules": {name: msgspec.convert(self.drv.ca_status(slot), ModuleState)
                            for name, slot in self.slots.items()},
                "cycles_total": self.cycles}

    def status(self) -> dict[str, Any]:
        """The engine's modules by name, and the fabric's clocks since power-on."""
        return msgspec.to_builtins(DatapathState(**self._state()))
