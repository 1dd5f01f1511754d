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

from controller.messages import Grant
from drivers.mqtt import MQTTBus
from sim.broker import free_port

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
    conf.write_text(f"{as_root}listener {port} 127.0.0.1\nallow_anonymous false\n"
                    f"password_file {pw}\npersistence false\n")
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

    with pytest.raises(aiomqtt.MqttError, match=r"[Nn]ot authori[sz]ed|[Bb]ad user name"):
        asyncio.run(body())
