"""Device models behave like the devices: tuning time, refusals, collisions, line rate."""

from __future__ import annotations

import pytest
from oddl.controller.base.clock import Clock
from oddl.controller.base.devices import DeviceRefused
from oddl.controller.base.messages import Flow, Grant
from oddl.controller.base.topology import Grid
from oddl.controller.stage2.invariants import InvariantViolation
from oddl.sim import backend as sim_backend
from oddl.sim.clock import VirtualClockLoop
from oddl.sim.devices.wss import WSSModel

from tests.helpers import make_testbed


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, int, object]] = []
        self.clock: Clock | None = None

    def on_tuned(self, port: str, channel: int) -> None:
        assert self.clock
        self.events.append(("tuned", self.clock.now_ns(), channel))

    def on_tx_done(self, port: str, flow: Flow) -> None:
        assert self.clock
        self.events.append(("tx_done", self.clock.now_ns(), flow.id))

    def on_rx_done(self, port: str, flow: Flow) -> None:
        assert self.clock
        self.events.append(("rx_done", self.clock.now_ns(), flow.id))


def _setup(tuning_ns: float = 10.5) -> tuple[VirtualClockLoop, Clock, object, dict[str, Recorder]]:
    tb = make_testbed(1, 4, wavelengths=3, tuning_time_ns=tuning_ns, guard_time_ns=2,
                      propagation_ns=50)
    grid = Grid.from_testbed(tb)
    loop = VirtualClockLoop()
    clock = Clock(loop)
    st = sim_backend.build(tb, grid, clock)
    st.wss["wss-row0"].set_table([[1, 2, 3], [2, 3, 0], [3, 0, 1], [0, 1, 2]])
    recs = {}
    for n in grid.nodes:  # drive the fabric model itself: these are physics tests
        r = Recorder()
        r.clock = clock
        st.fabric.rx_handlers[n] = r.on_rx_done
        st.fabric.tx_handlers[n] = r.on_tx_done
        st.fabric.tuned_handlers[n] = r.on_tuned
        recs[n] = r
    return loop, clock, st, recs


class _Port:
    """One node's optical side of the fabric, called the way a board calls it."""

    def __init__(self, fabric: object, node: str) -> None:
        self.fabric, self.node = fabric, node

    def tune(self, port: str, ch: int) -> None:
        self.fabric.tune(self.node, port, ch)

    def send(self, port: str, flow: Flow) -> None:
        self.fabric.send(self.node, port, flow)


def _grant(st: object, node: str, flow: Flow, ch: int) -> None:
    st.checker.on_message(node, Grant(flow.id, flow.hop, flow.dst, node, "H", ch, 10**12))


def test_tuning_takes_the_configured_time_and_refuses_transfers_meanwhile() -> None:
    loop, clock, st, recs = _setup(tuning_ns=10.5)
    dev = _Port(st.fabric, "n0-0")
    f = Flow(1, "n0-0", "n0-1", 1250, t_submit=0)
    st.checker.flow_started(f)
    _grant(st, "n0-0", f, 0)
    st.checker.mode = "record"
    dev.tune("H", 0)
    outcome: list[str] = []

    def try_send() -> None:
        try:
            dev.send("H", f)
            outcome.append("sent")
        except DeviceRefused as e:
            outcome.append(f"refused at {clock.now_ns()} ns: {e}")

    clock.call_at_ns(5, try_send)  # mid-tune
    clock.call_at_ns(11, try_send)  # tuned: allowed
    loop.run_until_complete(_sleep(loop, 1e-6))
    assert outcome == ["refused at 5 ns: n0-0/H: transfer refused while tuning", "sent"]
    assert recs["n0-0"].events[0] == ("tuned", 11, 0)  # 10.5 ns rounds up to the next ns
    assert any("while tuning" in v for v in st.checker.violations)


async def _sleep(loop: VirtualClockLoop, s: float) -> None:
    import asyncio

    await asyncio.sleep(s)


def test_transfer_takes_bytes_over_line_rate_plus_propagation() -> None:
    loop, clock, st, recs = _setup()
    dev = _Port(st.fabric, "n0-0")
    f = Flow(1, "n0-0", "n0-2", 125_000, t_submit=0)  # 1 Mbit at 100 Gb/s = 10 us
    st.checker.flow_started(f)
    _grant(st, "n0-0", f, 1)
    dev.tune("H", 1)
    clock.call_at_ns(11, dev.send, "H", f)
    loop.run_until_complete(_sleep(loop, 1e-4))
    assert ("tx_done", 11 + 10_000 + 2, 1) in recs["n0-0"].events  # + guard time
    assert recs["n0-2"].events == [("rx_done", 11 + 10_000 + 50, 1)]
    assert st.checker.delivered == {1}


def test_sending_without_grant_or_on_wrong_channel_is_a_violation() -> None:
    loop, _clock, st, _recs = _setup()
    dev = _Port(st.fabric, "n0-0")
    f = Flow(1, "n0-0", "n0-1", 100)
    st.checker.flow_started(f)
    dev.tune("H", 0)
    loop.run_until_complete(_sleep(loop, 1e-7))
    with pytest.raises(InvariantViolation, match="without a GRANT"):
        dev.send("H", f)
    _grant(st, "n0-0", f, 2)
    with pytest.raises(InvariantViolation, match="on channel 0, granted channel 2"):
        dev.send("H", f)


def test_two_transmitters_into_one_receiver_collide() -> None:
    loop, _clock, st, _recs = _setup()
    a = Flow(1, "n0-0", "n0-1", 10_000)
    b = Flow(2, "n0-3", "n0-1", 10_000)
    for f, node, ch in ((a, "n0-0", 0), (b, "n0-3", 1)):
        st.checker.flow_started(f)
        _grant(st, node, f, ch)
        _Port(st.fabric, node).tune("H", ch)
    loop.run_until_complete(_sleep(loop, 1e-7))
    _Port(st.fabric, "n0-0").send("H", a)
    with pytest.raises(InvariantViolation, match=r"receiver gets .* while receiving"):
        _Port(st.fabric, "n0-3").send("H", b)


def test_wss_refuses_colliding_table_and_keeps_the_old_one() -> None:
    w = WSSModel("w", 4, 2)
    good = [[1, None], [2, None], [3, None], [0, None]]
    w.set_table(good)
    with pytest.raises(DeviceRefused, match=r"inputs 0 and 2 both reach \(out 1, channel 0\)"):
        w.set_table([[1, None], [2, None], [1, None], [0, None]])
    assert w.get_table() == good
    with pytest.raises(DeviceRefused, match="channel 2 not available"):
        w.set_table([[1, None, 2], [2, None, 3], [3, None, 0], [0, None, 1]])
    with pytest.raises(DeviceRefused, match="no output port 9"):
        w.set_table([[9, None], [2, None], [3, None], [0, None]])


def test_tune_while_sending_is_refused() -> None:
    loop, _clock, st, _recs = _setup()
    f = Flow(1, "n0-0", "n0-1", 100_000)
    st.checker.flow_started(f)
    _grant(st, "n0-0", f, 0)
    _Port(st.fabric, "n0-0").tune("H", 0)
    loop.run_until_complete(_sleep(loop, 1e-7))
    _Port(st.fabric, "n0-0").send("H", f)
    with pytest.raises(DeviceRefused, match="cannot tune while sending"):
        _Port(st.fabric, "n0-0").tune("H", 1)


def test_light_landing_on_a_node_that_did_not_grant_it_is_a_misroute() -> None:
    loop, _, st, _ = _setup()
    f = Flow(1, "n0-0", "n0-1", 1000)
    st.checker.flow_started(f)
    # n0-2 granted it (the source meant n0-2), but channel 0 of the WSS goes to n0-1
    st.checker.on_message("n0-0", Grant(1, 0, "n0-2", "n0-0", "H", 0, 10**12))
    _Port(st.fabric, "n0-0").tune("H", 0)
    loop.run_until_complete(_sleep(loop, 1e-7))
    with pytest.raises(InvariantViolation, match="lands on n0-1 but n0-2 granted it"):
        _Port(st.fabric, "n0-0").send("H", f)
