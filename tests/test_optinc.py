"""OptINC (seeds/004): MZI meshes, the averaging unit, the cascade, the network's closed
form and the training comparison."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from oddl.app.cli import main
from oddl.controller.base.clock import Clock
from oddl.controller.base.collectives import build, check_balanced
from oddl.controller.base.config import ConfigError, NetworkSpec, load_experiment
from oddl.controller.stage2.workloads import CollectiveEngine
from oddl.sim.clock import VirtualClockLoop
from oddl.sim.networks.baselines import build_network
from oddl.studies.mzi import Components, decompose
from oddl.studies.onn import AveragingUnit, OptINC, quantise, realise
from oddl.studies.training import compare
from pydantic import ValidationError
from scipy.stats import unitary_group


@pytest.mark.parametrize("n", [2, 3, 5, 8, 12])
def test_mesh_from_a_unitarys_phases_rebuilds_it(n: int) -> None:
    u = unitary_group.rvs(n, random_state=n)
    mesh = decompose(u)
    # Clements' rectangle: n(n-1)/2 MZIs, n columns (one MZI is one column)
    assert len(mesh.mzis) == n * (n - 1) // 2 and mesh.depth == (n if n > 2 else 1)
    assert np.abs(mesh.matrix() - u).max() < 1e-9
    again = decompose(mesh.matrix())  # and phases -> unitary -> phases -> the same unitary
    assert np.abs(again.matrix() - u).max() < 1e-9


def test_not_a_unitary_is_refused() -> None:
    with pytest.raises(ValueError, match="not a unitary"):
        decompose(np.ones((3, 3)))


@pytest.mark.parametrize("shape,how", [((3, 7), "horizontal"), ((8, 2), "vertical"),
                                       ((4, 4), "square")])
def test_non_square_weights_partition_into_square_blocks(shape: tuple[int, int],
                                                        how: str) -> None:
    w = np.random.default_rng(1).normal(size=shape)
    r = realise(w)
    assert r.how == how and all(b.v.n == min(shape) for b in r.blocks)
    assert np.abs(r.matrix() - w).max() < 1e-9
    assert all(b.att.max() <= 1 + 1e-12 for b in r.blocks)  # attenuators are passive


def test_ideal_unit_averages_exactly_up_to_the_output_quantisation() -> None:
    comp = Components(output_bits=8)
    fabric = OptINC(8, 8, comp, seed=3)
    x = np.random.default_rng(0).uniform(-1, 1, (8, 1000))
    got = fabric.average(x, 1.0)
    mean = quantise(x, 8, 1.0).mean(axis=0)  # what the servers' 8-bit gradients average to
    lsb = 1 / 127
    assert np.abs(got - mean[None, :]).max() <= lsb / 2 + 1e-12  # the output's rounding only
    assert np.allclose(np.round(got / lsb), got / lsb)  # and it is on the 8-bit grid
    assert fabric.matrix_error < 1e-12


def test_cascade_equals_flat_averaging() -> None:
    x = np.random.default_rng(2).uniform(-1, 1, (16, 50))
    two = OptINC(16, 4, Components(), seed=0)
    one = OptINC(16, 16, Components(), seed=0)
    assert two.levels == [4, 4] and one.levels == [16]
    assert np.abs(two.average(x, 1.0) - one.average(x, 1.0)).max() < 1e-12
    assert np.abs(two.average(x, 1.0) - x.mean(axis=0)).max() < 1e-12
    with pytest.raises(ValueError, match="serves a multiple of 4 up to 16"):
        OptINC(20, 4, Components())


def test_calibration_takes_out_what_the_chip_gets_wrong() -> None:
    comp = Components(coupler_error_rad=0.03, mzi_loss_db=0.2)
    unit = AveragingUnit(4, comp, seed=5)
    assert unit.error_before > 0.01  # couplers off 50:50 and lossy: the mean is wrong
    assert unit.error_after < unit.error_before / 100


def _allreduce_ns(n: int, size: int, **kw: object) -> tuple[int, int]:
    loop = VirtualClockLoop()
    clock = Clock(loop)
    ranks = [f"h{i}" for i in range(n)]
    sched = build("optinc", n, size, 1, n)
    check_balanced(sched)
    engine: CollectiveEngine
    net = build_network(NetworkSpec(name="o", kind="optinc", **kw), clock, ranks, 100.0,
                        lambda f: engine.on_delivered(f))
    engine = CollectiveEngine(clock, sched, ranks, net.submit)
    done = loop.create_future()
    engine.start_iteration(0, 0, done.set_result)
    t = loop.run_until_complete(done)
    loop.close()
    return t, len(net.levels)


@pytest.mark.parametrize("n,ports,levels", [(8, 32, 1), (64, 8, 2)])
def test_network_time_is_its_closed_form(n: int, ports: int, levels: int) -> None:
    # bytes / (M x line rate) + the optical path once per level: 10 MB over 4 x 100 Gb/s
    t, lv = _allreduce_ns(n, 10_000_000, transceivers=4, ports=ports, latency_ns=700)
    assert lv == levels and t == 10_000_000 * 8 / 400 + 700 * levels


def test_optinc_network_and_collective_go_together(tmp_path: Path, root: Path) -> None:
    assert NetworkSpec(name="o", kind="optinc").collective == "optinc"
    for bad in ({"kind": "optinc", "collective": "ring"},
                {"kind": "electrical", "collective": "optinc"}):
        with pytest.raises(ValidationError, match="runs on kind 'optinc' only"):
            NetworkSpec(name="x", **bad)  # type: ignore[arg-type]
    exp = tmp_path / "e.toml"
    exp.write_text((root / "experiments" / "table1-resnet50.toml").read_text().replace(
        "[reference]", '[[networks]]\nname = "o"\nkind = "optinc"\nports = 3\n\n[reference]'))
    with pytest.raises(ConfigError) as ei:  # 4 servers on 3-port units: no cascade fits
        load_experiment(exp, root / "hw_configs" / "prototype-4node.toml")
    assert ei.value.issues[0].path == "networks[2].ports"
    assert "serves a multiple of 3 up to 9" in ei.value.issues[0].reason


def test_training_comparison_is_deterministic_for_a_seed() -> None:
    a = compare(4, Components(output_bits=8, phase_noise_rad=0.01), 32, epochs=3, seed=7)
    b = compare(4, Components(output_bits=8, phase_noise_rad=0.01), 32, epochs=3, seed=7)
    assert a[0].accuracy == b[0].accuracy and a[1].accuracy == b[1].accuracy
    assert a[1].drift == b[1].drift and a[1].drift[-1] > 0  # each port its own copy
    ideal = compare(4, Components(), 32, epochs=3, seed=7)
    assert ideal[1].accuracy == pytest.approx(ideal[0].accuracy, abs=0.01)


def test_cli_train_and_mesh_print_fractions(tmp_path: Path) -> None:
    r = CliRunner().invoke(main, ["optinc", "train", "--servers", "4", "--epochs", "2",
                                  "--json", "--plot", str(tmp_path / "acc.png")])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert 0 < out["exact_accuracy"] <= 1 and 0 < out["optical_accuracy"] <= 1
    assert len(out["optical_curve"]) == 2 and (tmp_path / "acc.png").stat().st_size > 0
    r = CliRunner().invoke(main, ["optinc", "mesh", "--size", "4", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["decomposition_error"] < 1e-9
    assert 0 < out["averaging_error"] < 0.1 and out["matrix_error_calibrated"] < 0.01


def test_the_training_arithmetic_is_the_same_bits_whatever_the_cpu_picks(root: Path) -> None:
    """Issue 62: docs/optinc.md's table did not reproduce on another x86-64 machine: numpy
    picks its exp and OpenBLAS its matrix kernel by the CPU, and they differ in the last
    bit. The training's arithmetic goes through controller/base/fixedmath.py: the same
    replicas after two epochs of exact averaging, to the bit, under each OpenBLAS kernel
    and numpy SIMD width this machine can run (numpy's and OpenBLAS's own gave four)."""
    import os
    import subprocess
    import sys

    script = ("import hashlib\nfrom oddl.studies import training as T\nout = []\n"
              "T._sgd(4, T.exact, T._init(0), T._grad, 2, 16, 0.1, 0,\n"
              "       lambda p, _d: out.append(hashlib.sha256(p.tobytes()).hexdigest()))\n"
              "print(out[-1])\n")
    no_avx512 = "AVX512F,AVX512CD,AVX512_SKX,AVX512_CLX,AVX512_CNL,AVX512_ICL"
    digests = {}
    for env in ({"OPENBLAS_CORETYPE": "Prescott"}, {"OPENBLAS_CORETYPE": "Haswell"},
                {"OPENBLAS_CORETYPE": "SkylakeX"}, {"NPY_DISABLE_CPU_FEATURES": no_avx512}):
        r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           cwd=root, env={**os.environ, **env}, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        digests[tuple(env.values())] = r.stdout.strip()
    assert len(set(digests.values())) == 1, digests
