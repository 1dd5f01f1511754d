"""The shape of a stage-2 control frame as the gateware sees it: one beat of the 100 GbE
MAC's AXI-Stream, a version and a type code, then each message's fields at fixed offsets.

This module only holds the shape. What goes in it (which messages, which fields, in which
order) is decided once, by controller/stage2/wire.py from the message structs, which builds a
`FrameFormat` and hands it to the RTL (fpga/gateware/control_unit.py): the fpga layer sits
below the control plane and imports none of it.
"""

from __future__ import annotations

from dataclasses import dataclass

BEAT_BITS = 512  # the CMAC's AXI-Stream data width: a control frame is one beat


@dataclass(frozen=True)
class FrameFormat:
    version: int
    type_bits: tuple[int, int]  # (offset, width) of the type code; the version is at 0
    codes: dict[str, int]  # message kind ("request", ...) -> type code
    fields: dict[str, dict[str, tuple[int, int]]]  # kind -> field -> (offset, width)
    tag_shift: int  # a flow id's job tag starts at this bit (controller/stage2/invariants.py)
    no_node: int  # the node index that stands for "" (no node)

    def width(self, name: str) -> int:
        """A field's width, the same in every message that has it."""
        widths = {f[name][1] for f in self.fields.values() if name in f}
        assert len(widths) == 1, (name, widths)
        return widths.pop()

    def common(self, name: str) -> tuple[int, int]:
        """A field every message has, at one offset (flow, hop, src, dst, port)."""
        places = {f[name] for f in self.fields.values()}
        assert len(places) == 1, (name, places)
        return places.pop()
