"""What a run opens of its testbed (app/session.py, drivers/lab.py): every
device at once, every failure named; the lock for hw, taken before anything is opened."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from oddl.app import api, registry
from oddl.controller.base.config import load_experiment, load_testbed
from oddl.controller.base.topology import Grid
from oddl.controller.service.backend import RunFailed
from oddl.controller.service.lock import TestbedBusy, TestbedLock

ROOT = Path(__file__).resolve().parent.parent


def lab_testbed(tmp_path: Path) -> Path:
    """The prototype as a lab's hw config whose devices are all missing or mistyped."""
    text = (ROOT / "hw_configs" / "prototype-4node.toml").read_text()
    text = text.replace('backend = "sim"', 'backend = "hw"')
    text = text.replace('board = "onic0"', 'board = "grpc://127.0.0.1:9"')
    text = text.replace('board = "onic1"', 'board = "grpc://127.0.0.1:19"')
    text = text.replace('serial = "/dev/ttyUSB0"', f'serial = "{tmp_path / "ttyNONE"}"')
    p = tmp_path / "lab.toml"
    p.write_text(text)
    return p


@pytest.mark.realtime
def test_every_device_that_cannot_be_opened_is_named_at_once(tmp_path: Path) -> None:
    """Reproducer: the boards were opened one after another and the first failure ended it
    (board n0 only, after its own timeout); now all four boards are tried together and
    every failure, the WSS's too, is in the one error."""
    tb = load_testbed(lab_testbed(tmp_path))
    t0 = time.monotonic()
    with pytest.raises(RunFailed) as e:
        registry.open_backend("hw", tb, Grid.from_testbed(tb))
    msg = str(e.value)
    assert msg.startswith("5 of the testbed's devices cannot be opened:"), msg
    for n, why in (("n0", "grpc://127.0.0.1:9"), ("n1", "grpc://127.0.0.1:19"),
                   ("n2", "'onic2' is neither grpc://HOST:PORT, serial:PORT[?baud=B] nor "
                          "'local'"),
                   ("n3", "'onic3' is neither grpc://HOST:PORT, serial:PORT[?baud=B] nor "
                          "'local'")):
        assert f"board {n} (" in msg and why in msg, msg
    assert f"WSS wss-row0 ({tmp_path / 'ttyNONE'})" in msg, msg
    print(f"all devices tried in {time.monotonic() - t0:.2f} s")


def test_a_hw_run_on_a_held_testbed_is_refused_before_anything_is_opened(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ODDL_LOCK_DIR", str(tmp_path / "locks"))
    exp = tmp_path / "e.toml"
    exp.write_text((ROOT / "experiments" / "table1-resnet50.toml").read_text().replace(
        "../hw_configs/prototype-4node.toml", str(lab_testbed(tmp_path))))
    ctx = load_experiment(exp)
    with TestbedLock(ctx.testbed.name, "someone's long run").acquire(), \
            pytest.raises(TestbedBusy, match="someone's long run"):
        api.run(ctx, backend="hw", iterations=1, out=tmp_path / "run")
    # the run directory says what was asked, and holds no iteration
    assert (tmp_path / "run" / "manifest.json").exists()
    assert not (tmp_path / "run" / "summary.json").exists()
