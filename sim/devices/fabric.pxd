# Typed where compiled (Cython reads this beside fabric.py, which runs unchanged
# interpreted): the fabric's fields are C struct fields, its calls to itself C calls.
# Python's semantics kept: times and byte counts stay Python ints.
cdef class Fabric:
    cdef public object tb, grid, clock, checker, rate, tuning_ns, guard_ns, prop_ns
    cdef public object n_channels, transfers, bytes, lost
    cdef public dict wss, tx, rx, lit, attach_pt, ports, rx_handlers, tx_handlers
    cdef public dict tuned_handlers, tune_override
    cdef public set corrupt, dead

    cpdef duration_ns(self, nbytes)
    cpdef tune(self, node, port, channel)
    cpdef _tuned(self, node, port, tx, channel)
    cpdef send(self, node, port, flow)
    cpdef _tx_done(self, node, port, tx, flow)
    cpdef _rx_done(self, dst, port, rx, key, flow, src)
