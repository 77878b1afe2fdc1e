// Kernels of the distributed PCG (solvers/distributed/gpu.py); see dist_ref.py for their NumPy meaning.
//
// Compiled after pcg.cu, whose State, row products and block reductions they use. A rank's matrix
// block has its n owned rows and n + h columns: the owned ones, then the h halo entries (owned by
// other ranks, see solvers/distributed/partition.py), so one product covers a whole row. Every vector
// the product reads at neighbouring rows is stored with the halo's copy at [n, n + h). Every kernel
// takes the rank's buffers as one struct, DistRun (generated, see solvers/distributed/gpu.py).
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
dist_pack(const DistRun a, const real_t* v0, const real_t* v1) {
    const real_t* v = a.st->parity ? v0 : v1;
    for (int k = blockIdx.x * BLOCK + threadIdx.x; k < a.nsend; k += gridDim.x * BLOCK)
        a.sendbuf[k] = v[a.send_index[k]];
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

// Chronopoulos-Gear decision from reduced = [r.r, gamma = r.u, delta = w.u] (stopping.cu's
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
dist_pack_next_z(const DistRun a) {
    const double pq = a.reduced[0];
    if (a.st->status != RUNNING || !isfinite(pq) || pq <= 0.0) return;
    const real_t alpha = (real_t)(a.st->rz / pq);
    const real_t* r = a.st->parity ? a.r1 : a.r0;
    for (int k = blockIdx.x * BLOCK + threadIdx.x; k < a.nsend; k += gridDim.x * BLOCK) {
        const int i = a.send_index[k];
        a.sendbuf[k] = precondition(a.dinv, i, fma(-alpha, a.q[i], r[i]));
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
dist_spmv_dot(const DistRun a) {
    bool deciding;
    const State s = decided_state(a.st, a.reduced, a.pending, deciding, classic_decision);
    if (s.status != RUNNING && !deciding) return;
    double sums[1] = {0.0};
    const bool steps = s.status == RUNNING && (s.iteration & 1);
    if (s.status == RUNNING) {
        const int n = a.A.n;
        const real_t beta = (real_t)s.beta;
        const real_t* p_old = s.parity ? a.p1 : a.p0;
        real_t* p_new = s.parity ? a.p0 : a.p1;
        sums[0] = direction_product(a.A, a.z, p_old, p_new, a.q, beta, steps ? a.x : nullptr,
                                    (real_t)s.alpha_prev, (real_t)s.alpha);
        for (int j = n + blockIdx.x * BLOCK + threadIdx.x; j < n + a.h; j += gridDim.x * BLOCK)
            p_new[j] = fma(beta, p_old[j], a.z[j]);
    }
    if (!publish_partials(a.partials, sums, &a.st->ticket)) return;
    sum_partials(a.partials, sums);
    if (threadIdx.x == 0) {
        finish_decision(a.st, a.reduced, a.pending, a.history, deciding, classic_decision);
        if (steps) a.st->alpha_prev = a.st->alpha = 0.0;  // taken
        a.sums[0] = sums[0];
    }
}

// Classic PCG, r double-buffered (r0, r1; st->parity selects the one read, the other is written, so
// that dist_pack_next_z can read r beside this kernel). START: z = M^-1 r. Otherwise, with pq =
// reduced[0] (the allreduced p.Ap): stop on a bad pq, else r -= alpha q, z = M^-1 r with alpha =
// rz / pq. x does not take the step here (it would cost 24 bytes a row): alpha joins st's pending
// steps (alpha_prev, alpha), which every second product, or dist_finish, takes. Partial r.z, r.r ->
// sums[0..1].
template <bool START>
__device__ void classic_update(const DistRun& a) {
    State* st = a.st;
    if (st->status != RUNNING) return;
    real_t alpha = 0;
    if (!START) {
        const double pq = a.reduced[0];
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
    update_rows(START, ResidualVectors{parity ? a.r1 : a.r0, parity ? a.r0 : a.r1}, a.q, a.dinv, a.z, alpha, a.A.n,
                v[0], v[1]);
    publish_sums(v, st, a.partials, a.sums + 1, a.pending);
}

extern "C" __global__ void __launch_bounds__(BLOCK) dist_update(const DistRun a) { classic_update<false>(a); }

extern "C" __global__ void __launch_bounds__(BLOCK) dist_start(const DistRun a) { classic_update<true>(a); }

// After a classic solve has stopped: the steps no product took, x += alpha_prev p_prev + alpha p
// (p the last direction, p_prev the one before; a step is 0 once taken, and alpha is 0 when the
// last update stopped on a bad p.Ap).
extern "C" __global__ void __launch_bounds__(BLOCK)
dist_finish(const DistRun a) {
    const real_t alpha_prev = (real_t)a.st->alpha_prev, alpha = (real_t)a.st->alpha;
    const real_t* p = a.st->parity ? a.p0 : a.p1;
    const real_t* p_prev = a.st->parity ? a.p1 : a.p0;
    for (int i = blockIdx.x * BLOCK + threadIdx.x; i < a.A.n; i += gridDim.x * BLOCK) {
        real_t xi = a.x[i];
        if (alpha_prev != 0) xi = fma(alpha_prev, p_prev[i], xi);
        if (alpha != 0) xi = fma(alpha, p[i], xi);
        a.x[i] = xi;
    }
}

// The pending decision on its own (the host reads the status next).
extern "C" __global__ void dist_decide(const DistRun a) {
    if (threadIdx.x || blockIdx.x || a.st->status != RUNNING || !*a.pending) return;
    finish_decision(a.st, a.reduced, a.pending, a.history, true, classic_decision);
}

// Chronopoulos-Gear PCG, after the pending decision: one iteration of pcg1_run over the owned rows
// (pcg.cu's single_reduction_rows, which also advances the halo's copies of r and s); partial r.r,
// r.u, w.u -> sums[0..2], pending. Nothing once the solve has stopped. The set-up pass is the
// iteration taken while st->iteration is -1.
extern "C" __global__ void __launch_bounds__(BLOCK, 4)
dist_cg1_step(const DistRun a) {
    bool deciding;
    const State s = decided_state(a.st, a.reduced, a.pending, deciding, cg1_decision);
    if (s.status != RUNNING && !deciding) return;
    double v[3] = {0.0, 0.0, 0.0};
    if (s.status == RUNNING)
        single_reduction_rows(a.A, a.dinv, a.x, a.p, a.r0, a.r1, a.s0, a.s1, a.w0, a.w1, a.w_halo, s, a.h, v);
    if (!publish_partials(a.partials, v, &a.st->ticket)) return;
    sum_partials(a.partials, v);
    if (threadIdx.x == 0) {
        finish_decision(a.st, a.reduced, a.pending, a.history, deciding, cg1_decision);
        if (s.status == RUNNING) {
            for (int k = 0; k < 3; ++k) a.sums[k] = v[k];
            *a.pending = 1;
        }
    }
}

// The pending decision on its own (the host reads the status next).
extern "C" __global__ void dist_cg1_decide(const DistRun a) {
    if (threadIdx.x || blockIdx.x || a.st->status != RUNNING || !*a.pending) return;
    finish_decision(a.st, a.reduced, a.pending, a.history, true, cg1_decision);
}
