"""OptINC's trained ONN (studies/quantiser.py): it averages and quantises, hardware-aware
training holds on a noisy chip, the cascade is exact, and the training task runs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from oddl.app.cli import main
from oddl.app.registry import allreduce_ns
from oddl.controller.base.config import NetworkSpec
from oddl.studies import quantiser as Q
from oddl.studies import training as T
from oddl.studies.mzi import Components
from oddl.studies.onn import CHIP


@pytest.fixture(scope="module")
def trained() -> Q.Trained:
    return Q.load(Q.trained_path(4))


def test_the_shipped_unit_outputs_the_rounded_mean_on_an_ideal_chip(
        trained: Q.Trained) -> None:
    unit = trained.ideal()
    v = np.array([[0, 255, 3, 1, 200], [0, 255, 4, 2, 201], [0, 255, 4, 2, 202],
                  [1, 255, 5, 2, 203]])
    # round half up: (1 + 2) // 4 = 0, 1023 + 2 -> 255, 16 + 2 -> 4, 7 + 2 -> 2 ...
    assert unit.run(v).tolist() == [0, 255, 4, 2, 202] == Q.rounded_mean(v).tolist()
    share, errors, passes = unit.exact_share(5_000, checked=True)
    assert share >= 0.99 and passes == 1, errors  # no pilot ever wrong: never a retry


def test_hardware_aware_training_beats_the_ideally_trained_unit_on_the_noisy_chip(
        trained: Q.Trained) -> None:
    as_trained = trained.as_trained(CHIP).exact_share(5_000)[0]
    aware = trained.hardware_aware(CHIP)
    share = aware.exact_share(5_000)[0]
    assert share > as_trained + 0.2, (share, as_trained)
    # a disturbed pass shows in the pilots: sent again, nearly every value comes out right
    checked, _, passes = aware.exact_share(5_000, checked=True)
    assert checked > max(share, 0.99) and passes > 1


def test_hardware_aware_training_fits_a_cell_to_its_chip(trained: Q.Trained) -> None:
    cell = trained.as_trained(CHIP).cells[0]  # the ideal design on a lossy, skewed chip
    x, want = Q.cell_table(4)
    fit = Components(mzi_loss_db=CHIP.mzi_loss_db)

    def rms(c: Q.Cell) -> float:
        out = c.run(x.astype(complex), c.matrices(fit, None), fit, None).real
        return float(np.sqrt(((out - want) ** 2).mean()))

    assert rms(Q.tune(cell, 4, CHIP, draws=3, max_nfev=10)) < rms(cell) / 2


def test_a_cell_trains_from_random_starts() -> None:
    w = Q.train_weights(4, seed=0, restarts=4)
    x, want = Q.cell_table(4)
    out = w.forward(x)
    assert ((out[:, 0] > 0.5) == (want[:, 0] > 0.5)).all()
    assert np.abs(out[:, 1] - want[:, 1]).max() < 0.5 / 4


def test_two_levels_of_trained_units_round_once(trained: Q.Trained) -> None:
    c = Q.Cascade(trained.template(), 4, 8, Components())
    v = np.random.default_rng(3).integers(0, 256, (16, 2_000))
    assert (c.run(v) == Q.rounded_mean(v)).all()
    assert c.mzis == Q.cascade_mzis(4, 8)


def test_the_counts_match_the_built_unit_and_the_unit_refuses_what_it_cannot_do(
        trained: Q.Trained) -> None:
    assert trained.ideal().mzis == Q.mzi_count(4, 8) == 364
    assert Q.mzi_count(4, 8, partitioned=False) > 4 * Q.mzi_count(4, 8)  # Fig. 4 pays
    assert Q.domain(4, 8) == {"without_p": 2 ** 32, "with_p": 5 ** 8, "cell": 20}
    with pytest.raises(ValueError, match="power of two"):
        Q.Quantiser.on_chip(trained.template(), 6, 8, Components())
    with pytest.raises(ValueError, match="outside the cell"):
        Q.Quantiser.on_chip(trained.template(), 4, 8, Components(), carry_in=4)


def test_the_cnn_gradient_is_the_loss_slope() -> None:
    xtr, ytr, _, _ = T._data(0)
    x, y = xtr[:20], ytr[:20]
    p = T.cnn_init(0) + np.random.default_rng(3).normal(0, 0.05, T.cnn_init(0).size)
    g = T.cnn_grad(p, x, y)

    def loss(q: np.ndarray) -> float:
        pr = T.cnn_predict(q, x)
        return float(-np.log(pr[np.arange(20), y]).mean())

    for i in (0, 150, 170, 1000, 4700, 5125):  # conv, its bias, dense, output
        e = np.zeros_like(p)
        e[i] = 1e-6
        assert g[i] == pytest.approx((loss(p + e) - loss(p - e)) / 2e-6, rel=1e-4, abs=1e-9)


def test_the_ring_at_eight_bits_is_what_the_ideal_unit_computes(trained: Q.Trained) -> None:
    g = np.random.default_rng(0).normal(0, 1, (4, 3_000))
    scale = float(np.abs(g).max())
    ring = T.ring(8)(g, scale)
    assert (ring == T.trained_onn(trained.ideal())(g, scale)).all()
    assert np.abs(ring[0] - g.mean(axis=0)).max() <= 2 * scale / 255  # a level's step


def test_the_onn_pass_is_in_the_network_time() -> None:
    spec = NetworkSpec(name="o", kind="optinc", latency_ns=700, onn_pass_ns=0.72)
    assert allreduce_ns(spec, "optinc", 4, 5_000, 100.0) == 100 + 701  # ceil(700.72)
    two = NetworkSpec(name="o", kind="optinc", latency_ns=700, onn_pass_ns=50, ports=4)
    assert allreduce_ns(two, "optinc", 16, 5_000, 100.0) == 100 + 2 * 750


def test_optinc_onn_command_reports_the_unit() -> None:
    r = CliRunner().invoke(main, ["optinc", "onn", "--json", "--samples", "2000"])
    assert r.exit_code == 0, r.output
    onn = json.loads(r.output)["onn"]
    sizes = {(t["servers"], t["bits"]): t["with_p"] for t in json.loads(r.output)["mzi_table"]}
    assert sizes[(16, 8)] == Q.mzi_count(16, 8) == 1392  # the cost at sizes not shipped too
    assert onn["kind"] == "trained" and onn["hardware_aware"] is True
    assert (onn["servers"], onn["bits"], onn["mzis"]) == (4, 8, 364)
    assert onn["exact_share_ideal_chip"] >= 0.99
    assert onn["exact_share"] > onn["exact_share_ideally_trained"]


def test_optinc_train_with_the_trained_onn(tmp_path: Path) -> None:
    r = CliRunner().invoke(main, ["optinc", "train", "--onn", "trained", "--epochs", "1",
                             "--plot", str(tmp_path / "c.png"), "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["model"] == "cnn" and out["parameters"] > 2_410  # more than the MLP
    assert all(0 < out[f"{k}_accuracy"] <= 1 and len(out[f"{k}_loss"]) == 1
               for k in ("exact", "ring", "optical"))
    comm = out["iteration_communication"]
    assert comm["optinc_ns"] < comm["ring_ns"]
    assert out["onn"]["kind"] == "trained"
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("args", [["--servers", "6"], ["--servers", "16", "--ports", "8"],
                                  ["--servers", "32", "--ports", "4"]])
def test_the_trained_onn_says_which_sizes_it_serves(args: list[str]) -> None:
    r = CliRunner().invoke(main, ["optinc", "train", "--onn", "trained", *args])
    assert r.exit_code == 2 and "trained units serve 4, 8 servers" in r.output


@pytest.mark.parametrize("damage", ["{", '{"servers": 4}', "cut", "cascade"])
def test_a_damaged_unit_file_is_named(tmp_path: Path, damage: str) -> None:
    f = tmp_path / "unit.json"
    if damage in ("cut", "cascade"):  # a cell short, or the cascade a chip short
        d = json.loads(Q.trained_path(4).read_text())
        key = "tuned" if damage == "cut" else "cascade"
        d[key] = d[key][:-1]
        damage = json.dumps(d)
    f.write_text(damage)
    with pytest.raises(ValueError, match=r"unit\.json: not a trained unit"):
        Q.load(f)


def test_the_cell_fit_has_its_exact_slopes() -> None:
    """train_weights' Jacobian is the residuals' own slope (a wrong one trains nothing)."""
    x, y = Q.cell_table(8)
    r = np.random.default_rng(5)
    carry = np.array([0.0, 1.0, 0.0])  # the carry in, off a little in each draw
    fit = Q._CellFit([x + r.normal(0, 0.02, (len(x), 1)) * carry for _ in range(2)], y,
                     Q.hidden(8), [r.normal(0, 0.03, (len(x), Q.hidden(8) + 2))
                                   for _ in range(2)])
    p = r.normal(0, 1, fit.n1 + fit.nh + 2 * fit.width)
    p[fit.n1:fit.n1 + fit.nh] = r.uniform(0.5, 2, fit.nh)
    j = fit.jac(p)
    for i in r.choice(p.size, 12, replace=False):
        e = np.zeros_like(p)
        e[i] = 1e-6
        fd = (fit.resid(p + e) - fit.resid(p - e)) / 2e-6
        assert np.allclose(j[:, i], fd, atol=1e-6), i


def test_the_cascade_trained_on_its_chips_beats_the_design_put_on_them(
        trained: Q.Trained) -> None:
    two = trained.two_level(CHIP)
    assert (two.servers, len(two.units)) == (16, 5)
    share = two.exact_share(2_000)[0]
    assert share > trained.two_level(CHIP, tuned=False).exact_share(2_000)[0] + 0.1
    checked, _, passes = two.exact_share(2_000, checked=True)
    assert checked > share and passes > 1


def test_optinc_train_through_the_trained_cascade() -> None:
    r = CliRunner().invoke(main, ["optinc", "train", "--onn", "trained", "--servers", "16",
                                  "--ports", "4", "--epochs", "1", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["servers"] == 16 and 0 < out["optical_accuracy"] <= 1
    assert out["cascade"]["servers"] == 16


@pytest.mark.parametrize("servers", [4, 8])
def test_each_shipped_cell_fits_its_table_with_2n_ports(servers: int) -> None:
    t = Q.load(Q.trained_path(servers))
    assert (t.servers, t.bits, t.weights.gain.size) == (servers, 8, 2 * servers)
    assert t.ideal().mzis == Q.mzi_count(servers, 8)
    x, want = Q.cell_table(servers)
    assert Q._table_margin(t.weights.forward(x), want, servers) > 0


def test_the_four_server_cell_restores_its_carry(trained: Q.Trained) -> None:
    """What keeps the ripple exact (docs/optinc.md: the 8-server cell does not)."""
    x, want = Q.cell_table(4)
    off = x.copy()
    off[:, 1] += 0.01  # the carry from the cell below, a little off
    assert np.abs(trained.weights.forward(off)[:, 1] - want[:, 1]).max() < 0.001


def test_optinc_onn_reports_each_size_and_the_cascade() -> None:
    r = CliRunner().invoke(main, ["optinc", "onn", "--servers", "8", "--json",
                                  "--samples", "1000"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert (out["onn"]["servers"], out["onn"]["hidden"]) == (8, 16) and "cascade" not in out
    r = CliRunner().invoke(main, ["optinc", "onn", "--json", "--samples", "1000"])
    c = json.loads(r.output)["cascade"]
    assert (c["servers"], c["chips"], c["mzis"]) == (16, 5, Q.cascade_mzis(4, 8))


def test_the_command_offers_the_shipped_sizes() -> None:
    from oddl.app.cli.optinc import ONN_SIZES

    assert [str(n) for n in Q.SIZES] == ONN_SIZES
    assert all(Q.trained_path(n).is_file() for n in Q.SIZES)
