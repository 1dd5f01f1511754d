"""Cassettes (issue 49): an acceptance recorded on the emulator, replayed with no device; a
changed reply, a driver's changed register traffic and a damaged file each named."""

from __future__ import annotations

import gzip
import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from oddl.drivers import cassette
from oddl.drivers.cassette import CassetteError, Divergence

from tests.helpers import emulator

ROUTES = Path(__file__).parent / "data" / "cassettes" / "accept-routes.jsonl.gz"
# re-record with: oddl accept hw_configs/prototype-4node.toml --only routes
#   --record tests/data/cassettes/accept-routes.jsonl.gz   (docs/cassettes.md)


def oddl(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "oddl.app", *args], cwd=root,
                          capture_output=True, text=True, timeout=300)


def lines(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path, "rt") as f:
        return [json.loads(x) for x in f]


def write(path: Path, objs: list[dict[str, Any]]) -> Path:
    with gzip.open(path, "wt") as f:
        f.writelines(json.dumps(o) + "\n" for o in objs)
    return path


DRILL = """
[[faults]]
kind = "dead-board"
target = "n3"
at_iteration = 3
"""


@pytest.fixture(scope="module")
def recorded(root: Path, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[tuple[Path, list[str], list[int]]]:
    """`oddl accept` and `oddl run` (Table 1, a board killed by a drill) of a standing
    emulator, recorded: the directory of both cassettes, the broker's passwords and the
    emulator's token (read while it ran), its boards' ports (closed once it stopped)."""
    d = tmp_path_factory.mktemp("cassette")
    emu = d / "emu.toml"
    exp = d / "table1.toml"
    exp.write_text((root / "experiments" / "table1-resnet50.toml").read_text().replace(
        'testbed = "../hw_configs/prototype-4node.toml"',
        f'testbed = "{root}/hw_configs/prototype-4node.toml"\nrecovery = "shrink"') + DRILL)
    with emulator(root, root / "hw_configs" / "prototype-4node.toml", emu):
        secrets = emu.with_name(f".{emu.name}.secrets")
        passwords = [f.read_text().strip() for f in secrets.rglob("*") if f.is_file()]
        ports = [int(line.rsplit(":", 1)[1].split('"')[0])
                 for line in emu.read_text().splitlines() if "grpc://" in line]
        # every kind of device: boards, the WSS, the broker (the suite's time: not all)
        r = oddl(root, "accept", str(emu), "--only", "identity", "--only", "routes",
                 "--only", "control-rtt", "--record", str(d / "c.jsonl.gz"), "--report",
                 str(d / "rec"))
        run = oddl(root, "run", str(exp), "--testbed", str(emu), "--backend", "hw",
                   "--iterations", "8", "--json", "--out", str(d / "run"), "--record",
                   str(d / "run.jsonl.gz"))
    # (a busy machine can fail the control round trip: the replay must fail it alike)
    assert r.returncode in (0, 1) and "recorded" in r.stdout, r.stdout[-3000:] + r.stderr
    assert run.returncode == 0 and "recorded" in run.stderr, run.stderr[-3000:]
    (d / "run.json").write_text(run.stdout)
    (d / "run.err").write_text(run.stderr)  # what the run said: why a fault was found
    yield d, passwords, ports


@pytest.mark.realtime  # an emulator, then the recording's own pace
def test_an_acceptance_replays_with_no_device_and_no_secret(
        root: Path, recorded: tuple[Path, list[str], list[int]], tmp_path: Path) -> None:
    d, passwords, ports = recorded
    c = d / "c.jsonl.gz"
    for port in ports:  # the emulator is gone: nothing answers at its boards' addresses
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0
    r = oddl(root, "replay", str(c), "--json", "--report", str(tmp_path / "rep"))
    out = json.loads(r.stdout)
    assert r.returncode == 0, (out["differences"], r.stderr[-3000:])
    assert out["same"] and out["differences"] == []
    was = json.loads((c.parent / "rec" / "summary.json").read_text())
    assert (out["summary"]["verdict"], out["summary"]["counts"]) == (
        was["verdict"], was["counts"])
    assert {c["check"].split("[")[0] for c in was["checks"]} == {
        "test_identity", "test_wss_route", "test_control_rtt"}
    # the round trips' times are the recording's, not the replaying host's (a busy machine
    # replaying a pass failed it: p99 5.155 ms > 5.0 ms)
    rtt = [[c["figures"] for c in s["checks"] if c["check"] == "test_control_rtt"]
           for s in (was, out["summary"])]
    assert rtt[0] == rtt[1] and rtt[0][0], rtt
    assert out["summary"]["replayed_from"] == str(c)  # the report says so
    assert "replayed from" in (tmp_path / "rep" / "summary.md").read_text()
    objs = lines(c)
    devs = {o["dev"] for o in objs if "dev" in o}
    assert devs == {"board:n0", "board:n1", "board:n2", "board:n3", "wss:wss-row0",
                    "mqtt:oddl-ctl", "host"}  # host: the round trips' times
    with gzip.open(c, "rt") as f:
        text = f.read()
    assert passwords and not [p for p in passwords if p in text]  # no broker password


@pytest.mark.realtime  # an emulator, then the recording's own pace
def test_a_run_with_a_fault_drill_replays_with_no_device_and_no_secret(
        root: Path, recorded: tuple[Path, list[str], list[int]], tmp_path: Path) -> None:
    """Table 1 on the emulated boards, n3 killed by the drill at iteration 3: its stage
    1, its bus traffic with the node programs and the drill's requests, replayed, give the
    same result (every iteration's time, the fault found and recovered from)."""
    d, passwords, _ports = recorded
    was = json.loads((d / "run.json").read_text())
    faults = was["networks"]["oddl"]["faults"]
    assert [(f["kind"], f["target"], f["recovered"]) for f in faults] == [
        ("dead-board", "n3", True)], (faults, (d / "run.err").read_text()[-3000:])
    r = oddl(root, "replay", str(d / "run.jsonl.gz"), "--report", str(tmp_path / "rep"))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "the same result as recorded" in r.stdout
    with gzip.open(d / "run.jsonl.gz", "rt") as f:
        text = f.read()
    assert '"dev": "emulator"' in text and '"dev": "wss:wss-row0@stage1"' in text
    assert not [p for p in passwords if p in text]  # the broker's, the emulator's token


def test_a_changed_wss_reply_is_named(root: Path, tmp_path: Path) -> None:
    """One reply of the WSS changed in the file: the replay fails, naming that exchange
    (the events are chained by digest), then what it changed."""
    objs = lines(ROUTES)
    k = next(i for i, o in enumerate(objs) if o.get("dev") == "wss:wss-row0"
             and o.get("k") == "rx" and o.get("d") == "OK\n" and o["i"] > 4)
    objs[k]["d"] = 'ERR -222,"port out of range"\n'
    bad = write(tmp_path / "bad.jsonl.gz", objs)
    r = oddl(root, "replay", str(bad), "--report", str(tmp_path / "rep"))
    assert r.returncode == 1, r.stdout[-3000:]
    said = [x for x in r.stdout.splitlines() if x.startswith("DIFFERS")]
    assert said[0] == (f"DIFFERS changed since it was recorded: wss:wss-row0 event "
                       f"{objs[k]['i']} " + json.dumps({"i": objs[k]["i"], "k": "rx",
                                                       "d": objs[k]["d"]}))
    assert said[1].startswith("DIFFERS replay diverged on wss:wss-row0")
    assert "not as recorded" in r.stdout


def test_the_recorded_acceptance_replays_as_recorded(root: Path, tmp_path: Path) -> None:
    """The fixture in tests/data, against today's drivers: a change to their traffic with
    the boards or the WSS fails here, naming where (re-record it if it is meant)."""
    r = oddl(root, "replay", str(ROUTES), "--report", str(tmp_path / "rep"))
    assert r.returncode == 0, r.stdout[-3000:]
    assert "the same result as recorded" in r.stdout


def test_a_planted_change_in_register_traffic_is_the_divergence(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A driver that reads a board's identity in another order diverges at its first
    read, naming the board, the event, both reads and the asking code; `relaxed` takes
    reads by address, and lets it pass."""
    from oddl.drivers import lab, onic
    from oddl.fpga import regmap as R

    nodes = ["n0", "n1", "n2", "n3"]
    addr = "grpc://127.0.0.1:1"  # never reached: the cassette answers

    def reordered(self: onic.ONicDriver) -> dict[str, Any]:  # the planted change
        off = {n: r.offset for n, r in R.BY_NAME.items()}
        node_id = self.mmio.read(off["NODE_ID"])
        words = [self.mmio.read(off[f"BITSTREAM_HASH{i}"]) for i in range(8)]
        version = self.mmio.read(off["DESIGN_VERSION"])
        return {"magic": self.mmio.read(off["MAGIC"]), "design_version": version,
                "bitstream_hash": b"".join(w.to_bytes(4, "big") for w in words).hex(),
                "node_id": node_id}

    class Reordered(onic.ONicDriver):  # (a typed class where compiled: not patched)
        identity = reordered

    monkeypatch.setattr(lab, "ONicDriver", Reordered)
    with cassette.playing(ROUTES), pytest.raises(Divergence) as e:
        lab.open_board(addr, "n0", nodes)
    d = e.value
    assert (d.device, d.index) == ("board:n0", 1)
    assert (d.recorded or {})["a"] == R.BY_NAME["MAGIC"].offset
    assert d.asked == {"k": "r", "a": R.BY_NAME["NODE_ID"].offset}
    assert "in reordered" in d.stack and "open_board" in d.stack
    with cassette.playing(ROUTES, relaxed=True) as player:
        lab.open_board(addr, "n0", nodes)  # its identity held to the design: as recorded
        assert player.first is None


def test_a_board_that_could_not_be_reached_is_unreachable_again(tmp_path: Path) -> None:
    """A board whose opening failed when recorded (a dead board's PYNQ.remote) fails the
    same way, with the same words, when replayed; one that opened is held to its
    identity as it was read. (Found in review: the replay skipped the recorded failure.)"""
    from oddl.drivers import lab
    from oddl.fpga import regmap as R

    c = tmp_path / "c.jsonl.gz"
    nodes = ["n0", "n1"]
    def dead() -> None:
        raise ConnectionError("board n1: Failed to connect to remote device")

    with cassette.recording(c, {"kind": "accept", "argv": [], "testbed": "", "only": []}
                            ) as rec:
        with pytest.raises(ConnectionError) as was:
            cassette.opened("board:n1", dead, lambda _player: None)
        rec.event("board:n0", "open")
        for name in ("MAGIC", "DESIGN_VERSION", *(f"BITSTREAM_HASH{i}" for i in range(8)),
                     "NODE_ID"):
            v = {"MAGIC": R.MAGIC, "DESIGN_VERSION": R.DESIGN_VERSION}.get(name, 0)
            rec.event("board:n0", "r", a=R.BY_NAME[name].offset, v=v)
        rec.close({"summary": None})
    with cassette.playing(c) as player:
        with pytest.raises(ConnectionError) as again:
            lab.open_board("grpc://127.0.0.1:1", "n1", nodes)
        assert str(again.value) == str(was.value)
        lab.open_board("grpc://127.0.0.1:1", "n0", nodes)  # its identity, as it was read
        assert player.first is None and player.left() == {}


def test_a_damaged_cassette_is_refused_by_name(root: Path, tmp_path: Path) -> None:
    objs = lines(ROUTES)
    cases = {
        "not-json": (b"\x1f\x8b not gzip", "cannot be read"),
        "other": (None, "not an oddl cassette"),
        "newer": (None, "cassette version 99; this oddl plays version 1"),
        "event": (None, "line 2: not an event"),
    }
    for name, (raw, why) in cases.items():
        f = tmp_path / f"{name}.jsonl.gz"
        if raw is not None:
            f.write_bytes(raw)
        elif name == "other":
            write(f, [{"format": "something"}])
        elif name == "newer":
            write(f, [objs[0] | {"version": 99}])
        else:
            write(f, [objs[0], {"dev": 3}])
        with pytest.raises(CassetteError, match=why):
            cassette.read(f)
    r = oddl(root, "replay", str(tmp_path / "event.jsonl.gz"))  # as the command says it
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.startswith(f"error: {tmp_path / 'event.jsonl.gz'}: line 2: not an event")
    cut = write(tmp_path / "cut.jsonl.gz", objs[:-1])  # no result: recorded cut short
    r = oddl(root, "replay", str(cut))
    assert r.returncode == 2 and "cut short" in r.stderr, r.stderr
    assert os.path.getsize(ROUTES) < 64 * 1024  # a fixture stays small
    # a cassette that cannot be written is said before anything starts
    tb = str(root / "hw_configs" / "prototype-4node.toml")
    for cmd in (["accept", tb], ["run", str(root / "experiments" / "table1-resnet50.toml"),
                                 "--backend", "emu"]):
        r = oddl(root, *cmd, "--record", str(tmp_path / "none" / "c.jsonl.gz"))
        assert r.returncode == 2 and "no directory" in r.stderr, r.stderr
    r = oddl(root, "run", str(root / "experiments" / "table1-resnet50.toml"), "--record",
             str(tmp_path / "c.jsonl.gz"))
    assert r.returncode == 2 and "a sim run reaches no device" in r.stderr


def test_a_replay_on_a_late_loop_holds_the_controllers_timing_within_its_lateness() -> None:
    """Seen in the suite: a replay whose controller loop ran 62 ms late had the fault cost
    17 ms less than the recording (held within 10 ms: "not as recorded"). What the
    controller times moves with its loop; the devices' figures do not. When the fault was
    found is the replaying host's (5 ms recorded, 693 ms replayed): not compared."""
    from oddl.app.replay import _compare

    was = {"faults": [{"detected_after_ns": 13_355_321}], "fault_time_s": 0.515875601,
           "training_time_s": 7723.318577381, "flows": 48}
    got = {"faults": [{"detected_after_ns": 693_303_682}], "fault_time_s": 0.498681004,
           "training_time_s": 7723.301382784, "flows": 48}
    assert len(_compare("", was, got)) == 2  # detected_after_ns: the replaying host's
    assert _compare("", was, got, lag_s=0.062) == []
    assert _compare("", was, got | {"flows": 47}, lag_s=0.062) == [
        "flows: recorded 48, replayed 47"]


def test_how_late_the_replaying_hosts_node_programs_ran_is_not_compared() -> None:
    """Seen in CI: a drill's replay "not as recorded" for `host_lag_ms` 9 recorded, 8
    replayed. How late the node programs' loops ran is the host's, as is the verdict it
    alone makes (a quiet recording replayed on a busy host); the devices' disturbance and
    any verdict it makes are compared."""
    from oddl.app.replay import _compare

    def net(disturbed: bool, **dist: int) -> dict[str, object]:
        return {"networks": {"oddl": {"disturbed": disturbed, "disturbance": dist,
                                      "flows": 48}}}

    assert _compare("", net(True, dead_board=1, host_lag_ms=9),
                    net(True, dead_board=1, host_lag_ms=8)) == []
    assert _compare("", net(False), net(True, host_lag_ms=70)) == []
    assert _compare("", net(True, host_lag_ms=70), net(False)) == []
    assert _compare("", net(True, dead_board=1), net(True, dead_board=2, host_lag_ms=7)) == [
        "networks.oddl.disturbance.dead_board: recorded 1, replayed 2"]
    assert _compare("", net(False), net(True, dead_board=1)) == [
        "networks.oddl.disturbance.dead_board: recorded null, replayed 1",
        "networks.oddl.disturbed: recorded false, replayed true"]


@pytest.mark.realtime  # a listening socket: does the replay reach it?
def test_a_replay_reaches_no_address_its_cassette_names(root: Path, tmp_path: Path) -> None:
    """Reproducer (issue 62): a cassette whose testbed names a QICK board at pyro://...
    made `oddl replay` connect there (a fake name server answered with a pickle, and the
    replaying process ran it). A replay connects to nothing: the QICK checks, which the
    cassette does not hold, diverge at the board's opening, and nothing reached the
    listener."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.settimeout(0.2)
    objs = lines(ROUTES)
    objs[0]["testbed"] += f'\n[qick]\nsoc = "pyro://127.0.0.1:{port}/evil"\n'
    objs[0]["only"] = ["routes", "lightning"]
    c = write(tmp_path / "qick.jsonl.gz", objs)
    r = oddl(root, "replay", str(c), "--report", str(tmp_path / "rep"))
    with pytest.raises(TimeoutError):
        listener.accept()  # nobody came
    listener.close()
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    assert r.returncode == 1, r.stdout + r.stderr
    assert 'replay diverged on qick, event 0: recorded nothing more; asked {"k": "open"}' \
        in r.stdout


def test_every_malformed_cassette_is_refused_with_its_reason(root: Path,
                                                              tmp_path: Path) -> None:
    """Reproducers (issue 62): an event at t = 1e9 s made the replay sleep until killed;
    a 4 MB gzip of one 4 GiB line reached MemoryError; malformed headers exited 1 with a
    generic error. Each is refused as it is read: exit 2, the file and the reason."""
    objs = lines(ROUTES)
    head, events, end = objs[0], objs[1:-1], objs[-1]
    ev = next(e for e in events if e["k"] == "r")
    cases: dict[str, tuple[list[dict[str, Any]] | bytes, str]] = {
        "late": ([head, {**ev, "t": 1e9}, *events, end],
                 "line 2: t = 1000000000.0: not a time within a recording"),
        "nan": ([head, {**ev, "t": float("nan")}, end], "line 2: t = nan"),
        "kind": ([{**head, "kind": "sweep"}, end], "a cassette of 'sweep'"),
        "no-testbed": ([{k: v for k, v in head.items() if k != "testbed"}, end],
                       "header: 'testbed' missing or not str"),
        "argv": ([{**head, "argv": "accept"}, end], "header: 'argv' missing or not list"),
        "argv-items": ([{**head, "argv": [1]}, end], "'argv' holds something other"),
        "t0": ([{**head, "t0_ns": "x"}, end], "header: 't0_ns' missing or not int"),
        "value": ([head, {**ev, "v": {"x": 1}}, end], "a 'r' event's 'v' is dict, not int"),
        "bool": ([head, {**ev, "a": True}, end], "a 'r' event's 'a' is bool, not int"),
        "unknown": ([head, {**ev, "k": "exec"}, end], "k = 'exec': no kind of event"),
        "result": ([head, *events, {"end": {"rc": 0, "summary": {"checks": [1]}}}],
                   "the result: a check is not"),
        # (issue 85: these three ended in a TypeError or KeyError, exit 1)
        "kind-list": ([{**head, "kind": ["run"]}, end], "a cassette of ['run']"),
        "k-dict": ([head, {**ev, "k": {"r": 1}}, end], "k = {'r': 1}: no kind of event"),
        "no-summary": ([head, *events, {"end": {"rc": 0}}], "the result: no 'summary'"),
        "long": (gzip.compress(json.dumps(head).encode() + b"\n" + b"[" * (
            cassette.MAX_LINE + 1)), f"line 2: longer than {cassette.MAX_LINE:,}"),
    }
    for name, (content, why) in cases.items():
        f = tmp_path / f"{name}.jsonl.gz"
        if isinstance(content, bytes):
            f.write_bytes(content)
        else:
            write(f, content)
        with pytest.raises(CassetteError, match=re.escape(why)):
            cassette.read(f)
    write(tmp_path / "none-run.jsonl.gz", [head, *events, {"end": {"summary": None}}])
    r = oddl(root, "replay", str(tmp_path / "none-run.jsonl.gz"), "--report",
             str(tmp_path / "rep-none"))  # recorded: a suite that did not run
    assert r.returncode == 1 and "DIFFERS the suite did not run when it was recorded" in \
        r.stdout and "Traceback" not in r.stderr, r.stdout[-2000:] + r.stderr[-2000:]
    for name in ("late", "kind", "argv", "value", "kind-list", "k-dict", "no-summary"):
        r = oddl(root, "replay", str(tmp_path / f"{name}.jsonl.gz"), "--report",
                 str(tmp_path / f"rep-{name}"))
        assert r.returncode == 2 and "Traceback" not in r.stderr, (name, r.stderr)
        assert r.stderr.startswith(f"error: {tmp_path / name}.jsonl.gz: "), r.stderr


def test_oddl_replay_inside_the_checkout_runs_the_suite(root: Path, tmp_path: Path) -> None:
    """Reproducer (issue 62): run in the checkout (where `pip install -e .` leaves a user)
    with its report there, the acceptance suite took the project's pytest settings
    (`-n 4 --dist loadscope`) and did not run."""
    report = root / f"replay-test-{os.getpid()}"
    try:
        r = oddl(root, "replay", str(ROUTES), "--report", report.name)
    finally:
        import shutil

        shutil.rmtree(report, ignore_errors=True)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "the same result as recorded" in r.stdout


def test_a_watch_poll_replayed_after_stage_1_reads_what_stage_1_wrote(tmp_path: Path
                                                                      ) -> None:
    """The watch's polls of a WSS are answered by time, and stage 1 rewrites the table in
    between: a poll replayed once stage 1's writes are in reads the table they wrote, not
    one read before them (soak, issue 62: a fault drill's replay found a dead WSS that the
    recording had not: the poll got the table from before the drill's re-route)."""
    head = {"format": cassette.FORMAT, "version": cassette.VERSION, "kind": "run",
            "argv": [], "testbed": "", "experiment": "", "backend": "hw", "iterations": 1}
    w, s1 = "wss:w0", "wss:w0@stage1"
    evs = [(0.10, w, "tx", "ROUT?\n"), (0.11, w, "rx", "OLD\n"),  # a poll: the old table
           (0.20, s1, "tx", "ROUT NEW\n"), (0.21, s1, "rx", "OK\n"),  # stage 1 rewrites
           (0.30, w, "tx", "ROUT?\n"), (0.31, w, "rx", "NEW\n")]  # the next poll: new
    n: dict[str, int] = {}
    objs: list[dict[str, Any]] = [head]
    for t, dev, k, d in evs:
        objs.append({"t": t, "dev": dev, "i": n.setdefault(dev, 0), "k": k, "d": d})
        n[dev] += 1
    c = write(tmp_path / "c.jsonl.gz", [*objs, {"end": {"result": None}}])
    player = cassette.Player(c)
    for k, d in (("tx", "ROUT?\n"), ("rx", None)):  # a poll before stage 1: the old table
        got = player.take(w, k, **({} if d is None else {"d": d}))
    assert got["d"] == "OLD\n"
    player.take(s1, "tx", d="ROUT NEW\n")
    player.take(s1, "rx")
    # the loop polls at once, sooner than it did when recorded: what stage 1 wrote
    for k, d in (("tx", "ROUT?\n"), ("rx", None)):
        got = player.take(w, k, **({} if d is None else {"d": d}))
    assert got["d"] == "NEW\n" and player.first is None


def test_a_qick_board_records_and_replays_with_no_soc(tmp_path: Path) -> None:
    """Lightning's product check through an emulated QICK soc, recorded at the soc: the
    replay opens no soc (its `QickConfig` is the recorded configuration) and gives the
    same report, product for product (issue 65: QICK traffic was not recorded, so the
    Lightning checks could not be replayed)."""
    from oddl.app.registry import open_soc
    from oddl.controller.base.config.testbed import QickPhotonics
    from oddl.drivers import soc_tape
    from oddl.drivers.lightning import LightningConfig, characterize, operand_pairs

    c = tmp_path / "q.jsonl.gz"
    base = LightningConfig(dac_0=0, dac_1=0)
    head = {"kind": "accept", "argv": [], "testbed": "", "only": ["lightning"]}
    with cassette.recording(c, head) as rec:
        soc, cfg = open_soc("emulated", QickPhotonics())
        was = characterize(soc, cfg, operand_pairs(8), base)
        rec.close({"summary": None})
    assert isinstance(soc, soc_tape.TapedSoc)
    with cassette.playing(c) as player:
        soc, cfg = open_soc("pyro://127.0.0.1:9/nobody", QickPhotonics())  # (not reached)
        again = characterize(soc, cfg, operand_pairs(8), base)
        assert player.first is None and player.left() == {}
    assert isinstance(soc, soc_tape.PlayedSoc)
    timed = ("pairs_per_s", "wall_s")  # (this host's clock, not the board's answers)
    assert {k: v for k, v in again.items() if k not in timed} == \
        {k: v for k, v in was.items() if k not in timed}
    assert was["pairs"] == 8


@pytest.mark.parametrize(("value", "why"), [
    ({"nd": "|O", "shape": [1], "data": [1]}, "not a number's"),
    ({"nd": "<i8", "shape": [3], "data": [1, 2]}, "does not hold its values"),
    ({"nd": "<f8", "shape": [1 << 30], "data": []}, "does not hold its values"),
    ({"nd": "<i8", "shape": [1], "data": ["x"]}, "other than numbers"),
    ({"open": "/etc/passwd"}, "neither a map nor an array"),
])
def test_a_qick_answer_that_is_not_data_refuses_the_cassette(tmp_path: Path, value: Any,
                                                             why: str) -> None:
    """A soc's recorded answer is numbers, text, lists, maps and numeric arrays of their
    shape's size, held so when the cassette is read: anything else refuses it, by line."""
    head = {"format": cassette.FORMAT, "version": cassette.VERSION, "kind": "accept",
            "argv": [], "testbed": "", "only": []}
    bad = write(tmp_path / "bad.jsonl.gz", [
        head, {"t": 0.0, "dev": "qick", "i": 0, "k": "open"},
        {"t": 0.0, "dev": "qick", "i": 1, "k": "call", "m": "get_cfg", "a": [[], {"map": []}]},
        {"t": 0.0, "dev": "qick", "i": 2, "k": "ret", "v": value}, {"end": {"summary": None}}])
    with pytest.raises(CassetteError) as e:
        cassette.read(bad)
    assert "line 4: a QICK 'ret' event's value: " in str(e.value) and why in str(e.value)


@pytest.mark.realtime  # the recording's own pace
def test_ctrl_c_of_a_replay_is_a_stop_not_a_difference(root: Path, tmp_path: Path) -> None:
    """Reproducer (issue 83): Ctrl-C halfway through `oddl replay` exited 1 with "DIFFERS
    ... not as recorded" (pytest took the stop for an interrupted session). It is a stop:
    130, one line saying where the partial report is."""
    import signal

    p = subprocess.Popen([sys.executable, "-m", "oddl.app", "replay", str(ROUTES), "--report",
                          str(tmp_path / "rep")], cwd=root, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().startswith("replaying ")
        p.send_signal(signal.SIGINT)  # (the replay plays the recording's 3 s from here)
        out, err = p.communicate(timeout=120)
    finally:
        p.kill()
    assert p.returncode == 130, out[-2000:] + err[-2000:]
    # (where the stop lands decides whether the report was begun)
    assert err.strip() in ("stopped (SIGINT)", f"stopped (SIGINT): the replay's partial "
                                               f"report is in {tmp_path / 'rep'}"), err
    assert "DIFFERS" not in out and "not as recorded" not in out


def _signed_routes(path: Path, key: bytes) -> Path:
    """The shipped acceptance cassette written again by a Recorder that signs: the same
    exchanges, its own times, chain and signature."""
    objs = lines(ROUTES)
    head, events, end = objs[0], objs[1:-1], objs[-1]
    rec = cassette.Recorder(path, {k: v for k, v in head.items()
                                   if k not in ("format", "version", "t0_ns")}, key)
    for ev in events:
        rec.event(ev["dev"], ev["k"], **{k: v for k, v in ev.items()
                                         if k not in ("t", "dev", "i", "k", "h")})
    rec.close(end["end"])
    return path


@pytest.mark.realtime  # (replays: the recording's pace)
def test_a_signed_cassette_is_checked_and_an_edit_with_its_chain_redone_is_caught(
        root: Path, tmp_path: Path) -> None:
    """Reproducer (issue 85): the digest chain is unkeyed and covered neither header nor
    footer, so an edited cassette with its chain recomputed replayed as "the same result
    as recorded". Signed with a key (HMAC over every line), an edit is refused with the
    key, and a replay without it says what it played was not checked."""
    key = tmp_path / "key"
    key.write_text("k" * 32)
    signed = _signed_routes(tmp_path / "s.jsonl.gz", b"k" * 32)
    r = oddl(root, "replay", str(signed), "--key", str(key), "--report", str(tmp_path / "a"))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "the same result as recorded (signed, checked)" in r.stdout

    objs = lines(signed)
    k = next(i for i, o in enumerate(objs) if o.get("k") == "r")  # a register's value
    objs[k]["v"] ^= 1
    last: dict[str, str] = {}
    for o in objs[1:-2]:  # the chain redone, as anyone can
        o.pop("h")
        last[o["dev"]] = o["h"] = cassette._chain(last.get(o["dev"], ""), o)
    edited = write(tmp_path / "e.jsonl.gz", objs)
    r = oddl(root, "replay", str(edited), "--key", str(key), "--report", str(tmp_path / "b"))
    assert r.returncode == 2 and "its signature does not match the key" in r.stderr, \
        r.stderr
    r = oddl(root, "replay", str(edited), "--report", str(tmp_path / "c"))
    assert "(signed, not checked (no --key))" in r.stdout, r.stdout[-2000:]

    r = oddl(root, "replay", str(ROUTES), "--key", str(key), "--report", str(tmp_path / "d"))
    assert r.returncode == 2 and "unsigned: a key was given" in r.stderr, r.stderr
    other = tmp_path / "other"
    other.write_text("x" * 32)
    r = oddl(root, "replay", str(signed), "--key", str(other), "--report", str(tmp_path / "f"))
    assert r.returncode == 2 and "its signature does not match the key" in r.stderr
    r = oddl(root, "replay", str(ROUTES), "--report", str(tmp_path / "g"))
    assert "the same result as recorded (unsigned)" in r.stdout
