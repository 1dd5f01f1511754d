# Typed where compiled (Cython reads this beside bus.py, which runs unchanged
# interpreted): the bus's fields are C struct fields, its calls to itself C calls.
cdef class LocalBus:
    cdef public object clock, latency_ns, rng, tap, sent, dropped, delayed, drop_p, delay_p
    cdef public object max_extra_delay_ns, _lossy, down, dead, lose
    cdef public dict handlers

    cpdef passes(self, src, dst=*)
    cpdef send(self, src, dst, msg)
    cpdef _deliver(self, dst, msg)
