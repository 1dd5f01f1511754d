"""`oddl optinc`: OptINC (seeds/004), gradients averaged by an optical neural network in
flight: its training, its ONN unit and its cascade (docs/optinc.md)."""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click
from oddl.app.cli.main import emit, main


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
