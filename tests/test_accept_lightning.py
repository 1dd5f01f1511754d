"""`oddl accept`'s Lightning checks against `oddl emulate` of the QICK prototype (a module
of its own: the suite's workers take modules whole, and test_accept's are long). The plain
prototype's skip of both is checked in test_accept."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.test_accept import accept, outcomes, relaxed, summary

pytestmark = pytest.mark.realtime  # brokers, emulators, sockets: the wall clock


def test_lightning_checks_over_qick_pyro_and_faults_that_fail_them(
        root: Path, tmp_path: Path) -> None:
    """The product check and the inference check pass on the emulated QICK board (over
    qick.pyro); a DAC that never gets ready fails the first, naming the board; a modulator
    that passes no light fails the second at calibration, naming its pair."""
    qick = relaxed(root, tmp_path, "hw_configs/prototype-4node-qick.toml")
    text = re.sub(r"(?m)^lightning_samples = .*$", "lightning_samples = 64",
                  Path(qick).read_text())  # the suite's time: 64 are plenty
    Path(qick).write_text(re.sub(r"(?m)^lightning_inference_samples = .*$",
                                 "lightning_inference_samples = 5", text))
    r = accept(root, qick, "--only", "lightning", "--only", "lightning-inference",
               "--report", str(tmp_path / "ok"))
    assert r.returncode == 0, r.stdout + r.stderr
    figs = {c["check"]: {f["name"]: f["value"] for f in c["figures"]}
            for c in summary(tmp_path / "ok")["checks"]}
    product, infer = figs["test_lightning_accuracy"], figs["test_lightning_inference"]
    assert product["exact products"] >= 0.95 and product["runs with no light"] == 0
    assert infer["products through the board"] == 5 * 50_200
    assert infer["photonic accuracy"] >= infer["8-bit digital accuracy"] - 0.02
    assert infer["count-action firings"] > 5 * 3
    r = accept(root, qick, "--only", "lightning", "--fault", "dac-not-ready:1", "--report",
               str(tmp_path / "bad"))
    assert r.returncode == 1
    msg = outcomes(tmp_path / "bad", "failed")["test_lightning_accuracy"]
    assert "64 of 64 runs put no light on the detector" in msg and "pyro://127.0.0.1:" in msg
    r = accept(root, qick, "--only", "lightning-inference", "--fault", "dead-modulator:1",
               "--report", str(tmp_path / "dark"))
    assert r.returncode == 1, r.stdout + r.stderr
    msg = outcomes(tmp_path / "dark", "failed")["test_lightning_inference"]
    assert "modulator pair 0 (DACs 0, 1)" in msg and "passes no light" in msg, msg
    assert "Traceback" not in r.stdout + r.stderr
