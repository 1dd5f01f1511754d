"""An in-process O-NIC on the fabric model (the sim back end's `controller.devices.ONic`)."""

from __future__ import annotations

from controller.devices import DeviceRefused, ONicEvents
from controller.messages import Flow
from sim.fabric import Fabric

DESIGN_VERSION = "oddl-onic-0.1"


class SimONic:
    def __init__(self, fabric: Fabric, node: str) -> None:
        self.fabric = fabric
        self.node = node
        self.ports = fabric.ports[node]
        self._routes: dict[str, tuple[str, int, str]] = {}

    def attach(self, events: ONicEvents) -> None:
        self.fabric.rx_handlers[self.node] = events.on_rx_done
        self.fabric.tx_handlers[self.node] = events.on_tx_done
        self.fabric.tuned_handlers[self.node] = events.on_tuned

    def identity(self) -> dict[str, str]:
        return {"node": self.node, "design": DESIGN_VERSION, "ports": ",".join(self.ports)}

    def tune(self, port: str, channel: int) -> None:
        self.fabric.tune(self.node, port, channel)

    def send(self, port: str, flow: Flow) -> None:
        self.fabric.send(self.node, port, flow)

    def rx_flow(self, port: str) -> tuple[int, int] | None:
        return self.fabric.rx_flow(self.node, port)

    def load_routes(self, routes: dict[str, tuple[str, int, str]]) -> None:
        for dst, (port, ch, _nh) in routes.items():
            if port not in self.ports:
                raise DeviceRefused(f"{self.node}: route to {dst} uses port {port}, which is "
                                    f"not connected")
            if not 0 <= ch < self.fabric.n_channels:
                raise DeviceRefused(f"{self.node}: route to {dst} uses channel {ch}")
        self._routes = dict(routes)

    def read_routes(self) -> dict[str, tuple[str, int, str]]:
        return dict(self._routes)
