"""Boards: reachable, the expected design and bitstream, registers that behave as mapped."""

from __future__ import annotations

import contextlib
import hashlib
import time

import pytest
from oddl.acceptance.plugin import Absent, Bench, Unreachable
from oddl.controller.base.devices import DeviceRefused
from oddl.fpga import regmap as R
from oddl.fpga.overlay import BITFILE

pytestmark = pytest.mark.acceptance

PATTERNS = (0x00000000, 0xFFFFFFFF, 0xA5A5A5A5, 0x5A5A5A5A)


def test_board_reachable(bench: Bench, node: str, figure) -> None:
    t = time.perf_counter()
    try:
        bench.connect(node)
    except Absent as e:
        pytest.skip(str(e))
    except Unreachable as e:
        pytest.fail(str(e), pytrace=False)
    figure("connect and first read", round(1e3 * (time.perf_counter() - t), 1), "ms")


def test_identity(bench: Bench, node: str, figure) -> None:
    drv = bench.board(node)
    ident = drv.identity()
    spec = bench.spec
    want_hash = spec.bitstream_sha256 or hashlib.sha256(BITFILE.read_bytes()).hexdigest()
    major, minor = (int(x) for x in spec.design_version.split("."))
    v = ident["design_version"]
    index = list(bench.grid.nodes).index(node)
    figure("magic", f"0x{ident['magic']:08X}", spec=f"0x{R.MAGIC:08X}")
    figure("design version", f"{v >> 16}.{v & 0xFFFF}", spec=spec.design_version)
    figure("bitstream sha256", ident["bitstream_hash"][:16], spec=want_hash[:16])
    figure("node id", ident["node_id"], spec=str(index))
    bad = []
    if ident["magic"] != R.MAGIC:
        bad.append(f"magic 0x{ident['magic']:08X} is not an oddl O-NIC")
    if v != (major << 16 | minor):
        bad.append(f"design version {v >> 16}.{v & 0xFFFF}, expected {spec.design_version}")
    if ident["bitstream_hash"] != want_hash:
        bad.append(f"bitstream sha256 {ident['bitstream_hash']} != expected {want_hash}")
    if ident["node_id"] != index:
        bad.append(f"NODE_ID {ident['node_id']}, expected {index} (board on the wrong node?)")
    if bad:
        pytest.fail(f"{node}: " + "; ".join(bad), pytrace=False)


def _rw_registers() -> list[R.Reg]:
    """RW registers whose write has no side effect: transfer descriptors and enables."""
    keep = ("_DST", "_BYTES", "_FLOW", "_HDR", "IRQ_ENABLE", "NODE_ID")
    return [r for r in R.BY_NAME.values() if r.access == "RW" and r.name.startswith(
        ("TX", "IRQ", "NODE")) and any(k in r.name for k in keep)]


def _ro_registers() -> list[R.Reg]:
    skip = ("TS_", "_STATUS", "_CUR_FLOW")  # free-running or live: they change by themselves
    return [r for r in R.BY_NAME.values() if r.access == "RO" and not r.name.startswith("CA")
            and not any(k in r.name for k in skip)]


def test_register_readback(bench: Bench, node: str, figure) -> None:
    """Write/read patterns on RW registers (restored after); RO registers keep their value
    whatever is written (refused with an error, or ignored as an AXI slave may)."""
    m = bench.board(node).mmio
    bad: list[str] = []
    rw = _rw_registers()
    for reg in rw:
        saved = m.read(reg.offset)
        for pat in PATTERNS:
            m.write(reg.offset, pat)
            got = m.read(reg.offset)
            if got != pat:
                bad.append(f"{reg.name} (0x{reg.offset:03X}) wrote 0x{pat:08X} read 0x{got:08X}")
                break
        m.write(reg.offset, saved)
    ro = _ro_registers()
    for reg in ro:
        before = m.read(reg.offset)
        # refused: as it should be (over PYNQ.remote a RuntimeError, over a serial
        # bridge its SLVERR)
        with contextlib.suppress(RuntimeError, DeviceRefused):
            m.write(reg.offset, ~before & 0xFFFFFFFF)
        after = m.read(reg.offset)
        if after != before:
            bad.append(f"read-only {reg.name} (0x{reg.offset:03X}) changed 0x{before:08X} -> "
                       f"0x{after:08X} on a write")
    figure("RW registers holding patterns", f"{len(rw) - sum('wrote' in b for b in bad)}"
           f"/{len(rw)}", spec="all")
    figure("RO registers unchanged by writes", f"{len(ro) - sum('read-only' in b for b in bad)}"
           f"/{len(ro)}", spec="all")
    if bad:
        pytest.fail(f"{node}: " + "; ".join(bad), pytrace=False)
