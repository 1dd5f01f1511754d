"""The device interfaces the controller is written against.

Each back end supplies objects with these shapes: the sim back end in-process models, the
emu and hw back ends drivers over pynq / pyserial / MQTT. The controller never asks which.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from oddl.controller.base.messages import ControlMessage, Flow
from oddl.fpga.countaction import Program


class DeviceRefused(Exception):
    """A device refused a command, as the real one would (e.g. transfer while tuning)."""


class ONicEvents(Protocol):
    """What an O-NIC reports to the control unit that owns it."""

    def on_tx_done(self, port: str, flow: Flow) -> None: ...
    def on_rx_done(self, port: str, flow_id_lo: int, nbytes: int) -> None: ...


class ONic(Protocol):
    node: str
    ports: tuple[str, ...]
    tampered: int  # its registers found changed by another writer (and restored)

    def attach(self, events: ONicEvents) -> None: ...
    def identity(self) -> dict[str, str]: ...
    def send(self, port: str, flow: Flow) -> None: ...
    def tune_and_send(self, port: str, channel: int, flow: Flow) -> None: ...
    def rx_receiving(self, port: str, flow: int, hop: int) -> bool: ...
    def load_routes(self, routes: dict[str, tuple[str, int, str]]) -> None: ...
    def read_routes(self) -> dict[str, tuple[str, int, str]]: ...
    def load_countaction(self, prog: Program) -> None: ...
    def read_countaction(self) -> Program: ...
    def health(self) -> dict[str, Any]: ...
    def transmitting(self) -> bool: ...

    def on_interrupt(self) -> None: ...

    on_module_fired: Callable[[int], None] | None  # count-action slot that fired


class InterruptLine(Protocol):
    """A board's interrupt line, as the node program beside it takes it: pynq's
    `Interrupt` on the board's own processor, a poll of IRQ_STATUS over PYNQ.remote, the
    board model's line in emulation. `connect` hands every interrupt to the handler on
    the caller's event loop."""

    def connect(self, handler: Callable[[], None]) -> None: ...
    def disconnect(self) -> None: ...


class WSSDevice(Protocol):
    id: str
    ports: int

    def identify(self) -> str: ...
    def set_table(self, table: list[list[int | None]]) -> None: ...
    # change these inputs only: the others keep their light (a job admitted beside
    # running ones); refused, as a whole table is, if the result collides
    def set_rows(self, rows: Mapping[int, list[int | None]]) -> None: ...
    def get_table(self) -> list[list[int | None]]: ...


class Bus(Protocol):
    """Control-message transport between control units (in-process, or MQTT)."""

    def attach(self, node: str, handler: Callable[[ControlMessage], None]) -> None: ...
    def send(self, src: str, dst: str, msg: ControlMessage) -> None: ...
    @property
    def sent(self) -> int: ...
