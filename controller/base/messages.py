"""Flows and the stage-2 control messages (REQUEST / GRANT / RELEASE, and WAIT on retries).

Messages are msgspec structs with a type tag: typed, small, and encodable to JSON or
msgpack for a network bus without pickle.
"""

from __future__ import annotations

import msgspec

SCHEMA_VERSION = 1


class Flow:
    """A unit of data from src to its final dst; `hop` counts relay legs taken so far."""

    __slots__ = ("dst", "hop", "id", "iteration", "nbytes", "src", "step", "t_submit")

    def __init__(self, id: int, src: str, dst: str, nbytes: int, iteration: int = 0,
                 step: int = 0, hop: int = 0, t_submit: int = 0) -> None:
        self.id = id
        self.src = src
        self.dst = dst
        self.nbytes = nbytes
        self.iteration = iteration
        self.step = step
        self.hop = hop
        self.t_submit = t_submit

    def next_hop_copy(self) -> Flow:
        return Flow(self.id, self.src, self.dst, self.nbytes, self.iteration, self.step,
                    self.hop + 1, self.t_submit)

    def __repr__(self) -> str:
        return (f"Flow(id={self.id}, {self.src}->{self.dst}, {self.nbytes} B, "
                f"it={self.iteration}, step={self.step}, hop={self.hop})")


class Request(msgspec.Struct, tag="request", array_like=False, gc=False):
    """Asks the next-hop receiver for its port; also describes the flow, so the receiver
    knows what it is taking without parsing the data."""

    flow: int
    hop: int
    src: str  # requesting transmitter's node
    dst: str  # the receiver asked (next hop)
    port: str
    channel: int
    nbytes: int
    origin: str = ""  # the flow's source
    final: str = ""  # the flow's final destination
    iteration: int = 0
    step: int = 0
    t_submit: int = 0

    def as_flow(self) -> Flow:
        return Flow(self.flow, self.origin, self.final, self.nbytes, self.iteration, self.step,
                    self.hop, self.t_submit)


class Grant(msgspec.Struct, tag="grant", gc=False):
    flow: int
    hop: int
    src: str  # the granting receiver
    dst: str  # the transmitter granted
    port: str
    channel: int
    expires_ns: int  # the transmitter must have started by then (O-NIC clocks are synced)


class Release(msgspec.Struct, tag="release", gc=False):
    flow: int
    hop: int
    src: str
    dst: str
    port: str


class Wait(msgspec.Struct, tag="wait", gc=False):
    """Answer to a repeated REQUEST that is queued: keep waiting, do not count a retry."""

    flow: int
    hop: int
    src: str
    dst: str
    port: str
    queue_position: int


ControlMessage = Request | Grant | Release | Wait
