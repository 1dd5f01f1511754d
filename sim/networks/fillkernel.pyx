# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Progressive filling, compiled (issue 46): `max_min_arrays` (sim/networks/electrical.py),
round by round, in C.

A fat-tree's solve is ~25 rounds over ~1,000 flows, each round a dozen numpy calls: numpy's
per-call overhead was nearly all of it. The arithmetic is numpy's, in the same order (a
link's users and its frozen users summed in the entries' order, as `bincount` adds; built
without contracting a * b + c), so the rates are the same to the bit
(tests/test_fattree.py holds the two equal).
"""

import numpy as np

from libc.math cimport INFINITY


def max_min_arrays(rows_in, cols_in, Py_ssize_t nf, cap_in, weights=None):
    """`max_min_arrays` of sim/networks/electrical.py, compiled. Its rounds run over the
    links the flows cross, numbered anew in the order first crossed (a link no flow
    crosses takes no share and never saturates, so it changes nothing): a component of
    a 1024-node fat-tree crosses a few hundred of its thousands."""
    rows_a = np.array(rows_in, dtype=np.int64)  # compacted as flows freeze
    cols_a = np.array(cols_in, dtype=np.int64)
    all_cap = np.asarray(cap_in, dtype=float)
    cdef const double[:] cap_all = all_cap
    cdef long[:] rows = rows_a
    cdef long[:] cols = cols_a
    cdef Py_ssize_t m = rows.shape[0], e, k, i, l, nl = 0
    local_a = np.full(cap_all.shape[0], -1, dtype=np.int64)
    cdef long[:] local = local_a
    cap_a = np.empty(min(m, cap_all.shape[0]))
    cdef double[:] cap = cap_a
    for e in range(m):  # each crossed link's number here, and its capacity
        k = cols[e]
        if local[k] < 0:
            local[k] = nl
            cap[nl] = cap_all[k]
            nl += 1
        cols[e] = local[k]
    cdef bint weighted = weights is not None
    w_a = np.asarray(weights if weighted else np.zeros(0), dtype=float)
    cdef const double[:] w = w_a
    rate_a = np.zeros(nf)
    cdef double[:] rate = rate_a
    scratch = np.empty((3, nl))
    cdef double[:] users = scratch[0]
    cdef double[:] share = scratch[1]
    cdef double[:] gone = scratch[2]
    flags = np.empty(2 * nl + nf, dtype=np.uint8)
    cdef unsigned char[:] live = flags[:nl]
    cdef unsigned char[:] sat = flags[nl:2 * nl]
    cdef unsigned char[:] frozen = flags[2 * nl:]
    live[:] = 1
    cdef double level = 0.0, s, smin
    while m:
        users[:] = 0.0
        for e in range(m):
            users[cols[e]] += w[rows[e]] if weighted else 1.0
        smin = INFINITY
        for l in range(nl):
            share[l] = cap[l] / users[l] if live[l] and users[l] > 0 else INFINITY
            if share[l] < smin:
                smin = share[l]
        s = level = max(level, smin)  # the water level never falls
        for l in range(nl):
            sat[l] = live[l] and users[l] > 0 and share[l] <= s * (1 + 1e-9)  # TIE
        frozen[:] = 0
        for e in range(m):
            if sat[cols[e]]:
                frozen[rows[e]] = 1
        for i in range(nf):
            if frozen[i]:
                rate[i] = s * w[i] if weighted else s
        gone[:] = 0.0
        for e in range(m):
            if frozen[rows[e]]:
                gone[cols[e]] += w[rows[e]] if weighted else 1.0
        for l in range(nl):
            cap[l] -= s * gone[l]
            live[l] = live[l] and not sat[l]
        k = 0
        for e in range(m):  # only unfrozen flows' entries remain, in their order
            if not frozen[rows[e]]:
                rows[k] = rows[e]
                cols[k] = cols[e]
                k += 1
        m = k
    return rate_a
