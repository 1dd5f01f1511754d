"""The MQTT bus against Mosquitto with authentication (the lab's and CI's broker)."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import aiomqtt
import msgspec
import pytest
from oddl.controller.base.access import (
    CONTROLLER,
    ctl_topic,
    health_topic,
    results,
    run_topic,
    write_mosquitto,
)
from oddl.controller.base.clock import Clock
from oddl.controller.base.messages import Grant, Release
from oddl.controller.base.topology import Grid
from oddl.controller.service.health import Heartbeat
from oddl.controller.service.node import NodeProgram
from oddl.controller.stage2.control_unit import Timing
from oddl.controller.stage2.job import JOB_VERSION, JobEvent, JobSpec
from oddl.controller.stage2.wire import encode
from oddl.drivers.mqtt import BusError, MQTTBus
from oddl.sim import backend as sim_backend
from oddl.sim.devices.broker import free_port

from tests.helpers import make_testbed

MOSQUITTO = shutil.which("mosquitto") or (
    "/usr/sbin/mosquitto" if Path("/usr/sbin/mosquitto").exists() else None)
pytestmark = [pytest.mark.realtime,
              pytest.mark.skipif(MOSQUITTO is None, reason="mosquitto is not installed "
                                 "(.ci/run installs it; apt-get install mosquitto)")]


def _start(conf: Path, port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([MOSQUITTO, "-c", str(conf)], stdout=subprocess.PIPE,  # type: ignore[list-item]
                            stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # wait until it accepts connections
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc
        except OSError:
            if proc.poll() is not None:
                out = proc.stdout.read()  # type: ignore[union-attr]
                raise RuntimeError(f"mosquitto exited: {out!r}") from None
            time.sleep(0.02)
    proc.kill()
    raise RuntimeError("mosquitto did not listen within 10 s")


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[tuple[int, dict[str, str]]]:
    """Mosquitto with the files `oddl broker-config` writes for testbed tb (n0, n1)."""
    port = free_port()
    files = write_mosquitto("tb", ["n0", "n1"], tmp_path / "broker", port)
    conf = files["mosquitto.conf"]
    if os.geteuid() == 0:  # as root, mosquitto would drop to a user who cannot read tmp
        conf.write_text(conf.read_text() + "user root\n")
    pw = {k.removeprefix("secrets/"): p.read_text().strip() for k, p in files.items()
          if k.startswith("secrets/")}
    proc = _start(conf, port)
    try:
        yield port, pw
    finally:
        proc.terminate()
        proc.wait(timeout=5)


def _bus(port: int, pw: dict[str, str], user: str, got: list, arrived: asyncio.Event
         ) -> MQTTBus:
    bus = MQTTBus("tb", "127.0.0.1", port, user=user, password=pw[user])
    bus.attach(user, lambda m: (got.append(m), arrived.set()))
    return bus


def test_each_party_speaks_only_as_itself(mosquitto: tuple[int, dict[str, str]]) -> None:
    """The generated files against the real broker: a node's messages as itself arrive;
    as another node, as the controller (a job), or under another's client id, they do not;
    the read-only dashboard reads and cannot write."""
    port, pw = mosquitto

    async def body() -> tuple[list, list, list]:
        got0: list = []
        a0 = asyncio.Event()
        n0 = _bus(port, pw, "n0", got0, a0)
        jobs: list = []
        n0.on(run_topic("tb"), lambda t, p: jobs.append(p))
        n1 = _bus(port, pw, "n1", [], asyncio.Event())
        await n0.start()
        await n1.start()
        n1.send("n1", "n0", Grant(3, 0, "n1", "n0", "V", 0, 10**12))
        await asyncio.wait_for(a0.wait(), 10)
        # n1 as n0, on n0's topic (QoS 1: Mosquitto acknowledges and drops what it denies)
        await n1.publish(ctl_topic("tb", "n0", "n0"), encode(Release(4, 0, "n0", "n0", "H")))
        await n1.publish(run_topic("tb"), b'{"v": 2}')
        # a client with n1's password under n0's client id: it is n1 (the broker says so)
        thief = aiomqtt.Client("127.0.0.1", port, identifier="n0", username="n1",
                               password=pw["n1"])
        async with thief:
            await thief.publish(ctl_topic("tb", "n0", "n1"), b"x", qos=1)
        async with aiomqtt.Client("127.0.0.1", port, identifier="oddl-dash",
                                  username="oddl-dash", password=pw["oddl-dash"]) as dash:
            await dash.subscribe("oddl/tb/status/+", qos=1)
            seen = []
            async for m in dash.messages:  # the retained statuses
                seen.append(str(m.topic))
                if "oddl/tb/status/n0" in seen:
                    break
            await dash.publish(run_topic("tb"), b'{"v": 2}', qos=1)
        assert n1.lost.is_set()  # the "thief" was n1 itself: it took over n1's session
        n1 = _bus(port, pw, "n1", [], asyncio.Event())
        await n1.start()
        a0.clear()
        n1.send("n1", "n0", Grant(5, 0, "n1", "n0", "V", 0, 10**12))  # n0 still there
        await asyncio.wait_for(a0.wait(), 10)
        assert n0.rejected == 1  # the thief's "x", which arrived from n1
        await n0.close()
        await n1.close()
        return got0, jobs, seen

    got0, jobs, seen = asyncio.run(body())
    assert [(type(m).__name__, m.flow) for m in got0] == [("Grant", 3), ("Grant", 5)]
    assert jobs == []  # neither a node nor the dashboard can publish a job
    assert "oddl/tb/status/n0" in seen


def test_wrong_or_no_password_is_refused(mosquitto: tuple[int, dict[str, str]]) -> None:
    port, pw = mosquitto
    for user, password in (("n0", "guess"), ("n0", pw["n1"]), ("evil", "x"), ("n0", None)):
        with pytest.raises(BusError, match=r"[Nn]ot authori[sz]ed|[Bb]ad user name"):
            asyncio.run(MQTTBus("tb", "127.0.0.1", port, user=user, password=password).start())


def _tls_files(d: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1, made for this test."""
    import datetime as dt
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = dt.datetime.now(dt.UTC)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(name("oddl test CA")).issuer_name(
        name("oddl test CA")).public_key(ca_key.public_key()).serial_number(1)
        .not_valid_before(now - dt.timedelta(minutes=1)).not_valid_after(now + dt.timedelta(
            hours=1)).add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(name("127.0.0.1")).issuer_name(
        ca.subject).public_key(key.public_key()).serial_number(2)
        .not_valid_before(now - dt.timedelta(minutes=1)).not_valid_after(now + dt.timedelta(
            hours=1)).add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .sign(ca_key, hashes.SHA256()))
    paths = d / "ca.pem", d / "server.pem", d / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths


def test_tls_and_password_from_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from oddl.controller.base.config import Broker
    from oddl.drivers.mqtt import bus_from_config

    ca, cert, key = _tls_files(tmp_path)
    port = free_port()
    files = write_mosquitto("tb", ["n0"], tmp_path / "broker", port)
    conf = files["mosquitto.conf"]
    as_root = "user root\n" if os.geteuid() == 0 else ""
    conf.write_text(f"{conf.read_text()}{as_root}cafile {ca}\ncertfile {cert}\n"
                    f"keyfile {key}\n")
    proc = _start(conf, port)
    monkeypatch.setenv("ODDL_TEST_MQTT_PW", files["secrets/n0"].read_text().strip())
    cfg = Broker(url=f"mqtts://127.0.0.1:{port}", password_env="ODDL_TEST_MQTT_PW",
                 ca_file=str(ca))

    async def body() -> list:
        got: list = []
        arrived = asyncio.Event()
        bus = bus_from_config("tb", cfg, "n0")
        bus.attach("n0", lambda m: (got.append(m), arrived.set()))
        await bus.start()  # TLS handshake against our CA, then the password
        bus.send("n0", "n0", Grant(4, 0, "n0", "n0", "H", 0, 1))
        await asyncio.wait_for(arrived.wait(), 10)
        await bus.close()
        return got

    try:
        assert [m.flow for m in asyncio.run(body())] == [4]
    finally:
        proc.terminate()
        proc.wait(5)


def test_a_node_program_rides_out_a_mosquitto_restart(tmp_path: Path) -> None:
    """Reproducer (issue 14): after Mosquitto restarted mid-run, the emulator's job side
    never reconnected and the next run failed after 57 s. A node program whose broker goes
    drops its job (the board idles), reconnects with back-off once the broker is back,
    beats again, and runs the next job."""
    tb = make_testbed(2, 2)
    node, nodes = "n0-0", [n.id for n in tb.nodes]
    port = free_port()
    files = write_mosquitto("tb", nodes, tmp_path / "broker", port)
    conf = files["mosquitto.conf"]
    if os.geteuid() == 0:
        conf.write_text(conf.read_text() + "user root\n")
    pw = {k.removeprefix("secrets/"): p.read_text().strip() for k, p in files.items()
          if k.startswith("secrets/")}
    procs = [_start(conf, port)]

    async def main() -> tuple[int, list[JobEvent], Heartbeat]:
        world = sim_backend.build(tb, Grid.from_testbed(tb), Clock(asyncio.get_running_loop()))
        prog = await NodeProgram(
            "tb", node, world.onics[node], world.lines[node],
            MQTTBus("tb", "127.0.0.1", port, user=node, password=pw[node]),
            heartbeat_s=0.05).start()
        try:
            procs[0].terminate()  # the broker goes away under the node program
            await asyncio.to_thread(procs[0].wait, 10)
            await asyncio.wait_for(prog.bus.lost.wait(), 20)
            assert prog._task is not None and not prog._task.done()  # waiting, not gone
            procs.append(await asyncio.to_thread(_start, conf, port))
            while prog.reconnects == 0:
                await asyncio.sleep(0.05)
            events: list[JobEvent] = []
            beat = None
            async with aiomqtt.Client("127.0.0.1", port, identifier=CONTROLLER,
                                      username=CONTROLLER, password=pw[CONTROLLER]) as ctl:
                await ctl.subscribe(results("tb"), qos=1)
                await ctl.subscribe(health_topic("tb", "+"), qos=0)
                await ctl.publish(run_topic("tb"), msgspec.json.encode(JobSpec(
                    v=JOB_VERSION, job="after", collective="hd", size=1000, rows=1, cols=1,
                    degree=4, bidirectional=False, ranks=[node], nodes=[node],
                    iterations=3, compute_ns=1000, nic_sync=False,
                    timing=Timing(11, 2, 50, 1000, 1000, 5000, 3), routes={})), qos=1)
                async for m in ctl.messages:
                    if m.topic.matches(health_topic("tb", "+")):
                        beat = msgspec.json.decode(bytes(m.payload), type=Heartbeat)
                    elif m.topic.matches(results("tb")):
                        events.append(msgspec.json.decode(bytes(m.payload), type=JobEvent))
                    if beat is not None and events and events[-1].kind in ("done", "failed"):
                        break
            assert beat is not None
            return prog.reconnects, events, beat
        finally:
            await prog.stop()

    try:
        reconnects, events, beat = asyncio.run(asyncio.wait_for(main(), 90))
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=5)
    assert reconnects == 1
    assert events[-1].kind == "done", events[-1]
    assert [e.iteration for e in events if e.kind == "iteration"] == [0, 1, 2]
    assert beat.node == node and set(beat.crc_errors) == {"H", "V"}


@pytest.mark.skipif(os.geteuid() != 0, reason="the defect is Mosquitto started as root")
def test_the_printed_command_starts_mosquitto_as_root(root: Path) -> None:
    """Reproducer (issue 33, defect 18): as root, `mosquitto -c` as `oddl broker-config`
    printed it failed ("Unable to open pwfile"): Mosquitto drops to the user `mosquitto`,
    which could not read the root-owned 0600 files. Written where that user can pass."""
    import tempfile

    from click.testing import CliRunner
    from oddl.app.cli import main

    base = Path(tempfile.mkdtemp(dir="/var/tmp"))  # /tmp/pytest-of-root is 0700
    try:
        base.chmod(0o755)
        port = free_port()
        tb = str(root / "hw_configs/prototype-4node.toml")
        r = CliRunner().invoke(main, ["broker-config", tb, "--out", str(base / "b"),
                                      "--port", str(port)])
        assert r.exit_code == 0, r.output
        assert "drops to the user `mosquitto`" in r.output and "cannot pass" not in r.output
        conf = r.output.split("mosquitto -c ")[1].split()[0]
        proc = _start(Path(conf), port)  # as printed, no `user root`
        proc.terminate()
        try:  # (its stop is not what is tested: on a loaded machine it can be slow)
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    finally:
        shutil.rmtree(base)


def test_a_node_whose_session_is_taken_over_says_it_lost_its_connection(
        mosquitto: tuple[int, dict[str, str]]) -> None:
    """Reproducer (issue 33, defect 17): a second login with a node's credentials takes
    its session over on Mosquitto (as MQTT says), and the node's job failed with "the
    broker went away", though the broker never did. MQTT 3.1.1 tells the node no reason:
    it says what it knows (its connection went), and the controller, whose own connection
    held, adds the two explanations (drivers/lab.py)."""
    from oddl.controller.service.node import LOST_BROKER

    port, pw = mosquitto
    node = "n0"  # a party the fixture's broker knows; its board: a model board's

    async def main() -> JobEvent:
        tb = make_testbed(1, 2)
        world = sim_backend.build(tb, Grid.from_testbed(tb), Clock(asyncio.get_running_loop()))
        board = tb.nodes[0].id
        prog = await NodeProgram("tb", node, world.onics[board], world.lines[board],
                                 MQTTBus("tb", "127.0.0.1", port, user=node,
                                         password=pw[node]), heartbeat_s=0.05).start()
        try:
            async with aiomqtt.Client("127.0.0.1", port, identifier=CONTROLLER,
                                      username=CONTROLLER, password=pw[CONTROLLER]) as ctl:
                await ctl.subscribe(results("tb"), qos=1)
                await ctl.publish(run_topic("tb"), msgspec.json.encode(JobSpec(
                    v=JOB_VERSION, job="long", collective="hd", size=1000, rows=1, cols=1,
                    degree=4, bidirectional=False, ranks=[node], nodes=[node],
                    iterations=100_000, compute_ns=10_000_000, nic_sync=False,
                    timing=Timing(11, 2, 50, 1000, 1000, 5000, 3), routes={})), qos=1)
                taken = False
                async for m in ctl.messages:
                    ev = msgspec.json.decode(bytes(m.payload), type=JobEvent)
                    if ev.kind == "iteration" and not taken:
                        taken = True  # the job runs: a second login as the node
                        async with aiomqtt.Client("127.0.0.1", port, identifier=node,
                                                  username=node, password=pw[node]):
                            # (not `lost.wait()`: the node may be back, `lost` cleared,
                            # before the wait begins: it waited out its 20 s, 1 of 20 runs)
                            t_end = time.monotonic() + 20
                            while prog.bus.losses == 0:
                                assert time.monotonic() < t_end, "the node never lost it"
                                await asyncio.sleep(0.01)
                    elif ev.kind == "failed":
                        return ev
            raise AssertionError("no failed event")
        finally:
            await prog.stop()

    ev = asyncio.run(asyncio.wait_for(main(), 60))
    assert ev.node == node and ev.error == LOST_BROKER == "lost its connection to the broker"
