"""A board only its own node program touches (`board = "local"` in the testbed config).

A lab that opens no PYNQ.remote port (docs/deploy.md: an open port lets any process that
reaches it write any register) runs each `oddl node` on its board's own processor, with pynq
MMIO. The controller then reaches the board only through that program, over the
authenticated bus: the job it publishes names the board in `JobSpec.boards`, and the node
program applies the board's part of stage 1 itself (its routes from the job's routes, its
count-action program from the job's schedule), reads both back, and says "ready" only if
they match; it clears the routes when the job ends.

Here is what the controller's stage 1 holds for such a board: what it was given, for the
arbiter's bookkeeping (its read-back is the node program's, above); its identity is the
node program's to check (it opened the board, held to the design version); whether it still
transmits, its last heartbeat's word.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

from oddl.controller.base.devices import ONicEvents
from oddl.controller.base.messages import Flow
from oddl.controller.service.health import Health
from oddl.fpga.countaction import Program

VIA_NODE = "through its node program (board = local)"


class LocalBoard:
    """The controller's side of a board that only its node program touches."""

    def __init__(self, node: str, ports: tuple[str, ...], health: Health) -> None:
        # the watch it reads its transmitters from: not `health`, which is the board's
        # (an ONic's) own method, refused here as every stage-2 call is
        self.node, self.ports, self.watch = node, ports, health
        self.tampered = 0  # counted by the node program, beside the board
        self.on_module_fired: Callable[[int], None] | None = None
        self._routes: dict[str, tuple[str, int, str]] = {}
        self._program = Program()

    def identity(self) -> dict[str, str]:
        return {"node": self.node, "reached": VIA_NODE}

    def load_routes(self, routes: dict[str, tuple[str, int, str]]) -> None:
        self._routes = dict(routes)

    def read_routes(self) -> dict[str, tuple[str, int, str]]:
        return dict(self._routes)

    def load_countaction(self, prog: Program) -> None:
        self._program = prog

    def read_countaction(self) -> Program:
        return self._program

    def transmitting(self) -> bool:
        beat = self.watch.nodes[self.node].beat
        return beat is not None and beat.transmitting

    # stage 2 is the node program's: the controller never drives a board
    def _not_mine(self) -> NoReturn:
        raise RuntimeError(f"{self.node}: its board is its node program's ({VIA_NODE})")

    def attach(self, events: ONicEvents) -> None:
        self._not_mine()

    def send(self, port: str, flow: Flow) -> None:
        self._not_mine()

    def tune_and_send(self, port: str, channel: int, flow: Flow) -> None:
        self._not_mine()

    def rx_receiving(self, port: str, flow: int, hop: int) -> bool:
        return self._not_mine()

    def health(self) -> dict[str, Any]:
        return self._not_mine()

    def on_interrupt(self) -> None:
        self._not_mine()
