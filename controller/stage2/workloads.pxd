# Typed where compiled (Cython reads this beside workloads.py, which runs unchanged
# interpreted): the engine's fields are C struct fields, its calls to itself C calls.
# Python's semantics kept: counts, steps and times stay Python ints.
cdef class CollectiveEngine:
    cdef public object clock, schedule, ranks, submit, on_flow_start, flows, iteration
    cdef public object pending, on_done, on_delivered_hook, t_start, t_done, nic_sync
    cdef public object halted, id_base, carry, on_phase
    cdef public dict rank_of, _phase
    cdef public list local, seq, step, issued, computed, recv, fired, early, early_fired, got

    cpdef _run_steps(self, r)
    cpdef _enter(self, r, phase)
    cpdef on_delivered(self, flow)
    cpdef module_fired(self, node, slot)
