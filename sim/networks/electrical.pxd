# Typed where compiled (Cython reads this beside electrical.py; the .py runs unchanged
# interpreted): a flow's fields are a C struct's, and `_retime`'s loop reads them there.
# Python's semantics kept: a rate and a flow's bits left are floats either way; times
# stay Python ints.
import cython


cdef class _Active:
    cdef public object conn, flow, handle, last, lidx, links
    cdef public bint done
    cdef public double rate, remaining
    cdef public Py_ssize_t slot


@cython.locals(a=_Active, r=cython.double, left=cython.double, far=cython.bint)
cpdef _retime(list comp, list rates, object now, object next_tick, dict held, object at,
              object finish, object vloop)
