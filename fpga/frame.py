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


# a flow as a host hands it to the control unit and the unit hands a delivered one back:
# each field at the frame's width (nodes as indices), least significant first
FLOW_FIELDS = (("id", "flow"), ("src", "src"), ("dst", "dst"), ("nbytes", "nbytes"),
               ("iteration", "iteration"), ("step", "step"), ("hop", "hop"),
               ("t_submit", "t_submit"))


def flow_widths(frame: FrameFormat) -> list[tuple[str, int]]:
    """The flow's fields and their widths, in order."""
    return [(name, frame.width(field)) for name, field in FLOW_FIELDS]


def flow_word(frame: FrameFormat, *values: int) -> int:
    """A flow's fields (in FLOW_FIELDS' order) as one word."""
    word, at = 0, 0
    for (name, width), v in zip(flow_widths(frame), values, strict=True):
        if not 0 <= v < 1 << width:
            raise ValueError(f"a flow's {name} of {v} does not fit its {width} bits")
        word |= v << at
        at += width
    return word


def flow_fields(frame: FrameFormat, word: int) -> dict[str, int]:
    out, at = {}, 0
    for name, width in flow_widths(frame):
        out[name] = word >> at & (1 << width) - 1
        at += width
    return out
