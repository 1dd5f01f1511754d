"""The control bus's wire format: versioned JSON envelopes (msgspec), never pickle.

    {"v": 1, "msg": {"type": "request", "flow": 7, ...}}

Anything else (not JSON, another version, an unknown type, a wrong field) is rejected with
a reason; the bus logs it and drops it.
"""

from __future__ import annotations

import msgspec
from oddl.controller.base.messages import SCHEMA_VERSION, ControlMessage


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
