# Typed where compiled (Cython reads this beside onic_board.py, which runs unchanged
# interpreted): the board's fields are a C struct's, its own calls C calls. Python's
# semantics kept: every field holds the object it holds interpreted (registers stay
# Python ints); `__dict__` keeps room for what a test or a tool hangs on a board.
cdef class ONicBoard:
    cdef public object fabric, clock, node, nodes, index, ports, ca, routes
    cdef public dict regs
    cdef public set start_after_tune, tuning_pending
    cdef public object _ca_index, _events, _fires, fires, loaded_bitstream, ts_hi_latch
    cdef public object streamed, on_irq, unit_block
    cdef public dict _hdr_tx, _hdr_rx, _dst_off, _flow_off, _bytes_off, _rx_err, _seen_err
    cdef public dict _tx_done_at, _rx_irq, _rx_off
    cdef dict __dict__

    cpdef _interrupt(self)
    cpdef _start(self, p)
    cpdef bint _count(self, sig, index, value, src)
    cpdef _fire(self, m, mod)
