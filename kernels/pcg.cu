// Preconditioned CG on one GPU (see pcg_ref.py for the NumPy meaning of every kernel).
//
// A launch runs several iterations in one persistent (cooperative) kernel: pcg_run (classic, two
// grid reductions an iteration) or pcg1_run (single-reduction, Chronopoulos-Gear, one). Grid totals
// are the per-block partials summed in a fixed order, so results do not depend on block scheduling
// and every driver (eager, graph, while) produces the same bits. The distributed solver (dist.cu)
// runs the same pieces (direction_product, single_reduction_rows) with kernel boundaries instead, and
// its last-block (ticket) reductions (publish_partials, sum_partials).
//
// Compiled after grid.cu, matrix.cu and one matrix format (the Matrix struct and its
// for_each_row_product), with real_t (double or float) and the generated structs (State, Progress,
// and the kernels' argument structs ClassicRun / SingleReductionRun) defined by the loader.
//
// The product reads the vector it multiplies at neighbouring rows. With GATHER_STORED 0 it forms
// those entries on the fly from the vectors they are made of (the new direction p = z + beta p_old,
// or single-reduction's u = M^-1 r): no grid barrier before the product, at the cost of gathering
// two to four vectors, which is cheap where neighbours sit close in memory (stencils). With
// GATHER_STORED 1 the vector is formed row by row and stored first, behind a grid barrier, and the
// product gathers that one vector: the choice for scattered columns, where each gathered entry costs
// a memory transaction. Both give the same iterates; the order of the inner products' sums differs.

#ifndef GATHER_STORED
#define GATHER_STORED 0
#endif
#define BLOCK 256

// Publish this block's sums of v as partials[k * gridDim.x + blockIdx.x]; true in the last block to
// finish, which then calls sum_partials. The ticket is reset by that block's thread 0.
template <int K>
__device__ bool publish_partials(double* partials, double (&v)[K], unsigned int* ticket) {
    __shared__ bool last;
    block_sums<BLOCK>(v);
    if (threadIdx.x == 0) {
#pragma unroll
        for (int k = 0; k < K; ++k) partials[k * gridDim.x + blockIdx.x] = v[k];
        __threadfence();
        last = atomicAdd(ticket, 1u) == gridDim.x - 1;
        if (last) *ticket = 0;
    }
    __syncthreads();
    return last;
}

// Grid totals of the published partials, summed in a fixed order (valid in thread 0 of the last block).
template <int K>
__device__ void sum_partials(const double* partials, double (&v)[K]) {
    const volatile double* p = partials;
#pragma unroll
    for (int k = 0; k < K; ++k) {
        v[k] = 0.0;
        for (int i = threadIdx.x; i < gridDim.x; i += BLOCK) v[k] += p[k * gridDim.x + i];
    }
    block_sums<BLOCK>(v);
}

// z = M^-1 r at row i (Jacobi when dinv is set, else the identity).
__device__ __forceinline__ real_t precondition(const real_t* dinv, int i, real_t r) {
    return dinv ? __ldg(&dinv[i]) * r : r;
}

// Vectors that other blocks write during a persistent kernel are read through plain pointers (not
// __ldg): the read-only cache path is not coherent within a kernel.

// p_new = z + beta p_old and q = A p_new over this thread's rows; returns its share of p_new . q.
// With x, also takes the two previous steps x += alpha_prev p_prev, then x += alpha p_old, where
// p_prev is what p_new's buffer held. The classic solvers' updates leave the steps to every second
// pass, which reads p_old anyway: x costs 12 bytes a row an iteration instead of 24.
__device__ double direction_product(const Matrix& A, const real_t* z, const real_t* p_old, real_t* p_new, real_t* q,
                                    real_t beta, real_t* x = nullptr, real_t alpha_prev = 0, real_t alpha = 0,
                                    const MatrixStage& stage = MatrixStage{}) {
    auto direction = [&](int j) { return fma(beta, p_old[j], z[j]); };
    double pq = 0.0;
    for_each_row_product(A, stage, direction, [&](int i, real_t qi, int part) {
        const real_t pn = direction(i);
        if (owns_row(part)) {
            if (x) x[i] = fma(alpha, p_old[i], fma(alpha_prev, p_new[i], x[i]));
            p_new[i] = pn;
        }
        if (completes_row(part)) q[i] = qi;
        if (adds_to_sums(part)) pq += (double)pn * (double)qi;
    });
    return pq;
}

// q = A p over this thread's rows, p stored; returns its share of p . q.
__device__ double stored_product(const Matrix& A, const MatrixStage& stage, const real_t* p, real_t* q) {
    double pq = 0.0;
    for_each_row_product(A, stage, [&](int j) { return p[j]; }, [&](int i, real_t qi, int part) {
        if (completes_row(part)) q[i] = qi;
        if (adds_to_sums(part)) pq += (double)p[i] * (double)qi;
    });
    return pq;
}

// alpha = rz / pq, or the reason there is no step along the new direction.
__device__ void direction_decision(State* st, double pq) {
    st->pq = pq;
    if (!isfinite(pq)) st->status = NOT_FINITE;
    else if (pq <= 0.0) st->status = BREAKDOWN;
    else st->alpha = st->rz / pq;
}

// Where a pointwise pass reads and writes r at row i, the thread's k-th row of the pass (rows i, i + G,
// ... for G the grid's threads): read from r, written to r_out (which may be r) ...
struct ResidualVectors {
    const real_t* r;
    real_t* r_out;
    __device__ real_t get(int, int i) const { return r[i]; }
    __device__ void set(int, int i, real_t v) const { r_out[i] = v; }
};

// ... or, for the thread's first `count` rows, in the block's dynamic shared memory (persistent classic
// kernel, stored gather: see pcg_run), the rest in r.
struct HeldResidual {
    real_t* held;  // [count][blockDim.x]
    int count;
    real_t* r;
    __device__ real_t get(int k, int i) const { return k < count ? held[k * blockDim.x + threadIdx.x] : r[i]; }
    __device__ void set(int k, int i, real_t v) const {
        if (k < count) held[k * blockDim.x + threadIdx.x] = v;
        else r[i] = v;
    }
};

// r_out = r - alpha q (unless start), z = M^-1 r_out (unless z is null) over the rows [0, n);
// accumulates r.z, r.r of the new r.
template <typename Residual>
__device__ __forceinline__ void update_rows(bool start, const Residual& residual, const real_t* q, const real_t* dinv,
                                            real_t* z, real_t alpha, int n, double& rz, double& rr) {
    const int stride = gridDim.x * blockDim.x;
    for (int k = 0, i = blockIdx.x * blockDim.x + threadIdx.x; i < n; ++k, i += stride) {
        real_t ri = residual.get(k, i);
        if (!start) {
            ri = fma(-alpha, q[i], ri);
            residual.set(k, i, ri);
        }
        const real_t zi = precondition(dinv, i, ri);
        if (z) z[i] = zi;
        rz += (double)ri * (double)zi;
        rr += (double)ri * (double)ri;
    }
}

// Classic decision after the update's r.z and ||r|| at iteration `it`: the stop reason, and while
// running beta and rz for the next direction (the set-up pass keeps beta 0 and the parity).
__device__ int update_decision(State* st, bool start, int it, double rz_new, double rnorm) {
    const int status = stop_reason(rnorm, st->tol, it, st->maxiter, rz_new, true);
    if (status == RUNNING) {
        st->beta = start ? 0.0 : rz_new / st->rz;
        st->rz = rz_new;
        if (!start) st->parity ^= 1;
    }
    return status;
}

// ---- One GPU: persistent kernels, `count` iterations per launch (fewer once the solve stops) ----
//
// Every block keeps the solver state in shared memory and, from the same grid totals, takes the same
// decisions; block 0 publishes them (state, history, progress, WHILE condition). A launch therefore
// replaces `count` kernel boundaries by grid reductions, and the three drivers (eager, graph, while)
// run the same kernel, so they produce the same bits. The set-up pass is an iteration taken while
// st->iteration is -1.
//
// A launch first stages the block's part of the matrix in the dynamic shared memory the loader gives
// it (stage_matrix, matrix.cu; none where the matrix does not fit), for all of its products.

// Threads per block of the persistent kernels (the loader may set it), and the threads each SM must
// hold at once (caps the registers; set by the loader, which sizes the grid by it).
#ifndef RUN_BLOCK
#define RUN_BLOCK 256
#endif
#define RUN_MIN_BLOCKS (RUN_BLOCK >= RUN_SM_THREADS ? 1 : RUN_SM_THREADS / RUN_BLOCK)

// Settle the decision of iteration `it` in the block's copy `s` (thread 0); block 0 publishes it.
__device__ void settle(State& s, State* st, int it, double rnorm, int status, double* history,
                       Progress* progress, unsigned long long handle) {
    s.iteration = it;
    s.rnorm = rnorm;
    s.status = status;
    if (blockIdx.x != 0) return;
    *st = s;
    record_decision(st, it, rnorm, status, history, progress, handle);
}

// x += alpha p_last, after x += alpha_prev p_prev when two steps are pending: the steps that x has
// not taken (st.x_steps of them) when a launch ends, so that x is exact between launches.
__device__ void take_pending_steps(real_t* x, const real_t* p_prev, const real_t* p_last, const State& s, int n) {
    if (s.x_steps == 0) return;
    const real_t alpha_prev = (real_t)s.alpha_prev, alpha = (real_t)s.alpha;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        real_t xi = x[i];
        if (s.x_steps == 2) xi = fma(alpha_prev, p_prev[i], xi);
        x[i] = fma(alpha, p_last[i], xi);
    }
}

// The residual a launch of pcg_run keeps on chip: with a stored gather, z = M^-1 r is read only at a
// row's own index (the product gathers p_new), so the direction pass forms it from r with the update's
// multiplication (the same bits) and z is never stored; and a thread's first `held` rows keep r in the
// block's dynamic shared memory from the launch's start to its end (the loader gives `held` only where
// nothing of the matrix is staged there). The update then reads q (and dinv) and writes nothing, the
// direction pass reads p_old (and dinv). H200, power-law graph of 1M rows (132 x 1024 threads), us an
// iteration: none held 79.2-79.3, 4 rows 76.4-78.1, 8 rows (64 KiB a block) 75.4-77.3 (MEASUREMENTS.md).
__device__ HeldResidual hold_residual(real_t* r, int held, int n) {
    extern __shared__ __align__(16) unsigned char held_memory[];
    const HeldResidual residual{(real_t*)held_memory, held, r};
    const int stride = gridDim.x * blockDim.x;
    for (int k = 0, i = blockIdx.x * blockDim.x + threadIdx.x; i < n && k < residual.count; ++k, i += stride)
        residual.held[k * blockDim.x + threadIdx.x] = r[i];
    return residual;
}

__device__ void release_residual(const HeldResidual& residual, int n) {
    const int stride = gridDim.x * blockDim.x;
    for (int k = 0, i = blockIdx.x * blockDim.x + threadIdx.x; i < n && k < residual.count; ++k, i += stride)
        residual.r[i] = residual.held[k * blockDim.x + threadIdx.x];
}

// Classic PCG, two grid reductions per iteration (see pcg_ref.direction_product and pcg_update):
//   p_new = z + beta p_old ; q = A p_new ; alpha = rz / p_new.q ;
//   x += alpha p_new ; r -= alpha q ; z = M^-1 r ; r.z, r.r ; decide ; beta = rz_new / rz.
// The set-up pass computes z = M^-1 r, r.z and r.r only.
//
// x takes its steps late, two at a time, in the pass that forms p_new (which reads p_old anyway, and
// p_prev where p_new goes): st.x_steps counts the steps pending, alpha along p_old and, when two,
// alpha_prev along p_prev. x then costs 12 bytes a row an iteration instead of 24, and takes the
// same fma's in the same order, so its bits do not change. A launch ends with the steps still
// pending (take_pending_steps).
extern "C" __global__ void __launch_bounds__(RUN_BLOCK, RUN_MIN_BLOCKS)
pcg_run(const ClassicRun a, unsigned long long handle, int count) {
    __shared__ State s;
    if (threadIdx.x == 0) s = *a.st;
    const int n = a.A.n;
    const MatrixStage stage = a.held ? MatrixStage{} : stage_matrix(a.A);
    const HeldResidual residual = hold_residual(a.r, a.held, n);
    __syncthreads();
    unsigned int tag = *a.epoch;
    bool updated_and_stopped = false;  // the last direction is then p_new, not p_old (no parity flip)
    for (int c = 0; c < count && !finished(s, handle); ++c) {
        const bool start = s.iteration < 0;
        real_t* p_new = s.parity ? a.p0 : a.p1;
        if (!start) {
            const real_t* p_old = s.parity ? a.p1 : a.p0;
            const real_t beta = (real_t)s.beta;
            const bool steps = s.x_steps == 2;
            const real_t alpha_prev = (real_t)s.alpha_prev, alpha = (real_t)s.alpha;
            double pq[1];
            if (GATHER_STORED) {
                const int stride = gridDim.x * blockDim.x;
                for (int k = 0, i = blockIdx.x * blockDim.x + threadIdx.x; i < n; ++k, i += stride) {
                    const real_t po = p_old[i];
                    if (steps) a.x[i] = fma(alpha, po, fma(alpha_prev, p_new[i], a.x[i]));
                    p_new[i] = fma(beta, po, precondition(a.dinv, i, residual.get(k, i)));
                }
                grid_barrier(a.arrivals, tag);
                pq[0] = stored_product(a.A, stage, p_new, a.q);
            } else {
                pq[0] = direction_product(a.A, a.z, p_old, p_new, a.q, beta, steps ? a.x : nullptr, alpha_prev,
                                          alpha, stage);
            }
            grid_sums<RUN_BLOCK>(a.slots, a.arrivals, pq, tag);
            if (threadIdx.x == 0) {
                const int pending = steps ? 0 : s.x_steps;  // 0, or 1: alpha along p_old
                s.alpha_prev = s.alpha;
                direction_decision(&s, pq[0]);
                s.x_steps = pending + (s.status == RUNNING);
                if (s.status != RUNNING)
                    settle(s, a.st, s.iteration, s.rnorm, s.status, a.history, a.progress, handle);
            }
            __syncthreads();
            if (s.status != RUNNING) break;
        }
        double sums[2] = {0.0, 0.0};  // r.z, r.r
        update_rows(start, residual, a.q, a.dinv, GATHER_STORED ? nullptr : a.z, (real_t)s.alpha, n, sums[0], sums[1]);
        grid_sums<RUN_BLOCK>(a.slots, a.arrivals, sums, tag);
        if (threadIdx.x == 0) {
            const int it = s.iteration + 1;
            const double rnorm = sqrt(sums[1]);
            settle(s, a.st, it, rnorm, update_decision(&s, start, it, sums[0], rnorm), a.history, a.progress,
                   handle);
        }
        __syncthreads();
        updated_and_stopped = !start && s.status != RUNNING;
    }
    release_residual(residual, n);
    // the latest direction is p_old of the next iteration, unless the update stopped the solve
    const bool newest_in_p1 = s.parity ^ updated_and_stopped;
    take_pending_steps(a.x, newest_in_p1 ? a.p0 : a.p1, newest_in_p1 ? a.p1 : a.p0, s, n);
    if (blockIdx.x == 0 && threadIdx.x == 0) a.st->x_steps = 0;
    end_epoch(a.epoch, tag);
}

// Chronopoulos-Gear PCG, one grid reduction per iteration (see pcg_ref.pcg1_step):
//   s = w + beta s ; p = u + beta p ; x += alpha p ; r -= alpha s ; u = M^-1 r ; w = A u ;
//   r.r, r.u, w.u ; decide.
// The set-up pass is the same iteration with alpha = beta = 0 on zeroed p, s and w: it leaves x and r
// as they are and computes u = M^-1 r and w = A u. r, s and w are double-buffered: `parity` selects
// the old ones.
//
// Formed on the fly (GATHER_STORED 0, single_reduction_rows): the product A u needs u at neighbouring
// rows before their owners have written it, so every thread recomputes the u entries it reads from
// the previous iteration's r, s and w with the same operations as their owners: the result is exactly
// A u, with no barrier before the product. On one rank of the distributed solver the columns run past
// the n owned rows into h halo entries: r, s and dinv hold the halo's copies at [n, n + h), the old w
// there comes from `w_halo` (received from the owners), and the copies of r and s are advanced here by
// their owners' operations.
__device__ void single_reduction_rows(const Matrix& A, const real_t* dinv, real_t* x, real_t* p, real_t* r0,
                                      real_t* r1, real_t* s0, real_t* s1, real_t* w0, real_t* w1,
                                      const real_t* w_halo, const State& state, int h, double (&sums)[3],
                                      const MatrixStage& stage = MatrixStage{}) {
    const int n = A.n, parity = state.parity;
    const real_t alpha = (real_t)state.alpha, beta = (real_t)state.beta;
    const real_t* r_old = parity ? r1 : r0;
    const real_t* s_old = parity ? s1 : s0;
    const real_t* w_old = parity ? w1 : w0;
    real_t* r_new = parity ? r0 : r1;
    real_t* s_new = parity ? s0 : s1;
    real_t* w_new = parity ? w0 : w1;
    auto next_s = [&](int j) { return fma(beta, s_old[j], j < n ? w_old[j] : w_halo[j - n]); };
    auto next_r = [&](int j, real_t sj) { return fma(-alpha, sj, r_old[j]); };
    auto next_u = [&](int j) { return precondition(dinv, j, next_r(j, next_s(j))); };
    for_each_row_product(A, stage, next_u, [&](int i, real_t wi, int part) {
        const real_t si = next_s(i), ri = next_r(i, si), ui = precondition(dinv, i, ri);
        if (owns_row(part)) {
            const real_t pi = fma(beta, p[i], precondition(dinv, i, r_old[i]));
            p[i] = pi;
            x[i] = fma(alpha, pi, x[i]);
            s_new[i] = si;
            r_new[i] = ri;
            sums[0] += (double)ri * (double)ri;
            sums[1] += (double)ri * (double)ui;
        }
        if (completes_row(part)) w_new[i] = wi;
        if (adds_to_sums(part)) sums[2] += (double)wi * (double)ui;
    });
    for (int j = n + blockIdx.x * blockDim.x + threadIdx.x; j < n + h; j += gridDim.x * blockDim.x) {
        const real_t sj = next_s(j);
        s_new[j] = sj;
        r_new[j] = next_r(j, sj);
    }
}

// Stored (GATHER_STORED 1): the same iteration with u formed row by row into `u`, then, after a grid
// barrier, w = A u gathering that one vector.
__device__ void single_reduction_pointwise(const SingleReductionRun& a, const State& state, double (&sums)[3]) {
    const int n = a.A.n, parity = state.parity;
    const real_t alpha = (real_t)state.alpha, beta = (real_t)state.beta;
    const real_t* r_old = parity ? a.r1 : a.r0;
    const real_t* s_old = parity ? a.s1 : a.s0;
    const real_t* w_old = parity ? a.w1 : a.w0;
    real_t* r_new = parity ? a.r0 : a.r1;
    real_t* s_new = parity ? a.s0 : a.s1;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const real_t si = fma(beta, s_old[i], w_old[i]);
        const real_t ri = fma(-alpha, si, r_old[i]);
        const real_t ui = precondition(a.dinv, i, ri);
        const real_t pi = fma(beta, a.p[i], precondition(a.dinv, i, r_old[i]));
        a.p[i] = pi;
        a.x[i] = fma(alpha, pi, a.x[i]);
        s_new[i] = si;
        r_new[i] = ri;
        a.u[i] = ui;
        sums[0] += (double)ri * (double)ri;
        sums[1] += (double)ri * (double)ui;
    }
}

extern "C" __global__ void __launch_bounds__(RUN_BLOCK, RUN_MIN_BLOCKS)
pcg1_run(const SingleReductionRun a, unsigned long long handle, int count) {
    __shared__ State s;
    if (threadIdx.x == 0) s = *a.st;
    const MatrixStage stage = stage_matrix(a.A);
    __syncthreads();
    unsigned int tag = *a.epoch;
    for (int c = 0; c < count && !finished(s, handle); ++c) {
        double sums[3] = {0.0, 0.0, 0.0};  // r.r, r.u, w.u
        if (GATHER_STORED) {
            single_reduction_pointwise(a, s, sums);
            grid_barrier(a.arrivals, tag);
            real_t* w_new = s.parity ? a.w0 : a.w1;
            for_each_row_product(a.A, stage, [&](int j) { return a.u[j]; }, [&](int i, real_t wi, int part) {
                if (completes_row(part)) w_new[i] = wi;
                if (adds_to_sums(part)) sums[2] += (double)wi * (double)a.u[i];
            });
        } else {
            single_reduction_rows(a.A, a.dinv, a.x, a.p, a.r0, a.r1, a.s0, a.s1, a.w0, a.w1, nullptr, s, 0, sums,
                                  stage);
        }
        grid_sums<RUN_BLOCK>(a.slots, a.arrivals, sums, tag);
        if (threadIdx.x == 0) {
            const int it = s.iteration + 1;
            const double rnorm = sqrt(sums[0]);
            const int status = single_reduction_decision(&s, s.iteration < 0, it, rnorm, sums[1], sums[2]);
            if (status == RUNNING) s.parity ^= 1;
            settle(s, a.st, it, rnorm, status, a.history, a.progress, handle);
        }
        __syncthreads();
    }
    end_epoch(a.epoch, tag);
}

// out = b - A x
extern "C" __global__ void __launch_bounds__(BLOCK)
matrix_residual(const Matrix A, const real_t* __restrict__ x, const real_t* __restrict__ b,
                real_t* __restrict__ out) {
    for_each_row_product(A, [&](int j) { return x[j]; }, [&](int i, real_t ax, int part) {
        if (completes_row(part)) out[i] = b[i] - ax;
    });
}
