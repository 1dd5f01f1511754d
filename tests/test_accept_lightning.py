"""`oddl accept`'s Lightning checks against `oddl emulate` of the QICK prototype (a module
of its own: the suite's workers take modules whole, and test_accept's are long; the faults
that fail them in test_accept_lightning_faults, beside it). The plain prototype's skip of
both is checked in test_accept."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.test_accept import accept, relaxed, summary

pytestmark = pytest.mark.realtime  # brokers, emulators, sockets: the wall clock


def qick_testbed(root: Path, tmp_path: Path) -> str:
    """The QICK prototype, relaxed, with the suite's sample counts (64 are plenty)."""
    qick = relaxed(root, tmp_path, "hw_configs/prototype-4node-qick.toml")
    text = re.sub(r"(?m)^lightning_samples = .*$", "lightning_samples = 64",
                  Path(qick).read_text())
    Path(qick).write_text(re.sub(r"(?m)^lightning_inference_samples = .*$",
                                 "lightning_inference_samples = 5", text))
    return qick


def test_lightning_checks_pass_over_qick_pyro(root: Path, tmp_path: Path) -> None:
    """The product check and the inference check pass on the emulated QICK board (over
    qick.pyro)."""
    qick = qick_testbed(root, tmp_path)
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
    assert infer["host calls an inference"] == 3  # the board's datapath paced it

