"""`oddl dashboard` in a real browser: headless Chromium (Debian's, driven by Playwright)
watches an emu run with a drill, as an operator would; and the picture it draws is held to
what the bus said, junk included."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import msgspec
import pytest
import tomli_w
from click.testing import CliRunner
from oddl.app.cli import main
from oddl.app.dashboard import View
from oddl.controller.base.config import load_testbed
from oddl.controller.base.telemetry import (
    TELEMETRY_VERSION,
    EndedNote,
    IterationNote,
    PortsNote,
    PortView,
    QueuedJob,
    QueueNote,
    RunNote,
)
from oddl.controller.service.health import Heartbeat

from tests.helpers import check_chrome, dashboard

pytestmark = pytest.mark.realtime  # brokers, emulators, sockets: the wall clock

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (.ci/run installs it)")
def test_the_page_shows_a_live_run_and_its_fault(root: Path, emu: Path,
                                                 tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    exp = tmp_path / "drill.toml"
    exp.write_text(tomli_w.dumps({
        "name": "dash-drill", "testbed": str(emu), "iterations": 30, "recovery": "shrink",
        "workload": {"model": "resnet50", "collective": "hd", "epochs": 1,
                     "dataset_samples": 1_000_000, "batch_per_node": 64,
                     "compute_time_ms": 20.0},
        "networks": [{"name": "oddl", "kind": "oddl"}],
        "faults": [{"kind": "dead-board", "target": "n1-1", "at_iteration": 12}]}))
    trace = tmp_path / "trace.json"
    ARTIFACTS.mkdir(exist_ok=True)
    with dashboard(root, emu) as url, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update",
            "--disable-sync"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.goto(url)
        expect(page.locator("#conn")).to_have_text("live")
        # every node of the testbed appears, in its place, beating
        for n in ("n0-0", "n0-1", "n1-0", "n1-1"):
            expect(page.locator(f"#node-{n}")).to_have_class("node ok", timeout=10_000)
            expect(page.locator(f"#node-{n} .port")).to_have_count(2)  # H and V
        run = subprocess.Popen([sys.executable, "-m", "oddl.app", "run", str(exp),
                                "--backend", "emu", "--testbed", str(emu), "--json",
                                "--out", str(tmp_path / "run"), "--trace", str(trace)],
                               cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
        try:
            page.wait_for_function("Number(document.getElementById('iterations')"
                                   ".textContent) >= 3", timeout=60_000)
            first = int(page.locator("#iterations").text_content() or 0)
            # the plan's WSS tables, and a port busy at some moment
            expect(page.locator(".wss")).to_have_count(4)
            page.wait_for_function("document.querySelector('.st.sending, .st.requesting, "
                                   ".st.tuning, .st.waiting') !== null", timeout=30_000)
            # the drill's fault, as injected and as the watch found it
            expect(page.locator("#faults")).to_contain_text("found dead-board n1-1",
                                                            timeout=60_000)
            expect(page.locator("#faults")).to_contain_text("drill injected dead-board n1-1")
            expect(page.locator("#node-n1-1")).to_contain_class("faulty")
            out, err = run.communicate(timeout=120)
        finally:
            if run.poll() is None:
                run.kill()
        assert run.returncode == 0, err[-3000:]
        expect(page.locator("#run")).to_contain_text("finished", timeout=10_000)
        # a run a loaded host disturbed is marked, with the lag its figures say (issue 83)
        lag = json.loads(out)["networks"]["oddl"]["disturbance"].get("host_lag_ms")
        expect(page.locator("#disturbed")).to_have_text(
            f"disturbed: the node programs' host ran {lag} ms late; its figures are skewed "
            "(free the CPU and run it again)" if lag else "")
        last = int(page.locator("#iterations").text_content() or 0)
        assert first < last == 30  # it rose, to every iteration the run recorded
        page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)
        browser.close()
    assert not errors, errors  # the page ran, not only loaded
    oddl = json.loads(out)["networks"]["oddl"]
    assert oddl["iterations"] == 30 and oddl["faults"][0]["kind"] == "dead-board"
    # the same trace format from emu as from sim
    check_chrome(json.loads(trace.read_text())["traceEvents"])


def test_beyond_loopback_needs_a_token(root: Path, emu: Path, tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "oddl.app", "dashboard", str(emu),
                        "--host", "0.0.0.0", "--port", "0"], cwd=root, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "needs a token" in r.stderr
    tok = tmp_path / "token"
    tok.write_text("s3cret-token-of-the-lab\n")
    with dashboard(root, emu, "--token-file", str(tok)) as url:
        assert url.endswith("?token=s3cret-token-of-the-lab")
        base = url.split("?")[0]
        assert httpx.get(base + "api/state").status_code == 401
        assert httpx.get(base + "api/state?token=wrong").status_code == 401
        ok = httpx.get(base + "api/state", headers={"authorization": "Bearer "
                                                     "s3cret-token-of-the-lab"})
        assert ok.status_code == 200 and ok.json()["testbed"]["rows"] == 2
        # a page fetched under another host name (DNS rebinding) is refused
        assert httpx.get(url, headers={"host": "evil.example"}).status_code == 400


def test_the_view_counts_junk_and_keeps_its_bounds(root: Path) -> None:
    tb = load_testbed(root / "hw_configs/prototype-4node.toml")
    v = View(tb)
    pre = f"oddl/{tb.name}"
    enc = msgspec.json.encode
    v.feed(f"{pre}/telemetry/n1", enc(PortsNote(TELEMETRY_VERSION, "n1", "j",
                                                {"H": PortView("sending", 1, 7, "n0")}, 1, 10)))
    v.feed(f"{pre}/health/n1", enc(Heartbeat(1, "n1", 0)))
    v.feed(f"{pre}/telemetry/oddl-ctl/run", enc(RunNote(1, "e", "oddl", "emu", "finished", 5,
                                                        host_lag_ms=312)))
    for i in range(MAX := 2100):
        v.feed(f"{pre}/telemetry/oddl-ctl/iteration",
               enc(IterationNote(1, "oddl", i, 12.5)))
    s = v.snapshot()
    assert s["run"]["host_lag_ms"] == 312  # a disturbed run, as the page marks it
    assert s["nodes"]["n1"]["ports"]["H"] == {"state": "sending", "channel": 1, "flow": 7,
                                              "peer": "n0", "queued": 0}
    assert s["nodes"]["n1"]["health"] == "ok" and s["nodes"]["n0"]["health"] == "silent"
    assert len(s["iterations"]["oddl"]) == 2000 and s["iterations"]["oddl"][-1] == [MAX - 1,
                                                                                   12.5]
    assert s["rejected"] == 0
    junk = [
        (f"{pre}/telemetry/n2", enc(PortsNote(1, "n1"))),  # n1 speaking on n2's topic
        (f"{pre}/telemetry/n9", enc(PortsNote(1, "n9"))),  # no node of this testbed
        (f"{pre}/health/n0", b"{not json"),
        (f"{pre}/telemetry/oddl-ctl/iteration", b'{"v": 1, "network": "x"}'),
        (f"{pre}/telemetry/oddl-ctl/melt", b"{}"),
        (f"{pre}/status/n0", b"maybe"),
        (f"{pre}/telemetry/n1", enc({"v": 1, "node": "n1", "ports": {"X": {"state": "idle"}}})),
    ]
    for topic, payload in junk:
        v.feed(topic, payload)
    for i in range(20):  # ever new networks: the picture stays bounded
        v.feed(f"{pre}/telemetry/oddl-ctl/iteration", enc(IterationNote(1, f"net{i}", 0, 1)))
    s = v.snapshot()
    assert s["rejected"] == len(junk) + 5 and len(s["iterations"]) == 16
    assert s["nodes"]["n1"]["ports"]["H"]["state"] == "sending"  # nothing lost to junk
    # a new run of a network starts a new series, whatever order its notes come in
    for i in (1, 0):
        v.feed(f"{pre}/telemetry/oddl-ctl/iteration",
               enc(IterationNote(1, "oddl", i, 8.0 + i, run="job-2")))
    assert v.snapshot()["iterations"]["oddl"] == [[0, 8.0], [1, 9.0]]
    # the arbiter's jobs: a series each, the oldest going as new ones come (issue 64: two
    # jobs drew one series); its queue and its jobs' ends, timed out ones too
    for j in range(1, 25):
        v.feed(f"{pre}/telemetry/oddl-ctl/iteration",
               enc(IterationNote(1, "oddl", 0, float(j), run="arbiter-1", job=f"j{j}")))
    series = v.snapshot()["iterations"]
    assert sorted(k for k in series if "/" in k) == [f"oddl/j{j}" for j in range(17, 25)]
    assert series["oddl"] == [[0, 8.0], [1, 9.0]]  # a network's own series stays
    v.feed(f"{pre}/telemetry/oddl-ctl/queue", enc(QueueNote(1, tb.name, [
        QueuedJob("j3", "alice", "timeout", 2, 5, 9), QueuedJob(
            "j4", "bob", "running", 2, 1, 9, "j4: 2 ranks", 3.0, False, "", ["n0", "n1"])])))
    v.feed(f"{pre}/telemetry/oddl-ctl/ended", enc(EndedNote(1, tb.name, "j3", "alice",
                                                            "timeout", "its time limit")))
    s = v.snapshot()
    assert [j["state"] for j in s["queue"]["jobs"]] == ["timeout", "running"]
    assert s["queue"]["jobs"][1]["nodes"] == ["n0", "n1"]
    assert (s["ended"]["job"], s["ended"]["state"]) == ("j3", "timeout")
    assert s["rejected"] == len(junk) + 5
    # each job's end on its own topic (issue 86), and its clearing, are read; one that
    # names another job is not
    v.feed(f"{pre}/telemetry/oddl-ctl/ended/j3", enc(EndedNote(1, tb.name, "j3", "alice",
                                                               "timeout", "")))
    v.feed(f"{pre}/telemetry/oddl-ctl/ended/j3", b"")
    assert v.snapshot()["rejected"] == len(junk) + 5
    v.feed(f"{pre}/telemetry/oddl-ctl/ended/j4", enc(EndedNote(1, tb.name, "j3", "alice",
                                                               "timeout", "")))
    assert v.snapshot()["rejected"] == len(junk) + 6


def test_a_sim_run_and_an_acceptance_result_reach_the_dashboard(root: Path, emu: Path,
                                                                 tmp_path: Path) -> None:
    """`oddl run --publish` (sim, virtual time) and `oddl accept`'s note, through the
    emulated testbed's broker, as the lab's would go through Mosquitto."""
    from oddl.app.registry import open_announcer
    from oddl.controller.base.telemetry import accept_note

    exp = tmp_path / "sim.toml"
    exp.write_text(tomli_w.dumps({
        "name": "published", "testbed": str(emu), "iterations": 7,
        "workload": {"model": "resnet50", "collective": "hd", "epochs": 1,
                     "dataset_samples": 1_000_000, "batch_per_node": 64,
                     "compute_time_ms": 5.0},
        "networks": [{"name": "oddl", "kind": "oddl"},
                     {"name": "electrical", "kind": "electrical"}]}))
    with dashboard(root, emu) as url, httpx.Client() as http:
        r = subprocess.run([sys.executable, "-m", "oddl.app", "run", str(exp),
                            "--publish", "--json", "--out", str(tmp_path / "run")],
                           cwd=root, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        announcer = open_announcer(load_testbed(emu))
        summary = {"verdict": "FAIL", "checks": [
            {"check": "test_tuning[n0-0/H]", "outcome": "passed"},
            {"check": "test_loopback[n1-1/V]", "outcome": "failed"}]}
        announcer.announce("accept", msgspec.json.encode(
            accept_note("t2x2", summary, "2026-11-23 10:00:00")))
        announcer.close()
        # the notes are QoS 0, and the broker may deliver them in another order: wait for
        # all of them, bounded
        for _ in range(100):
            s = http.get(url + "api/state").json()
            if s["accept"] and sum(map(len, s["iterations"].values())) == 14:
                break
            time.sleep(0.05)
    assert {k: len(v) for k, v in s["iterations"].items()} == {"oddl": 7, "electrical": 7}
    assert len(s["plan"]["wss"]) == 4 and s["plan"]["network"] == "oddl"
    assert s["accept"]["passed"] is False
    assert [c["outcome"] for c in s["accept"]["checks"]] == ["passed", "failed"]


@pytest.mark.parametrize(("content", "why"), [
    (None, "longer than 4096 bytes: not a token file"),  # /dev/zero: endless
    (b"\xff\xfe" * 20, "not UTF-8 text"),
])
def test_a_token_file_that_is_no_token_is_refused_at_once(root: Path, tmp_path: Path,
                                                          content: bytes | None,
                                                          why: str) -> None:
    """Reproducer (issue 33, defect 19): `--token-file /dev/zero` read GBs and ended in a
    MemoryError traceback. A token file is read up to 4 KiB, as every secret is."""
    path = Path("/dev/zero") if content is None else tmp_path / "tok"
    if content is not None:
        path.write_bytes(content)
    r = CliRunner().invoke(main, ["dashboard", str(root / "hw_configs/prototype-4node.toml"),
                                  "--host", "0.0.0.0", "--token-file", str(path)])
    assert r.exit_code == 2, r.output
    assert f"--token-file {path}: " in r.output and why in r.output


def test_the_websocket_is_for_the_dashboards_own_page_only(root: Path) -> None:
    """Reproducer (issue 33, defect 8): /ws accepted any Origin, so in loopback mode any web
    page the operator opened could read the testbed's state through it."""
    from oddl.app.dashboard import Dashboard
    from oddl.drivers.mqtt import MQTTBus
    from starlette.testclient import TestClient
    from starlette.websockets import WebSocketDisconnect

    tb = load_testbed(root / "hw_configs/prototype-4node.toml")
    dash = Dashboard(tb, MQTTBus(tb.name, "127.0.0.1", 1, user="oddl-dash", readonly=True))
    client = TestClient(dash.app)
    host = {"host": "127.0.0.1:8050"}
    with client.websocket_connect("/ws", headers=host | {"origin": "http://127.0.0.1:8050"}
                                  ) as ws:
        assert "nodes" in ws.receive_json()  # its own page
    with client.websocket_connect("/ws", headers=host) as ws:  # a client, not a browser
        assert "nodes" in ws.receive_json()
    for evil in ("http://evil.example", "http://127.0.0.1:9999", "null"):
        with pytest.raises(WebSocketDisconnect) as ei, \
                client.websocket_connect("/ws", headers=host | {"origin": evil}):
            pass
        assert ei.value.code == 1008
