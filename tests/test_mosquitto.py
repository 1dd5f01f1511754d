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
import pytest
from oddl.controller.messages import Grant
from oddl.drivers.mqtt import BusError, MQTTBus
from oddl.sim.broker import free_port

MOSQUITTO = shutil.which("mosquitto") or (
    "/usr/sbin/mosquitto" if Path("/usr/sbin/mosquitto").exists() else None)
pytestmark = pytest.mark.skipif(MOSQUITTO is None, reason="mosquitto is not installed "
                                "(.ci/run installs it; apt-get install mosquitto)")


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[int]:
    port = free_port()
    pw = tmp_path / "passwd"
    subprocess.run(["mosquitto_passwd", "-c", "-b", str(pw), "oddl", "s3cret"], check=True,
                   capture_output=True)
    pw.chmod(0o600)
    conf = tmp_path / "mosquitto.conf"
    # as root, mosquitto would drop to its own user, which cannot read pytest's tmp dir
    as_root = "user root\n" if os.geteuid() == 0 else ""
    conf.write_text(f"{as_root}listener {port} 127.0.0.1\nset_tcp_nodelay true\n"
                    f"allow_anonymous false\npassword_file {pw}\npersistence false\n")
    proc = subprocess.Popen([MOSQUITTO, "-c", str(conf)], stdout=subprocess.PIPE,  # type: ignore[list-item]
                            stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # wait until it accepts connections
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            if proc.poll() is not None:
                out = proc.stdout.read()  # type: ignore[union-attr]
                raise RuntimeError(f"mosquitto exited: {out!r}") from None
            time.sleep(0.02)
    try:
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=5)


def test_authenticated_exchange(mosquitto: int) -> None:
    async def body() -> list:
        got: list = []
        arrived = asyncio.Event()
        bus = MQTTBus("tb", "127.0.0.1", mosquitto, username="oddl", password="s3cret",
                      client_id="ctl")
        bus.attach("n0", lambda m: (got.append(m), arrived.set()))
        await bus.start()
        bus.send("n1", "n0", Grant(3, 0, "n1", "n0", "V", 0, 10**12))
        await asyncio.wait_for(arrived.wait(), 10)
        async with aiomqtt.Client("127.0.0.1", mosquitto, username="oddl", password="s3cret",
                                  identifier="watch") as w:
            await w.subscribe("oddl/tb/status/#", qos=1)
            async for m in w.messages:  # the retained status
                assert bytes(m.payload) == b"online"  # type: ignore[arg-type]
                break
        await bus.close()
        return got

    got = asyncio.run(body())
    assert [(type(m).__name__, m.flow) for m in got] == [("Grant", 3)]


def test_wrong_password_is_refused(mosquitto: int) -> None:
    async def body() -> None:
        bus = MQTTBus("tb", "127.0.0.1", mosquitto, username="oddl", password="guess",
                      client_id="intruder")
        await bus.start()

    with pytest.raises(BusError, match=r"[Nn]ot authori[sz]ed|[Bb]ad user name"):
        asyncio.run(body())


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
    from oddl.controller.config import Broker
    from oddl.drivers.mqtt import bus_from_config

    ca, cert, key = _tls_files(tmp_path)
    port = free_port()
    pw = tmp_path / "passwd"
    subprocess.run(["mosquitto_passwd", "-c", "-b", str(pw), "oddl", "s3cret"], check=True,
                   capture_output=True)
    conf = tmp_path / "m.conf"
    as_root = "user root\n" if os.geteuid() == 0 else ""
    conf.write_text(f"{as_root}listener {port} 127.0.0.1\ncafile {ca}\ncertfile {cert}\n"
                    f"keyfile {key}\nset_tcp_nodelay true\n"
                    f"allow_anonymous false\npassword_file {pw}\n"
                    f"persistence false\n")
    proc = subprocess.Popen([MOSQUITTO, "-c", str(conf)], stdout=subprocess.PIPE,  # type: ignore[list-item]
                            stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            assert proc.poll() is None, proc.stdout.read()  # type: ignore[union-attr]
            time.sleep(0.02)
    monkeypatch.setenv("ODDL_TEST_MQTT_PW", "s3cret")
    cfg = Broker(url=f"mqtts://127.0.0.1:{port}", username="oddl",
                 password_env="ODDL_TEST_MQTT_PW", ca_file=str(ca))

    async def body() -> list:
        got: list = []
        arrived = asyncio.Event()
        bus = bus_from_config("tb", cfg)
        bus.attach("n0", lambda m: (got.append(m), arrived.set()))
        await bus.start()  # TLS handshake against our CA, then the password
        bus.send("n1", "n0", Grant(4, 0, "n1", "n0", "H", 0, 1))
        await asyncio.wait_for(arrived.wait(), 10)
        await bus.close()
        return got

    try:
        assert [m.flow for m in asyncio.run(body())] == [4]
    finally:
        proc.terminate()
        proc.wait(5)
