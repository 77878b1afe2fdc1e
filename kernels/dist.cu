// Kernels of the distributed PCG (solvers/dist/gpu.py); see dist_ref.py for their NumPy meaning.
//
// Compiled after pcg.cu, whose State, row products and block reductions they use. A rank's matrix
// block has its n owned rows and n + h columns: the owned ones, then the h halo entries (owned by
// other ranks, see solvers/dist/partition.py), so one product covers a whole row. Every vector the
// product reads at neighbouring rows is stored with the halo's copy at [n, n + h).
//
// The kernels only produce this rank's partial sums: the decisions are taken from the allreduced
// values, identical on every rank, so every rank stops at the same iteration. `pending` is set when
// new partial sums have been produced and cleared by the decision, so that it acts once on them.
// The product kernels (dist_spmv_dot, dist_cg1_step) take the pending decision themselves, saving
// a launch: every block decides on a private copy of the state, and the last block to finish (all
// others have read the state by then) writes the decision; dist_decide / dist_cg1_decide take it
// alone, before the host reads the status.

// out[k] = v[idx[k]]: the entries of v that neighbours need, where v is the buffer of the pair
// (v0, v1) that the last update wrote: v1 while st's parity is 0, else v0 (pass v0 = v1 for a
// vector with one buffer).
extern "C" __global__ void __launch_bounds__(BLOCK)
dist_pack(const real_t* v0, const real_t* v1, const State* st, const int* __restrict__ idx,
          real_t* __restrict__ out, int m) {
    const real_t* v = st->parity ? v0 : v1;
    for (int k = blockIdx.x * BLOCK + threadIdx.x; k < m; k += gridDim.x * BLOCK) out[k] = v[idx[k]];
}

// Classic decision from reduced = [pq, rz_new, rr] (pcg.cu's update_decision, as on one GPU); the
// first one after a reset (st->iteration == -1) closes the set-up pass. Returns the status.
__device__ int classic_decision(State* st, const double* reduced, double* history) {
    const bool start = st->iteration < 0;
    const int it = st->iteration + 1;
    const double rnorm = sqrt(reduced[2]);
    const int status = update_decision(st, start, it, reduced[1], rnorm);
    record_decision(st, it, rnorm, status, history, nullptr, 0);
    return status;
}

// Chronopoulos-Gear decision from reduced = [r.r, gamma = r.u, delta = w.u] (pcg.cu's
// single_reduction_decision; the buffers swap while running, as in pcg1_run).
__device__ int cg1_decision(State* st, const double* reduced, double* history) {
    const int it = st->iteration + 1;
    const double rnorm = sqrt(reduced[0]);
    const int status = single_reduction_decision(st, st->iteration < 0, it, rnorm, reduced[1], reduced[2]);
    if (status == RUNNING) st->parity ^= 1;
    record_decision(st, it, rnorm, status, history, nullptr, 0);
    return status;
}

// The state a product kernel runs on: *st, with the pending decision taken (`deciding`) on this
// block's copy; the last block applies it to *st with finish_decision.
template <typename Decision>
__device__ State decided_state(const State* st, const double* reduced, const int* pending, bool& deciding,
                               Decision decision) {
    State s = *st;  // every field in one round trip
    deciding = s.status == RUNNING && *pending;
    if (deciding) decision(&s, reduced, nullptr);
    return s;
}

template <typename Decision>
__device__ void finish_decision(State* st, const double* reduced, int* pending, double* history, bool deciding,
                                Decision decision) {
    if (!deciding) return;
    *pending = 0;
    decision(st, reduced, history);
}

// Classic PCG: the send buffer of the z that dist_update computes, taken on the communication
// stream while the update runs, so that the halo exchange overlaps it: out[k] = M^-1 (r - alpha q) at
// row idx[k], with the update's alpha and operations (update_rows), hence its z bit for bit. r is
// the buffer of (r0, r1) the update reads (it writes the other one). Nothing on a bad pq (the update
// stops the solve).
extern "C" __global__ void __launch_bounds__(BLOCK)
dist_pack_next_z(const real_t* __restrict__ r0, const real_t* __restrict__ r1, const real_t* __restrict__ q,
                 const real_t* __restrict__ dinv, const State* st, const double* reduced,
                 const int* __restrict__ idx, real_t* __restrict__ out, int m) {
    const double pq = reduced[0];
    if (st->status != RUNNING || !isfinite(pq) || pq <= 0.0) return;
    const real_t alpha = (real_t)(st->rz / pq);
    const real_t* r = st->parity ? r1 : r0;
    for (int k = blockIdx.x * BLOCK + threadIdx.x; k < m; k += gridDim.x * BLOCK) {
        const int i = idx[k];
        const real_t ri = fma(-alpha, q[i], r[i]);
        out[k] = dinv ? dinv[i] * ri : ri;
    }
}

// Publish this kernel's K partial sums into sums[0..K) (last block) and mark them pending.
template <int K>
__device__ void publish_sums(double (&v)[K], State* st, double* partials, double* sums, int* pending) {
    if (!publish_partials(partials, v, &st->ticket)) return;
    sum_partials(partials, v);
    if (threadIdx.x == 0) {
#pragma unroll
        for (int k = 0; k < K; ++k) sums[k] = v[k];
        *pending = 1;
    }
}

// Classic PCG's product, after the pending decision: p_new = z + beta p_old and q = A p_new over the
// owned rows, p_new also at the halo entries (the owners' fma on the received z, so the copy matches
// the owner's p bit for bit and only z crosses the network); *out = this rank's p_new . q. Every
// second product (odd iteration) also takes the two steps x += alpha_prev p_prev + alpha p_old that
// the updates left to it (see dist_update). Nothing once the solve has stopped.
// At least 4 blocks an SM cap it at 64 registers (124 without, 2 blocks an SM): enough rows in
// flight to stream at bandwidth, as pcg_run's direction_product does at the same cap.
extern "C" __global__ void __launch_bounds__(BLOCK, 4)
dist_spmv_dot(const int* __restrict__ rowptr, const int* __restrict__ col, const real_t* __restrict__ val,
              const real_t* z, real_t* p0, real_t* p1, real_t* q, real_t* x, State* st, const double* reduced,
              int* pending, double* history, double* partials, double* out, int n, int h) {
    bool deciding;
    const State s = decided_state(st, reduced, pending, deciding, classic_decision);
    if (s.status != RUNNING && !deciding) return;
    double sums[1] = {0.0};
    const bool steps = s.status == RUNNING && (s.iteration & 1);
    if (s.status == RUNNING) {
        const real_t beta = (real_t)s.beta;
        const real_t* p_old = s.parity ? p1 : p0;
        real_t* p_new = s.parity ? p0 : p1;
        sums[0] = direction_product(rowptr, col, val, z, p_old, p_new, q, beta, n, steps ? x : nullptr,
                                    (real_t)s.alpha_prev, (real_t)s.alpha);
        for (int j = n + blockIdx.x * BLOCK + threadIdx.x; j < n + h; j += gridDim.x * BLOCK)
            p_new[j] = fma(beta, p_old[j], z[j]);
    }
    if (!publish_partials(partials, sums, &st->ticket)) return;
    sum_partials(partials, sums);
    if (threadIdx.x == 0) {
        finish_decision(st, reduced, pending, history, deciding, classic_decision);
        if (steps) st->alpha_prev = st->alpha = 0.0;  // taken
        *out = sums[0];
    }
}

// Classic PCG, r double-buffered (r0, r1; st->parity selects the one read, the other is written, so
// that dist_pack_next_z can read r beside this kernel). START: z = M^-1 r. Otherwise, with pq =
// reduced[0] (the allreduced p.Ap): stop on a bad pq, else r -= alpha q, z = M^-1 r with alpha =
// rz / pq. x does not take the step here (it would cost 24 bytes a row): alpha joins st's pending
// steps (alpha_prev, alpha), which every second product, or dist_finish, takes. Partial r.z, r.r ->
// sums[0..1].
template <bool START>
__device__ void classic_update(real_t* r0, real_t* r1, const real_t* __restrict__ q,
                               const real_t* __restrict__ dinv, real_t* __restrict__ z, State* st,
                               const double* reduced, double* partials, double* sums, int* pending, int n) {
    if (st->status != RUNNING) return;
    real_t alpha = 0;
    if (!START) {
        const double pq = reduced[0];
        const bool bad = !isfinite(pq) || pq <= 0.0;  // every block sees the same pq
        if (blockIdx.x == 0 && threadIdx.x == 0) {  // no block reads st->alpha here
            st->alpha_prev = st->alpha;
            st->alpha = bad ? 0.0 : st->rz / pq;
            if (bad) {
                st->pq = pq;
                st->status = isfinite(pq) ? BREAKDOWN : NOT_FINITE;
            }
        }
        if (bad) return;
        alpha = (real_t)(st->rz / pq);
    }
    double v[2] = {0.0, 0.0};  // r.z, r.r
    const int parity = st->parity;  // no block writes it here
    update_rows(START, nullptr, parity ? r1 : r0, parity ? r0 : r1, q, nullptr, dinv, z, alpha, n, v[0], v[1]);
    publish_sums(v, st, partials, sums, pending);
}

extern "C" __global__ void __launch_bounds__(BLOCK)
dist_update(real_t* r0, real_t* r1, const real_t* q, const real_t* dinv, real_t* z, State* st,
            const double* reduced, double* partials, double* sums, int* pending, int n) {
    classic_update<false>(r0, r1, q, dinv, z, st, reduced, partials, sums, pending, n);
}

extern "C" __global__ void __launch_bounds__(BLOCK)
dist_start(real_t* r0, real_t* r1, const real_t* q, const real_t* dinv, real_t* z, State* st,
           const double* reduced, double* partials, double* sums, int* pending, int n) {
    classic_update<true>(r0, r1, q, dinv, z, st, reduced, partials, sums, pending, n);
}

// After a classic solve has stopped: the steps no product took, x += alpha_prev p_prev + alpha p
// (p the last direction, p_prev the one before; a step is 0 once taken, and alpha is 0 when the
// last update stopped on a bad p.Ap).
extern "C" __global__ void __launch_bounds__(BLOCK)
dist_finish(real_t* x, const real_t* p0, const real_t* p1, const State* st, int n) {
    const real_t alpha_prev = (real_t)st->alpha_prev, alpha = (real_t)st->alpha;
    const real_t* p = st->parity ? p0 : p1;
    const real_t* p_prev = st->parity ? p1 : p0;
    for (int i = blockIdx.x * BLOCK + threadIdx.x; i < n; i += gridDim.x * BLOCK) {
        real_t xi = x[i];
        if (alpha_prev != 0) xi = fma(alpha_prev, p_prev[i], xi);
        if (alpha != 0) xi = fma(alpha, p[i], xi);
        x[i] = xi;
    }
}

// The pending decision on its own (the host reads the status next).
extern "C" __global__ void dist_decide(State* st, const double* reduced, int* pending, double* history) {
    if (threadIdx.x || blockIdx.x || st->status != RUNNING || !*pending) return;
    finish_decision(st, reduced, pending, history, true, classic_decision);
}

// Chronopoulos-Gear PCG, after the pending decision: one iteration of pcg1_run over the owned rows
// (pcg.cu's single_reduction_rows, which also advances the halo's copies of r and s); partial r.r,
// r.u, w.u -> sums[0..2], pending. Nothing once the solve has stopped. The set-up pass is the
// iteration taken while st->iteration is -1.
extern "C" __global__ void __launch_bounds__(BLOCK, 4)
dist_cg1_step(const int* __restrict__ rowptr, const int* __restrict__ col, const real_t* __restrict__ val,
              const real_t* __restrict__ dinv, real_t* x, real_t* p, real_t* r0, real_t* r1, real_t* s0,
              real_t* s1, real_t* w0, real_t* w1, const real_t* w_halo, State* st, const double* reduced,
              int* pending, double* history, double* partials, double* sums, int n, int h) {
    bool deciding;
    const State s = decided_state(st, reduced, pending, deciding, cg1_decision);
    if (s.status != RUNNING && !deciding) return;
    double v[3] = {0.0, 0.0, 0.0};
    if (s.status == RUNNING)
        single_reduction_rows(rowptr, col, val, dinv, x, p, r0, r1, s0, s1, w0, w1, w_halo, s, n, h, v);
    if (!publish_partials(partials, v, &st->ticket)) return;
    sum_partials(partials, v);
    if (threadIdx.x == 0) {
        finish_decision(st, reduced, pending, history, deciding, cg1_decision);
        if (s.status == RUNNING) {
            for (int k = 0; k < 3; ++k) sums[k] = v[k];
            *pending = 1;
        }
    }
}

// The pending decision on its own (the host reads the status next).
extern "C" __global__ void dist_cg1_decide(State* st, const double* reduced, int* pending, double* history) {
    if (threadIdx.x || blockIdx.x || st->status != RUNNING || !*pending) return;
    finish_decision(st, reduced, pending, history, true, cg1_decision);
}
