"""Every command stops the same way on SIGINT (a terminal's Ctrl-C, sent to the whole
process group) and SIGTERM: within seconds, one line saying what was stopped and where the
partial results are, exit 128 + the signal, never a traceback (issue 43).

Reproducers: a virtual-time run went on after Ctrl-C (or stopped with "Event loop is
closed" and a worker's failure logged); `oddl arbiter` printed KeyboardInterrupt and
"Task was destroyed but it is pending"."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from oddl.app.experiments.results import read_store

from tests.helpers import emulator

pytestmark = pytest.mark.realtime  # processes and signals: the wall clock

TABLE1 = "experiments/table1-resnet50.toml"


def _start(root: Path, *args: str) -> subprocess.Popen[str]:
    """`oddl ...` in a process group of its own, as a terminal runs a command (in the
    terminal's session)."""
    return subprocess.Popen([sys.executable, "-m", "oddl.app", *args], cwd=root,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            process_group=0)


def _stop(proc: subprocess.Popen[str], sig: int) -> tuple[int, str, float]:
    """The signal to the whole group; its exit status, stderr and seconds to stop."""
    t0 = time.monotonic()
    os.killpg(proc.pid, sig)
    try:
        _out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _out, err = proc.communicate()
        pytest.fail(f"still running 30 s after {signal.Signals(sig).name}: {err[-2000:]}")
    return proc.returncode, err, time.monotonic() - t0


def _iterations(db: Path, network: str = "oddl") -> int:
    if not db.exists():
        return 0
    try:
        c = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            return int(c.execute("SELECT COUNT(*) FROM iterations WHERE network = ?",
                                 (network,)).fetchone()[0])
        finally:
            c.close()
    except sqlite3.OperationalError:  # not yet created
        return 0


def _until(what: str, ok: object, proc: subprocess.Popen[str], limit_s: float = 120) -> None:
    t_end = time.monotonic() + limit_s
    while not ok():  # type: ignore[operator]
        assert proc.poll() is None, f"ended before {what}: {proc.stderr.read()[-2000:]}"  # type: ignore[union-attr]
        assert time.monotonic() < t_end, f"no {what} within {limit_s} s"
        time.sleep(0.05)  # polling the store, not a timing assumption


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_virtual_time_run_stops_halfway_and_keeps_its_iterations(
        root: Path, tmp_path: Path, sig: int) -> None:
    out = tmp_path / "run"
    # (every iteration simulated: a run that repeats would be written in a second)
    proc = _start(root, "run", TABLE1, "--iterations", "100000", "--every-iteration",
                  "--out", str(out))
    db = out / "results.sqlite"
    _until("20 iterations of each network",  # the baseline's in its worker process
           lambda: min(_iterations(db), _iterations(db, "electrical")) >= 20, proc)
    code, err, secs = _stop(proc, sig)
    assert code == 128 + sig, err[-2000:]
    assert "Traceback" not in err and "failed in its worker" not in err, err[-3000:]
    name = signal.Signals(sig).name
    assert f"stopped ({name}): every completed iteration is in {db}" in err
    data = read_store(db)
    for net in ("oddl", "electrical"):  # the worker's network too, none half-written
        its = data[net]["iterations"]
        assert [r[0] for r in its] == list(range(len(its)))
    assert len(data["oddl"]["iterations"]) >= 20
    assert secs < 20


def test_a_run_of_model_networks_alone_stops_cleanly(root: Path, tmp_path: Path) -> None:
    """A run with no ODDL network has its parent only waiting on its workers (two here:
    one per spare core and one for the parent's own, issue 46). Found trying it: Ctrl-C
    there printed "Exception in thread oddl-aside ... handle is closed", since a join that
    a signal interrupts leaves Python 3.11 saying the thread is not alive, and the pipes
    were closed under it."""
    text = (root / TABLE1).read_text()
    body, _, _nets = text.partition("[[networks]]")
    exp = tmp_path / "models.toml"
    exp.write_text(body.replace('testbed = "../hw_configs/',
                                f'testbed = "{root}/hw_configs/')
                   + "".join(f'[[networks]]\nname = "{n}"\nkind = "electrical"\n'
                             'latency_ns = 1000\n\n' for n in ("electrical", "el-2")))
    out = tmp_path / "run"
    proc = _start(root, "run", str(exp), "--iterations", "100000", "--every-iteration",
                  "--out", str(out))
    db = out / "results.sqlite"
    _until("20 iterations of both networks, each in its worker",
           lambda: min(_iterations(db, "electrical"), _iterations(db, "el-2")) >= 20, proc)
    code, err, _secs = _stop(proc, signal.SIGINT)
    assert code == 130, err[-2000:]
    assert "Traceback" not in err and "Exception in thread" not in err, err[-3000:]
    assert f"stopped (SIGINT): every completed iteration is in {db}" in err


def test_a_worker_hears_no_signal_its_parent_has_not_acted_on(root: Path, tmp_path: Path
                                                             ) -> None:
    """Seen in the suite: a SIGTERM to the group reached the baseline's worker before its
    parent acted on it; the worker reported its own stop as a failure (a traceback, and
    "network electrical failed in its worker"). A worker is deaf to the group's signals
    (its parent stops it): SIGTERM to the worker alone changes nothing, and the run goes
    on until its parent is stopped."""
    out = tmp_path / "run"
    # (every iteration simulated: a run that repeats would be written in a second)
    proc = _start(root, "run", TABLE1, "--iterations", "100000", "--every-iteration",
                  "--out", str(out))
    db = out / "results.sqlite"
    _until("20 iterations of each network",
           lambda: min(_iterations(db), _iterations(db, "electrical")) >= 20, proc)
    kids = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    [worker] = [int(k) for k in kids  # (not multiprocessing's resource tracker)
                if b"spawn_main" in Path(f"/proc/{k}/cmdline").read_bytes()]
    os.kill(worker, signal.SIGTERM)
    done = _iterations(db, "electrical")
    _until("the worker's next iterations", lambda: _iterations(db, "electrical") > done + 20,
           proc)
    code, err, _secs = _stop(proc, signal.SIGINT)
    assert code == 130 and "Traceback" not in err and "failed in its worker" not in err, \
        err[-3000:]


def test_an_emulated_run_stops_and_takes_its_emulator_with_it(root: Path, tmp_path: Path
                                                             ) -> None:
    out = tmp_path / "run"
    proc = _start(root, "run", TABLE1, "--backend", "emu", "--iterations", "5000", "--out",
                  str(out))
    db = out / "results.sqlite"
    _until("an iteration on the emulated boards", lambda: _iterations(db) >= 1, proc)
    # CI's nextpnr at nice 19 took a third of both cores: it ran in a session of its own,
    # and Linux's autogroup gives each session an equal share whatever its nice. The
    # emulator's session did the same: `nice oddl run --backend emu` left it at full share
    try:
        [emu] = [k for k in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text()
                 .split() if b"emulate" in Path(f"/proc/{k}/cmdline").read_bytes()]
        if Path("/proc/self/autogroup").exists():  # (a kernel with autogroup scheduling)
            assert (Path(f"/proc/{emu}/autogroup").read_text()
                    == Path("/proc/self/autogroup").read_text())
    finally:
        code, err, _secs = _stop(proc, signal.SIGINT)
    assert code == 130, err[-2000:]
    assert "Traceback" not in err and "stopped (SIGINT)" in err, err[-3000:]
    # issue 62: the controller stopped listening before it told the nodes, and waited out
    # grace_ms for their answers (5.3 to 7.5 s), warning that none came
    assert "no word from" not in err, err[-3000:]
    log = (out / "emulator.log").read_text()
    assert "Traceback" not in log, log[-3000:]
    assert _iterations(db) >= 1


def test_the_emulator_stops_on_sigterm_and_takes_its_secrets(root: Path, tmp_path: Path
                                                            ) -> None:
    out = tmp_path / "emu.toml"
    with emulator(root, root / "hw_configs" / "prototype-4node.toml", out) as (proc, _):
        secrets = out.with_name(f".{out.name}.secrets")
        assert secrets.is_dir()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 143
        assert not secrets.exists()


def test_a_sweep_stops_at_once_and_says_what_it_kept_and_cut(root: Path, tmp_path: Path
                                                             ) -> None:
    """Reproducer (issue 62): Ctrl-C of `oddl sweep --jobs N` printed a multiprocessing
    traceback from an idle worker, or waited 8.6 to 10.2 s for the points under way and
    said nothing of what it kept. Three workers, two points: one worker idle, one point
    (16 nodes) done, one (1024 nodes, a minute) under way when the signal comes."""
    sweep = tmp_path / "s.toml"
    sweep.write_text(f'name = "s"\ntestbed = "{root}/hw_configs/grid-1024.toml"\n'
                     'models = ["vgg19"]\nnodes = [16, 1024]\nline_rates_gbps = [100]\n'
                     '[[networks]]\nname = "oddl"\nkind = "oddl"\n')
    out = tmp_path / "sweep"
    proc = _start(root, "sweep", str(sweep), "--jobs", "3", "--out", str(out))
    journal = out / "points.jsonl"
    _until("the 16-node point in points.jsonl",
           lambda: journal.is_file() and journal.read_text().endswith("\n"), proc)
    code, err, _secs = _stop(proc, signal.SIGINT)
    assert code == 130, err[-2000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    assert (f"stopped (SIGINT): 1 of 2 points kept in {journal}; 1 cut: oddl vgg19 1024n "
            f"100G (the same --out {out} runs only those)") in err, err[-2000:]
    assert [json.loads(r)["nodes"] for r in journal.read_text().splitlines()] == [16]
