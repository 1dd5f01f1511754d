"""The docs' arbiter quick start on a busy host (issue 43), figures printed, not asserted:
`python bench/busy_host_bench.py [--testbed hw_configs/grid-64.toml] [--quiet-host]`.

1. `oddl emulate TESTBED`: its CPU while idle (a share of one core, after "ready");
2. `oddl arbiter` on it, and one extra process keeping a core busy (unless
   --quiet-host); a 16-rank job (experiments/job-resnet50-16.toml, fewer ranks on a
   smaller testbed): its outcome, its wall time, and the arbiter's false stops (its
   "dead-board" and "beats again" lines);
3. a second job, and one of its boards killed (the emulator's drill endpoint) after its
   first iterations: how long until the arbiter names it dead, against its bound
   (`missed` heartbeat periods plus the patience a loaded host is given).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from oddl.controller.base.config import load_testbed
from oddl.controller.base.topology import Grid

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "experiments" / "job-resnet50-16.toml"


def cpu_share(pid: int, seconds: float) -> float:
    """The share of one core `pid` used over `seconds` (utime + stime)."""
    def ticks() -> int:
        f = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        return int(f[11]) + int(f[12])
    t0 = ticks()
    time.sleep(seconds)
    return (ticks() - t0) / os.sysconf("SC_CLK_TCK") / seconds


@contextlib.contextmanager
def started(cmd: list[str], until: str, log: Path) -> Iterator[tuple[subprocess.Popen[str],
                                                                       str]]:
    """A command whose stdout says `until` once it serves; its stderr into `log`."""
    with log.open("w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "oddl.app", *cmd],
                                stdout=subprocess.PIPE, stderr=err, text=True, cwd=ROOT)
    assert proc.stdout is not None
    line = ""
    for line in proc.stdout:
        if line.startswith(until):
            break
    threading.Thread(target=proc.stdout.read, daemon=True).start()
    try:
        yield proc, line.strip()
    finally:
        proc.send_signal(2)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--testbed", type=Path, default=ROOT / "hw_configs" / "grid-64.toml")
    ap.add_argument("--quiet-host", action="store_true", help="no busy process beside it")
    ap.add_argument("--iterations", type=int, default=20)
    a = ap.parse_args()
    d = Path(tempfile.mkdtemp(prefix="oddl-busy-"))
    os.environ["ODDL_LOCK_DIR"] = str(d / "locks")
    emu = d / "emu.toml"
    with started(["emulate", str(a.testbed), "--out", str(emu)], "ready",
                 d / "emulator.log") as (e, _):
        time.sleep(2)  # settled after "ready"
        print(f"idle emulator of {a.testbed.name}: {cpu_share(e.pid, 20):.1%} of a core")
        busy = None if a.quiet_host else subprocess.Popen(
            [sys.executable, "-c", "while True: pass"])
        try:
            with started(["arbiter", str(emu), "--state", str(d / "state"), "--user", "alice",
                          "--port", "0"], "ready", d / "arbiter.log") as (_arb, ready):
                url = ready.removeprefix("ready ")
                token = (d / "state" / "tokens" / "alice").read_text().strip()
                head = {"Authorization": f"Bearer {token}"}
                tb = load_testbed(emu)
                ranks = min(16, tb.n_nodes)
                job = {"experiment": JOB.read_text().replace("ranks = 16", f"ranks = {ranks}")
                       .replace("iterations = 20", f"iterations = {a.iterations}")}

                def until(jid: str, done: int | None) -> dict[str, Any]:
                    """Until `done` iterations are recorded (None: until the job ends)."""
                    while True:
                        j = httpx.get(f"{url}/jobs/{jid}", headers=head).json()
                        if j["state"] not in ("queued", "running") or (
                                done is not None and j["iterations_done"] >= done):
                            return j
                        time.sleep(0.1)

                t0 = time.monotonic()
                jid = httpx.post(f"{url}/jobs", json=job, headers=head).json()["job"]
                j = until(jid, None)
                log = (d / "arbiter.log").read_text()
                print(f"{ranks}-rank job, {a.iterations} iterations"
                      f"{'' if a.quiet_host else ', a core kept busy'}: {j['state']} in "
                      f"{time.monotonic() - t0:.1f} s; false stops: "
                      f"{log.count('dead-board')} dead-board, {log.count('beats again')} "
                      f"beats again")
                # a board killed under the same load: found within its bound?
                jid = httpx.post(f"{url}/jobs", json=job, headers=head).json()["job"]
                j = until(jid, 2)
                row, col = (int(x) for x in re.findall(r"at row (\d+), col (\d+)",
                                                       j["partition"])[0])
                victim = next(n for n, rc in Grid.from_testbed(tb).coord.items()
                              if rc == (row, col))
                before = log.count("dead-board")
                t_kill = time.monotonic()
                assert tb.emulator is not None
                httpx.post(f"{tb.emulator.control}/faults",
                           json={"kind": "dead-board", "target": victim},
                           headers={"Authorization": "Bearer " + Path(
                               tb.emulator.token_file).read_text().strip()})
                while (d / "arbiter.log").read_text().count("dead-board") == before and \
                        time.monotonic() - t_kill < 120:
                    time.sleep(0.05)
                print(f"board {victim} killed: named dead after "
                      f"{time.monotonic() - t_kill:.2f} s (heartbeats every "
                      f"{tb.monitor.heartbeat_ms:g} ms, {tb.monitor.missed} missed)")
                httpx.delete(f"{url}/jobs/{jid}", headers=head)
        finally:
            if busy is not None:
                busy.kill()
    print(f"(logs in {d})")


if __name__ == "__main__":
    main()
