# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""One tick of the congestion laws, compiled (issue 46): `CongestionControl.step`'s numpy
code, loop by loop, in C.

A tick of the laws touches a few connections and a few hundred links, so numpy spends it
in the overhead of ~80 calls; here it is one call. The arithmetic is numpy's, operation for
operation and in the same order (sums in their input's order, as `bincount` adds), built
without contracting a * b + c (setup.py: -ffp-contract=off); exp, log1p and pow are the C
library's, as numpy's are on x86-64 below AVX-512 (tests/test_congestion.py holds the two
to the bit, tick by tick). The random draws and the sums numpy pairs up (`ndarray.sum`)
are left to numpy.
"""

import numpy as np

from libc.math cimport exp, log1p, pow, INFINITY


def step(cc) -> bool:
    """`CongestionControl.step` (sim/networks/congestion.py), compiled."""
    cdef double dt = float(cc.tick_ns)
    slots_a, rows_a, cols_a = cc._index()
    cdef const long[:] slots = slots_a
    cdef const long[:] rows = rows_a
    cdef const long[:] cols = cols_a
    cdef Py_ssize_t n = len(slots_a), m = len(rows_a)
    cdef const double[:] cap = cc.net.cap_arr
    cdef Py_ssize_t L = cap.shape[0]
    cdef double[:] queue = cc.queue
    cdef double[:] rate = cc.rate
    cdef double[:] line = cc.line
    cdef double[:] goodput = cc.goodput
    arrive_a = np.zeros(L)
    cdef double[:] arrive = arrive_a
    cdef Py_ssize_t i, j, k, s
    for j in range(m):  # np.bincount(cols, weights=x[rows])
        arrive[cols[j]] += rate[slots[rows[j]]]
    cdef bint quiet = not cc.random_loss
    for k in range(L):
        if not quiet:
            break
        quiet = queue[k] == 0.0 and arrive[k] <= cap[k] * (1 + 1e-9)
    for i in range(n):
        if not quiet:
            break
        quiet = rate[slots[i]] >= line[slots[i]] * (1 - 1e-9)
    if quiet:
        for i in range(n):
            goodput[slots[i]] = rate[slots[i]]
        return False
    cdef double buf = cc.buffer_bits, q, over, seen, qmax = 0.0
    lost_a, serve_a = np.empty(L), np.empty(L)
    cdef double[:] lost = lost_a
    cdef double[:] serve = serve_a
    for k in range(L):
        q = queue[k] + (arrive[k] - cap[k]) * dt
        over = q - buf if q - buf > 0.0 else 0.0
        q = q if q > 0.0 else 0.0  # np.clip's order: the floor, then the ceiling
        q = q if q < buf else buf
        queue[k] = q
        qmax = q if q > qmax else qmax
        seen = arrive[k] if arrive[k] > 1e-300 else 1e-300
        lost[k] = over / (seen * dt)
        serve[k] = (cap[k] if q > 0.0 else (arrive[k] if arrive[k] < cap[k] else cap[k])) / seen
    cc.stats["max_queue_bytes"] = max(cc.stats["max_queue_bytes"], qmax / 8)
    x_a, kept_a, through_a = np.empty(n), np.zeros(n), np.full(n, INFINITY)
    cdef double[:] x = x_a
    cdef double[:] kept = kept_a
    cdef double[:] through = through_a
    for i in range(n):
        x[i] = rate[slots[i]]
    for j in range(m):
        i = rows[j]
        k = cols[j]
        if serve[k] < through[i]:
            through[i] = serve[k]
        kept[i] += log1p(-(lost[k] if lost[k] < 1 - 1e-12 else 1 - 1e-12))
    aside_a = np.empty(n)  # what the buffers turn away: paused (DCQCN) or dropped (TCP)
    cdef double[:] aside = aside_a
    for i in range(n):
        kept[i] = exp(kept[i])
        goodput[slots[i]] = x[i] * through[i] * kept[i]
        aside[i] = x[i] * (1 - kept[i])
    if cc.law == "dcqcn":
        cc.stats["paused_bytes"] += float(aside_a.sum() * dt / 8)
        _dcqcn(cc, slots_a, rows, cols, x, dt)
    else:
        cc.stats["dropped_bytes"] += float(aside_a.sum() * dt / 8)
        _reno(cc, slots_a, rows, cols, x, kept, dt)
    return True


cdef void _dcqcn(cc, slots_a, const long[:] rows, const long[:] cols,
                 const double[:] x, double dt) except *:
    d = cc.d
    cdef double kmin = d.kmin_bytes, kmax = d.kmax_bytes, pmax = d.pmax, g = d.g
    cdef double cnp_ns = d.cnp_ns, alpha_ns = d.alpha_ns, timer_ns = d.timer_ns
    cdef double byte_counter = d.byte_counter, fast = d.fast_steps
    cdef double rai = d.rai_gbps, rhai = d.rhai_gbps, pkt = d.mtu * 8
    cdef const long[:] slots = slots_a
    cdef Py_ssize_t n = len(slots_a), m = rows.shape[0], i, j, s
    cdef const double[:] queue = cc.queue
    cdef Py_ssize_t L = queue.shape[0]
    p_a = np.empty(L)
    cdef double[:] p = p_a
    cdef double qb
    for j in range(L):
        qb = queue[j] / 8
        p[j] = 0.0 if qb <= kmin else (1.0 if qb >= kmax else pmax * (qb - kmin) / (kmax - kmin))
    unmarked_a = np.zeros(n)
    cdef double[:] unmarked = unmarked_a
    for j in range(m):
        unmarked[rows[j]] += log1p(-(p[cols[j]] if p[cols[j]] < 1 - 1e-12 else 1 - 1e-12))
    draws = cc.rng.random(n)
    cdef const double[:] u = draws
    cdef double[:] rc = cc.rate
    cdef double[:] rt = cc.target
    cdef double[:] al = cc.alpha
    cdef double[:, :] clk = cc.clocks
    cdef double[:, :] cnt = cc.counts
    cdef double[:] sent = cc.sent
    cdef double[:] line = cc.line
    cdef unsigned char[:] marked = cc.marked.view(np.uint8)
    cdef unsigned char[:] cut = cc.cut.view(np.uint8)
    ev_a = np.zeros(n, dtype=np.uint8)
    cdef unsigned char[:] ev = ev_a
    cdef bint cnp, decay, t_ev, b_ev, any_ev = False
    cdef long long cnps = 0
    cdef double bytes_acc
    for i in range(n):
        s = slots[i]
        marked[s] = marked[s] | (u[i] < 1.0 - pow(exp(unmarked[i]), x[i] * dt / pkt))
        clk[s, 0] += dt
        clk[s, 1] += dt
        clk[s, 2] += dt
        cnp = marked[s] and clk[s, 0] >= cnp_ns
        if cnp:
            cnps += 1
            rt[s] = rc[s]
            rc[s] = rc[s] * (1 - al[s] / 2)
            al[s] = (1 - g) * al[s] + g
            clk[s, 0] = clk[s, 1] = clk[s, 2] = clk[s, 3] = 0.0
            cnt[s, 0] = cnt[s, 1] = 0.0
            marked[s] = 0
            cut[s] = 1
        decay = not cnp and clk[s, 1] >= alpha_ns
        if decay:
            al[s] = (1 - g) * al[s]
            clk[s, 1] = 0.0
        bytes_acc = (0.0 if cnp else sent[s]) + x[i] * dt / 8
        t_ev = cut[s] and clk[s, 2] >= timer_ns
        b_ev = cut[s] and bytes_acc >= byte_counter
        if t_ev:
            clk[s, 2] = 0.0
            cnt[s, 0] += 1
        if b_ev:
            bytes_acc = bytes_acc - byte_counter
            cnt[s, 1] += 1
        sent[s] = bytes_acc
        ev[i] = t_ev or b_ev
        any_ev = any_ev or ev[i]
    if cnps:
        cc.stats["cnps"] += cnps
    cdef double[:] f
    cdef double lo, hi, add
    if any_ev:
        f = cc._scale(slots_a)
        for i in range(n):
            if not ev[i]:
                continue
            s = slots[i]
            lo = min(cnt[s, 0], cnt[s, 1])
            hi = max(cnt[s, 0], cnt[s, 1])
            add = (0.0 if hi < fast else ((lo - fast) * rhai if lo > fast else rai)) * f[i]
            rt[s] = min(rt[s] + add, line[s])
            rc[s] = (rt[s] + rc[s]) / 2
    for i in range(n):
        s = slots[i]
        rc[s] = min(rc[s], line[s])


cdef void _reno(cc, slots_a, const long[:] rows, const long[:] cols,
                const double[:] x, const double[:] kept, double dt) except *:
    r = cc.r
    cdef double seg = r.mss * 8, keep = 1.0 - cc.random_loss
    cdef const long[:] slots = slots_a
    cdef Py_ssize_t n = len(slots_a), m = rows.shape[0], i, j, s
    cdef const double[:] queue = cc.queue
    cdef const double[:] cap = cc.net.cap_arr
    delay_a = np.zeros(n)
    cdef double[:] delay = delay_a
    for j in range(m):
        delay[rows[j]] += queue[cols[j]] / cap[cols[j]]
    draws = cc.rng.random(n)
    cdef const double[:] u = draws
    cdef const double[:] f = cc._scale(slots_a)
    cdef double[:] w = cc.window
    cdef double[:] ssthresh = cc.ssthresh
    cdef double[:, :] clk = cc.clocks
    cdef double[:] base_rtt = cc.base_rtt
    cdef double[:] goodput = cc.goodput
    cdef double[:] line = cc.line
    cdef double[:] rate = cc.rate
    cdef double rtt, p, acked, grow, wi
    cdef bint loss
    cdef long long losses = 0
    for i in range(n):
        s = slots[i]
        rtt = base_rtt[s] + delay[i]
        p = 1.0 - kept[i] * keep
        clk[s, 3] += dt
        loss = u[i] < 1.0 - pow(1.0 - p, x[i] * dt / seg) and clk[s, 3] >= rtt
        acked = goodput[s] * dt / seg
        wi = w[s]
        grow = acked if wi < ssthresh[s] else f[i] * acked / (wi if wi > 1.0 else 1.0)
        if loss:
            wi = wi / 2 if wi / 2 > 1.0 else 1.0
            ssthresh[s] = wi
            clk[s, 3] = 0.0
            losses += 1
        else:
            wi = wi + grow
        wi = min(wi, line[s] * rtt / seg)
        w[s] = wi
        rate[s] = min(line[s], wi * seg / rtt)
    cc.stats["losses"] += losses
