"""`oddl accept`'s Lightning checks failed by faults of the emulated QICK prototype (apart
from test_accept_lightning's pass: the suite's workers take modules whole, so the two
halves, about as long, run side by side)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_accept import accept, outcomes
from tests.test_accept_lightning import qick_testbed

pytestmark = pytest.mark.realtime  # brokers, emulators, sockets: the wall clock


def test_lightning_faults_fail_their_checks_naming_the_part(root: Path, tmp_path: Path
                                                            ) -> None:
    """A DAC that never gets ready fails the product check, naming the board; a modulator
    that passes no light fails the inference check at calibration, naming its pair."""
    qick = qick_testbed(root, tmp_path)
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
