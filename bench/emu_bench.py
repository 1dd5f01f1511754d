"""Emulator-path figures (printed, not asserted): `python bench/emu_bench.py`.

- register operations/s through pynq RemoteDevice (gRPC) to an emulated O-NIC
- REQUEST -> GRANT round trip p50/p99 through the embedded amqtt broker and through
  Mosquitto with authentication (if installed)
- Table 1 for 50 iterations: ODDL's iteration time, sim against emu (embedded broker, and
  Mosquitto if installed), and the emu run's wall time (`--runs N` repeats each emu run;
  `--quick` skips them)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from oddl.acceptance.plugin import percentile  # noqa: E402
from oddl.drivers.mqtt import MQTTBus, request_grant_rtt  # noqa: E402
from oddl.sim.broker import EmbeddedBroker, free_port  # noqa: E402


def remote_register_ops(pairs: int = 2000) -> dict[str, float]:
    from oddl.fpga import regmap as R
    from pynq import MMIO
    from pynq.pl_server.remote_device import RemoteDevice

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


@contextlib.contextmanager
def mosquitto(auth: bool) -> Iterator[int | None]:
    """A private Mosquitto on a free loopback port (None if not installed)."""
    exe = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    if not Path(exe).exists():
        yield None
        return
    with tempfile.TemporaryDirectory() as d:
        port = free_port()
        conf = Path(d) / "m.conf"
        text = f"user root\nlistener {port} 127.0.0.1\nset_tcp_nodelay true\npersistence false\n"
        if auth:
            pw = Path(d) / "pw"
            subprocess.run(["mosquitto_passwd", "-c", "-b", str(pw), "oddl", "s3cret"],
                           check=True, capture_output=True)
            text += f"allow_anonymous false\npassword_file {pw}\n"
        else:
            text += "allow_anonymous true\n"
        conf.write_text(text)
        p = subprocess.Popen([exe, "-c", str(conf)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        try:
            time.sleep(0.3)  # a benchmark, not a test: give the broker a moment
            yield port
        finally:
            p.terminate()
            p.wait(5)


def mosquitto_rtt() -> dict[str, float] | str:
    with mosquitto(auth=True) as port:
        if port is None:
            return "mosquitto not installed"
        return asyncio.run(rtt(port, username="oddl", password="s3cret"))


def table1(backend: str, testbed: Path | None, out: Path) -> dict[str, float]:
    cmd = [sys.executable, "-m", "oddl.controller.cli", "run", "experiments/table1-resnet50.toml",
           "--backend", backend, "--iterations", "50", "--json", "--out", str(out)]
    if testbed is not None:
        cmd += ["--testbed", str(testbed)]
    t = time.perf_counter()
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - t
    return {"iteration_ms": 1e3 * json.loads(r.stdout)["networks"]["oddl"]["iteration_time_s"],
            "wall_s": wall}


def emu_vs_sim(runs: int) -> None:
    import tomli_w

    with tempfile.TemporaryDirectory() as d:
        sim = table1("sim", None, Path(d) / "sim")["iteration_ms"]
        print(f"Table 1, 50 iterations, sim: {sim:.2f} ms/iteration")
        with mosquitto(auth=False) as port:
            brokers: list[tuple[str, Path | None]] = [("embedded amqtt", None)]
            if port is not None:
                tb = tomllib.loads((ROOT / "hw_configs" / "prototype-4node.toml").read_text())
                tb["broker"] = {"url": f"mqtt://127.0.0.1:{port}"}
                path = Path(d) / "prototype-4node-mosquitto.toml"
                path.write_text(tomli_w.dumps(tb))
                brokers.append(("Mosquitto", path))
            for name, testbed in brokers:
                for k in range(runs):
                    e = table1("emu", testbed, Path(d) / f"emu-{name[:4]}-{k}")
                    print(f"  emu, {name}: {e['iteration_ms']:.2f} ms/iteration "
                          f"({100 * (e['iteration_ms'] / sim - 1):+.2f}% vs sim), "
                          f"wall {e['wall_s']:.1f} s (emulator start included)")


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=2, help="emu runs per broker")
    ap.add_argument("--quick", action="store_true", help="skip the Table 1 runs")
    args = ap.parse_args()
    print("register ops through pynq RemoteDevice (gRPC, loopback):", remote_register_ops())
    print("REQUEST->GRANT round trip, embedded amqtt:", asyncio.run(embedded_rtt()))
    print("REQUEST->GRANT round trip, Mosquitto (auth):", mosquitto_rtt())
    if not args.quick:
        emu_vs_sim(args.runs)


if __name__ == "__main__":
    main()
