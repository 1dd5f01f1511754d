"""The compiled tick of the congestion laws (lawkernel.pyx): its interface, for the type
checker."""

from oddl.sim.networks.congestion import CongestionControl

def step(cc: CongestionControl) -> bool: ...
