"""The one place a back end is chosen: names to the modules that build them, and what
each back end is (`KINDS`: a table of capabilities; nothing else compares a back end's
name).

The application asks here for a back end, a board, or a node program, and never imports
`oddl.sim` or `oddl.drivers` itself (an import contract holds this; docs/api.md). Each
back end's module is imported only when that back end is asked for, so a lab's hw run
loads no model and a sim run opens no socket.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from oddl.controller.base.config import (
    FaultSpec,
    NetworkSpec,
    QickDatapath,
    QickPhotonics,
    Testbed,
)
from oddl.controller.base.parallelism import Hybrid
from oddl.controller.base.topology import Grid
from oddl.controller.service.backend import Announce, Backend
from oddl.controller.service.node import NodeProgram

if TYPE_CHECKING:  # what the back ends hand out, named for the checker (imported when asked)
    from oddl.drivers.announce import BusAnnouncer
    from oddl.drivers.cassette import Player, Recorder
    from oddl.drivers.lightning_mac import PhotonicCore
    from oddl.drivers.mqtt import MQTTBus
    from oddl.drivers.onic import ONicDriver
    from oddl.sim.networks.profile import Profile
    from oddl.sim.networks.search import SearchResult
    from oddl.studies.lenet import Inference

T = TypeVar("T")


@dataclass(frozen=True)
class Kind:
    """What a back end is, and what it needs and offers."""

    name: str
    devices: bool  # real device I/O through the drivers (a lab's, or an emulator's)
    private_emulator: bool  # on a testbed of models: a private `oddl emulate` of it
    locks: bool  # takes the testbed's lock (another run or an arbiter holds devices)
    says_itself: bool  # tells the bus's watchers on its own connection (else: announce)
    faults_at_start: bool  # takes `--fault` at its start (an emulator's)
    models_boards: bool  # its boards are models: `--board-model` chooses which
    served_by_arbiter: bool  # a lab's arbiter may run its ODDL job (`oddl run` with one)
    real_time: bool  # runs on the wall clock (its loops' lag is said)


KINDS = {
    "sim": Kind("sim", devices=False, private_emulator=False, locks=False, says_itself=False,
                faults_at_start=False, models_boards=True, served_by_arbiter=False,
                real_time=False),
    "emu": Kind("emu", devices=True, private_emulator=True, locks=True, says_itself=True,
                faults_at_start=True, models_boards=True, served_by_arbiter=False,
                real_time=True),
    "hw": Kind("hw", devices=True, private_emulator=False, locks=True, says_itself=True,
               faults_at_start=False, models_boards=False, served_by_arbiter=True,
               real_time=True),
}


def kind(name: str) -> Kind:
    """A back end's capabilities; ValueError for a name that is none."""
    if name not in KINDS:
        raise ValueError(f"unknown back end {name!r} ({', '.join(KINDS)})")
    return KINDS[name]


def serves(tb: Testbed) -> Kind:
    """What a testbed config's own back end is (`[testbed] backend`): a model (sim), an
    emulator serving (emu), a lab (hw)."""
    return kind(tb.testbed.backend)


def default_backend(tb: Testbed) -> str:
    """The back end that checks a testbed's devices: a private emulator of a model's; the
    devices themselves where they serve (a lab's, or an emulator's, as a lab's)."""
    return "hw" if serves(tb).devices else "emu"


def lock_name(tb: Testbed) -> str:
    """What the testbed lock is named after: a lab's testbed by its name; an emulated one
    (an emu config) by its name and its emulator's broker, since two emulators of one
    testbed are two testbeds, and neither is the lab's."""
    if serves(tb).private_emulator:
        return f"{tb.name}@{tb.broker.url.removeprefix('mqtt://')}"
    return tb.name


def open_backend(name: str, tb: Testbed, grid: Grid, *, faults: list[FaultSpec] | None = None,
                 seed: int = 0, checker_mode: str = "record",
                 announce: Announce | None = None) -> Backend:
    """The ODDL network's back end: `sim` (models in process), `emu` or `hw` (devices
    through the drivers; `emu` is `oddl emulate`'s, `hw` a lab's). emu and hw tell the
    bus's watchers on their own connection; sim through `announce` if given."""
    if kind(name).devices:
        from oddl.drivers.lab import LabBackend

        return LabBackend(tb, grid, name, checker_mode, faults)
    from oddl.sim.backend import SimBackend

    return SimBackend(tb, grid, faults, seed, checker_mode, announce)


def open_model(spec: NetworkSpec, tb: Testbed, ranks: list[str],
               checker_mode: str = "record", announce: Announce | None = None) -> Backend:
    """A baseline network (electrical, fat-tree, SiP-Ring, TopoOpt): a model in every back
    end, since a lab has no such hardware beside its ODDL testbed."""
    from oddl.sim.backend import ModelBackend

    return ModelBackend(spec, tb, ranks, checker_mode, announce)


def allreduce_ns(spec: NetworkSpec, collective: str, servers: int, size_bytes: int,
                 line_rate_gbps: float) -> int:
    """One all-reduce of `size_bytes` per server on a network's flow model, alone on it:
    its time in ns (the training task's iteration time, `oddl optinc train --onn trained`)."""
    from oddl.controller.base.clock import Clock
    from oddl.controller.base.collectives import build
    from oddl.controller.stage2.workloads import CollectiveEngine
    from oddl.sim.clock import VirtualClockLoop
    from oddl.sim.networks.baselines import build_network

    loop = VirtualClockLoop()
    try:
        clock = Clock(loop)
        ranks = [f"h{i}" for i in range(servers)]
        engine: CollectiveEngine | None = None
        net = build_network(spec, clock, ranks, line_rate_gbps,
                            lambda f: engine.on_delivered(f) if engine else None)
        engine = CollectiveEngine(clock, build(collective, servers, size_bytes, 1, servers),
                                  ranks, net.submit)
        done = loop.create_future()
        engine.start_iteration(0, 0, done.set_result)
        return int(loop.run_until_complete(done))
    finally:
        loop.close()


def search_split(spec: NetworkSpec, base: Hybrid, collective: str, nodes: list[str],
                 line_rate_gbps: float, cols: int | None = None) -> SearchResult:
    """`oddl plan --search`: the best tensor x pipeline x data split of a Transformer job
    on a network's flow model (TopoOpt: with its topology; SiP-ML: within its degree)."""
    from oddl.sim.networks.search import search

    return search(spec, base, collective, nodes, line_rate_gbps, cols)


def open_announcer(tb: Testbed) -> BusAnnouncer:
    """The controller's notes on the testbed's bus from a thread and a connection of their
    own (`.announce`, `.close()`): for a sim run (a virtual-time loop does no network I/O)
    and for what `oddl accept` found."""
    from oddl.drivers.announce import BusAnnouncer

    return BusAnnouncer(tb)


def open_watch(tb: Testbed) -> MQTTBus:
    """`oddl dashboard`: a read-only connection to the testbed's bus, as the dashboard."""
    from oddl.controller.base.access import DASHBOARD
    from oddl.drivers.mqtt import bus_from_config

    return bus_from_config(tb.name, tb.broker, DASHBOARD, readonly=True)


def open_board(addr: str | None, node: str, nodes: list[str]) -> ONicDriver:
    """A board's register driver (acceptance checks, diagnostics): its .hwh held to the
    register map and its identity to the design version; raises why it cannot."""
    from oddl.drivers.lab import open_board as _open

    return _open(addr, node, nodes)


def recording(path: Path, header: dict[str, Any], key: bytes | None = None
              ) -> contextlib.AbstractContextManager[Recorder]:
    """The drivers write every exchange with the devices onto cassette `path`, while in
    it (drivers/cassette.py; the caller closes the Recorder it yields, with its result)."""
    from oddl.drivers import cassette

    return cassette.recording(path, header, key)


def playing(path: Path, relaxed: bool, key: bytes | None = None
            ) -> contextlib.AbstractContextManager[Player]:
    """The drivers' devices served from cassette `path`, while in it (the Player it
    yields; ValueError naming the file if it cannot be played)."""
    from oddl.drivers import cassette

    return cassette.playing(path, relaxed, key)


def recorded(name: str, make: Callable[[], T]) -> T:
    """A value of this host's (a clock, a process id) as a cassette has it: made and
    recorded, or, replaying, the recorded one (drivers/cassette.py)."""
    from oddl.drivers import cassette

    return cassette.value(name, make)


def replaying() -> bool:
    """Whether the devices are a cassette's: no emulator is started, no device reached."""
    from oddl.drivers import cassette

    return isinstance(cassette.active, cassette.Player)


def open_soc(spec: str, photonics: QickPhotonics | None = None, seed: int = 0,
             dacs: int = 2, dead_modulators: frozenset[int] = frozenset(),
             datapath: QickDatapath | None = None, board_model: str = "python",
             hmac_key: bytes | None = None) -> tuple[Any, Any]:
    """A QICK board for Lightning: 'emulated' (the photonic multiplier model in process,
    from the testbed's [qick.photonics], with `dacs` generators: 4 are two modulator
    pairs, for multiply-accumulate; its fabric holds Lightning's datapath from
    [qick.datapath], its count-action engine the O-NIC's, `board_model` the Python model
    or the gateware), 'local' or pyro://HOST:PORT/NAME (the driver; `hmac_key`: its
    messages signed, as a keyed server demands)."""
    from oddl.drivers import soc_tape

    def open_() -> tuple[Any, Any]:
        if spec == "emulated":
            from oddl.sim.devices.lightning_datapath import DatapathSpec
            from oddl.sim.devices.qick_soc import EmulatedQickSoc, Photonics

            ph = Photonics.from_config(photonics or QickPhotonics(), [True] * dacs, seed,
                                       dead_modulators)
            dp = datapath or QickDatapath()
            soc = EmulatedQickSoc(ph, n_dacs=dacs, engine=lambda: open_engine(board_model),
                                  datapath=DatapathSpec(dp.stream_gsps, dp.latency_ns))
            return soc, soc
        from oddl.drivers.lightning import open_soc as _open

        return _open(spec, hmac_key)

    return soc_tape.opened(open_)  # (on a cassette, when one records or plays)


def open_core(soc: Any, soccfg: Any, adc_channel: int = 0) -> PhotonicCore:
    """A QICK board's modulator pairs as Lightning's multiply-accumulate unit (the driver)."""
    from oddl.drivers.lightning_mac import PhotonicCore

    return PhotonicCore(soc, soccfg, adc_channel=adc_channel)


def rtl_lockstep(nodes: int, flows: int, walks: int, every: bool, forge: bool,
                 faults: frozenset[str], simulator: str = "amaranth", design: str = "top"
                 ) -> dict[str, Any]:
    """The RTL control unit held to the Python one on the model checker's worlds
    (sim/devices/rtl_lockstep.py), through `design`'s ports (the whole O-NIC, or the unit
    alone): every path of the small configurations and/or random walks of the larger
    ones; `oddl verify rtl`'s verdict."""
    import dataclasses
    import logging
    import time

    from oddl.sim.devices import rtl_lockstep as L

    t0 = time.perf_counter()
    out: dict[str, Any] = {"design": design}
    quiet = logging.getLogger("oddl.controller.stage2")  # strays, by the hundred: expected
    level, quiet.level = quiet.level, logging.CRITICAL
    try:
        if every:
            out["every_path"] = dataclasses.asdict(L.every_path(min(nodes, 3), flows, faults,
                                                                simulator, design))
        if walks:
            out["walks"] = dataclasses.asdict(L.walks(nodes, flows, walks, forge, faults,
                                                      simulator=simulator, design=design))
    finally:
        quiet.setLevel(level)
    out["differences"] = sum(len(v["differences"]) for v in out.values()
                             if isinstance(v, dict))
    out["seconds"] = round(time.perf_counter() - t0, 1)
    return out


def open_engine(board_model: str = "python") -> tuple[ONicDriver, Any]:
    """An O-NIC's count-action engine, in emulation (the emulated QICK board's datapath
    holds one): (its register driver, the board whose `set_dac_valid` are the DAC valid
    lines)."""
    from oddl.sim.backend import lone_board

    return lone_board(board_model)


def open_inference(net: Any, core: PhotonicCore) -> Inference:
    """Lightning's inference of a trained network (studies/lenet.py) on a photonic core:
    paced by its count-action DAG in the board's datapath, or by the host on a board whose
    firmware has none."""
    from oddl.studies.lenet import Inference, Quantised

    return Inference(Quantised.of(net), core)


def node_program(tb: Testbed, node: str, bitfile: Path | None = None,
                 irq_pin: str | None = None) -> NodeProgram:
    """`oddl node`: this node's program on its board as the testbed config addresses it
    (`local`: pynq MMIO and pynq's `Interrupt` on `irq_pin`; grpc://: PYNQ.remote, the
    interrupt line polled), logged in to the config's broker as the node itself."""
    from oddl.drivers.irq import PolledLine, PynqLine
    from oddl.drivers.lab import open_board as _open
    from oddl.drivers.lab import overlay_of, ports_of
    from oddl.drivers.mqtt import bus_from_config
    from oddl.drivers.onic import DriverONic
    from oddl.drivers.onic_unit import unit_for

    grid = Grid.from_testbed(tb)
    addr = {n.id: n.board for n in tb.nodes}
    if node not in addr:
        raise ValueError(f"{tb.name} has no node {node!r} (it has {', '.join(addr)})")
    drv = _open(addr[node], node, list(grid.nodes), bitfile or overlay_of(tb))
    line: Any = PynqLine(irq_pin) if addr[node] == "local" and irq_pin else PolledLine(
        drv.mmio, node)
    # its stage 2: the board's own control unit if its overlay's IP is onic_top (the node
    # then only loads routes, hands flows over and reports), else the Python unit here
    return NodeProgram(
        tb.name, node, DriverONic(drv, ports_of(grid, node)), line,
        bus_from_config(tb.name, tb.broker, node), heartbeat_s=tb.monitor.heartbeat_ms / 1e3,
        unit=unit_for(drv.design))


def profiles_on_a_link(jobs: list[tuple[str, str, int]], link_gbps: float,
                       overlap: bool = False) -> list[Profile]:
    """`oddl compat --job MODEL[:RANKS]`: each job's demand on a link of `link_gbps`,
    measured from its simulated iteration (the flow-level model: sim/networks/profile.py;
    `overlap`: DDP's buckets while backward runs)."""
    from oddl.sim.networks.profile import on_a_link

    return on_a_link(jobs, link_gbps, overlap=overlap)


def link_profiles(spec: NetworkSpec, nodes: list[str], line_rate_gbps: float
                  ) -> Callable[..., dict[object, Profile]]:
    """CASSINI in the multi-job runner: a function measuring a job's demand on each link of
    the network `spec` it uses, alone (sim/networks/profile.py), for `Admission`'s profiler."""
    import functools

    from oddl.sim.networks.profile import link_profiles as measure

    return functools.partial(measure, spec, nodes, line_rate_gbps)
