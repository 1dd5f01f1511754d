"""The baseline networks by kind: what the runner drives with the same workload as ODDL."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from oddl.controller.base.clock import Clock
from oddl.controller.base.messages import Flow
from oddl.sim.networks.congestion import CongestionControl
from oddl.sim.networks.electrical import ElectricalSwitch, FlowNetwork
from oddl.sim.networks.sharing import MLTCP, sharing_of


def build_network(spec: Any, clock: Clock, ranks: list[str], line_rate_gbps: float,
                  deliver: Callable[[Flow], None],
                  traffic: Mapping[tuple[str, str], int] | None = None,
                  links: Sequence[tuple[str, str]] | None = None) -> FlowNetwork:
    """A flow-level network for a NetworkSpec of kind electrical/fattree/sipring/sipocs/
    topoopt/optinc, sharing its links as the spec says; `traffic` (bytes per node pair, the
    first job's), where the network places by it (SiP-ML's ring order); `links`, TopoOpt's
    topology for a hybrid job."""
    net = _network(spec, clock, ranks, line_rate_gbps, deliver, traffic or {}, links)
    law = spec.sharing.removeprefix("mltcp-")
    mltcp_tick = round(spec.mltcp_tick_us * 1e3)
    if law in ("dcqcn", "tcp"):  # a congestion-control law, MLTCP on it or not
        net.sharing = CongestionControl(law, round(spec.cc_tick_us * 1e3), mltcp=MLTCP(
            spec.mltcp_slope, spec.mltcp_intercept, mltcp_tick)
            if spec.sharing != law else None)
    else:
        net.sharing = sharing_of(spec.sharing, spec.mltcp_slope, spec.mltcp_intercept,
                                 mltcp_tick)
    net.sharing.attach(net)
    return net


def _network(spec: Any, clock: Clock, ranks: list[str], line_rate_gbps: float,
             deliver: Callable[[Flow], None],
             traffic: Mapping[tuple[str, str], int],
             links: Sequence[tuple[str, str]] | None = None) -> FlowNetwork:
    if spec.kind == "electrical":
        return ElectricalSwitch(clock, ranks, line_rate_gbps, spec.latency_ns, deliver)
    if spec.kind == "fattree":
        from oddl.sim.networks.fattree import FatTree

        return FatTree(clock, ranks, line_rate_gbps, spec.latency_ns, deliver,
                       spec.hosts_per_leaf, spec.spines, spec.oversubscription)
    if spec.kind in ("sipring", "sipocs"):
        from oddl.sim.networks.sipring import SipRing, ring_order

        return SipRing(clock, ranks, line_rate_gbps, spec.latency_ns, deliver,
                       spec.wavelengths, spec.degree, spec.reconfig_ns, spec.link_gbps,
                       ring_order(ranks, traffic), ocs=spec.kind == "sipocs")
    if spec.kind == "topoopt":
        from oddl.sim.networks.topoopt import TopoOpt

        return TopoOpt(clock, ranks, line_rate_gbps, spec.latency_ns, deliver, spec.degree,
                       spec.link_gbps, spec.bidirectional, links)
    if spec.kind == "optinc":
        from oddl.sim.networks.optinc import OptINCNetwork

        return OptINCNetwork(clock, ranks, line_rate_gbps, spec.latency_ns, deliver,
                             spec.transceivers, spec.ports, spec.onn_pass_ns)
    raise ValueError(f"no flow-level model for network kind {spec.kind!r}")
