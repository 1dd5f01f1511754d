# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""One tick of the congestion laws, compiled (issue 46): `CongestionControl.step`'s numpy
code, loop by loop, in C.

A tick of the laws touches a few connections and a few hundred links, so numpy spends it
in the overhead of ~80 calls; here it is one call, which reaches the arrays through their
buffers (a typed memoryview apiece cost more than the arithmetic). The arithmetic is
numpy's, operation for operation and in the same order: sums in their input's order, as
`bincount` adds, and `ndarray.sum`'s pairwise order (`_pairwise`); built without
contracting a * b + c (setup.py: -ffp-contract=off); exp, log1p and pow are the C
library's, as the numpy tick's are (numpy's own differ in the last bit on AVX-512
machines). tests/test_congestion.py holds the two ticks equal to the bit, tick by tick.
The random draws are numpy's.
"""

from cpython.buffer cimport PyBUF_ANY_CONTIGUOUS, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from libc.math cimport INFINITY, exp, log1p, pow
from libc.stdlib cimport free, malloc

cdef enum:
    MAX_BUFFERS = 20  # a tick holds at most 16

if sizeof(long) != 8:  # the index arrays are int64, read as C longs
    raise ImportError("lawkernel: a C long is not 64 bits on this platform")


cdef struct Tick:
    # what the common part of a tick hands to its law: the arrays it already holds
    const long* slots
    const long* rows
    const long* cols
    const double* cap
    double* queue
    double* rate
    double* line
    double* goodput
    const double* x
    double dt
    Py_ssize_t n, m, L
    double* scratch  # the law's: L + 2 n doubles


cdef class _Buffers:
    """The arrays a tick reads and writes, held by their buffers until it ends."""

    cdef Py_buffer views[MAX_BUFFERS]
    cdef int n

    cdef void* get(self, obj) except NULL:
        if self.n == MAX_BUFFERS:
            raise RuntimeError("lawkernel: too many arrays")
        PyObject_GetBuffer(obj, &self.views[self.n], PyBUF_ANY_CONTIGUOUS | PyBUF_WRITABLE)
        self.n += 1
        return self.views[self.n - 1].buf

    def __dealloc__(self):
        cdef int i
        for i in range(self.n):
            PyBuffer_Release(&self.views[i])


cdef double _pairwise(const double* a, Py_ssize_t n) noexcept:
    """numpy's pairwise sum of a contiguous float64 array (`np.add.reduce`)."""
    cdef double r[8]
    cdef double res
    cdef Py_ssize_t i, j, n2
    if n < 8:
        res = 0.0
        for i in range(n):
            res += a[i]
        return res
    if n <= 128:
        for j in range(8):
            r[j] = a[j]
        i = 8
        while i < n - (n % 8):
            for j in range(8):
                r[j] += a[i + j]
            i += 8
        res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
        while i < n:
            res += a[i]
            i += 1
        return res
    n2 = n // 2
    n2 -= n2 % 8
    return _pairwise(a, n2) + _pairwise(a + n2, n - n2)


def pairwise_sum(double[::1] a) -> float:
    """`_pairwise`, for the test that holds it to numpy's `sum`."""
    return 0.0 + _pairwise(&a[0], a.shape[0]) if a.shape[0] else 0.0


cdef class _Arrays:
    """The law's state arrays, held by their buffers from tick to tick (taking 14 buffers
    every tick was 4% of a DCQCN run's samples) until the law replaces one
    (`generation`)."""

    cdef _Buffers held
    cdef Py_ssize_t generation
    cdef double* cap
    cdef double* queue
    cdef double* rate
    cdef double* line
    cdef double* goodput
    cdef double* target
    cdef double* alpha
    cdef double* clocks
    cdef double* counts
    cdef double* sent
    cdef double* window
    cdef double* ssthresh
    cdef double* base_rtt
    cdef unsigned char* marked
    cdef unsigned char* cut

    def __cinit__(self, cc):
        cdef _Buffers h = _Buffers()
        self.held, self.generation = h, cc.generation
        self.cap = <double*> h.get(cc.net.cap_arr)
        self.queue = <double*> h.get(cc.queue)
        self.rate = <double*> h.get(cc.rate)
        self.line = <double*> h.get(cc.line)
        self.goodput = <double*> h.get(cc.goodput)
        self.target = <double*> h.get(cc.target)
        self.alpha = <double*> h.get(cc.alpha)
        self.clocks = <double*> h.get(cc.clocks)
        self.counts = <double*> h.get(cc.counts)
        self.sent = <double*> h.get(cc.sent)
        self.window = <double*> h.get(cc.window)
        self.ssthresh = <double*> h.get(cc.ssthresh)
        self.base_rtt = <double*> h.get(cc.base_rtt)
        self.marked = <unsigned char*> h.get(cc.marked)
        self.cut = <unsigned char*> h.get(cc.cut)


def step(cc) -> bool:
    """`CongestionControl.step` (sim/networks/congestion.py), compiled."""
    cdef _Arrays arr = cc._arrays
    if arr is None or arr.generation != cc.generation:
        arr = cc._arrays = _Arrays(cc)
    cdef _Buffers held = _Buffers()
    slots_a, rows_a, cols_a = cc._index()
    cdef Py_ssize_t n = len(slots_a), m = len(rows_a), L = len(cc.queue)
    # per link: arrive, lost, serve, and the law's; per connection: x, kept, through, aside,
    # and the law's two
    cdef double* scratch = <double*> malloc((4 * L + 6 * n + 1) * sizeof(double))
    if scratch == NULL:
        raise MemoryError()
    try:
        return _step(cc, arr, held, slots_a, rows_a, cols_a, n, m, L, scratch)
    finally:
        free(scratch)


cdef bint _step(cc, _Arrays arr, _Buffers held, slots_a, rows_a, cols_a, Py_ssize_t n,
                Py_ssize_t m, Py_ssize_t L, double* scratch) except -1:
    cdef double dt = float(cc.tick_ns)
    cdef const long* slots = <long*> held.get(slots_a)
    cdef const long* rows = <long*> held.get(rows_a)
    cdef const long* cols = <long*> held.get(cols_a)
    cdef const double* cap = arr.cap
    cdef double* queue = arr.queue
    cdef double* rate = arr.rate
    cdef double* line = arr.line
    cdef double* goodput = arr.goodput
    cdef double* arrive = scratch
    cdef double* lost = scratch + L
    cdef double* serve = scratch + 2 * L
    cdef double* x = scratch + 3 * L
    cdef double* kept = x + n
    cdef double* through = x + 2 * n
    cdef double* aside = x + 3 * n
    cdef Py_ssize_t i, j, k
    for k in range(L):
        arrive[k] = 0.0
    for j in range(m):  # np.bincount(cols, weights=x[rows])
        arrive[cols[j]] += rate[slots[rows[j]]]
    cdef bint quiet = not cc.random_loss
    k = 0
    while quiet and k < L:
        quiet = queue[k] == 0.0 and arrive[k] <= cap[k] * (1 + 1e-9)
        k += 1
    i = 0
    while quiet and i < n:
        quiet = rate[slots[i]] >= line[slots[i]] * (1 - 1e-9)
        i += 1
    if quiet:
        for i in range(n):
            goodput[slots[i]] = rate[slots[i]]
        return False
    cdef double buf = cc.buffer_bits, q, over, seen, qmax = 0.0
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
    stats = cc.stats
    stats["max_queue_bytes"] = max(stats["max_queue_bytes"], qmax / 8)
    for i in range(n):
        x[i] = rate[slots[i]]
        kept[i] = 0.0
        through[i] = INFINITY
    for j in range(m):
        i = rows[j]
        k = cols[j]
        if serve[k] < through[i]:
            through[i] = serve[k]
        kept[i] += log1p(-(lost[k] if lost[k] < 1 - 1e-12 else 1 - 1e-12))
    for i in range(n):  # what the buffers turn away: paused (DCQCN) or dropped (TCP)
        kept[i] = exp(kept[i])
        goodput[slots[i]] = x[i] * through[i] * kept[i]
        aside[i] = x[i] * (1 - kept[i])
    cdef double turned = 0.0 + _pairwise(aside, n)
    cdef Tick t = Tick(slots, rows, cols, cap, queue, rate, line, goodput, x, dt, n, m, L,
                       x + 4 * n)
    if cc.law == "dcqcn":
        stats["paused_bytes"] += turned * dt / 8
        _dcqcn(cc, arr, held, slots_a, &t)
    else:
        stats["dropped_bytes"] += turned * dt / 8
        _reno(cc, arr, held, slots_a, &t, kept)
    return True


cdef int _dcqcn(cc, _Arrays arr, _Buffers held, slots_a, Tick* t) except -1:
    cdef const long* slots = t.slots
    cdef const long* rows = t.rows
    cdef const long* cols = t.cols
    cdef const double* x = t.x
    cdef const double* queue = t.queue
    cdef double* rc = t.rate
    cdef double* line = t.line
    cdef double dt = t.dt
    cdef Py_ssize_t n = t.n, m = t.m, L = t.L
    cdef double kmin, kmax, pmax, g, cnp_ns, alpha_ns, timer_ns, byte_counter, fast, rai
    cdef double rhai, pkt
    (kmin, kmax, pmax, g, cnp_ns, alpha_ns, timer_ns, byte_counter, fast, rai, rhai,
     pkt) = cc.dcqcn_params
    cdef double* p = t.scratch  # per link
    cdef double* unmarked = t.scratch + L  # per connection
    cdef Py_ssize_t i, j, s
    cdef double qb
    for j in range(L):
        qb = queue[j] / 8
        p[j] = 0.0 if qb <= kmin else (1.0 if qb >= kmax else pmax * (qb - kmin) / (kmax - kmin))
    for i in range(n):
        unmarked[i] = 0.0
    for j in range(m):
        unmarked[rows[j]] += log1p(-(p[cols[j]] if p[cols[j]] < 1 - 1e-12 else 1 - 1e-12))
    cdef const double* u = <double*> held.get(cc.uniform(n))
    cdef double* rt = arr.target
    cdef double* al = arr.alpha
    cdef double* clk = arr.clocks  # [slot, 4]
    cdef double* cnt = arr.counts  # [slot, 2]
    cdef double* sent = arr.sent
    cdef unsigned char* marked = arr.marked
    cdef unsigned char* cut = arr.cut
    cdef unsigned char* ev = <unsigned char*> (t.scratch + L + n)  # n flags in n doubles
    cdef bint cnp, decay, t_ev, b_ev, any_ev = False
    cdef long long cnps = 0
    cdef double bytes_acc
    for i in range(n):
        s = slots[i]
        marked[s] = marked[s] | (u[i] < 1.0 - pow(exp(unmarked[i]), x[i] * dt / pkt))
        clk[4 * s] += dt
        clk[4 * s + 1] += dt
        clk[4 * s + 2] += dt
        cnp = marked[s] and clk[4 * s] >= cnp_ns
        if cnp:
            cnps += 1
            rt[s] = rc[s]
            rc[s] = rc[s] * (1 - al[s] / 2)
            al[s] = (1 - g) * al[s] + g
            clk[4 * s] = clk[4 * s + 1] = clk[4 * s + 2] = clk[4 * s + 3] = 0.0
            cnt[2 * s] = cnt[2 * s + 1] = 0.0
            marked[s] = 0
            cut[s] = 1
        decay = not cnp and clk[4 * s + 1] >= alpha_ns
        if decay:
            al[s] = (1 - g) * al[s]
            clk[4 * s + 1] = 0.0
        bytes_acc = (0.0 if cnp else sent[s]) + x[i] * dt / 8
        t_ev = cut[s] and clk[4 * s + 2] >= timer_ns
        b_ev = cut[s] and bytes_acc >= byte_counter
        if t_ev:
            clk[4 * s + 2] = 0.0
            cnt[2 * s] += 1
        if b_ev:
            bytes_acc = bytes_acc - byte_counter
            cnt[2 * s + 1] += 1
        sent[s] = bytes_acc
        ev[i] = t_ev or b_ev
        any_ev = any_ev or ev[i]
    if cnps:
        cc.stats["cnps"] += cnps
    cdef const double* f
    cdef double lo, hi, add
    if any_ev:
        f = <double*> held.get(cc._scale(slots_a))
        for i in range(n):
            if not ev[i]:
                continue
            s = slots[i]
            lo = min(cnt[2 * s], cnt[2 * s + 1])
            hi = max(cnt[2 * s], cnt[2 * s + 1])
            add = (0.0 if hi < fast else ((lo - fast) * rhai if lo > fast else rai)) * f[i]
            rt[s] = min(rt[s] + add, line[s])
            rc[s] = (rt[s] + rc[s]) / 2
    for i in range(n):
        s = slots[i]
        rc[s] = min(rc[s], line[s])
    return 0


cdef int _reno(cc, _Arrays arr, _Buffers held, slots_a, Tick* t, const double* kept
               ) except -1:
    cdef const long* slots = t.slots
    cdef const long* rows = t.rows
    cdef const long* cols = t.cols
    cdef const double* x = t.x
    cdef const double* queue = t.queue
    cdef const double* cap = t.cap
    cdef const double* goodput = t.goodput
    cdef const double* line = t.line
    cdef double* rate = t.rate
    cdef double dt = t.dt
    cdef Py_ssize_t n = t.n, m = t.m
    r = cc.r
    cdef double seg = r.mss * 8, keep = 1.0 - cc.random_loss
    cdef double* delay = t.scratch  # per connection
    cdef Py_ssize_t i, j, s
    for i in range(n):
        delay[i] = 0.0
    for j in range(m):
        delay[rows[j]] += queue[cols[j]] / cap[cols[j]]
    cdef const double* u = <double*> held.get(cc.uniform(n))
    cdef const double* f = <double*> held.get(cc._scale(slots_a))
    cdef double* w = arr.window
    cdef double* ssthresh = arr.ssthresh
    cdef double* clk = arr.clocks  # [slot, 4]
    cdef const double* base_rtt = arr.base_rtt
    cdef double rtt, p, acked, grow, wi
    cdef bint loss
    cdef long long losses = 0
    for i in range(n):
        s = slots[i]
        rtt = base_rtt[s] + delay[i]
        p = 1.0 - kept[i] * keep
        clk[4 * s + 3] += dt
        loss = u[i] < 1.0 - pow(1.0 - p, x[i] * dt / seg) and clk[4 * s + 3] >= rtt
        acked = goodput[s] * dt / seg
        wi = w[s]
        grow = acked if wi < ssthresh[s] else f[i] * acked / (wi if wi > 1.0 else 1.0)
        if loss:
            wi = wi / 2 if wi / 2 > 1.0 else 1.0
            ssthresh[s] = wi
            clk[4 * s + 3] = 0.0
            losses += 1
        else:
            wi = wi + grow
        wi = min(wi, line[s] * rtt / seg)
        w[s] = wi
        rate[s] = min(line[s], wi * seg / rtt)
    cc.stats["losses"] += losses
    return 0
