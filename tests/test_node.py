"""`oddl node`: stage 2 beside each O-NIC, and the hw back end that hands it jobs."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import aiomqtt
import msgspec
import pytest
from oddl.controller.base import config
from oddl.controller.base.access import (
    CONTROLLER,
    DASHBOARD,
    new_passwords,
    result_topic,
    results,
    run_topic,
    status_topic,
    stop_topic,
)
from oddl.controller.base.clock import Clock
from oddl.controller.base.topology import Grid
from oddl.controller.service.node import NodeProgram
from oddl.controller.stage2.control_unit import Timing
from oddl.controller.stage2.job import JOB_VERSION, JobEvent, JobRunner, JobSpec, JobStop
from oddl.drivers.mqtt import MQTTBus
from oddl.sim import backend as sim_backend
from oddl.sim.devices.broker import EmbeddedBroker

from tests.helpers import emulator, make_testbed, write_experiment

pytestmark = pytest.mark.realtime  # brokers, emulators, sockets: the wall clock

TIMING = Timing(11, 2, 50, 1000, 1000, 5000, 3)


@pytest.fixture(scope="module")
def n1_apart(root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One `oddl emulate` of the prototype with n1's node program left to a lab's host
    (`--external-node n1`), serving the module's tests that start an n1 of their own, one
    after another, as a lab's emulator serves job after job; its emu config."""
    out = tmp_path_factory.mktemp("n1-apart") / "emu.toml"
    with emulator(root, root / "hw_configs" / "prototype-4node.toml", out,
                  "--external-node", "n1", limit_s=120):
        yield out


def test_node_program_reports_a_failing_job_and_serves_the_next() -> None:
    """Garbage and wrong schemas are dropped; a job it cannot run fails with the reason
    (to the controller and its peers); the program keeps serving."""
    tb = make_testbed(2, 2)
    node = "n0-0"
    pw = new_passwords(tb_nodes := [n.id for n in tb.nodes])
    rejected: list[int] = []

    async def main() -> list[JobEvent]:
        broker = await EmbeddedBroker("tb", tb_nodes, pw).start()
        port = broker.port
        world = sim_backend.build(tb, Grid.from_testbed(tb), Clock(asyncio.get_running_loop()))
        prog = await NodeProgram(
            "tb", node, world.onics[node], world.lines[node],
            MQTTBus("tb", "127.0.0.1", port, user=node, password=pw[node])).start()
        events: list[JobEvent] = []
        try:
            async with aiomqtt.Client("127.0.0.1", port, identifier=CONTROLLER,
                                      username=CONTROLLER, password=pw[CONTROLLER]) as c:
                await c.subscribe(results("tb"), qos=1)
                await c.publish(run_topic("tb"), b"not json", qos=1)
                await c.publish(run_topic("tb"), b'{"v": 99}', qos=1)  # wrong schema
                await c.publish(run_topic("tb"), b"[" * 100_000, qos=1)  # deep: no recursion
                spec = JobSpec(v=JOB_VERSION, job="j1", collective="no-such-collective", size=1000,
                               rows=1, cols=1, degree=4, bidirectional=False, ranks=[node],
                               nodes=[node], iterations=1, compute_ns=0, nic_sync=False,
                               timing=TIMING, routes={})
                for job in ("j1", "j2"):
                    await c.publish(run_topic("tb"), msgspec.json.encode(
                        msgspec.structs.replace(spec, job=job)), qos=1)
                    async for m in c.messages:
                        events.append(msgspec.json.decode(bytes(m.payload), type=JobEvent))
                        break
            rejected.append(prog.rejected)
        finally:
            await prog.stop()
            await broker.stop()
        return events

    events = asyncio.run(asyncio.wait_for(main(), 60))
    assert rejected == [3]  # the garbage, the wrong schema and the deep nesting, counted
    assert [(e.job, e.kind, e.node) for e in events] == [("j1", "failed", "n0-0"),
                                                         ("j2", "failed", "n0-0")]
    assert "no-such-collective" in events[0].error  # says why


def _cli(*args: str, root: Path, timeout: float = 200) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "oddl.app", *args], cwd=root,
                          capture_output=True, text=True, timeout=timeout)


# a node program gone bad (issue 33): it runs its board honestly and lies in its reports
_LIAR = """
import sys
from oddl.controller.service import node as N

honest = N._NodeJob._iteration
def lying(self, i, t_start, t_end):
    if {lie!r} == "time":
        honest(self, i, t_start, t_end + 1_000_000_000)  # 1 s more than it took
    else:
        self.runner.engine.flows = 10**15  # and so many flows
        honest(self, i, t_start, t_end)
N._NodeJob._iteration = lying
from oddl.app.cli import main
sys.argv = ["oddl", *sys.argv[1:]]
main()
"""


@contextlib.contextmanager
def _oddl_node(root: Path, config: Path, node: str, limit_s: float, lie: str | None = None
               ) -> Iterator[subprocess.Popen[str]]:
    """`oddl node CONFIG --node NODE` as a lab starts it, once it says "ready"; killed
    after `limit_s` whatever happens (never hangs the suite). `lie`: its reports do."""
    head = ["-m", "oddl.app"] if lie is None else ["-c", _LIAR.format(lie=lie)]
    proc = subprocess.Popen([sys.executable, *head, "node", str(config), "--node", node],
                            cwd=root, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    killer = threading.Timer(limit_s, proc.kill)
    killer.start()
    try:
        assert proc.stdout is not None
        assert "ready" in proc.stdout.readline()
        yield proc
    finally:
        killer.cancel()
        if proc.poll() is None:
            proc.kill()


def test_hw_run_with_oddl_node_beside_a_board(root: Path, tmp_path: Path) -> None:
    """The lab's layout: one board's stage 2 runs as its own `oddl node` process, over
    PYNQ.remote with its interrupt line polled; the emulator's node programs run the
    others; `oddl run --backend hw` applies stage 1 and hands them the job."""
    out = tmp_path / "emu.toml"
    with emulator(root, root / "hw_configs" / "prototype-4node.toml", out,
                  "--external-node", "n1", limit_s=240) as (proc, _):
        with _oddl_node(root, out, "n1", 200) as node:
            r = _cli("run", "experiments/table1-resnet50.toml", "--backend", "hw",
                     "--testbed", str(out), "--iterations", "2", "--json", "--out",
                     str(tmp_path / "run"), root=root)
            assert r.returncode == 0, r.stderr[-2000:]
            d = json.loads(r.stdout)
            oddl = d["networks"]["oddl"]
            assert d["backend"] == "hw"
            assert (oddl["iterations"], oddl["flows"], oddl["invariant_violations"]) == (2, 32, 0)
            assert oddl["control_messages"] >= 3 * 32  # REQUEST, GRANT, RELEASE per flow
            node.send_signal(signal.SIGINT)
            assert node.wait(20) == 130  # a clean stop by SIGINT
            assert "stopped after 1 jobs" in node.stdout.read()  # type: ignore[union-attr]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(20) == 130  # a clean stop by SIGINT


@pytest.mark.parametrize(("lie", "said"), [
    ("time", r"node n1: its reports add up to \d+\.\d+ s of iterations, but the job was "
             r"sent \d+\.\d+ s ago"),  # 1 s more than the time since (a slow machine too)
    ("flows", r"node n1: its report of iteration 0 cannot be true \(1000000000000000 flows "
              r"where its schedule starts 4 an iteration"),
])
def test_a_node_whose_reports_cannot_be_true_is_named(root: Path, tmp_path: Path, lie: str,
                                                       said: str, n1_apart: Path) -> None:
    """Reproducer (issue 33, defect 5): a node that added 1 s to each iteration it reported
    gave 1,261 ms an iteration and a ratio of 5.41, exit 0, unflagged (50 of those
    iterations were longer than the run); one claiming 10^15 flows passed too. Reports are
    held to what the controller knows: its own clock and the job's schedule."""
    out = n1_apart
    with _oddl_node(root, out, "n1", 100, lie=lie):
        r = _cli("run", "experiments/table1-resnet50.toml", "--backend", "hw", "--testbed",
                 str(out), "--iterations", "3", "--out", str(tmp_path / "run"), root=root)
    assert r.returncode == 1, r.stdout[-500:]
    assert re.search(said, r.stderr), r.stderr[-2000:]
    assert "its reports are not to be trusted" in r.stderr


def test_a_lab_with_no_pynq_remote_port_gets_its_stage1_through_the_node_programs(
        root: Path, tmp_path: Path) -> None:
    """Issue 33, defect 4: with `board = "local"` the controller opens no board; each node
    program applies its own board's routes and count-action program from the job, over the
    authenticated bus, and reads them back (without that, no transfer would find a route
    and the run would stall)."""
    out = tmp_path / "emu.toml"
    with emulator(root, root / "hw_configs" / "prototype-4node.toml", out,
                  "--local-boards") as (_, lines):
        assert not [x for x in lines if "PYNQ.remote" in x], lines  # no port open
        boards = {n.id: n.board for n in config.load_testbed(out).nodes}
        assert boards == dict.fromkeys(("n0", "n1", "n2", "n3"), "local")
        r = _cli("run", "experiments/table1-resnet50.toml", "--backend", "hw", "--testbed",
                 str(out), "--iterations", "3", "--json", "--out", str(tmp_path / "run"),
                 root=root)
    assert r.returncode == 0, r.stderr[-2000:]
    oddl = json.loads(r.stdout)["networks"]["oddl"]
    assert (oddl["iterations"], oddl["flows"], oddl["invariant_violations"]) == (3, 48, 0)


def test_a_board_whose_interrupts_another_writer_disables_is_restored_and_named(
        root: Path, tmp_path: Path) -> None:
    """Reproducer (issue 33, defect 4): IRQ_ENABLE = 0 written on n2 over its PYNQ.remote
    port wedged the run, and the error blamed n3. The node program checks the enables it
    set with every heartbeat, restores them, and the run says who was disturbed."""
    import sqlite3
    import time

    from oddl.drivers.lab import open_board
    from oddl.fpga import regmap as R

    out, run_dir = tmp_path / "emu.toml", tmp_path / "run"
    exp = write_experiment(tmp_path / "e.toml", out, name="tampered", iterations=20,
                           compute_ms=20.0)
    with emulator(root, root / "hw_configs" / "prototype-4node.toml", out):
        run = subprocess.Popen([sys.executable, "-m", "oddl.app", "run", str(exp),
                                "--backend", "emu", "--testbed", str(out), "--json",
                                "--out", str(run_dir)], cwd=root,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline, recorded = time.monotonic() + 60, 0
            while recorded < 2:  # the job runs: the node's driver has set its enables
                assert run.poll() is None and time.monotonic() < deadline, run.communicate()
                with contextlib.suppress(sqlite3.Error, StopIteration):
                    db = sqlite3.connect(f"file:{next(run_dir.glob('**/results.sqlite'))}"
                                         f"?mode=ro", uri=True)
                    recorded = db.execute("SELECT COUNT(*) FROM iterations").fetchone()[0]
                    db.close()
                time.sleep(0.05)
            addr = next(n.board for n in config.load_testbed(out).nodes if n.id == "n2")
            board = open_board(addr, "n2", ["n0", "n1", "n2", "n3"])
            board.mmio.write(R.BY_NAME["IRQ_ENABLE"].offset, 0)  # the attack
            stdout, stderr = run.communicate(timeout=120)
        finally:
            run.kill()
    assert run.returncode == 0, stderr[-3000:]
    oddl = json.loads(stdout)["networks"]["oddl"]
    assert oddl["iterations"] == 20 and oddl["disturbed"]
    assert oddl["disturbance"]["board_tampered"] >= 1
    assert "node n2: another writer changed its board's registers" in stderr


def test_a_board_without_its_node_program_is_named(root: Path, tmp_path: Path) -> None:
    out = tmp_path / "emu.toml"
    with emulator(root, root / "hw_configs" / "prototype-4node.toml", out,
                  "--external-node", "n2") as _:
        r = _cli("run", "experiments/table1-resnet50.toml", "--backend", "hw", "--testbed",
                 str(out), "--iterations", "1", "--out", str(tmp_path / "run"), root=root)
    assert r.returncode == 1
    # the watch never hears n2: dead, and the run says so, and what to start
    assert "dead-board n2 (never heard in" in r.stderr
    assert "is `oddl node` running beside its board?" in r.stderr


def test_emulate_refuses_an_unknown_external_node(root: Path) -> None:
    from click.testing import CliRunner
    from oddl.app.cli import main

    r = CliRunner().invoke(main, ["emulate", str(root / "hw_configs" / "prototype-4node.toml"),
                                  "--external-node", "n9"])
    assert r.exit_code == 2
    assert "n9 is not a node of prototype-4node" in r.output


def test_a_job_whose_controller_vanishes_is_cancelled() -> None:
    """Reproducer (issue 13/14): a controller killed with `kill -9` left its job running on
    the nodes. Its last will now reaches them and they cancel the job, saying why."""
    tb = make_testbed(2, 2)
    node = "n0-0"
    pw = new_passwords(tb_nodes := [n.id for n in tb.nodes])

    async def main() -> tuple[list[JobEvent], int]:
        broker = await EmbeddedBroker("tb", tb_nodes, pw).start()
        world = sim_backend.build(tb, Grid.from_testbed(tb), Clock(asyncio.get_running_loop()))
        prog = await NodeProgram(
            "tb", node, world.onics[node], world.lines[node],
            MQTTBus("tb", "127.0.0.1", broker.port, user=node, password=pw[node])).start()
        events: list[JobEvent] = []
        try:
            will = aiomqtt.Will(status_topic("tb", CONTROLLER), b"offline", 1, retain=True)
            async with aiomqtt.Client("127.0.0.1", broker.port, identifier=CONTROLLER,
                                      username=CONTROLLER, password=pw[CONTROLLER],
                                      will=will) as ctl:
                await ctl.publish(status_topic("tb", CONTROLLER), b"online", qos=1, retain=True)
                # a long job: 100,000 iterations of 10 ms compute
                await ctl.publish(run_topic("tb"), msgspec.json.encode(JobSpec(
                    v=JOB_VERSION, job="long", collective="hd", size=1000, rows=1, cols=1,
                    degree=4, bidirectional=False, ranks=[node], nodes=[node],
                    iterations=100_000, compute_ns=10_000_000, nic_sync=False, timing=TIMING,
                    routes={})), qos=1)
                async with aiomqtt.Client("127.0.0.1", broker.port, identifier=DASHBOARD,
                                          username=DASHBOARD, password=pw[DASHBOARD]) as dash:
                    await dash.subscribe(results("tb"), qos=1)
                    async for m in dash.messages:
                        if not m.topic.matches(results("tb")):
                            continue  # amqtt has been seen to hand over a retained status
                        events.append(msgspec.json.decode(bytes(m.payload), type=JobEvent))
                        sock = ctl._client.socket()
                        if events[-1].kind == "iteration" and sock is not None:
                            # running: now the controller dies (once: a later iteration
                            # may come before the node hears its will)
                            sock.shutdown(socket.SHUT_RDWR)
                        if events[-1].kind in ("failed", "done"):
                            break
        except aiomqtt.MqttError:
            pass  # the controller's own client noticing its dead socket
        finally:
            cancelled = prog.jobs_cancelled
            await prog.stop()
            await broker.stop()
        return events, cancelled

    events, cancelled = asyncio.run(asyncio.wait_for(main(), 60))
    assert events[-1].kind == "failed" and "controller is gone" in events[-1].error
    assert cancelled == 1


@contextlib.asynccontextmanager
async def _node_program(tb: config.Testbed, node: str, pw: dict[str, str]
                        ) -> AsyncIterator[tuple[EmbeddedBroker, NodeProgram]]:
    """An embedded broker for `tb` and `node`'s program on it (its board the sim model),
    both stopped after."""
    broker = await EmbeddedBroker("tb", [n.id for n in tb.nodes], pw).start()
    world = sim_backend.build(tb, Grid.from_testbed(tb), Clock(asyncio.get_running_loop()))
    prog = await NodeProgram(
        "tb", node, world.onics[node], world.lines[node],
        MQTTBus("tb", "127.0.0.1", broker.port, user=node, password=pw[node])).start()
    try:
        yield broker, prog
    finally:
        await prog.stop()
        await broker.stop()


def test_the_controller_stops_one_job_and_the_program_serves_on() -> None:
    """Several jobs run at once, so the controller ends one on `job/stop` (its status
    going "offline" would end them all). A stop for another job's id leaves this one
    running; a stop for its own ends it, saying why; a job stopped before it reached the
    node is never started; the next job runs."""
    tb = make_testbed(2, 2)
    node = "n0-0"
    pw = new_passwords(n.id for n in tb.nodes)
    seen: list[tuple[str, str, str]] = []

    def spec(job: str, iterations: int) -> bytes:  # 10 ms of compute an iteration
        return msgspec.json.encode(JobSpec(v=JOB_VERSION, job=job, collective="hd", size=1000,
                                           rows=1, cols=1, degree=4, bidirectional=False,
                                           ranks=[node], nodes=[node], iterations=iterations,
                                           compute_ns=10_000_000, nic_sync=False, timing=TIMING,
                                           routes={}))

    def stop(job: str) -> bytes:
        return msgspec.json.encode(JobStop(JOB_VERSION, job, "a fault on its nodes"))

    async def main() -> int:
        async with _node_program(tb, node, pw) as (broker, prog), \
                aiomqtt.Client("127.0.0.1", broker.port, identifier=CONTROLLER,
                               username=CONTROLLER, password=pw[CONTROLLER]) as ctl:
            await ctl.subscribe(results("tb"), qos=1)
            await ctl.publish(run_topic("tb"), spec("long", 100_000), qos=1)
            iterations = 0
            async for m in ctl.messages:
                ev = msgspec.json.decode(bytes(m.payload), type=JobEvent)
                seen.append((ev.job, ev.kind, ev.error))
                if ev.kind == "iteration":
                    iterations += 1
                    if iterations == 1:  # another job's stop: this one runs on
                        await ctl.publish(stop_topic("tb"), stop("other"), qos=1)
                    elif iterations == 4:
                        await ctl.publish(stop_topic("tb"), stop("long"), qos=1)
                if ev.kind == "failed":
                    break
            await ctl.publish(stop_topic("tb"), stop("late"), qos=1)
            for _ in range(200):  # heard (bounded): then its job comes
                if "late" in prog.stopped:
                    break
                await asyncio.sleep(0.01)
            await ctl.publish(run_topic("tb"), spec("late", 1), qos=1)
            await ctl.publish(run_topic("tb"), spec("next", 1), qos=1)
            async for m in ctl.messages:
                ev = msgspec.json.decode(bytes(m.payload), type=JobEvent)
                seen.append((ev.job, ev.kind, ev.error))
                if ev.kind in ("done", "failed"):
                    break
        return prog.jobs_cancelled

    cancelled = asyncio.run(asyncio.wait_for(main(), 60))
    kinds = [(j, k) for j, k, _ in seen]
    assert kinds[:5] == [("long", "ready")] + [("long", "iteration")] * 4
    assert seen[kinds.index(("long", "failed"))][2] == \
        "stopped by the controller: a fault on its nodes"
    assert cancelled == 1
    assert kinds[-3:] == [("next", "ready"), ("next", "iteration"), ("next", "done")]
    assert all(j != "late" for j, _ in kinds)


def test_a_peers_ready_heard_before_the_job_itself_is_kept() -> None:
    """Reproducer (CI, stop 27): a board's `oddl node` over PYNQ.remote took the job a
    little after its peers, and their "ready" events, heard before it had the job, were
    dropped: it waited for them for ever and the run timed out. A peer's event that comes
    before the job does is now kept for it."""
    tb = make_testbed(2, 2)
    node, peer = "n0-0", "n0-1"
    pw = new_passwords(n.id for n in tb.nodes)

    events: list[JobEvent] = []

    async def main() -> None:
        async with _node_program(tb, node, pw) as (broker, _prog):
            spec = JobSpec(v=JOB_VERSION, job="j", collective="hd", size=1000, rows=1, cols=1,
                           degree=4, bidirectional=False, ranks=[node], nodes=[node, peer],
                           iterations=1, compute_ns=1000, nic_sync=False, timing=TIMING, routes={})
            async with aiomqtt.Client("127.0.0.1", broker.port, identifier=peer,
                                      username=peer, password=pw[peer]) as p, \
                    aiomqtt.Client("127.0.0.1", broker.port, identifier=CONTROLLER,
                                   username=CONTROLLER, password=pw[CONTROLLER]) as ctl:
                await ctl.subscribe(results("tb"), qos=1)
                await p.publish(result_topic("tb", peer), msgspec.json.encode(
                    JobEvent(JOB_VERSION, "j", "ready", peer)), qos=1)
                await ctl.publish(run_topic("tb"), msgspec.json.encode(spec), qos=1)
                async for m in ctl.messages:
                    ev = msgspec.json.decode(bytes(m.payload), type=JobEvent)
                    if ev.node == node:
                        events.append(ev)
                    if ev.kind in ("done", "failed"):
                        break

    with contextlib.suppress(TimeoutError):  # before the fix: no event after "ready"
        asyncio.run(asyncio.wait_for(main(), 20))
    assert [e.kind for e in events] == ["ready", "iteration", "done"]


def test_a_job_sent_again_is_not_failed_by_its_earlier_attempts_news() -> None:
    """Reproducer (issue 43): a job that failed on a node, sent again under the same id,
    failed at once with the earlier attempt's failure: a peer's late "failed" had been
    kept as news for a job not yet taken."""
    tb = make_testbed(2, 2)
    node, peer = "n0-0", "n0-1"
    pw = new_passwords(n.id for n in tb.nodes)
    events: list[JobEvent] = []

    async def until(what: str, ok: Callable[[], bool]) -> None:
        t_end = asyncio.get_running_loop().time() + 15
        while not ok():
            assert asyncio.get_running_loop().time() < t_end, f"no {what} within 15 s"
            await asyncio.sleep(0.01)

    async def main() -> None:
        async with _node_program(tb, node, pw) as (broker, prog):
            spec = JobSpec(v=JOB_VERSION, job="j", collective="hd", size=1000, rows=1, cols=1,
                           degree=4, bidirectional=False, ranks=[node], nodes=[node, peer],
                           iterations=1, compute_ns=1000, nic_sync=False, timing=TIMING, routes={})
            async with aiomqtt.Client("127.0.0.1", broker.port, identifier=peer,
                                      username=peer, password=pw[peer]) as p, \
                    aiomqtt.Client("127.0.0.1", broker.port, identifier=CONTROLLER,
                                   username=CONTROLLER, password=pw[CONTROLLER]) as ctl:
                await ctl.subscribe(results("tb"), qos=1)

                async def say(job: str, kind: str, error: str = "") -> None:
                    await p.publish(result_topic("tb", peer), msgspec.json.encode(
                        JobEvent(JOB_VERSION, job, kind, peer, error=error)), qos=1)

                async def hear() -> None:
                    async for m in ctl.messages:
                        ev = msgspec.json.decode(bytes(m.payload), type=JobEvent)
                        if ev.node == node:
                            events.append(ev)

                listening = asyncio.ensure_future(hear())
                await ctl.publish(run_topic("tb"), msgspec.json.encode(spec), qos=1)
                await until("ready", lambda: [e.kind for e in events] == ["ready"])
                await say("j", "failed", "its board died")  # the first attempt fails
                await until("failed", lambda: [e.kind for e in events] == ["ready", "failed"])
                await say("j", "failed", "its board died")  # said again, late
                await say("k", "ready")  # after it, from the same peer: a marker
                await until("the late news", lambda: any(e.job == "k" for e in prog._early))
                await ctl.publish(run_topic("tb"), msgspec.json.encode(spec), qos=1)
                await say("j", "ready")
                await until("the second attempt's end", lambda: events[-1].kind in (
                    "done", "failed") and len(events) > 2)
                listening.cancel()

    asyncio.run(asyncio.wait_for(main(), 60))
    assert [e.kind for e in events] == ["ready", "failed", "ready", "iteration", "done"], \
        [(e.kind, e.error) for e in events]


def test_a_count_action_fire_the_host_cannot_account_for_fails_the_job() -> None:
    """An O-NIC that says a step is complete when its bytes are not all delivered fails
    the job, naming the step; it used to raise in the interrupt callback, where asyncio
    logged it and the rank waited for ever."""
    tb = make_testbed(2, 2)
    node = "n0-0"

    async def main() -> list[BaseException]:
        clock = Clock(asyncio.get_running_loop())
        world = sim_backend.build(tb, Grid.from_testbed(tb), clock)
        spec = JobSpec(v=JOB_VERSION, job="j", collective="ring", size=2000, rows=1, cols=1,
                       degree=4, bidirectional=False, ranks=[node, "n0-1"], nodes=[node, "n0-1"],
                       iterations=1, compute_ns=10**9, nic_sync=True, timing=TIMING, routes={})
        runner = JobRunner(spec, clock, None, lambda *_: None, local=[node])
        failed: list[BaseException] = []
        runner.fail = failed.append
        runner.on_onics(world.bus, {node: world.onics[node]}, {node: world.lines[node]})
        runner.begin(0)
        assert world.onics[node].on_module_fired is not None
        world.onics[node].on_module_fired(0)  # as its interrupt handler does
        runner.close()
        return failed

    failed = asyncio.run(main())
    assert [str(e) for e in failed] == [
        "n0-0: count-action fired for step 0 with 0 of 1000 bytes delivered"]


def test_a_job_not_done_in_time_names_whom_it_waits_for() -> None:
    """A job the controller gives up on says where it stood (before: only "not done within
    181 s", which left a lost report, a dead peer or a stuck rank to guesswork)."""
    from oddl.drivers.job_tally import JobTally

    spec = JobSpec(v=JOB_VERSION, job="j", collective="hd", size=1000, rows=1, cols=1, degree=4,
                   bidirectional=False, ranks=["a", "b", "c"], nodes=["a", "b", "c", "r"],
                   iterations=5, compute_ns=10_000_000, nic_sync=False, timing=TIMING, routes={})
    tally = JobTally(spec, lambda it: None, lambda why: None)

    def hear(kind: str, *nodes: str, i: int = 0) -> None:
        for n in nodes:
            tally.heard(JobEvent(JOB_VERSION, "j", kind, n, iteration=i))

    hear("ready", "a", "r")
    assert tally.progress() == "never ready: b, c"
    hear("ready", "b", "c")
    for i in (0, 1):
        hear("iteration", "a", "b", "c", i=i)
    hear("iteration", "b", i=2)
    assert tally.progress() == "2 iterations recorded; iteration 2 not reported by a, c"
    hear("iteration", "a", "c", i=2)
    for i in (3, 4):
        hear("iteration", "a", "b", "c", i=i)
    hear("done", "a", "b")
    assert tally.progress() == 'every iteration recorded; no "done" from c, r'


@contextlib.contextmanager
def _stuck_node(emu: Path, node: str) -> Iterator[list[str]]:
    """A node program gone wrong: logged in as `node`, it beats, says "ready" to every job
    and GRANTs every REQUEST (so its peers send, and need no retry), but never sends a
    flow of its own nor reports. Yields the ids of the jobs it took."""
    from oddl.controller.base.access import ctl_topic, health_topic
    from oddl.controller.base.config import load_testbed
    from oddl.controller.base.messages import Grant, Request
    from oddl.controller.service.health import HEARTBEAT_VERSION, Heartbeat
    from oddl.controller.stage2.wire import decode, encode

    tb = load_testbed(emu)
    assert tb.broker.password_file is not None
    pw = Path(tb.broker.password_file.replace("{user}", node)).read_text().strip()
    port = int(tb.broker.url.rpartition(":")[2])
    name = tb.testbed.name
    jobs: list[str] = []
    stop = threading.Event()

    async def main() -> None:
        async with aiomqtt.Client("127.0.0.1", port, identifier=node, username=node,
                                  password=pw) as c:
            await c.subscribe(run_topic(name), qos=1)
            await c.subscribe(ctl_topic(name, node, "+"), qos=1)

            async def take() -> None:
                async for m in c.messages:
                    raw = bytes(m.payload)  # type: ignore[arg-type]
                    if m.topic.matches(run_topic(name)):
                        jobs.append(msgspec.json.decode(raw, type=JobSpec).job)
                        await c.publish(result_topic(name, node), msgspec.json.encode(
                            JobEvent(JOB_VERSION, jobs[-1], "ready", node)), qos=1)
                    elif isinstance(q := decode(raw), Request):
                        await c.publish(ctl_topic(name, q.src, node), encode(Grant(
                            q.flow, q.hop, node, q.src, q.port, q.channel, 2**62)))

            taking = asyncio.ensure_future(take())
            seq = 0
            while not stop.is_set():  # alive to the watch all along
                seq += 1
                await c.publish(health_topic(name, node), msgspec.json.encode(
                    Heartbeat(HEARTBEAT_VERSION, node, seq)))
                await asyncio.sleep(0.1)
            taking.cancel()

    t = threading.Thread(target=lambda: asyncio.run(asyncio.wait_for(main(), 120)),
                         daemon=True)
    t.start()
    try:
        yield jobs
    finally:
        stop.set()
        t.join(10)


def test_a_job_a_live_node_never_reports_fails_naming_it(root: Path, tmp_path: Path,
                                                        n1_apart: Path) -> None:
    """A node program that beats, says "ready" and grants, but never sends nor reports:
    the job is stuck (its peers wait for its flows), though every node is alive. Once
    nothing has been heard for an iteration's compute plus `grace_ms`, the iteration is
    cut short and goes on (issue 85: light a fault swallowed unseen is sent again so);
    stuck each time, the run fails after MAX_STOPS such stops, naming the ranks it waits
    for. (Before: it waited 5 s an iteration plus 30 s, and said only "not done".)"""
    out = n1_apart
    with _stuck_node(out, "n1") as jobs:
        r = _cli("run", "experiments/table1-resnet50.toml", "--backend", "hw",
                 "--testbed", str(out), "--iterations", "3", "--out", str(tmp_path / "run"),
                 root=root, timeout=100)
    assert r.returncode == 1
    assert jobs  # it took the job
    assert "stopped for faults 4 times" in r.stderr, r.stderr[-2000:]
    assert re.search(r"job \S+: no report and no control message for 5\.\d s: 0 "
                     r"iterations recorded; "
                     r"iteration 0 not reported by n0, n1, n2, n3", r.stderr), r.stderr[-2000:]
