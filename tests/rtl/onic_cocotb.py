"""The register-level suite of onic_ctrl's Verilog, under an HDL simulator with cocotb and
cocotbext-axi's AXI-Lite master (run by tests/test_gateware.py)."""

from __future__ import annotations

from typing import Any

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge
from cocotbext.axi import AxiLiteBus, AxiLiteMaster
from cocotbext.axi.constants import AxiResp
from oddl.fpga import regmap as R

OFF = {n: r.offset for n, r in R.BY_NAME.items()}


async def _bring_up(dut: Any) -> AxiLiteMaster:
    cocotb.start_soon(Clock(dut.clk, 4, unit="ns").start())
    for name, v in (("node_id", 2), ("n_nodes", 4), ("n_channels", 8), ("ports_present", 3),
                    ("ts_ns", 1000), ("dac_valid", 0), ("h_tune_locked", 0), ("h_tx_done", 0),
                    ("h_rx_done", 0), ("v_tune_locked", 0), ("v_tx_done", 0), ("v_rx_done", 0),
                    ("h_rx_busy", 0), ("v_rx_busy", 0), ("bitstream_hash", 0xAB << 248),
                    ("s_axi_awvalid", 0), ("s_axi_wvalid", 0), ("s_axi_arvalid", 0),
                    ("s_axi_bready", 0), ("s_axi_rready", 0), ("s_axi_awaddr", 0),
                    ("s_axi_araddr", 0), ("s_axi_wdata", 0), ("s_axi_wstrb", 0)):
        getattr(dut, name).value = v
    dut.rst.value = 1
    axi = AxiLiteMaster(AxiLiteBus.from_prefix(dut, "s_axi"), dut.clk, dut.rst)
    await ClockCycles(dut.clk, 3)
    dut.rst.value = 0
    await ClockCycles(dut.clk, 1)
    return axi


async def _read(axi: AxiLiteMaster, name: str) -> int:
    return int.from_bytes((await axi.read(OFF[name], 4)).data, "little")


async def _write(axi: AxiLiteMaster, off: int, value: int) -> AxiResp:
    return (await axi.write(off, value.to_bytes(4, "little"))).resp


@cocotb.test()
async def identity_and_access_kinds(dut: Any) -> None:
    axi = await _bring_up(dut)
    assert await _read(axi, "MAGIC") == R.MAGIC
    assert await _read(axi, "DESIGN_VERSION") == R.DESIGN_VERSION
    assert await _read(axi, "CAPS") == R.BY_NAME["CAPS"].reset
    assert await _read(axi, "NODE_ID") == 2  # the strap, until written
    assert await _read(axi, "BITSTREAM_HASH0") == 0xAB000000
    assert await _write(axi, OFF["MAGIC"], 1) == AxiResp.SLVERR  # RO refuses
    assert await _write(axi, 0x0F0, 1) == AxiResp.SLVERR  # a hole refuses
    assert await _write(axi, OFF["IRQ_ENABLE"], 0xA5) == AxiResp.OKAY
    assert await _read(axi, "IRQ_ENABLE") == 0xA5
    assert await _read(axi, "TXH_START") == 0  # SC reads 0
    assert await _read(axi, "RXH_CUR_FLOW") == 0xFFFFFFFF  # idle
    await _write(axi, R.ROUTE_BASE + 8 * 5 + 4, 0x8100_0203)
    assert int.from_bytes((await axi.read(R.ROUTE_BASE + 8 * 5 + 4, 4)).data,
                          "little") == 0x8100_0203


@cocotb.test()
async def tune_lock_start_done_and_the_interrupt(dut: Any) -> None:
    axi = await _bring_up(dut)
    await _write(axi, OFF["IRQ_ENABLE"], 1 << R.IRQ_BITS["TX_DONE_H"])
    await _write(axi, OFF["TXH_CHANNEL"], 9)  # beyond n_channels
    await _write(axi, OFF["TXH_CMD"], 1)
    assert await _read(axi, "ERROR") == 1 << R.ERROR_BITS["BAD_CHANNEL"]
    await _write(axi, OFF["ERROR"], 0xFF)  # W1C
    assert await _read(axi, "ERROR") == 0
    await _write(axi, OFF["TXH_CHANNEL"], 3)
    for k, v in (("DST", 1), ("BYTES", 1500), ("FLOW", 77), ("HDR1", 2)):
        await _write(axi, OFF[f"TXH_{k}"], v)
    await _write(axi, OFF["TXH_CMD"], 3)  # TUNE | THEN_START
    while not dut.h_tune_valid.value:
        await RisingEdge(dut.clk)
    assert int(dut.h_tune_channel.value) == 3
    assert await _read(axi, "TXH_STATUS") & 1  # tuning
    dut.ts_ns.value = 1011
    dut.h_tune_locked.value = 1
    await RisingEdge(dut.clk)
    dut.h_tune_locked.value = 0
    while not dut.h_tx_valid.value:  # the start the lock released
        await RisingEdge(dut.clk)
    assert (int(dut.h_tx_dst.value), int(dut.h_tx_bytes.value), int(dut.h_tx_flow.value)) \
        == (1, 1500, 77)
    assert await _read(axi, "TXH_TUNE_NS") == 11
    assert await _read(axi, "TXH_STATUS") == 0b110 | 3 << 8  # sending, tuned, channel 3
    assert not dut.irq.value
    dut.h_tx_done.value = 1
    await RisingEdge(dut.clk)
    dut.h_tx_done.value = 0
    await ClockCycles(dut.clk, 4)
    assert dut.irq.value
    assert await _read(axi, "TXH_DONE_COUNT") == 1
    assert await _read(axi, "TXH_SENT_LO") == 1500
    status = await _read(axi, "IRQ_STATUS")
    await _write(axi, OFF["IRQ_STATUS"], status)
    await ClockCycles(dut.clk, 1)
    assert not dut.irq.value


@cocotb.test()
async def a_count_action_module_fires_and_interrupts(dut: Any) -> None:
    axi = await _bring_up(dut)
    # module 0: count DAC[1..2].valid to 2, then stream DAC 1 and interrupt
    await _write(axi, R.ca(0, "SRC0"), 4 | 1 << 8)
    await _write(axi, R.ca(0, "SRC1"), 4 | 2 << 8)
    await _write(axi, R.ca(0, "TARGET"), 2)
    await _write(axi, R.ca(0, "ACT0"), 3 | 1 << 8)
    await _write(axi, R.ca(0, "ACT1"), 4)
    await _write(axi, R.ca(0, "CTRL"), 1)
    assert await _write(axi, R.ca(0, "COUNT"), 5) == AxiResp.SLVERR
    streamed = []
    for dac in (1, 2):
        dut.dac_index.value = dac
        dut.dac_valid.value = 1
        await RisingEdge(dut.clk)
        dut.dac_valid.value = 0
        for _ in range(30):
            await RisingEdge(dut.clk)
            if dut.stream_valid.value:
                streamed.append(int(dut.stream_dac.value))
    assert streamed == [1]
    assert dut.irq.value  # module bits interrupt whatever IRQ_ENABLE says
    assert await _read(axi, "IRQ_STATUS") == (1 << R.IRQ_MODULE_SHIFT
                                               | 1 << R.IRQ_BITS["CA_FIRED"])
    assert await _read(axi, "CA0_STATUS") == 0b10 | 1 << 8  # disarmed, fired once
