"""An attacker on the same machine against the emulated testbed, during a run (issue 13).

Before: any local client could connect anonymously, forge GRANTs and RELEASEs, replay a
captured job with a million iterations, forge "done" and duplicate "iteration" results,
take the emulator's job service over by its client id, and flood REQUESTs. Now the broker
admits the run's parties only, each speaking only as itself: what the attacker can reach,
the read-only dashboard's identity, and guessed credentials, changes nothing in the run.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from pathlib import Path

import aiomqtt
import msgspec
import pytest
from oddl.controller.base.access import CONTROLLER, DASHBOARD, ctl_topic, result_topic, run_topic
from oddl.controller.base.config import load_testbed
from oddl.controller.base.messages import Grant, Release, Request
from oddl.controller.stage2.job import JOB_VERSION, JobEvent, JobSpec
from oddl.controller.stage2.wire import encode
from oddl.drivers.mqtt import password_of

from tests.helpers import emulator

pytestmark = pytest.mark.realtime  # brokers, emulators, sockets: the wall clock


async def _attack(port: int, tb: str, dash_pw: str, run: subprocess.Popen[str]) -> dict:
    """Everything the attacker tries, over and over, until the run ends."""
    seen = {"specs": 0, "refused": 0, "published": 0}

    async def as_dashboard() -> None:
        async with aiomqtt.Client("127.0.0.1", port, identifier=DASHBOARD, username=DASHBOARD,
                                  password=dash_pw) as c:
            await c.subscribe(run_topic(tb), qos=1)
            spec: JobSpec | None = None
            async for m in c.messages:  # it may read the job: capture it
                spec = msgspec.json.decode(bytes(m.payload), type=JobSpec)  # type: ignore[arg-type]
                seen["specs"] += 1
                break
            assert spec is not None
            huge = msgspec.json.encode(msgspec.structs.replace(spec, iterations=1_000_000))
            forged = [
                (run_topic(tb), huge),  # the captured job, replayed with 10^6 iterations
                (ctl_topic(tb, "n1", "n0"), encode(Grant(0, 0, "n0", "n1", "H", 1, 1 << 62))),
                (ctl_topic(tb, "n0", "n1"), encode(Release(1, 0, "n1", "n0", "H"))),
                (result_topic(tb, "n0"), msgspec.json.encode(JobEvent(
                    JOB_VERSION, spec.job, "done", "n0"))),
                (result_topic(tb, "n1"), msgspec.json.encode(JobEvent(
                    JOB_VERSION, spec.job, "iteration", "n1", iteration=0))),
                (run_topic(tb), b"[" * 40_000),
            ] + [(ctl_topic(tb, "n0", "evil"), encode(Request(10**9 + i, 0, "evil", "n0",
                                                            "H", 0, 64))) for i in range(200)]
            while run.poll() is None:
                for topic, payload in forged:
                    await c.publish(topic, payload)
                    seen["published"] += 1
                await asyncio.sleep(0.01)

    async def takeover() -> None:  # a party's client id, without its password
        while run.poll() is None:
            for ident in ("n0", CONTROLLER, "oddl-node-jobs"):
                try:
                    async with aiomqtt.Client("127.0.0.1", port, identifier=ident,
                                              username=ident, password="guess"):
                        pass
                except aiomqtt.MqttError:
                    seen["refused"] += 1
            await asyncio.sleep(0.05)

    await asyncio.gather(as_dashboard(), takeover())
    return seen


def test_attacks_during_a_run_change_nothing(root: Path, tmp_path: Path) -> None:
    out = tmp_path / "emu.toml"
    with emulator(root, root / "hw_configs" / "prototype-4node.toml", out, limit_s=240) as _:
        tb = load_testbed(out)
        port = int(tb.broker.url.rsplit(":", 1)[1])
        run = subprocess.Popen(
            [sys.executable, "-m", "oddl.app", "run",
             "experiments/table1-resnet50.toml", "--backend", "hw", "--testbed", str(out),
             "--iterations", "10", "--json", "--out", str(tmp_path / "run")],
            cwd=root, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        killer = threading.Timer(200, run.kill)
        killer.start()
        try:
            seen = asyncio.run(_attack(port, tb.name, password_of(tb.broker, DASHBOARD) or "",
                                       run))
            stdout, stderr = run.communicate()
        finally:
            killer.cancel()
    assert run.returncode == 0, stderr[-3000:]
    oddl = json.loads(stdout)["networks"]["oddl"]
    # exactly the clean run's figures: 10 iterations of 16 flows, nothing forged counted
    assert (oddl["iterations"], oddl["flows"], oddl["invariant_violations"]) == (10, 160, 0)
    # the units' own messages, nothing more: every REQUEST (the first, a poll after a WAIT,
    # a retry without), every GRANT (again for a retry whose GRANT was slow, on a loaded
    # machine), a WAIT where a receiver was busy, one RELEASE a flow
    st = json.loads((tmp_path / "run" / "summary.json").read_text())["stats"]["oddl"]
    assert st["requests"] == 160 + st["polls"] + st["retries"]
    assert oddl["control_messages"] == st["requests"] + st["grants"] + st["waits"] + 160
    # nothing the attacker sent is counted: no junk refused, no transfer nobody granted,
    # no register changed (a loaded machine may still retry, and say so)
    assert not {"rejected", "unexpected", "unexpected_rx", "board_tampered"} & set(
        oddl["disturbance"]), oddl["disturbance"]
    assert seen["specs"] == 1 and seen["published"] > 200 and seen["refused"] >= 3
