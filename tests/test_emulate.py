"""`oddl emulate` end to end: every endpoint reached with the real client library."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import aiomqtt
import pytest
from oddl.controller.base.config import load_testbed
from oddl.drivers.mqtt import password_of
from oddl.drivers.onic import ONicDriver
from oddl.drivers.wss import WSSDriver
from oddl.fpga import regmap as R
from pynq import MMIO
from pynq.pl_server.remote_device import RemoteDevice

from tests.helpers import emulator

pytestmark = pytest.mark.realtime  # brokers, emulators, sockets: the wall clock


def _iterations(db: Path) -> int:
    try:
        c = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            return int(c.execute("SELECT COUNT(*) FROM iterations").fetchone()[0])
        finally:
            c.close()
    except sqlite3.OperationalError:  # not there yet
        return 0


def test_emulate_serves_the_prototype(root: Path, tmp_path: Path) -> None:
    out = tmp_path / "emu.toml"
    with emulator(root, root / "hw_configs" / "prototype-4node.toml", out) as (proc, _):
        tb = load_testbed(out)  # the written config is a valid testbed
        assert tb.testbed.backend == "emu" and tb.broker.url.startswith("mqtt://127.0.0.1:")
        # its control plane is MQTT on loopback, measured, not the prototype's 1 us network
        assert tb.control.kind == "mqtt" and 1_000 < tb.control.latency_ns < 50_000_000
        for n in tb.nodes:  # every board answers PYNQ.remote with its own identity
            host, port = n.board.removeprefix("grpc://").split(":")  # type: ignore[union-attr]
            assert host == "127.0.0.1"
            rd = RemoteDevice(0, host, port=int(port))
            ident = ONicDriver(MMIO(R.IP_BASE, R.IP_RANGE, device=rd)).check_identity()
            assert ident["node_id"] == [x.id for x in tb.nodes].index(n.id)
        wss = WSSDriver(tb.wss[0].serial)  # type: ignore[arg-type]
        assert (wss.id, wss.ports, wss.channels) == ("wss-row0", 4, 2)
        wss.set_table([[1, 2], [0, 3], [3, 0], [2, 1]])
        assert wss.get_table() == [[1, 2], [0, 3], [3, 0], [2, 1]]
        wss.close()

        # the broker admits this run's parties only, each with its own password, kept in
        # files only this user can read, named by the config
        secrets = Path(tb.broker.password_file.replace("{user}", ""))  # type: ignore[union-attr]
        assert secrets.stat().st_mode & 0o777 == 0o700
        assert {p.name for p in secrets.iterdir()} >= {"oddl-ctl", "oddl-emu", "n0"}
        assert all(p.stat().st_mode & 0o777 == 0o600 for p in secrets.iterdir())
        port = int(tb.broker.url.rsplit(":", 1)[1])

        async def connect(user: str | None, password: str | None) -> None:
            async with aiomqtt.Client("127.0.0.1", port, identifier=user or "anon",
                                      username=user, password=password) as c:
                await c.publish("oddl/probe/x", b"x")

        asyncio.run(connect("oddl-ctl", password_of(tb.broker, "oddl-ctl")))
        for user, password in ((None, None), ("oddl-ctl", "guess"), ("n0", "")):
            with pytest.raises(aiomqtt.MqttError, match=r"[Bb]ad user name or password"):
                asyncio.run(connect(user, password))
        proc.send_signal(signal.SIGINT)
        assert proc.stdout is not None
        rest = proc.stdout.read()
        assert proc.wait(20) == 130  # stopped by SIGINT, cleanly (128 + 2)
        assert "stopped" in rest
        assert not secrets.exists()  # this run's credentials die with it


def test_run_table1_on_the_emulated_testbed(root: Path, tmp_path: Path) -> None:
    """`oddl run --backend emu`: the control units drive the boards over PYNQ.remote, the
    WSS over its pseudo-terminal and each other over MQTT, in real time."""
    import json

    r = subprocess.run([sys.executable, "-m", "oddl.app", "run",
                        "experiments/table1-resnet50.toml", "--backend", "emu",
                        "--iterations", "3", "--json", "--out", str(tmp_path / "run")],
                       cwd=root, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    d = json.loads(r.stdout)
    oddl = d["networks"]["oddl"]
    assert d["backend"] == "emu" and oddl["iterations"] == 3 and oddl["flows"] == 48
    assert oddl["invariant_violations"] == 0
    assert oddl["control_messages"] >= 3 * 48  # REQUEST, GRANT, RELEASE per flow, real
    # real time adds the network round trips the model does not have: never faster
    assert oddl["iteration_time_s"] > d["networks"]["electrical"]["iteration_time_s"]
    # how late the loops ran is said beside the figures (issue 43: a loaded host's run)
    lag = json.loads((tmp_path / "run" / "summary.json").read_text())["stats"]["oddl"][
        "loop_lag_ms"]
    assert set(lag) == {"controller", "nodes"} and all(v >= 0 for v in lag.values())


def test_one_emulator_serves_job_after_job(root: Path, tmp_path: Path) -> None:
    """A lab keeps `oddl emulate` running: flow ids restart with every job, and the
    testbed's checker must judge each job on its own flows (it once reported the second
    job's flows as 'started twice')."""
    import json

    out = tmp_path / "emu.toml"
    with emulator(root, root / "hw_configs" / "prototype-4node.toml", out,
                  limit_s=240) as (proc, _):
        for k in range(2):
            r = subprocess.run([sys.executable, "-m", "oddl.app", "run",
                                "experiments/table1-resnet50.toml", "--backend", "emu",
                                "--testbed", str(out), "--iterations", "2", "--json",
                                "--out", str(tmp_path / f"run{k}")],
                               cwd=root, capture_output=True, text=True, timeout=200)
            assert r.returncode == 0, r.stderr[-2000:]
            oddl = json.loads(r.stdout)["networks"]["oddl"]
            assert (oddl["iterations"], oddl["flows"]) == (2, 32)
            assert oddl["invariant_violations"] == 0, f"job {k}"
        # issue 43: a second run on the same emulator while one runs is refused, naming
        # the holder (it failed on the WSS's serial port, "not an oddl WSS identity")
        first = subprocess.Popen([sys.executable, "-m", "oddl.app", "run",
                                  "experiments/table1-resnet50.toml", "--backend", "emu",
                                  "--testbed", str(out), "--iterations", "100000", "--out",
                                  str(tmp_path / "long")], cwd=root,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            db, t_end = tmp_path / "long" / "results.sqlite", time.monotonic() + 60
            while not _iterations(db):  # an iteration recorded: it holds the testbed
                assert time.monotonic() < t_end and first.poll() is None
                time.sleep(0.05)  # polling its store, not a timing assumption
            r = subprocess.run([sys.executable, "-m", "oddl.app", "run",
                                "experiments/table1-resnet50.toml", "--backend", "emu",
                                "--testbed", str(out), "--iterations", "2", "--out",
                                str(tmp_path / "second")], cwd=root, capture_output=True,
                               text=True, timeout=60)
            assert r.returncode == 3, r.stderr[-2000:]
            assert "is in use by oddl run experiments/table1-resnet50.toml" in r.stderr
        finally:
            first.send_signal(signal.SIGINT)
            assert first.wait(30) == 130
        proc.send_signal(signal.SIGINT)
        assert proc.wait(20) == 130  # a clean stop by SIGINT


def test_the_embedded_broker_listens_where_the_testbed_says(root: Path, tmp_path: Path
                                                            ) -> None:
    """Reproducer (issue 33, defect 15): `[broker] bind` was accepted and `oddl emulate`
    ignored it. 127.0.0.2 is loopback too, and nothing else listens there."""
    tb_path = tmp_path / "tb.toml"
    tb_path.write_text((root / "hw_configs" / "prototype-4node.toml").read_text()
                       + '\n[broker]\nbind = "127.0.0.2"\n')
    out = tmp_path / "emu.toml"
    with emulator(root, tb_path, out) as _:
        tb = load_testbed(out)
        assert tb.broker.url.startswith("mqtt://127.0.0.2:")
        port = int(tb.broker.url.rsplit(":", 1)[1])

        async def connect(host: str) -> None:
            async with aiomqtt.Client(host, port, identifier="oddl-ctl", username="oddl-ctl",
                                      password=password_of(tb.broker, "oddl-ctl")) as c:
                await c.publish("oddl/probe/x", b"x")

        asyncio.run(connect("127.0.0.2"))
        with pytest.raises(aiomqtt.MqttError):
            asyncio.run(connect("127.0.0.1"))
