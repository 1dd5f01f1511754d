# Typed where compiled (Cython reads this beside control_unit.py, which runs unchanged
# interpreted): a unit's and its transmitters' and receivers' fields are C struct fields,
# and its calls to itself C calls (cpdef: a subclass still overrides them, as the
# checker's tests do). Python's semantics kept: counts and times stay Python ints.
import cython


cdef class _Tx:
    cdef public object port, queue, state, channel, current, route, retries, timer, shown
    cdef public object late
    cdef public object since
    cdef public bint waited


cdef class _Rx:
    cdef public object port, granted, queue, done_order, deferred, lease_timer
    cdef public object release_timer
    cdef public set queued, done
    cdef public bint data_done, released, asked


cdef class ControlUnit:
    cdef public object node, clock, bus, onic, t, deliver, fail, trace, sent, tag
    cdef public dict routes, tx, rx, unexpected_rx, stats
    cdef public bint halted

    cpdef _show(self, _Tx tx, state, at=*)
    cpdef _send(self, dst, m)
    cpdef submit(self, flow)
    cpdef _next(self, _Tx tx)
    cpdef _request(self, _Tx tx)
    @cython.locals(tx=_Tx)
    cpdef _on_grant(self, g)
    @cython.locals(tx=_Tx)
    cpdef on_tx_done(self, port, flow)
    cpdef _grant(self, _Rx rx, q)
    cpdef _grant_next(self, _Rx rx)
    @cython.locals(rx=_Rx)
    cpdef on_rx_done(self, port, flow_id_lo, nbytes)
    @cython.locals(rx=_Rx)
    cpdef _on_release(self, m)
    cpdef _free(self, _Rx rx)
    cpdef on_message(self, m)
