"""The compiled tick of the congestion laws (lawkernel.pyx): its interface, for the type
checker."""

import numpy as np
from oddl.sim.networks.congestion import CongestionControl

def step(cc: CongestionControl) -> bool: ...
def pairwise_sum(a: np.ndarray) -> float: ...
