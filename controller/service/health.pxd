# Typed where compiled (Cython reads this beside health.py, which runs unchanged
# interpreted): a node program's heartbeat and the arbiter's watch tick every period,
# with their fields in C and their ticks C calls. Times stay Python ints.
cdef class Heartbeats:
    cdef public object clock, period_ns, read, send, phase_ns, seq, _timer, _due
    cdef public bint slow
    cdef public list _lags

    cpdef _tick(self)


cdef class Watch:
    cdef public object clock, health, wss, expected, _timer, _ticks

    cpdef _tick(self)
