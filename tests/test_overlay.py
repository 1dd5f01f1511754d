"""Overlay loading through unmodified pynq.Overlay: metadata checked against the map."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pynq
import pytest
from oddl.drivers.onic import IdentityMismatch, open_onic
from oddl.fpga import regmap as R
from oddl.fpga.overlay import (
    BITFILE,
    PLACEHOLDER_MAGIC,
    OverlayMismatch,
    hwh_text,
    placeholder_bit,
)

from tests.helpers import Bench


def test_shipped_overlay_is_current_and_marked_placeholder() -> None:
    from oddl.fpga import regmap as R
    from oddl.fpga.overlay import TOP_BITFILE

    assert BITFILE.with_suffix(".hwh").read_text() == hwh_text()
    assert BITFILE.read_bytes() == placeholder_bit()
    # an onic_top's (the control unit in the datapath): the same placeholder, its IP named
    assert TOP_BITFILE.with_suffix(".hwh").read_text() == hwh_text(
        ip_name=R.TOP_IP_NAME, version="0.3")
    assert TOP_BITFILE.read_bytes() == placeholder_bit()
    from pynq.pl_server.embedded_device import parse_bit_header

    head = parse_bit_header(BITFILE.read_bytes())  # pynq reads it as a .bit...
    assert head["design"] == "oddl_onic_PLACEHOLDER"  # ...and it says what it is
    assert head["data"].startswith(PLACEHOLDER_MAGIC)


def test_open_onic_loads_checks_and_drives() -> None:
    b = Bench()
    drv = open_onic(BITFILE, b.devs[0], "n0-0", b.grid.nodes,
                    bitstream_hash=hashlib.sha256(BITFILE.read_bytes()).hexdigest())
    assert drv.identity()["magic"] == R.MAGIC
    assert abs(pynq.Clocks.fclk0_mhz - 250) < 0.01  # programmed from the .hwh by pynq
    drv.tune("H", 1)
    b.run_ns(11)
    assert drv.tx_status("H")["channel"] == 1


def _pair(tmp_path: Path, **kw: object) -> Path:
    bit = tmp_path / "o.bit"
    bit.write_bytes(placeholder_bit())
    bit.with_suffix(".hwh").write_text(hwh_text(**kw))  # type: ignore[arg-type]
    return bit


@pytest.mark.parametrize("kw,msg", [
    ({"base": R.IP_BASE + 0x10000},
     "onic_ctrl: base address 0xA0010000, the register map expects 0xA0000000"),
    ({"addr_range": 0x1000}, "address range 0x1000, the register map expects 0x10000"),
    ({"ip_name": "onic_ctl"}, "no IP named 'onic_ctrl' or 'onic_top' (the .hwh has: "
     "onic_ctl"),
    ({"version": "0.7"}, "IP type 'oddl.org:oddl:onic_ctrl:0.7', expected"),
])
def test_mismatched_hwh_is_a_clear_error(tmp_path: Path, kw: dict, msg: str) -> None:
    with pytest.raises(OverlayMismatch) as ei:
        open_onic(_pair(tmp_path, **kw), Bench().devs[0])
    assert msg in str(ei.value)
    assert str(tmp_path / "o.hwh") in str(ei.value)


def test_board_with_wrong_design_version(tmp_path: Path) -> None:
    b = Bench(design_version=(1 << 16) | 2)
    with pytest.raises(IdentityMismatch, match=r"design version 1\.2 .* expects 0\.1"):
        open_onic(BITFILE, b.devs[0], "n0-0")


def test_wrong_bitstream_hash(tmp_path: Path) -> None:
    with pytest.raises(IdentityMismatch, match="bitstream hash"):
        open_onic(BITFILE, Bench().devs[0], bitstream_hash="ab" * 32)
