# Typed where compiled (Cython reads this beside pynq_device.py, which runs unchanged
# interpreted): pynq's MMIO indexes the window as its mapped array, a dozen words a flow;
# typed, an index is a C slot's call, not a Python method's.
cdef class _Window:
    cdef public object board
    cdef public Py_ssize_t first, words
