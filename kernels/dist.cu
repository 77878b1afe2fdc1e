// Kernels of the distributed PCG (solvers/dist/gpu.py); see dist_ref.py for their NumPy meaning.
//
// Compiled after pcg.cu, whose State, row products and block reductions they use. A rank's matrix
// block has its n owned rows and n + h columns: the owned ones, then the h halo entries (owned by
// other ranks, see solvers/dist/partition.py), so one product covers a whole row. Every vector the
// product reads at neighbouring rows is stored with the halo's copy at [n, n + h).
//
// The kernels only produce this rank's partial sums: the decisions are taken by dist_decide /
// dist_cg1_decide from the allreduced values, identical on every rank, so every rank stops at the
// same iteration. `pending` is set when new partial sums have been produced and cleared by the
// decide kernel, so a decide launched twice on the same sums (once at the end of a block of
// iterations, once at the head of the next) acts once.

// out[k] = v[idx[k]]: the entries of v that neighbours need, where v is the buffer of the pair
// (v0, v1) that the last update wrote: v1 while st's parity is 0, else v0 (pass v0 = v1 for a
// vector with one buffer).
extern "C" __global__ void __launch_bounds__(BLOCK)
dist_pack(const real_t* v0, const real_t* v1, const State* st, const int* __restrict__ idx,
          real_t* __restrict__ out, int m) {
    const real_t* v = st->parity ? v0 : v1;
    for (int k = blockIdx.x * BLOCK + threadIdx.x; k < m; k += gridDim.x * BLOCK) out[k] = v[idx[k]];
}

// Classic PCG: the send buffer of the z that dist_update is about to compute, taken before it runs
// so that the halo exchange overlaps the update: out[k] = M^-1 (r - alpha q) at row idx[k], with the
// update's alpha and operations (update_rows), hence its z bit for bit. Nothing on a bad pq (the
// update stops the solve).
extern "C" __global__ void __launch_bounds__(BLOCK)
dist_pack_next_z(const real_t* __restrict__ r, const real_t* __restrict__ q, const real_t* __restrict__ dinv,
                 const State* st, const double* reduced, const int* __restrict__ idx, real_t* __restrict__ out,
                 int m) {
    const double pq = reduced[0];
    if (st->status != RUNNING || !isfinite(pq) || pq <= 0.0) return;
    const real_t alpha = (real_t)(st->rz / pq);
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

// Classic PCG's product: the previous step x += alpha p_old (see dist_update), p_new = z + beta p_old
// and q = A p_new over the owned rows, p_new also at the halo entries (the owners' fma on the
// received z, so the copy matches the owner's p bit for bit and only z crosses the network);
// *out = this rank's p_new . q. Skipped once st has stopped.
// At least 4 blocks an SM cap it at 64 registers (124 without, 2 blocks an SM): enough rows in
// flight to stream at bandwidth, as pcg_run's direction_product does at the same cap.
extern "C" __global__ void __launch_bounds__(BLOCK, 4)
dist_spmv_dot(const int* __restrict__ rowptr, const int* __restrict__ col, const real_t* __restrict__ val,
              const real_t* z, real_t* p0, real_t* p1, real_t* q, real_t* x, State* st, double* partials,
              double* out, int n, int h) {
    const State s = *st;  // every field in one round trip, before the branch that needs one
    if (s.status != RUNNING) return;
    const real_t beta = (real_t)s.beta;
    const real_t* p_old = s.parity ? p1 : p0;
    real_t* p_new = s.parity ? p0 : p1;
    double sums[1] = {direction_product(rowptr, col, val, z, p_old, p_new, q, beta, n, x, (real_t)s.alpha)};
    for (int j = n + blockIdx.x * BLOCK + threadIdx.x; j < n + h; j += gridDim.x * BLOCK)
        p_new[j] = fma(beta, p_old[j], z[j]);
    if (!publish_partials(partials, sums, &st->ticket)) return;
    sum_partials(partials, sums);
    if (threadIdx.x == 0) *out = sums[0];
}

// Classic PCG. START: z = M^-1 r. Otherwise, with pq = reduced[0] (the allreduced p.Ap): stop on a bad
// pq, else r -= alpha q, z = M^-1 r with alpha = rz / pq, kept in st for the step x += alpha p that
// the next product (or dist_finish) takes. Partial r.z, r.r -> sums[0..1].
template <bool START>
__device__ void classic_update(real_t* __restrict__ r, const real_t* __restrict__ q,
                               const real_t* __restrict__ dinv, real_t* __restrict__ z, State* st,
                               const double* reduced, double* partials, double* sums, int* pending, int n) {
    if (st->status != RUNNING) return;
    real_t alpha = 0;
    if (!START) {
        const double pq = reduced[0];
        const bool bad = !isfinite(pq) || pq <= 0.0;  // every block sees the same pq
        if (blockIdx.x == 0 && threadIdx.x == 0) {  // no block reads st->alpha here
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
    update_rows(START, nullptr, r, q, nullptr, dinv, z, alpha, n, v[0], v[1]);
    publish_sums(v, st, partials, sums, pending);
}

extern "C" __global__ void __launch_bounds__(BLOCK)
dist_update(real_t* r, const real_t* q, const real_t* dinv, real_t* z, State* st, const double* reduced,
            double* partials, double* sums, int* pending, int n) {
    classic_update<false>(r, q, dinv, z, st, reduced, partials, sums, pending, n);
}

extern "C" __global__ void __launch_bounds__(BLOCK)
dist_start(real_t* r, const real_t* q, const real_t* dinv, real_t* z, State* st, const double* reduced,
           double* partials, double* sums, int* pending, int n) {
    classic_update<true>(r, q, dinv, z, st, reduced, partials, sums, pending, n);
}

// After a classic solve has stopped: the step x += alpha p of its last update, which no product
// took (alpha is 0 when that update stopped on a bad p.Ap, or when there was none).
extern "C" __global__ void __launch_bounds__(BLOCK)
dist_finish(real_t* x, const real_t* p0, const real_t* p1, const State* st, int n) {
    const real_t alpha = (real_t)st->alpha;
    if (alpha == 0) return;
    const real_t* p = st->parity ? p0 : p1;
    for (int i = blockIdx.x * BLOCK + threadIdx.x; i < n; i += gridDim.x * BLOCK) x[i] = fma(alpha, p[i], x[i]);
}

// Classic PCG decision from reduced = [pq, rz_new, rr]; the first call after a reset
// (st->iteration == -1) is the set-up pass; pcg.cu's update_decision, as on one GPU.
extern "C" __global__ void dist_decide(State* st, const double* reduced, int* pending, double* history) {
    if (threadIdx.x || blockIdx.x || st->status != RUNNING || !*pending) return;
    *pending = 0;
    const bool start = st->iteration < 0;
    const int it = st->iteration + 1;
    const double rnorm = sqrt(reduced[2]);
    record_decision(st, it, rnorm, update_decision(st, start, it, reduced[1], rnorm), history, nullptr, 0);
}

// Chronopoulos-Gear PCG: one iteration of pcg1_run over the owned rows (pcg.cu's
// single_reduction_rows, which also advances the halo's copies of r and s); partial r.r, r.u, w.u
// -> sums[0..2]. The set-up pass is the iteration taken while st->iteration is -1.
extern "C" __global__ void __launch_bounds__(BLOCK, 4)
dist_cg1_step(const int* __restrict__ rowptr, const int* __restrict__ col, const real_t* __restrict__ val,
              const real_t* __restrict__ dinv, real_t* x, real_t* p, real_t* r0, real_t* r1, real_t* s0,
              real_t* s1, real_t* w0, real_t* w1, const real_t* w_halo, State* st, double* partials,
              double* sums, int* pending, int n, int h) {
    const State s = *st;
    if (s.status != RUNNING) return;
    double v[3] = {0.0, 0.0, 0.0};
    single_reduction_rows(rowptr, col, val, dinv, x, p, r0, r1, s0, s1, w0, w1, w_halo, s, n, h, v);
    publish_sums(v, st, partials, sums, pending);
}

// Chronopoulos-Gear decision from reduced = [r.r, gamma = r.u, delta = w.u] (pcg.cu's
// single_reduction_decision; the buffers swap while running, as in pcg1_run).
extern "C" __global__ void dist_cg1_decide(State* st, const double* reduced, int* pending, double* history) {
    if (threadIdx.x || blockIdx.x || st->status != RUNNING || !*pending) return;
    *pending = 0;
    const int it = st->iteration + 1;
    const double rnorm = sqrt(reduced[0]);
    const int status = single_reduction_decision(st, st->iteration < 0, it, rnorm, reduced[1], reduced[2]);
    if (status == RUNNING) st->parity ^= 1;
    record_decision(st, it, rnorm, status, history, nullptr, 0);
}
