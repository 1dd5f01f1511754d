"""The control bus's wire formats, both from the message structs (controller/base/messages.py):

- on MQTT (a node program's bus): versioned JSON envelopes (msgspec), never pickle,
      {"v": 1, "msg": {"type": "request", "flow": 7, ...}}
- on the O-NIC's own 100 GbE port (the control unit in gateware): one 512-bit frame, the
  version and a type code, then the message's fields in the struct's order at the widths of
  `FRAME_WIDTHS`, node and port names as indices. `FRAME` is that layout, which the RTL is
  generated from (fpga/gateware/control_unit.py); `encode_frame` / `decode_frame` are its
  Python side.

Anything else (not JSON, another version, an unknown type, a wrong field, a value wider
than its field) is rejected with a reason; the bus logs it and drops it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec
from oddl.controller.base.messages import (
    SCHEMA_VERSION,
    ControlMessage,
    Grant,
    Release,
    Request,
    Wait,
)
from oddl.controller.stage2.invariants import TAG_SHIFT
from oddl.fpga.frame import BEAT_BITS, FrameFormat


class BusDecodeError(ValueError):
    pass


class _Envelope(msgspec.Struct):
    v: int
    msg: msgspec.Raw


class _Outgoing(msgspec.Struct):
    v: int
    msg: ControlMessage


_enc = msgspec.json.Encoder()
_head = msgspec.json.Decoder(_Envelope)
_body: msgspec.json.Decoder[ControlMessage] = msgspec.json.Decoder(ControlMessage)


def encode(msg: ControlMessage) -> bytes:
    return _enc.encode(_Outgoing(SCHEMA_VERSION, msg))


MAX_BYTES = 2048  # a control message is ~300 bytes; anything bigger is not one


def decode(data: bytes) -> ControlMessage:
    if len(data) > MAX_BYTES:  # bounded before a byte is parsed (nesting, huge numbers)
        raise BusDecodeError(f"{len(data)} bytes is no control message (at most {MAX_BYTES})")
    try:
        env = _head.decode(data)
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError) as e:
        raise BusDecodeError(f"not a control envelope: {e}") from None
    if env.v != SCHEMA_VERSION:
        raise BusDecodeError(f"schema version {env.v}, this controller speaks {SCHEMA_VERSION}")
    try:
        return _body.decode(env.msg)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError,
            UnicodeDecodeError) as e:
        raise BusDecodeError(f"bad message: {e}") from None


# --- the frame on the O-NIC's port --------------------------------------------------------
FRAME_WIDTHS = {"flow": 64, "hop": 8, "src": 16, "dst": 16, "port": 8, "channel": 8,
                "nbytes": 48, "origin": 16, "final": 16, "iteration": 32, "step": 32,
                "t_submit": 64, "expires_ns": 64, "queue_position": 16}
_NODE_FIELDS = frozenset({"src", "dst", "origin", "final"})
_KINDS: dict[str, type[Request | Grant | Release | Wait]] = {
    "request": Request, "grant": Grant, "release": Release, "wait": Wait}
_HEAD = 16  # version (8 bits), then the type code (8)


def _frame() -> FrameFormat:
    fields: dict[str, dict[str, tuple[int, int]]] = {}
    for kind, cls in _KINDS.items():
        at, fields[kind] = _HEAD, {}
        for f in msgspec.structs.fields(cls):
            fields[kind][f.name] = (at, FRAME_WIDTHS[f.name])
            at += FRAME_WIDTHS[f.name]
        assert at <= BEAT_BITS, (kind, at)
    return FrameFormat(SCHEMA_VERSION, (8, 8), {k: i + 1 for i, k in enumerate(_KINDS)},
                       fields, TAG_SHIFT, (1 << FRAME_WIDTHS["src"]) - 1)


FRAME = _frame()
_KIND_OF = {cls: kind for kind, cls in _KINDS.items()}
_BY_CODE = {code: kind for kind, code in FRAME.codes.items()}


def encode_frame(msg: ControlMessage, nodes: Mapping[str, int], ports: Sequence[str]) -> int:
    """`msg` as one frame (an int of BEAT_BITS bits); a name not in `nodes`/`ports`, or a
    value that does not fit its field, is refused with a ValueError naming it."""
    kind = _KIND_OF[type(msg)]
    word = FRAME.version | FRAME.codes[kind] << FRAME.type_bits[0]
    for name, (at, width) in FRAME.fields[kind].items():
        v = getattr(msg, name)
        if name in _NODE_FIELDS:
            v = FRAME.no_node if v == "" else nodes.get(v, -1)
            if v < 0:
                raise ValueError(f"{kind}.{name}: {getattr(msg, name)!r} is no node here")
        elif name == "port":
            if v not in ports:
                raise ValueError(f"{kind}.port: {v!r} is no port (of {', '.join(ports)})")
            v = ports.index(v)
        if not 0 <= v < 1 << width:
            raise ValueError(f"{kind}.{name} = {v} does not fit the frame's {width} bits")
        word |= v << at
    return word


def decode_frame(word: int, names: Sequence[str], ports: Sequence[str]) -> ControlMessage:
    """A frame back into its message; another version, an unknown type code, a node or port
    index out of range: a BusDecodeError with the reason."""
    version = word & 0xFF
    if version != FRAME.version:
        raise BusDecodeError(f"frame version {version}, this controller speaks {FRAME.version}")
    at, width = FRAME.type_bits
    code = word >> at & ((1 << width) - 1)
    kind = _BY_CODE.get(code)
    if kind is None:
        raise BusDecodeError(f"frame type code {code} is no control message")
    values: dict[str, int | str] = {}
    for name, (at, width) in FRAME.fields[kind].items():
        v = word >> at & ((1 << width) - 1)
        if name in _NODE_FIELDS:
            if v == FRAME.no_node:
                values[name] = ""
                continue
            if v >= len(names):
                raise BusDecodeError(f"{kind}.{name}: node index {v} (of {len(names)})")
            values[name] = names[v]
        elif name == "port":
            if v >= len(ports):
                raise BusDecodeError(f"{kind}.port: port index {v} (of {len(ports)})")
            values[name] = ports[v]
        else:
            values[name] = v
    return _KINDS[kind](**values)  # type: ignore[arg-type]
