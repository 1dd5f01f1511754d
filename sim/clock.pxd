# Typed where compiled (Cython reads this beside clock.py, which runs unchanged
# interpreted): the model events' heap and counters are C fields; scheduling and running
# an event reaches them without a Python attribute lookup. Times stay Python ints.
import cython


cdef class Events:
    cdef public list heap
    cdef public object now
    cdef public long long seq
    cdef public Py_ssize_t cancelled, events

    cpdef sweep(self)
    @cython.locals(n=Py_ssize_t)
    cpdef run(self, limit_ns, ready, loop)
