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
from oddl.controller.base.access import CONTROLLER, new_passwords, probe_ns, write_mosquitto  # noqa: E402
from oddl.drivers.mqtt import MQTTBus, request_grant_rtt  # noqa: E402
from oddl.sim.devices.broker import EmbeddedBroker, free_port  # noqa: E402


def remote_register_ops(pairs: int = 2000) -> dict[str, float]:
    """Register writes and reads through PYNQ.remote to a board `oddl emulate` serves."""
    from oddl.app.session import emulated
    from oddl.controller.base.config import load_testbed
    from oddl.fpga import regmap as R
    from pynq import MMIO
    from pynq.pl_server.remote_device import RemoteDevice

    with tempfile.TemporaryDirectory() as d, emulated(
            ROOT / "hw_configs" / "prototype-4node.toml", [], Path(d), print) as cfg:
        board = load_testbed(cfg).nodes[0].board or ""
        host, _, port = board.removeprefix("grpc://").rpartition(":")
        m = MMIO(R.IP_BASE, R.IP_RANGE, device=RemoteDevice(0, host, port=int(port)))
        off = R.BY_NAME["TXH_BYTES"].offset  # read-write, and idle until a START
        t = time.perf_counter()
        for i in range(pairs):
            m.write(off, i)
            m.read(off)
        wall = time.perf_counter() - t
    return {"ops_per_s": 2 * pairs / wall, "write_read_pairs_per_s": pairs / wall}


async def rtt(port: int, password: str, n: int = 500) -> dict[str, float]:
    """As the controller, in the probe namespace, as the acceptance suite measures it."""
    bus = MQTTBus(probe_ns("bench"), "127.0.0.1", port, user=CONTROLLER, password=password)
    s = await request_grant_rtt(bus, n, a=CONTROLLER, b="probe")
    return {"samples": len(s), "p50_ms": 1e3 * statistics.median(s),
            "p99_ms": 1e3 * percentile(s, 0.99)}


async def embedded_rtt() -> dict[str, float]:
    pw = new_passwords([])
    b = await EmbeddedBroker("bench", [], pw).start()
    try:
        return await rtt(b.port, pw[CONTROLLER])
    finally:
        await b.stop()


@contextlib.contextmanager
def mosquitto(testbed: str, nodes: list[str]) -> Iterator[tuple[int, Path] | None]:
    """A private Mosquitto with `oddl broker-config`'s files (None if not installed):
    its port and the directory of the parties' password files."""
    exe = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    if not Path(exe).exists():
        yield None
        return
    with tempfile.TemporaryDirectory() as d:
        port = free_port()
        files = write_mosquitto(testbed, nodes, Path(d), port)
        conf = files["mosquitto.conf"]
        conf.write_text(conf.read_text() + "user root\n")
        p = subprocess.Popen([exe, "-c", str(conf)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        try:
            time.sleep(0.3)  # a benchmark, not a test: give the broker a moment
            yield port, Path(d) / "secrets"
        finally:
            p.terminate()
            p.wait(5)


def mosquitto_rtt() -> dict[str, float] | str:
    with mosquitto("bench", []) as m:
        if m is None:
            return "mosquitto not installed"
        port, secrets = m
        return asyncio.run(rtt(port, (secrets / CONTROLLER).read_text().strip()))


def table1(backend: str, testbed: Path | None, out: Path) -> dict[str, float]:
    cmd = [sys.executable, "-m", "oddl.app", "run", "experiments/table1-resnet50.toml",
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
        tb = tomllib.loads((ROOT / "hw_configs" / "prototype-4node.toml").read_text())
        with mosquitto(tb["testbed"]["name"], [n["id"] for n in tb["nodes"]]) as m:
            brokers: list[tuple[str, Path | None]] = [("embedded amqtt", None)]
            if m is not None:
                port, secrets = m
                tb["broker"] = {"url": f"mqtt://127.0.0.1:{port}",
                                "password_file": str(secrets / "{user}")}
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
