// Kernels of the distributed PCG (solvers/dist/gpu.py); see dist_ref.py for their NumPy meaning.
//
// Compiled after pcg.cu, whose State and block reductions (publish_partials, sum_partials) they use;
// the product with the owned columns is pcg.cu's pcg_spmv_dot (CSR or ELL). Each rank's kernels
// only produce partial sums: the decisions are taken by dist_decide / dist_cg1_decide from the
// allreduced values, identical on every rank, so every rank stops at the same iteration.
//
// pcg_spmv_dot decides on its own from the local p.Ap it computes; it therefore runs on a *shadow*
// State (`sh`) that dist_pack or dist_decide refreshes from the global one (`st`) before every
// product, and its local decision is ignored. `pending` is set when new partial sums have been produced and cleared by
// the decide kernel, so a decide launched twice on the same sums (once at the end of a block of
// iterations, once at the head of the next) acts once.

// out[k] = v[idx[k]]: the entries of v that neighbours need. The shadow state takes st's status with
// beta 0 and parity 0, so a pcg_spmv_dot that follows multiplies v itself (writing a copy to p1).
extern "C" __global__ void __launch_bounds__(BLOCK)
dist_pack(const real_t* __restrict__ v, const int* __restrict__ idx, real_t* __restrict__ out, const State* st,
          State* sh, int m) {
    for (int k = blockIdx.x * BLOCK + threadIdx.x; k < m; k += gridDim.x * BLOCK) out[k] = v[idx[k]];
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        sh->status = st->status;
        sh->beta = 0.0;
        sh->parity = 0;
    }
}

// Classic PCG's direction on the halo: hp = hz + beta hp with the decided beta, the same fma by which
// the owning rank forms its p (direction_product), so hp holds the owner's new p bit for bit and
// only z crosses the network (its exchange overlaps the r.z allreduce).
extern "C" __global__ void __launch_bounds__(BLOCK)
dist_halo_direction(const real_t* __restrict__ hz, real_t* __restrict__ hp, const State* st, int m) {
    const real_t beta = (real_t)st->beta;
    for (int k = blockIdx.x * BLOCK + threadIdx.x; k < m; k += gridDim.x * BLOCK) hp[k] = fma(beta, hp[k], hz[k]);
}

// y[rows[i]] += sign * (H h)_i over the boundary rows (H: their halo columns in CSR, h: the halo
// buffer), one thread a row (halo rows are short). With `out`: skipped once st has stopped, and
// *out = sh->pq + sum_i v[rows[i]] (H h)_i where v is the vector pcg_spmv_dot just multiplied, so *out
// is this rank's whole share of v.Av.
extern "C" __global__ void __launch_bounds__(BLOCK)
dist_halo_spmv(const int* __restrict__ hptr, const int* __restrict__ hcol, const real_t* __restrict__ hval,
               const int* __restrict__ rows, const real_t* __restrict__ h, real_t* y, real_t sign,
               const real_t* p0, const real_t* p1, const State* st, State* sh, double* partials,
               double* out, int nb) {
    if (out && st->status != RUNNING) return;
    const real_t* v = out ? (sh->parity ? p0 : p1) : nullptr;
    double acc = 0.0;
    for (int i = blockIdx.x * BLOCK + threadIdx.x; i < nb; i += gridDim.x * BLOCK) {
        real_t s = 0;
        for (int k = hptr[i]; k < hptr[i + 1]; ++k) s += hval[k] * h[hcol[k]];
        const int row = rows[i];
        y[row] += sign * s;
        if (v) acc += (double)v[row] * (double)s;
    }
    double sums[1] = {acc};
    if (!out || !publish_partials(partials, sums, &sh->ticket)) return;
    sum_partials(partials, sums);
    if (threadIdx.x == 0) *out = sh->pq + sums[0];
}

// Publish this kernel's two partial sums as sums[0], sums[1] (last block) and mark them pending.
__device__ void publish_pair(double a, double b, State* sh, double* partials, double* sums, int* pending) {
    double v[2] = {a, b};
    if (!publish_partials(partials, v, &sh->ticket)) return;
    sum_partials(partials, v);
    if (threadIdx.x == 0) {
        sums[0] = v[0];
        sums[1] = v[1];
        *pending = 1;
    }
}

// Classic PCG. START: z = M^-1 r. Otherwise, with pq = reduced[0] (the allreduced p.Ap): stop on a bad
// pq, else x += alpha p, r -= alpha q, z = M^-1 r with alpha = rz / pq. Partial r.z, r.r -> sums[0..1].
template <bool START>
__device__ void classic_update(real_t* __restrict__ x, real_t* __restrict__ r, const real_t* __restrict__ q,
                               const real_t* p0, const real_t* p1, const real_t* __restrict__ dinv,
                               real_t* __restrict__ z, State* st, State* sh, const double* reduced,
                               double* partials, double* sums, int* pending, int n) {
    if (st->status != RUNNING) return;
    real_t alpha = 0;
    if (!START) {
        const double pq = reduced[0];
        if (!isfinite(pq) || pq <= 0.0) {  // every block sees the same pq and leaves
            if (blockIdx.x == 0 && threadIdx.x == 0) {
                st->pq = pq;
                st->status = isfinite(pq) ? BREAKDOWN : NOT_FINITE;
            }
            return;
        }
        alpha = (real_t)(st->rz / pq);
    }
    double rz = 0.0, rr = 0.0;
    update_rows(START, x, r, q, st->parity ? p0 : p1, dinv, z, alpha, n, rz, rr);
    publish_pair(rz, rr, sh, partials, sums, pending);
}

extern "C" __global__ void __launch_bounds__(BLOCK)
dist_update(real_t* x, real_t* r, const real_t* q, const real_t* p0, const real_t* p1, const real_t* dinv,
            real_t* z, State* st, State* sh, const double* reduced, double* partials, double* sums,
            int* pending, int n) {
    classic_update<false>(x, r, q, p0, p1, dinv, z, st, sh, reduced, partials, sums, pending, n);
}

extern "C" __global__ void __launch_bounds__(BLOCK)
dist_start(real_t* x, real_t* r, const real_t* q, const real_t* p0, const real_t* p1, const real_t* dinv,
           real_t* z, State* st, State* sh, const double* reduced, double* partials, double* sums,
           int* pending, int n) {
    classic_update<true>(x, r, q, p0, p1, dinv, z, st, sh, reduced, partials, sums, pending, n);
}

// Classic PCG decision from reduced = [pq, rz_new, rr]; the first call after a reset
// (st->iteration == -1) is the set-up pass; pcg.cu's update_decision, as on one GPU. The shadow
// state then takes st's status, beta and parity for the pcg_spmv_dot that follows.
extern "C" __global__ void dist_decide(State* st, State* sh, const double* reduced, int* pending, double* history) {
    if (threadIdx.x || blockIdx.x) return;
    if (st->status == RUNNING && *pending) {
        *pending = 0;
        const bool start = st->iteration < 0;
        const int it = st->iteration + 1;
        const double rnorm = sqrt(reduced[2]);
        record_decision(st, it, rnorm, update_decision(st, start, it, reduced[1], rnorm), history, nullptr, 0);
    }
    sh->status = st->status;
    sh->beta = st->beta;
    sh->parity = st->parity;
}

// Chronopoulos-Gear PCG. START: u = M^-1 r. Otherwise, with alpha and beta from st:
// p = u + beta p, s = w + beta s (s = A p), x += alpha p, r -= alpha s, u = M^-1 r.
// Partial r.r, r.u -> sums[0..1]; u.w comes from pcg_spmv_dot + dist_halo_spmv into sums[2].
template <bool START>
__device__ void cg1_update(real_t* __restrict__ x, real_t* __restrict__ r, real_t* __restrict__ u,
                           const real_t* __restrict__ w, real_t* __restrict__ p, real_t* __restrict__ s,
                           const real_t* __restrict__ dinv, State* st, State* sh, double* partials,
                           double* sums, int* pending, int n) {
    if (st->status != RUNNING) return;
    const real_t alpha = (real_t)st->alpha, beta = (real_t)st->beta;
    double rr = 0.0, ru = 0.0;
    for (int i = blockIdx.x * BLOCK + threadIdx.x; i < n; i += gridDim.x * BLOCK) {
        real_t ri = r[i];
        if (!START) {
            const real_t pi = fma(beta, p[i], u[i]);
            const real_t si = fma(beta, s[i], w[i]);
            p[i] = pi;
            s[i] = si;
            x[i] = fma(alpha, pi, x[i]);
            ri = fma(-alpha, si, ri);
            r[i] = ri;
        }
        const real_t ui = dinv ? dinv[i] * ri : ri;
        u[i] = ui;
        rr += (double)ri * (double)ri;
        ru += (double)ri * (double)ui;
    }
    publish_pair(rr, ru, sh, partials, sums, pending);
}

extern "C" __global__ void __launch_bounds__(BLOCK)
dist_cg1_update(real_t* x, real_t* r, real_t* u, const real_t* w, real_t* p, real_t* s, const real_t* dinv,
                State* st, State* sh, double* partials, double* sums, int* pending, int n) {
    cg1_update<false>(x, r, u, w, p, s, dinv, st, sh, partials, sums, pending, n);
}

extern "C" __global__ void __launch_bounds__(BLOCK)
dist_cg1_start(real_t* x, real_t* r, real_t* u, const real_t* w, real_t* p, real_t* s, const real_t* dinv,
               State* st, State* sh, double* partials, double* sums, int* pending, int n) {
    cg1_update<true>(x, r, u, w, p, s, dinv, st, sh, partials, sums, pending, n);
}

// Chronopoulos-Gear decision from reduced = [r.r, gamma = r.u, delta = w.u] (pcg.cu's
// single_reduction_decision); the first call after a reset (st->iteration == -1) is the set-up pass.
extern "C" __global__ void dist_cg1_decide(State* st, const double* reduced, int* pending, double* history) {
    if (threadIdx.x || blockIdx.x || st->status != RUNNING || !*pending) return;
    *pending = 0;
    const int it = st->iteration + 1;
    const double rnorm = sqrt(reduced[0]);
    const int status = single_reduction_decision(st, st->iteration < 0, it, rnorm, reduced[1], reduced[2]);
    record_decision(st, it, rnorm, status, history, nullptr, 0);
}
