"""The baseline networks by kind: what the runner drives with the same workload as ODDL."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from oddl.controller.base.clock import Clock
from oddl.controller.base.messages import Flow
from oddl.sim.electrical import ElectricalSwitch, FlowNetwork
from oddl.sim.sharing import sharing_of


def build_network(spec: Any, clock: Clock, ranks: list[str], line_rate_gbps: float,
                  deliver: Callable[[Flow], None]) -> FlowNetwork:
    """A flow-level network for a NetworkSpec of kind electrical/fattree/sipring/topoopt/
    optinc, sharing its links as the spec says."""
    net = _network(spec, clock, ranks, line_rate_gbps, deliver)
    net.sharing = sharing_of(spec.sharing, spec.mltcp_slope, spec.mltcp_intercept,
                             round(spec.mltcp_tick_us * 1e3))
    return net


def _network(spec: Any, clock: Clock, ranks: list[str], line_rate_gbps: float,
             deliver: Callable[[Flow], None]) -> FlowNetwork:
    if spec.kind == "electrical":
        return ElectricalSwitch(clock, ranks, line_rate_gbps, spec.latency_ns, deliver)
    if spec.kind == "fattree":
        from oddl.sim.fattree import FatTree

        return FatTree(clock, ranks, line_rate_gbps, spec.latency_ns, deliver,
                       spec.hosts_per_leaf, spec.spines, spec.oversubscription)
    if spec.kind == "sipring":
        from oddl.sim.sipring import SipRing

        return SipRing(clock, ranks, line_rate_gbps, spec.latency_ns, deliver,
                       spec.wavelengths, spec.degree, spec.reconfig_ns)
    if spec.kind == "topoopt":
        from oddl.sim.topoopt import TopoOpt

        return TopoOpt(clock, ranks, line_rate_gbps, spec.latency_ns, deliver, spec.degree,
                       spec.link_gbps, spec.bidirectional)
    if spec.kind == "optinc":
        from oddl.sim.optinc import OptINCNetwork

        return OptINCNetwork(clock, ranks, line_rate_gbps, spec.latency_ns, deliver,
                             spec.transceivers, spec.ports)
    raise ValueError(f"no flow-level model for network kind {spec.kind!r}")
