# Typed where compiled (Cython reads this beside onic.py, which runs unchanged
# interpreted): the drivers' fields are C struct fields and their per-flow calls to each
# other C calls. Python's semantics kept: register values and offsets stay Python ints.
cdef class ONicDriver:
    cdef public object mmio, node, design, nodes, index
    cdef public dict _tx

    cpdef tune_and_start(self, port, channel, dst, nbytes, flow, header=*)
    cpdef start_transfer(self, port, dst, nbytes, flow, header=*)
    cpdef _command(self, port, transfer, which, data, refused)


cdef class DriverONic:
    cdef public ONicDriver d
    cdef public object node, ports, index, events, on_module_fired, _mask, tampered
    cdef public object _ca_names, _w, _r, _o, _irq_ports, _health_regs, unit_routes
    cdef public dict inflight

    cpdef send(self, port, flow)
    cpdef tune_and_send(self, port, channel, flow)
    cpdef _header(self, flow)
    cpdef _in_flight(self, port, flow)
    cpdef _refused(self, port, prev)
    cpdef rx_receiving(self, port, flow, hop)
    cpdef on_interrupt(self)
