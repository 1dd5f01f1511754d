"""Emulator-path figures (printed, not asserted): `python bench/emu_bench.py`.

- register operations/s through pynq RemoteDevice (gRPC) to an emulated O-NIC
- REQUEST -> GRANT round trip p50/p99 through the embedded amqtt broker and through
  Mosquitto with authentication (if installed)
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from controller.acceptance import percentile  # noqa: E402
from drivers.mqtt import MQTTBus, request_grant_rtt  # noqa: E402
from sim.broker import EmbeddedBroker, free_port  # noqa: E402


def remote_register_ops(pairs: int = 2000) -> dict[str, float]:
    from pynq import MMIO
    from pynq.pl_server.remote_device import RemoteDevice

    from fpga import regmap as R
    from tests.test_pynq_remote import Emulator

    with Emulator() as emu:
        rd = RemoteDevice(0, "127.0.0.1", port=emu.server.port)
        m = MMIO(R.IP_BASE, R.IP_RANGE, device=rd)
        off = R.BY_NAME["NODE_ID"].offset
        t = time.perf_counter()
        for i in range(pairs):
            m.write(off, i)
            m.read(off)
        wall = time.perf_counter() - t
    return {"ops_per_s": 2 * pairs / wall, "write_read_pairs_per_s": pairs / wall}


async def rtt(port: int, n: int = 500, **auth: str) -> dict[str, float]:
    bus = MQTTBus("bench", "127.0.0.1", port, client_id="bench", **auth)
    s = await request_grant_rtt(bus, n)  # the acceptance suite's own measurement
    return {"samples": len(s), "p50_ms": 1e3 * statistics.median(s),
            "p99_ms": 1e3 * percentile(s, 0.99)}


async def embedded_rtt() -> dict[str, float]:
    b = await EmbeddedBroker().start()
    try:
        return await rtt(b.port)
    finally:
        await b.stop()


def mosquitto_rtt() -> dict[str, float] | str:
    exe = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    if not Path(exe).exists():
        return "mosquitto not installed"
    with tempfile.TemporaryDirectory() as d:
        port = free_port()
        pw = Path(d) / "pw"
        subprocess.run(["mosquitto_passwd", "-c", "-b", str(pw), "oddl", "s3cret"], check=True,
                       capture_output=True)
        conf = Path(d) / "m.conf"
        conf.write_text(f"user root\nlistener {port} 127.0.0.1\nset_tcp_nodelay true\n"
                        f"allow_anonymous false\n"
                        f"password_file {pw}\npersistence false\n")
        p = subprocess.Popen([exe, "-c", str(conf)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        try:
            time.sleep(0.3)  # a benchmark, not a test: give the broker a moment
            return asyncio.run(rtt(port, username="oddl", password="s3cret"))
        finally:
            p.terminate()
            p.wait(5)


def main() -> None:
    print("register ops through pynq RemoteDevice (gRPC, loopback):", remote_register_ops())
    print("REQUEST->GRANT round trip, embedded amqtt:", asyncio.run(embedded_rtt()))
    print("REQUEST->GRANT round trip, Mosquitto (auth):", mosquitto_rtt())


if __name__ == "__main__":
    main()
