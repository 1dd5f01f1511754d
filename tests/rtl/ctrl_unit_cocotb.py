"""The control unit's Verilog under an HDL simulator with cocotb (run by
tests/test_control_unit_rtl.py): frames in the wire's layout in and out of its streams, a
flow scheduled end to end on each side (tests/test_control_unit_rtl.py builds it with
CU_BOUNDS below)."""

from __future__ import annotations

from typing import Any

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, ReadOnly, RisingEdge
from oddl.controller.base.messages import ControlMessage, Grant, Release, Request
from oddl.controller.stage2.wire import FRAME, decode_frame, encode_frame
from oddl.fpga.frame import flow_word

NODES = [f"n{i}" for i in range(16)]
INDEX = {n: i for i, n in enumerate(NODES)}
PORTS = ("H", "V")
TIMING = {"tuning_ns": 50, "propagation_ns": 5, "request_timeout_ns": 1000,
          "release_timeout_ns": 1000, "lease_ns": 600, "max_retries": 3}
ME = 1  # this unit is n1


async def _bring_up(dut: Any) -> None:
    cocotb.start_soon(Clock(dut.clk, 4, unit="ns").start())
    for name, v in (("node_id", ME), ("tag", 0), ("halt", 0), ("timers_en", 0b111111),
                    ("ts_ns", 1000), ("route_we", 0), ("submit_valid", 0), ("rx_tvalid", 0),
                    ("rx_tlast", 1), ("tx_tready", 1), ("tx_done", 0), ("rx_done", 0),
                    ("rx_done_flow", 0), ("rx_done_bytes", 0), ("rx_receiving", 0),
                    *TIMING.items()):
        getattr(dut, name).value = v
    dut.rst.value = 1
    await ClockCycles(dut.clk, 3)
    dut.rst.value = 0
    await RisingEdge(dut.clk)
    while dut.busy.value:  # out of reset, the unit clears its route table
        await RisingEdge(dut.clk)
    # a route: to n2 on port V, channel 7, directly
    dut.route_we.value, dut.route_dst.value, dut.route_valid.value = 1, 2, 1
    dut.route_port.value, dut.route_channel.value, dut.route_next.value = 1, 7, 2
    await RisingEdge(dut.clk)
    dut.route_we.value = 0


async def _handshake(dut: Any, prefix: str, data: str, value: int) -> None:
    """`value` on `data`, held with `{prefix}valid` until `{prefix}ready` takes it."""
    getattr(dut, data).value = value
    getattr(dut, f"{prefix}valid").value = 1
    while True:
        await RisingEdge(dut.clk)
        if getattr(dut, f"{prefix}ready").value:
            break
    getattr(dut, f"{prefix}valid").value = 0


async def _frame_in(dut: Any, m: ControlMessage) -> None:
    await _handshake(dut, "rx_t", "rx_tdata", encode_frame(m, INDEX, PORTS))


async def _frame_out(dut: Any, within: int = 200) -> ControlMessage:
    for _ in range(within):
        await RisingEdge(dut.clk)
        await ReadOnly()
        if dut.tx_tvalid.value:
            assert dut.tx_tlast.value == 1
            word = int(dut.tx_tdata.value)
            m = decode_frame(word, NODES, PORTS)
            assert int(dut.tx_tdest.value) == INDEX[m.dst]
            return m
    raise AssertionError(f"no frame within {within} cycles")


async def _strobe(dut: Any, name: str, within: int = 200) -> int:
    for n in range(within):
        await RisingEdge(dut.clk)
        await ReadOnly()
        if getattr(dut, name).value:
            return n
    raise AssertionError(f"no {name} within {within} cycles")


@cocotb.test()
async def a_request_is_granted_received_and_released(dut: Any) -> None:
    await _bring_up(dut)
    await _frame_in(dut, Request(7, 0, "n0", "n1", "H", 3, 1500, "n0", "n1"))
    g = await _frame_out(dut)
    assert g == Grant(7, 0, "n1", "n0", "H", 3, 1000 + TIMING["lease_ns"]), g
    await RisingEdge(dut.clk)
    dut.rx_done_flow.value, dut.rx_done_bytes.value = 7, 1500  # port H: the low words
    dut.rx_done.value = 0b01
    await RisingEdge(dut.clk)
    dut.rx_done.value = 0
    await _strobe(dut, "deliver_valid")  # n1 is the flow's final node
    await RisingEdge(dut.clk)
    await _frame_in(dut, Release(7, 0, "n0", "n1", "H"))
    await ClockCycles(dut.clk, 20)
    assert int(dut.granted_ok.value) == 0  # free for the next sender


@cocotb.test()
async def a_flow_is_requested_tuned_sent_and_released(dut: Any) -> None:
    await _bring_up(dut)
    # the host hands over flow 9, n1 -> n2, 4000 B
    await _handshake(dut, "submit_", "submit_flow",
                     flow_word(FRAME, 9, ME, 2, 4000, 0, 0, 0, 0))
    q = await _frame_out(dut)
    assert isinstance(q, Request) and (q.flow, q.dst, q.port, q.channel, q.nbytes) == \
        (9, "n2", "V", 7, 4000), q
    await RisingEdge(dut.clk)
    await _frame_in(dut, Grant(9, 0, "n2", "n1", "V", 7, 5000))
    await _strobe(dut, "start_valid")
    assert (int(dut.start_port.value), int(dut.start_tune.value),
            int(dut.start_channel.value)) == (1, 1, 7)  # never tuned: tune, then send
    await RisingEdge(dut.clk)
    dut.tx_done.value = 0b10
    await RisingEdge(dut.clk)
    dut.tx_done.value = 0
    r = await _frame_out(dut)
    assert r == Release(9, 0, "n1", "n2", "V"), r
