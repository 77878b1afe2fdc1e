// Classic Jacobi (or unpreconditioned) PCG on NRHS right-hand sides of one matrix at once (see
// multirhs_ref.py for the NumPy meaning of every kernel).
//
// The vectors are n x NRHS, row-major: the NRHS entries of a row are contiguous, so one matrix entry
// (loaded once, broadcast to the row's threads) serves every column, and a row's gather of a
// neighbour is one coalesced segment. A thread holds one column c and strides over rows; the block's
// MR_BLOCK threads cover MR_ROWS rows of NRHS columns (threads past MR_ROWS * NRHS only join the
// reductions). Every column has its own State (alpha, beta, rz, status, parity, iteration): a column
// that has stopped is frozen (its threads skip it; its vectors are never written again), so a
// converged, broken-down or NaN column never touches the others.
//
// An iteration is two passes over the matrix, each ending in per-column sums reduced in one grid
// pass (the last block to finish adds every block's partials in a fixed order, so the bits do not
// depend on scheduling, and the eager, graph and WHILE drivers agree exactly):
//   mr_direction: p_new = z + beta p_old, formed from r and p_old where the product gathers it
//                 (z = M^-1 r is never stored); q = A p_new; pq = p_new . q; p_new stored;
//                 alpha = rz / pq per column (or BREAKDOWN / NOT_FINITE).
//   mr_update:    q = A p_new again, gathering the stored p_new (the same bits); x += alpha p_new;
//                 r -= alpha q; z = M^-1 r; r.z, r.r; decide per column.
// Per row and column an iteration moves 64 bytes: r and p_old read and p_new written, then p_new,
// x and r read and x and r written (storing q instead of forming it twice would add 16). p is
// double-buffered (the direction pass gathers the old one while writing the new), `parity` selecting
// the current buffer of each column; r is only read at other rows in the direction pass, so it is
// updated in place. A column whose iteration is -1 takes the set-up pass in mr_update: r.z and r.r of
// r = b - A x0, nothing written.
//
// Compiled after grid.cu and stopping.cu, with real_t, NRHS and the generated structs (State,
// Progress, MultiRun) defined by the loader.

#define MR_BLOCK 512
#define MR_ROWS (MR_BLOCK / NRHS)
static_assert(NRHS >= 1 && 2 * NRHS <= MR_BLOCK, "NRHS: 1 to MR_BLOCK / 2 columns");

__host__ __device__ constexpr int next_pow2(int v) { return v <= 1 ? 1 : 2 * next_pow2((v + 1) / 2); }

// Per-column sums of NV values held by each thread (its column's share), reduced over the grid.
// Returns true in the last block to finish, whose threads t < NV * NRHS then hold in total[t] the grid
// sum of value t / NRHS of column t % NRHS (shared memory). Blocks publish partials[value][block]; the
// last block sums them with every thread taking a fixed share of blocks, then a fixed tree.
template <int NV>
__device__ bool column_sums(const MultiRun& a, const double (&v)[NV], double* total) {
    constexpr int VALUES = NV * NRHS;
    constexpr int PARTS = MR_BLOCK / VALUES;
    __shared__ double buf[NV * MR_BLOCK];
    __shared__ bool last;
    const int c = threadIdx.x % NRHS, row = threadIdx.x / NRHS;
    __syncthreads();
#pragma unroll
    for (int k = 0; k < NV; ++k) buf[k * MR_BLOCK + threadIdx.x] = v[k];
    __syncthreads();
    // rows of the block, a fixed tree (idle threads past MR_ROWS * NRHS hold zeros and are not read)
    for (int h = next_pow2(MR_ROWS) / 2; h > 0; h >>= 1) {
        if (row < h && row + h < MR_ROWS) {
#pragma unroll
            for (int k = 0; k < NV; ++k) buf[k * MR_BLOCK + threadIdx.x] += buf[k * MR_BLOCK + threadIdx.x + h * NRHS];
        }
        __syncthreads();
    }
    if (threadIdx.x < NRHS) {
#pragma unroll
        for (int k = 0; k < NV; ++k) a.partials[(k * NRHS + c) * gridDim.x + blockIdx.x] = buf[k * MR_BLOCK + c];
        __threadfence();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(a.ticket, 1u) == gridDim.x - 1;
        if (last) *a.ticket = 0;
    }
    __syncthreads();
    if (!last) return false;
    __threadfence();
    const int value = threadIdx.x % VALUES, part = threadIdx.x / VALUES;
    double s = 0.0;
    if (part < PARTS)
        for (int b = part; b < gridDim.x; b += PARTS) s += __ldcg(&a.partials[value * gridDim.x + b]);
    __syncthreads();
    if (part < PARTS) buf[part * VALUES + value] = s;
    __syncthreads();
    for (int h = next_pow2(PARTS) / 2; h > 0; h >>= 1) {
        if (part < h && part + h < PARTS) buf[part * VALUES + value] += buf[(part + h) * VALUES + value];
        __syncthreads();
    }
    if (threadIdx.x < VALUES) total[threadIdx.x] = buf[threadIdx.x];
    __syncthreads();
    return true;
}

__device__ __forceinline__ bool running(const State& s) { return s.status == RUNNING; }

// The block's copy of every column's State; false (and, in a WHILE body, the loop ended) when no
// column is running: a launch after the stop does nothing.
__device__ bool load_states(const MultiRun& a, State* s, unsigned long long handle) {
    for (int c = threadIdx.x; c < NRHS; c += MR_BLOCK) s[c] = a.st[c];
    __syncthreads();
    const bool any = __syncthreads_or(threadIdx.x < NRHS && running(s[threadIdx.x]));
    if (!any && handle && blockIdx.x == 0 && threadIdx.x == 0) cudaGraphSetConditional(handle, 0);
    return any;
}

// After the last block's decisions: end the WHILE loop once every column has stopped.
__device__ void end_when_all_stopped(const State* s, unsigned long long handle) {
    const bool any = __syncthreads_or(threadIdx.x < NRHS && running(s[threadIdx.x]));
    if (!any && handle && threadIdx.x == 0) cudaGraphSetConditional(handle, 0);
}

// z = M^-1 r at row i (Jacobi when dinv is set, else the identity).
__device__ __forceinline__ real_t mr_precondition(const real_t* dinv, int i, real_t r) {
    return dinv ? __ldg(&dinv[i]) * r : r;
}

// (A v)_i over column c's entries v(j) of the row. The matrix is the solver's own ELL layout when it
// has one (MR_ELL_WIDTH entries a row, column-major, padding of value 0 at the row's own column: the
// unrolled loop keeps all of a row's loads in flight), else CSR (rowptr, col, val).
template <typename V>
__device__ __forceinline__ real_t row_product(const MultiRun& a, int i, V v) {
    real_t q = 0;
#ifdef MR_ELL_WIDTH
#pragma unroll
    for (int k = 0; k < MR_ELL_WIDTH; ++k) {
        const size_t e = (size_t)k * a.n + i;
        q += __ldg(&a.val[e]) * v(__ldg(&a.col[e]));
    }
#else
    const int end = __ldg(&a.rowptr[i + 1]);
#pragma unroll 4
    for (int e = __ldg(&a.rowptr[i]); e < end; ++e) q += __ldg(&a.val[e]) * v(__ldg(&a.col[e]));
#endif
    return q;
}

extern "C" __global__ void __launch_bounds__(MR_BLOCK)
mr_direction(const MultiRun a, unsigned long long handle) {
    __shared__ State s[NRHS];
    __shared__ double total[NRHS];
    if (!load_states(a, s, handle)) return;
    const int c = threadIdx.x % NRHS, row = threadIdx.x / NRHS;
    double pq[1] = {0.0};
    if (row < MR_ROWS && running(s[c]) && s[c].iteration >= 0) {
        const int parity = s[c].parity;
        const real_t* p_old = parity ? a.p1 : a.p0;
        real_t* p_new = parity ? a.p0 : a.p1;
        const real_t beta = (real_t)s[c].beta;
        const real_t* r = a.r;
        auto direction = [&](int j) {
            return fma(beta, p_old[(size_t)j * NRHS + c], mr_precondition(a.dinv, j, r[(size_t)j * NRHS + c]));
        };
        for (int i = blockIdx.x * MR_ROWS + row; i < a.n; i += gridDim.x * MR_ROWS) {
            const real_t pi = direction(i), qi = row_product(a, i, direction);
            p_new[(size_t)i * NRHS + c] = pi;
            pq[0] += (double)pi * (double)qi;
        }
    }
    if (!column_sums<1>(a, pq, total)) return;
    if (threadIdx.x < NRHS && running(s[c]) && s[c].iteration >= 0) {
        State& st = s[c];
        const double v = total[c];
        st.pq = v;
        if (!isfinite(v)) st.status = NOT_FINITE;
        else if (v <= 0.0) st.status = BREAKDOWN;
        else st.alpha = st.rz / v;
        a.st[c] = st;
    }
    end_when_all_stopped(s, handle);
}

extern "C" __global__ void __launch_bounds__(MR_BLOCK)
mr_update(const MultiRun a, unsigned long long handle) {
    __shared__ State s[NRHS];
    __shared__ double total[2 * NRHS];
    if (!load_states(a, s, handle)) return;
    const int c = threadIdx.x % NRHS, row = threadIdx.x / NRHS;
    double sums[2] = {0.0, 0.0};  // r.z, r.r of the new r
    if (row < MR_ROWS && running(s[c])) {
        const bool start = s[c].iteration < 0;
        const real_t* p = s[c].parity ? a.p0 : a.p1;  // the direction pass's p_new
        const real_t alpha = (real_t)s[c].alpha;
        for (int i = blockIdx.x * MR_ROWS + row; i < a.n; i += gridDim.x * MR_ROWS) {
            const size_t at = (size_t)i * NRHS + c;
            real_t ri = a.r[at];
            if (!start) {
                const real_t qi = row_product(a, i, [&](int j) { return p[(size_t)j * NRHS + c]; });
                a.x[at] = fma(alpha, p[at], a.x[at]);
                ri = fma(-alpha, qi, ri);
                a.r[at] = ri;
            }
            const real_t zi = mr_precondition(a.dinv, i, ri);
            sums[0] += (double)ri * (double)zi;
            sums[1] += (double)ri * (double)ri;
        }
    }
    if (!column_sums<2>(a, sums, total)) return;
    if (threadIdx.x < NRHS && running(s[c])) {
        State& st = s[c];
        const bool start = st.iteration < 0;
        const int it = st.iteration + 1;
        const double rz = total[c], rnorm = sqrt(total[NRHS + c]);
        const int status = stop_reason(rnorm, st.tol, it, st.maxiter, rz, true);
        if (status == RUNNING) {
            st.beta = start ? 0.0 : rz / st.rz;
            st.rz = rz;
            if (!start) st.parity ^= 1;
        }
        st.iteration = it;
        st.rnorm = rnorm;
        st.status = status;
        a.st[c] = st;
    }
    end_when_all_stopped(s, handle);
}

// out = b - A x for every column.
extern "C" __global__ void __launch_bounds__(MR_BLOCK)
mr_residual(const MultiRun a, const real_t* __restrict__ x, const real_t* __restrict__ b, real_t* __restrict__ out) {
    const int c = threadIdx.x % NRHS, row = threadIdx.x / NRHS;
    if (row >= MR_ROWS) return;
    for (int i = blockIdx.x * MR_ROWS + row; i < a.n; i += gridDim.x * MR_ROWS)
        out[(size_t)i * NRHS + c] = b[(size_t)i * NRHS + c] - row_product(a, i, [&](int j) { return x[(size_t)j * NRHS + c]; });
}
