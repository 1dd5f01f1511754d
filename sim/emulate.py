"""`oddl emulate`: the testbed's devices as servers on 127.0.0.1, speaking real protocols.

Per O-NIC a PYNQ.remote-compatible gRPC server in front of its register-accurate board; per
WSS the serial instrument on a pseudo-terminal, fronting the very WSS model the fabric
routes light with; the embedded MQTT broker. All run on one real-time asyncio loop. The
endpoints are written out as an emu testbed config that the controller loads like any other.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import secrets as secrets_
import shutil
import statistics
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w
from oddl.controller.base.access import EMULATOR, new_passwords, probe_ns, write_private
from oddl.controller.base.clock import Clock
from oddl.controller.base.config import FaultSpec, Testbed
from oddl.controller.base.faultkinds import QICK_KINDS
from oddl.controller.base.topology import Grid
from oddl.controller.service.node import NodeProgram
from oddl.controller.serving.lifecycle import Services
from oddl.sim import backend as sim_backend
from oddl.sim.devices.broker import EmbeddedBroker, free_port
from oddl.sim.devices.faults import Drill, install
from oddl.sim.devices.pynq_device import EmulatedONicDevice
from oddl.sim.devices.pynq_remote import RemoteBoardServer
from oddl.sim.devices.wss_serial import SerialWSS

log = logging.getLogger(__name__)
BEATS_PER_S = 100  # the heartbeats of all node programs an emulator hosts, a second
NODES_PER_SCALE = 16  # node programs an emulator hosts within the control timing's base


@dataclass
class Emulation:
    boards: dict[str, RemoteBoardServer] = field(default_factory=dict)
    wss: dict[str, SerialWSS] = field(default_factory=dict)
    broker: EmbeddedBroker | None = None
    qick: Any = None  # sim.qick_pyro.QickPyroServer
    nodes: dict[str, NodeProgram] = field(default_factory=dict)  # `oddl node`, per board
    observer: Any = None  # the monitor's ear on external node programs' control topics
    world: Any = None
    control_hop_ns: int | None = None  # one control message through the broker, measured
    passwords: dict[str, str] = field(default_factory=dict)  # this run's, per party
    drill: Drill | None = None  # the faults in force
    control: Any = None  # sim.control.ControlEndpoint: faults while a job runs
    token: str = field(default_factory=lambda: secrets_.token_urlsafe(24))  # the endpoint's
    qick_key: str = field(default_factory=lambda: secrets_.token_urlsafe(32))  # Pyro's HMAC
    revive: Any = None  # node -> its node program started afresh (a board back)
    external: frozenset[str] = frozenset()
    _effects: list[asyncio.Task[None]] = field(default_factory=list)

    def password(self, party: str) -> str | None:
        return self.passwords.get(party)

    def write_secrets(self, where: Path) -> Path:
        """Each party's password in a file of its own, in a directory only this user can
        open: what the emu config's `password_file` names."""
        where.mkdir(mode=0o700, exist_ok=True)
        where.chmod(0o700)
        for party, pw in self.passwords.items():
            write_private(where / party, pw)
        write_private(where / "_control", self.token)  # "_": no party can have this name
        if self.qick is not None:
            write_private(where / "_qick", self.qick_key)
        return where

    def busy(self) -> bool:
        """Are the devices at work: a job on a node program here, or a board whose node
        program runs elsewhere (whose jobs this emulator cannot see)?"""
        return bool(self.external) or any(p.busy() for p in self.nodes.values())

    def refusal(self, f: FaultSpec) -> str | None:
        """Why this emulator cannot inject `f` while it runs (None: it can)."""
        if f.kind == "broker-restart" and self.broker is None:
            return "broker-restart: this emulator runs no broker (restart yours by hand)"
        if f.kind == "dead-board" and f.target in self.external:
            return f"dead-board: {f.target}'s node program runs elsewhere: stop it there"
        if f.kind in QICK_KINDS:
            return f"{f.kind}: the QICK board's faults are given at start (--fault)"
        return None

    def effect(self, f: FaultSpec, on: bool) -> None:
        """What a fault does beyond the models: a dead board's server and node program
        go (and come back with it); the broker stops (and starts again on its port).
        Run in order, one after the other, on the emulator's loop."""
        if self.control is None:  # at start: `start` leaves dead boards out itself
            return
        step: Coroutine[Any, Any, object]
        if f.kind == "dead-board":
            step = self._kill(f.target) if on else self._revive(f.target)
        elif f.kind == "broker-restart" and self.broker is not None:
            step = self.broker.stop() if on else self.broker.start()
        else:
            return
        before = self._effects[-1] if self._effects else None

        async def then() -> None:
            if before is not None:
                await asyncio.gather(before, return_exceptions=True)
            try:
                await step
            except Exception:
                log.exception("emulator: %s %s", "injecting" if on else "ending", f)

        self._effects.append(asyncio.ensure_future(then()))

    async def _kill(self, node: str) -> None:
        prog = self.nodes.pop(node, None)
        if prog is not None:  # at once, as with the board's power
            await prog.crash()
        if node in self.boards:
            await self.boards[node].stop()

    async def _revive(self, node: str) -> None:
        if node in self.boards:
            await self.boards[node].start()
        self.nodes[node] = await self.revive(node)

    def endpoints(self) -> dict[str, Any]:
        return {
            "boards": {n: f"grpc://127.0.0.1:{s.port}" for n, s in self.boards.items()},
            "wss": {w: s.path for w, s in self.wss.items()},
            "broker": self.broker.url if self.broker else None,
            "qick": self.qick.url if self.qick else None,
        }

    async def stop(self) -> None:
        if self.control is not None:
            await self.control.stop()
        await asyncio.gather(*self._effects, return_exceptions=True)
        for prog in self.nodes.values():  # before the broker they talk through
            await prog.stop()
        if self.observer is not None:
            await self.observer.close()
        # all at once: each waits its grace for calls in flight (a lab's boards stop apart)
        await asyncio.gather(*(s.stop() for s in self.boards.values()))
        for w in self.wss.values():
            w.close()
        if self.broker is not None:
            await self.broker.stop()
        if self.qick is not None:
            self.qick.stop()


async def start(tb: Testbed, emu: Emulation, host: str = "127.0.0.1",
                faults: list[FaultSpec] | None = None, local_boards: bool = False
                ) -> Emulation:
    """Start every device of `emu` (its `stop` stops what has started, also part-way).
    emu.external: boards whose node program runs elsewhere (`oddl node` over PYNQ.remote).
    local_boards: the others open no PYNQ.remote port; the emu config names them `local`
    (their node programs, here, apply their stage 1: drivers/local_board.py)."""
    loop = asyncio.get_running_loop()
    grid = Grid.from_testbed(tb)
    external = emu.external
    # the devices answer hand-driven probes too (acceptance checks): record, never raise
    emu.world = sim_backend.build(tb, grid, Clock(loop), checker_mode="record",
                                  real_time=True)
    emu.drill = install(emu.world, Clock(loop), faults or [],
                        lambda: sum(p.retries() for p in emu.nodes.values()), emu.effect)
    dead = {f.target for f in faults or [] if f.kind == "dead-board"}
    for node, board in emu.world.boards.items():
        if local_boards and node not in external:
            continue
        server = RemoteBoardServer(EmulatedONicDevice(board), host, free_port(host))
        emu.boards[node] = server if node in dead else await server.start()  # dead: silent
    settle = {w.id: w.reconfig_ms for w in tb.wss}
    for wid, model in emu.world.wss.items():
        emu.wss[wid] = SerialWSS(model, settle[wid]).start()
    if tb.broker.url == "embedded":  # credentials of this run's own, for every party
        emu.passwords = new_passwords(grid.nodes)
        # where the testbed says ([broker] bind: 127.0.0.1 unless configured otherwise)
        emu.broker = await EmbeddedBroker(tb.name, list(grid.nodes), emu.passwords,
                                          tb.broker.bind).start()
    # stage 2 beside each board: the `oddl node` program on the board's local registers
    # and its interrupt line, logged in as its node; the fabric's monitor (which sees the
    # light) judges every job, as it judges a sim run
    from oddl.drivers.mqtt import bus_from_config

    port = emu.broker.port if emu.broker is not None else None
    w = emu.world
    emu.control_hop_ns = await control_hop_ns(tb, port, emu.password(EMULATOR))

    async def node_program(node: str) -> NodeProgram:
        return await NodeProgram(
            tb.name, node, w.onics[node], w.lines[node],
            bus_from_config(tb.name, tb.broker, node, port, tap=w.checker.on_message,
                            password=emu.password(node)),
            w.checker, tb.monitor.heartbeat_ms / 1e3, w.unit).start()

    emu.revive = node_program
    for node in grid.nodes:
        if node not in dead and node not in external:
            emu.nodes[node] = await node_program(node)
    if external:  # their GRANTs reach the monitor through an observer; which flows they
        # start, only they know: the monitor does not hold them to "never started"
        emu.observer = bus_from_config(tb.name, tb.broker, EMULATOR, port,
                                       tap=w.checker.on_message,
                                       password=emu.password(EMULATOR))
        for node in external:
            emu.observer.attach(node, lambda m: None)
        await emu.observer.start()
        w.checker.partial = True
    if tb.qick is not None:
        from oddl.sim.backend import lone_board
        from oddl.sim.devices.lightning_datapath import DatapathSpec
        from oddl.sim.devices.qick_pyro import QickPyroServer
        from oddl.sim.devices.qick_soc import Photonics

        stuck = {f.dac for f in faults or [] if f.kind == "dac-not-ready"}
        dark = frozenset(f.dac for f in faults or [] if f.kind == "dead-modulator"
                         and f.dac is not None)
        n_dacs = max(tb.qick.dac_channels) + 1
        photonics = Photonics.from_config(tb.qick.photonics,
                                          [g not in stuck for g in range(n_dacs)],
                                          dead_modulators=dark)
        dp = tb.qick.datapath  # its fabric's Lightning datapath, with its own engine
        emu.qick = await asyncio.to_thread(QickPyroServer(
            photonics, host, n_dacs=n_dacs,
            engine=functools.partial(lone_board, tb.testbed.board_model),
            datapath=DatapathSpec(dp.stream_gsps, dp.latency_ns),
            hmac_key=emu.qick_key.encode()).start)
    from oddl.sim.devices.control import ControlEndpoint

    emu.control = await ControlEndpoint(tb, emu.drill, emu.token, emu.refusal).start()
    return emu


async def control_hop_ns(tb: Testbed, port: int | None, password: str | None,
                         n: int = 40) -> int:
    """One control message's trip through this testbed's broker (half the median REQUEST ->
    GRANT round trip on the node side's own loop): what a model of the emulated testbed
    should use for `[control] latency_ns`, instead of the prototype's FPGA network. It runs
    in the emulator's own namespace, before the node programs, as the emulator."""
    from oddl.drivers.mqtt import bus_from_config, request_grant_rtt

    bus = bus_from_config(probe_ns(tb.name), tb.broker, EMULATOR, port, password=password)
    rtt = await request_grant_rtt(bus, n, warmup=10, a=EMULATOR, b="probe")
    return round(statistics.median(rtt) / 2 * 1e9)


def emu_config(tb: Testbed, emu: Emulation, source: str, secrets: Path | None = None
               ) -> dict[str, Any]:
    """The testbed as the controller should see it: same fabric, emulated endpoints."""
    d = tb.model_dump(mode="json", exclude_none=True, exclude={"generate"})
    d["testbed"]["backend"] = "emu"
    # control messages cross a real MQTT broker here (~1 ms on loopback, tens of ms on a
    # loaded machine; not the modelled FPGA network's 1 us): time-outs and leases sized
    # for it, so a busy CI machine slows a run down rather than failing its flows; and for
    # the node programs it hosts, whose messages queue in its one broker (a 16-rank job on
    # grid-64's: over a second as the job began, and every first REQUEST ran out of its
    # 60 retries of 50 ms)
    scale = max(1.0, len(tb.nodes) / NODES_PER_SCALE)
    d["control"] |= {"request_timeout_ns": round(50_000_000 * scale),
                     "grant_lease_ns": round(250_000_000 * scale), "max_retries": 60}
    # one process hosts every node program here (a lab: a processor each): their
    # heartbeats are kept to about BEATS_PER_S in all, or the emulator spends itself on
    # them (64 nodes at the prototype's 100 ms starved grid-64's jobs); the watch's
    # bounds (missed periods) scale with the period
    d["monitor"]["heartbeat_ms"] = max(tb.monitor.heartbeat_ms, 1e3 * len(tb.nodes)
                                       / BEATS_PER_S)
    if emu.control_hop_ns is not None:  # a sim run of this file models the emulated bus
        d["control"] |= {"kind": "mqtt", "latency_ns": emu.control_hop_ns}
    d["testbed"]["description"] = f"emulated by `oddl emulate {source}`"
    for n in d["nodes"]:
        server = emu.boards.get(n["id"])
        n["board"] = f"grpc://127.0.0.1:{server.port}" if server is not None else "local"
    for w in d["wss"]:
        w["serial"] = emu.wss[w["id"]].path
    if emu.broker is not None:
        d["broker"]["url"] = emu.broker.url
        if secrets is not None:
            d["broker"].pop("password_env", None)
            d["broker"]["password_file"] = str(secrets.resolve() / "{user}")
    if emu.control is not None and secrets is not None:
        d["emulator"] = {"control": emu.control.url,
                         "token_file": str(secrets.resolve() / "_control")}
    if emu.qick is not None:
        d["qick"]["soc"] = emu.qick.url
        if secrets is not None:  # its key, which only this user reads
            d["qick"]["hmac_key_file"] = str(secrets.resolve() / "_qick")
    for k in ("wavelengths_nm", "wavelength_grid"):
        if d["optical"].get(k) is None:
            d["optical"].pop(k, None)
    return d


async def serve(tb: Testbed, source: str, out: Path, say: Any,
                faults: list[FaultSpec] | None = None,
                external: set[str] | frozenset[str] = frozenset(),
                local_boards: bool = False) -> None:
    """Serve until a signal: every device started, then stopped in the reverse order (its
    credentials last); "stopped" said on the way out, whatever ended it."""
    emu = Emulation(external=frozenset(external))
    secrets = out.with_name(f".{out.name}.secrets")
    if out.exists() and not secrets.exists():  # an earlier emulator's, stopped: its ports
        out.unlink()  # are gone, and a reader must not take them for this one's
    try:
        async with Services(f"emulator of {tb.name}") as services:
            services.add("its credentials", lambda: shutil.rmtree(secrets, ignore_errors=True))
            services.add("its devices, broker and node programs", emu.stop)
            await start(tb, emu, faults=faults, local_boards=local_boards)
            spin = getattr(asyncio.get_running_loop(), "spin", None)
            if spin is not None:  # poll for device timing only while a job runs
                spin.wanted = emu.busy
            for f in faults or []:
                say(f"fault: {f}")
            emu.write_secrets(secrets)
            out.write_text(tomli_w.dumps(emu_config(tb, emu, source, secrets)))
            ep = emu.endpoints()
            for n, url in ep["boards"].items():
                say(f"board {n}: {url} (PYNQ.remote)")
            for w, path in ep["wss"].items():
                say(f"wss {w}: {path} (serial)")
            say(f"broker: {ep['broker'] or tb.broker.url}")
            if ep["qick"]:
                say(f"qick: {ep['qick']} (qick.pyro)")
            say(f"control: {emu.control.url} (faults while a job runs; token in {secrets})")
            m = tb.testbed
            if m.board_model != "python" or m.control_model != "python":
                say(f"models: boards {m.board_model}, control units {m.control_model}"
                    + (f" ({m.rtl_simulator})" if m.control_model == "rtl" else ""))
                if m.control_model == "rtl" and m.rtl_simulator == "amaranth":
                    say("warning: Amaranth's simulator takes milliseconds an event on this "
                        "real-time loop: REQUESTs time out and runs are disturbed (Table 1: "
                        "1.08 s an iteration, not 0.26); --rtl-simulator verilator keeps time")
            say(f"config: {out}")
            gc.collect()
            gc.freeze()  # the long-lived models and servers: never scanned again
            say("ready")
            await services.run()
    finally:
        say("stopped")
