# Typed where compiled (Cython reads this beside congestion.py, which runs unchanged
# interpreted): a flow's connection slot read from its C struct, its connection's goodput
# and flow count from the arrays' buffers.
import cython

from oddl.sim.networks.electrical cimport _Active


@cython.locals(a=_Active)
cpdef list _shares(list comp, double[::1] goodput, long[::1] count)
