"""Lightning over QICK: qick programs on the emulated soc, the photonic model, decoding."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from oddl.app.cli import main
from oddl.drivers.lightning import (
    FULL,
    SEGMENTS,
    LightningConfig,
    LightningControl,
    LightningSignalProcessing,
    NoOutput,
    characterize,
    expected_product,
    multiply,
    operand_pairs,
)
from oddl.sim.devices.qick_soc import MAXV, EmulatedQickSoc, Photonics
from pydantic import ValidationError
from qick import QickConfig

IDEAL = {"noise_rms_lsb": 0.0, "adc_bits": None}


def test_decoding_is_exact_without_noise_over_all_pairs() -> None:
    """Every (a, b) through the photonic model (modulators with a 20 dB extinction ratio,
    detector offset) and the decoder: the product must be round(a b / 255) exactly."""
    ph = Photonics(**IDEAL)
    cfg = LightningConfig(dac_0=0, dac_1=0)
    soc = EmulatedQickSoc(ph)
    dec = LightningSignalProcessing(soc, cfg)
    slices = dec.segment_slices()
    n = slices[-1].stop + 8
    step = MAXV // FULL  # the code -> gain step LightningControl plays
    codes = np.arange(FULL + 1)
    a, b = np.meshgrid(codes, codes, indexing="ij")
    wrong = []
    levels = []
    for sa, sb in SEGMENTS:  # the drive of each segment, for all pairs at once
        ga = a if sa is None else np.full_like(a, sa)
        gb = b if sb is None else np.full_like(b, sb)
        amps = np.stack([ga * step / MAXV, gb * step / MAXV], axis=-1)
        levels.append(ph.detector(amps))
    for i in range(FULL + 1):
        for j in range(FULL + 1):
            wave = np.zeros((n, 2))
            for lv, sl in zip(levels, slices, strict=True):
                wave[sl, 0] = lv[i, j]
            if dec_product(dec, wave, i, j) != expected_product(i, j):
                wrong.append((i, j))
    assert wrong == []


def dec_product(dec: LightningSignalProcessing, wave: np.ndarray, a: int, b: int) -> int:
    d = LightningSignalProcessing.__new__(LightningSignalProcessing)
    d.__dict__.update(dec.__dict__)
    d.config = dec.config.model_copy(update={"dac_0": a, "dac_1": b})
    return d.decode_adc_result(wave).product


def test_full_program_path_is_exact_without_noise() -> None:
    # boundary pairs: a b / 255 closest to k + 1/2 (127 x 1 -> 0.498), the corners
    soc = EmulatedQickSoc(Photonics(**IDEAL))
    pairs = [(127, 1), (128, 1), (255, 128), (1, 255), (0, 0), (255, 255), (254, 254),
             *operand_pairs(40, seed=3)]
    rep = characterize(soc, soc, pairs)
    assert rep["exact"] == 1.0 and rep["no_output"] == 0
    # Lightning's metric: only the decoder's rounding to 8 bits is left, 100 - 100 RMSE of
    # round(a b / 255) / 255 against (a / 255) (b / 255)
    ab = np.array(pairs, dtype=float)
    rounding = np.round(ab[:, 0] * ab[:, 1] / 255) / 255 - ab[:, 0] * ab[:, 1] / 255 ** 2
    assert rep["rmse_accuracy"] == pytest.approx(100 - 100 * np.sqrt(np.mean(rounding ** 2)),
                                                 abs=1e-4)
    assert 99.8 < rep["rmse_accuracy"] < 100


def test_the_board_plays_what_the_program_asked_for() -> None:
    soc = EmulatedQickSoc(Photonics(**IDEAL))
    cfg = LightningConfig(dac_0=100, dac_1=50, pulse_ns=200, gap_ns=50)
    prog = LightningControl(soc, cfg)
    wave = prog.run(soc)
    slot = prog.slot_c
    # generator 0 plays a in segments 0-1, 255 in 4-5; generator 1 plays b in 0 and 2,
    # 255 in 4 and 6; each pulse 200 ns long (77 cycles of 384 MHz)
    got = sorted((t - 200, g, gain, n) for t, g, gain, n in soc.pulses)
    want = sorted([(0, 0, 100 * 128, 77), (slot, 0, 100 * 128, 77), (4 * slot, 0, 255 * 128, 77),
                   (5 * slot, 0, 255 * 128, 77), (0, 1, 50 * 128, 77),
                   (2 * slot, 1, 50 * 128, 77), (4 * slot, 1, 255 * 128, 77),
                   (6 * slot, 1, 255 * 128, 77)])
    assert got == want
    # in the waveform: light during the first 200 ns, dark in the gap after it
    ns = 1e3 / soc["readouts"][0]["f_output"]
    assert wave[int(100 / ns), 0] > 10 * wave[int(225 / ns), 0]
    assert soc.get_tproc_counter(1) == 1  # the shot counter acquire_decimated waits for


def test_accuracy_falls_as_noise_rises() -> None:
    pairs = operand_pairs(300, seed=1)
    acc = [characterize(s, s, pairs)["exact"] for s in (
        EmulatedQickSoc(Photonics(noise_rms_lsb=x, seed=2)) for x in (0.0, 15.0, 60.0))]
    assert acc[0] > acc[1] > acc[2]
    assert acc[2] < 0.8


def test_streamer_gate_gives_no_output_rather_than_a_wrong_one() -> None:
    soc = EmulatedQickSoc(Photonics(dac_ready=[True, False]))
    with pytest.raises(NoOutput, match="streamer never fired"):
        multiply(soc, soc, LightningConfig(dac_0=200, dac_1=100))
    assert soc.streamed == []
    ok = EmulatedQickSoc(Photonics())
    assert multiply(ok, ok, LightningConfig(dac_0=200, dac_1=100))[0].product == 78
    assert ok.streamed == [0, 1]


@pytest.mark.parametrize("kw,msg", [
    ({"dac_0": 256, "dac_1": 1}, "less than or equal to 255"),
    ({"dac_0": -1, "dac_1": 1}, "greater than or equal to 0"),
    ({"dac_0": 1, "dac_1": 1, "dac_channels": (1, 1)}, "two distinct"),
    ({"dac_0": 1, "dac_1": 1, "dac_2": 5}, "Extra inputs are not permitted"),
    ({"dac_0": 1, "dac_1": 1, "pulse_ns": 0}, "greater than 0"),
])
def test_invalid_operands_and_configs(kw: dict, msg: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ValidationError, match=msg):
        LightningConfig(**kw)


def test_configs_the_board_cannot_play_are_refused() -> None:
    soc = EmulatedQickSoc(Photonics())
    with pytest.raises(ValueError, match="readout 3 does not exist"):
        LightningControl(soc, LightningConfig(dac_0=1, dac_1=1, adc_channel=3))
    with pytest.raises(ValueError, match="generator 5 does not exist"):
        LightningControl(soc, LightningConfig(dac_0=1, dac_1=1, dac_channels=(0, 5)))
    with pytest.raises(ValueError, match="exceeds the buffer"):
        LightningControl(soc, LightningConfig(dac_0=1, dac_1=1, pulse_ns=9000))


def test_soc_config_round_trips_through_qickconfig() -> None:
    cfg = EmulatedQickSoc().get_cfg()
    again = QickConfig(json.loads(json.dumps(cfg)))  # as make_proxy rebuilds it
    assert "oddl emulated board" in str(again)
    assert len(again["gens"]) == 2 and again["tprocs"][0]["type"] == "axis_tproc64x32_x8"


def test_cli_product_json_and_plots(tmp_path: Path) -> None:
    r = CliRunner().invoke(main, ["lightning", "--a", "100", "--b", "50", "--json",
                                  "--plot", str(tmp_path / "w.png")])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["product"] == d["expected"] == 20 and d["soc"] == "emulated"
    assert abs(d["raw_product"] - 100 * 50 / 255) < 0.5
    assert (tmp_path / "w.png").read_bytes()[:4] == b"\x89PNG"
    r = CliRunner().invoke(main, ["lightning", "--a", "300", "--b", "5"])
    assert r.exit_code == 2 and "--a: Input should be less than or equal to 255" in r.output
    r = CliRunner().invoke(main, ["lightning", "--characterize", "--samples", "200",
                                  "--json", "--plot", str(tmp_path / "h.png")])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output)
    assert rep["pairs"] == 200 and rep["within_1_lsb"] == 1.0 and rep["exact"] > 0.9
    assert rep["published_accuracy"] == 0.9925
    assert (tmp_path / "h.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.realtime
def test_qick_pyro_make_proxy_against_the_emulated_soc() -> None:
    from oddl.sim.devices.qick_pyro import QickPyroServer

    srv = QickPyroServer(Photonics(**IDEAL)).start()
    try:
        from oddl.drivers.lightning import open_soc

        soc, soccfg = open_soc(srv.url)  # qick.pyro.make_proxy underneath
        assert isinstance(soccfg, QickConfig)
        prod, _ = multiply(soc, soccfg, LightningConfig(dac_0=77, dac_1=211))
        assert prod.product == expected_product(77, 211) == 64
    finally:
        srv.stop()


def test_testbed_qick_section_is_validated(root: Path, tmp_path: Path) -> None:
    text = (root / "hw_configs" / "prototype-4node-qick.toml").read_text()
    bad = tmp_path / "q.toml"
    bad.write_text(text.replace('soc = "emulated"', 'soc = "telnet://board"'))
    r = CliRunner().invoke(main, ["check", str(bad)])
    assert r.exit_code == 2 and "qick.soc" in r.output and "pyro://HOST:PORT/NAME" in r.output


@pytest.mark.realtime
def test_a_keyed_qick_server_unpickles_nothing_a_stranger_sends(tmp_path: Path) -> None:
    """Reproducer (issue 85): the emulated board's Pyro daemon unpickled what any local
    client sent; a forged argument made it write a file. With its HMAC key (the emu
    testbed's `hmac_key_file`), an unsigned message is refused before it is read; the
    signed client works as before."""
    import Pyro4
    import Pyro4.errors
    from oddl.drivers.lightning import open_soc
    from oddl.sim.devices.qick_pyro import QickPyroServer

    class Forged:
        def __init__(self, path: Path) -> None:
            self.path = str(path)

        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (Path.touch, (self.path,))

    def forge(srv: QickPyroServer, key: bytes | None, marker: Path) -> None:
        ns = Pyro4.locateNS(host=srv.host, port=srv.ns_port, hmac_key=key)
        stranger = Pyro4.Proxy(ns.lookup(srv.name))  # no key: what any local user has
        Pyro4.config.SERIALIZER = "pickle"
        try:
            stranger.get_cfg(Forged(marker))
        except Exception:  # (the call may fail either way: what matters is the file)
            pass
        finally:
            stranger._pyroRelease()

    for key in (None, b"k" * 32):
        marker = tmp_path / f"planted-{key is not None}"
        srv = QickPyroServer(Photonics(**IDEAL), hmac_key=key).start()
        try:
            forge(srv, key, marker)
            assert marker.exists() == (key is None)  # unkeyed: it ran the forged code
            if key is not None:
                with pytest.raises(Pyro4.errors.PyroError):
                    open_soc(srv.url)  # unsigned: refused
                soc, soccfg = open_soc(srv.url, key)
                prod, _ = multiply(soc, soccfg, LightningConfig(dac_0=77, dac_1=211))
                assert prod.product == 64
        finally:
            srv.stop()


@pytest.mark.parametrize("args, why", [
    (["lightning", "--characterize", "--samples", "0"], "'--samples': 0 is not in the range"),
    (["lightning", "--a", "1", "--b", "2", "--noise", "nan"], "'nan' is not a finite number"),
    (["lightning", "infer", "--dataset", "digits", "--dead-modulator", "9"],
     "a DAC of the board's 4: 0 to 3"),
    (["usage", "--since", "0001-01-01", "--arbiter", "http://127.0.0.1:9", "--token-file",
      "/dev/null"], "not a time this machine can count from 1970"),
])
def test_an_argument_out_of_its_range_is_refused_before_any_work(args: list[str],
                                                                   why: str) -> None:
    """Issue 85's argument edges: each was a traceback's message, exit 1, or work done."""
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2, r.output
    assert why in r.output and "Traceback" not in r.output
