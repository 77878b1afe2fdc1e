// Batched PCG: many independent SPD systems in one launch, one thread block a system (see
// batched_ref.py for the NumPy meaning). The systems' matrices are stacked into one block-diagonal
// CSR matrix; system s owns the rows [start[s], start[s + 1]), which may differ in number and
// pattern from system to system. A block runs its system's whole solve, classic Jacobi PCG with the
// stopping rule of every PCG here (stopping.cu), with block reductions only: no system waits for
// another, and one that breaks down or turns NaN stops alone. Reductions sum in a fixed order, so
// the results do not depend on scheduling.
//
// Compiled after grid.cu and stopping.cu; struct BatchRun is generated (solvers/pcg/batched.py).

#define BATCH_BLOCK 256

// Sums of K values over the block, in every thread.
template <int K>
__device__ void block_totals(double (&v)[K]) {
    __shared__ double totals[K];
    block_sums<BATCH_BLOCK>(v);
    if (threadIdx.x == 0) {
#pragma unroll
        for (int k = 0; k < K; ++k) totals[k] = v[k];
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < K; ++k) v[k] = totals[k];
    __syncthreads();  // every thread has read them before the next call writes them
}

// (A v)_i for one row of the stacked matrix.
__device__ __forceinline__ real_t batch_row(const BatchRun& a, int i, const real_t* v) {
    real_t sum = 0;
    const int end = __ldg(&a.rowptr[i + 1]);
    for (int k = __ldg(&a.rowptr[i]); k < end; ++k) sum += __ldg(&a.val[k]) * v[__ldg(&a.col[k])];
    return sum;
}

__device__ __forceinline__ real_t batch_precondition(const BatchRun& a, int i, real_t r) {
    return a.dinv ? __ldg(&a.dinv[i]) * r : r;
}

// The whole solve of system s by this block: x holds x0 on entry, the solution on exit; status,
// iterations and the recursive ||r|| go to the system's entries of the result arrays.
__device__ void solve_system(const BatchRun& a, int s) {
    const int lo = a.start[s], hi = a.start[s + 1];
    const double tol = a.tol[s];
    double sums[2] = {0.0, 0.0};  // r.z, r.r
    for (int i = lo + threadIdx.x; i < hi; i += BATCH_BLOCK) {
        const real_t ri = a.b[i] - batch_row(a, i, a.x);
        const real_t zi = batch_precondition(a, i, ri);
        a.r[i] = ri;
        a.p[i] = zi;
        sums[0] += (double)ri * (double)zi;
        sums[1] += (double)ri * (double)ri;
    }
    block_totals(sums);
    double rz = sums[0], rnorm = sqrt(sums[1]);
    int it = 0;
    int status = stop_reason(rnorm, tol, it, a.maxiter, rz, true);
    while (status == RUNNING) {  // block_totals' barriers order each phase's writes before the next's reads
        double pq[1] = {0.0};
        for (int i = lo + threadIdx.x; i < hi; i += BATCH_BLOCK) {
            const real_t qi = batch_row(a, i, a.p);
            a.q[i] = qi;
            pq[0] += (double)a.p[i] * (double)qi;
        }
        block_totals(pq);
        if (!isfinite(pq[0]) || pq[0] <= 0.0) {
            status = isfinite(pq[0]) ? BREAKDOWN : NOT_FINITE;
            break;
        }
        const real_t alpha = (real_t)(rz / pq[0]);
        sums[0] = sums[1] = 0.0;
        for (int i = lo + threadIdx.x; i < hi; i += BATCH_BLOCK) {
            a.x[i] = fma(alpha, a.p[i], a.x[i]);
            const real_t ri = fma(-alpha, a.q[i], a.r[i]);
            const real_t zi = batch_precondition(a, i, ri);
            a.r[i] = ri;
            a.z[i] = zi;
            sums[0] += (double)ri * (double)zi;
            sums[1] += (double)ri * (double)ri;
        }
        block_totals(sums);
        ++it;
        rnorm = sqrt(sums[1]);
        status = stop_reason(rnorm, tol, it, a.maxiter, sums[0], true);
        if (status != RUNNING) break;
        const real_t beta = (real_t)(sums[0] / rz);
        rz = sums[0];
        for (int i = lo + threadIdx.x; i < hi; i += BATCH_BLOCK) a.p[i] = fma(beta, a.p[i], a.z[i]);
        __syncthreads();  // the new p at every row before the next product
    }
    if (threadIdx.x == 0) {
        a.status[s] = status;
        a.iterations[s] = it;
        a.rnorm[s] = rnorm;
    }
}

extern "C" __global__ void __launch_bounds__(BATCH_BLOCK) batched_pcg(const BatchRun a) {
    for (int s = blockIdx.x; s < a.systems; s += gridDim.x) solve_system(a, s);
}

// out[s] = ||b - A x|| of system s (the true residual of its solution).
extern "C" __global__ void __launch_bounds__(BATCH_BLOCK) batched_residual_norms(const BatchRun a, double* out) {
    for (int s = blockIdx.x; s < a.systems; s += gridDim.x) {
        double sum[1] = {0.0};
        for (int i = a.start[s] + threadIdx.x; i < a.start[s + 1]; i += BATCH_BLOCK) {
            const double ri = (double)(a.b[i] - batch_row(a, i, a.x));
            sum[0] += ri * ri;
        }
        block_totals(sum);
        if (threadIdx.x == 0) out[s] = sqrt(sum[0]);
    }
}
