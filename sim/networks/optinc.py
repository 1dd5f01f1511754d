"""OptINC (seeds/004) as a flow-level network: gradients averaged in flight.

Each server has `transceivers` (M) full-duplex transceivers at the line rate into the
OptINC fabric. Its all-reduce is one optical pass (collective `optinc`): every server
streams its gradient over its M transceivers, the ONN averages as the light passes and
every server receives the mean on the same M transceivers. Time: bytes / (M x line rate)
plus the optical path latency (`latency_ns`, server to unit and back), once per level: a
fabric of more servers than a unit has `ports` is a two-level cascade (Fig. 5), whose
pass goes up through the second level and back down. The light streams through both
levels, so the second level adds latency, not transmission time. A trained ONN adds its
pass (`onn_pass_ns`, studies/quantiser.pass_ns) once per level. What the averaging does
to the gradients' values is studies/onn.py's and studies/training.py's.
"""

from __future__ import annotations

from collections.abc import Callable

from oddl.controller.base.clock import Clock
from oddl.controller.base.collectives import optinc_levels
from oddl.controller.base.messages import Flow
from oddl.sim.networks.electrical import FlowNetwork


class OptINCNetwork(FlowNetwork):
    name = "optinc"

    def __init__(self, clock: Clock, nodes: list[str], line_rate_gbps: float,
                 latency_ns: float, deliver: Callable[[Flow], None], transceivers: int = 4,
                 ports: int = 32, onn_pass_ns: float = 0.0) -> None:
        self.levels = optinc_levels(len(nodes), ports)
        cap: dict[object, float] = {}
        for n in nodes:  # each server's M transceivers, both ways
            cap[("up", n)] = cap[("down", n)] = transceivers * line_rate_gbps
        super().__init__(clock, cap, lambda f: (("up", f.src), ("down", f.dst)),
                         (latency_ns + onn_pass_ns) * len(self.levels), deliver)

    def describe(self) -> dict[str, int | float]:
        return {"levels": len(self.levels)}
