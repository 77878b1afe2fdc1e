// Classic Jacobi (or unpreconditioned) PCG on NRHS right-hand sides of one matrix at once (see
// multirhs_ref.py for the NumPy meaning of every kernel).
//
// The vectors are n x NRHS, row-major: the NRHS entries of a row are contiguous, so one matrix entry
// (loaded once, broadcast to the row's threads) serves every column, and a row's gather of a
// neighbour is one coalesced segment. A thread holds MR_CPT neighbouring columns c0.. (two when NRHS
// is even: one vector load brings both, so a thread has twice the bytes in flight for the same
// registers of addresses, which is what bounds these kernels: at one column a thread, k = 16 on a 1M-row
// stencil, ncu counted 100% occupancy, 2.0-2.2 TB/s and 80-90% of warp time waiting on loads) and
// strides over rows; the block's MR_BLOCK threads cover MR_ROWS rows of NRHS columns (threads past
// MR_ROWS * MR_TPR only join the reductions). Every column has its own State (alpha, beta, rz, status,
// parity, iteration): a column that has stopped is frozen (nothing of it is stored again, its sums are
// zeros), so a converged, broken-down or NaN column never touches the others.
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
// Compiled after grid.cu and stopping.cu, with real_t, NRHS, MR_CPT and the generated structs (State,
// Progress, MultiRun) defined by the loader.

#define MR_BLOCK 512
#define MR_TPR (NRHS / MR_CPT)     // threads a row
#define MR_ROWS (MR_BLOCK / MR_TPR)  // rows a block holds at once
#define MR_SLOTS (MR_BLOCK * MR_CPT)  // (row, column) places of a block
static_assert(NRHS >= 1 && 2 * NRHS <= MR_BLOCK, "NRHS: 1 to MR_BLOCK / 2 columns");
static_assert(NRHS % MR_CPT == 0, "MR_CPT divides NRHS");

__host__ __device__ constexpr int next_pow2(int v) { return v <= 1 ? 1 : 2 * next_pow2((v + 1) / 2); }

// A thread's columns of one row: loaded and stored as one vector access (rows are NRHS entries long
// and the columns start at an even place, so the address is aligned).
struct alignas(MR_CPT * sizeof(real_t)) Cols {
    real_t v[MR_CPT];
};

__device__ __forceinline__ Cols load_cols(const real_t* base, int j, int c0) {
    return *reinterpret_cast<const Cols*>(base + (size_t)j * NRHS + c0);
}

// Store the columns that are running (one vector store when all are).
__device__ __forceinline__ void store_cols(real_t* base, int i, int c0, const Cols& v, const bool (&on)[MR_CPT]) {
    bool all = true;
#pragma unroll
    for (int m = 0; m < MR_CPT; ++m) all = all && on[m];
    real_t* at = base + (size_t)i * NRHS + c0;
    if (all) {
        *reinterpret_cast<Cols*>(at) = v;
        return;
    }
#pragma unroll
    for (int m = 0; m < MR_CPT; ++m)
        if (on[m]) at[m] = v.v[m];
}

// Per-column sums of NV values of each of the thread's MR_CPT columns, reduced over the grid.
// Returns true in the last block to finish, whose threads t < NV * NRHS then hold in total[t] the grid
// sum of value t / NRHS of column t % NRHS (shared memory). A block adds its rows by a fixed tree and
// publishes partials[value][block]; the last block sums them with every thread taking a fixed share
// of blocks, then a fixed tree.
template <int NV>
__device__ bool column_sums(const MultiRun& a, const double (&v)[NV][MR_CPT], double* total) {
    constexpr int VALUES = NV * NRHS;
    constexpr int PARTS = MR_BLOCK / VALUES;
    __shared__ double buf[NV * MR_SLOTS];
    __shared__ bool last;
    const int row = threadIdx.x / MR_TPR;
    const int slot = threadIdx.x * MR_CPT;  // = row * NRHS + the thread's first column
    __syncthreads();
#pragma unroll
    for (int k = 0; k < NV; ++k)
#pragma unroll
        for (int m = 0; m < MR_CPT; ++m) buf[k * MR_SLOTS + slot + m] = v[k][m];
    __syncthreads();
    // rows of the block, a fixed tree (idle threads past MR_ROWS * MR_TPR hold zeros and are not read)
    for (int h = next_pow2(MR_ROWS) / 2; h > 0; h >>= 1) {
        if (row < h && row + h < MR_ROWS) {
#pragma unroll
            for (int k = 0; k < NV; ++k)
#pragma unroll
                for (int m = 0; m < MR_CPT; ++m)
                    buf[k * MR_SLOTS + slot + m] += buf[k * MR_SLOTS + slot + m + h * NRHS];
        }
        __syncthreads();
    }
    if (threadIdx.x < NRHS) {
#pragma unroll
        for (int k = 0; k < NV; ++k)
            a.partials[(k * NRHS + threadIdx.x) * gridDim.x + blockIdx.x] = buf[k * MR_SLOTS + threadIdx.x];
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

// The first of a thread's columns that runs. Running columns share their parity (they take the set-up
// pass together and step together; a stopped column keeps the parity it stopped at).
__device__ __forceinline__ int first_on(const bool (&on)[MR_CPT]) {
    int first = 0;
#pragma unroll
    for (int m = MR_CPT - 1; m >= 0; --m)
        if (on[m]) first = m;
    return first;
}

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
__device__ __forceinline__ Cols mr_precondition(const real_t* dinv, int i, Cols r) {
    if (dinv) {
        const real_t d = __ldg(&dinv[i]);
#pragma unroll
        for (int m = 0; m < MR_CPT; ++m) r.v[m] *= d;
    }
    return r;
}

// (A v)_i over the thread's columns' entries v(j) of the row. The matrix is the solver's own ELL or
// DIA slots when it has them (MR_ELL_WIDTH entries a row, column-major, padding of value 0 at a column
// inside the vector; DIA's columns written out: the unrolled loop keeps all of a row's loads in
// flight), else CSR (rowptr, col, val).
template <typename V>
__device__ __forceinline__ Cols row_product(const MultiRun& a, int i, V v) {
    Cols q;
#pragma unroll
    for (int m = 0; m < MR_CPT; ++m) q.v[m] = 0;
    auto add = [&](int e) {
        const real_t w = __ldg(&a.val[e]);
        const Cols x = v(__ldg(&a.col[e]));
#pragma unroll
        for (int m = 0; m < MR_CPT; ++m) q.v[m] += w * x.v[m];
    };
#ifdef MR_ELL_WIDTH
#pragma unroll
    for (int k = 0; k < MR_ELL_WIDTH; ++k) add((int)((size_t)k * a.n + i));
#else
    const int end = __ldg(&a.rowptr[i + 1]);
#pragma unroll 4
    for (int e = __ldg(&a.rowptr[i]); e < end; ++e) add(e);
#endif
    return q;
}

extern "C" __global__ void __launch_bounds__(MR_BLOCK)
mr_direction(const MultiRun a, unsigned long long handle) {
    __shared__ State s[NRHS];
    __shared__ double total[NRHS];
    if (!load_states(a, s, handle)) return;
    const int row = threadIdx.x / MR_TPR, c0 = (threadIdx.x % MR_TPR) * MR_CPT;
    double pq[1][MR_CPT] = {};
    bool on[MR_CPT], any = false;
    real_t beta[MR_CPT];
#pragma unroll
    for (int m = 0; m < MR_CPT; ++m) {
        on[m] = row < MR_ROWS && running(s[c0 + m]) && s[c0 + m].iteration >= 0;
        beta[m] = (real_t)s[c0 + m].beta;
        any = any || on[m];
    }
    if (any) {
        const int parity = s[c0 + first_on(on)].parity;
        const real_t* p_old = parity ? a.p1 : a.p0;
        real_t* p_new = parity ? a.p0 : a.p1;
        auto direction = [&](int j) {
            const Cols z = mr_precondition(a.dinv, j, load_cols(a.r, j, c0)), p = load_cols(p_old, j, c0);
            Cols d;
#pragma unroll
            for (int m = 0; m < MR_CPT; ++m) d.v[m] = fma(beta[m], p.v[m], z.v[m]);
            return d;
        };
        for (int i = blockIdx.x * MR_ROWS + row; i < a.n; i += gridDim.x * MR_ROWS) {
            const Cols pi = direction(i), qi = row_product(a, i, direction);
            store_cols(p_new, i, c0, pi, on);
#pragma unroll
            for (int m = 0; m < MR_CPT; ++m)
                if (on[m]) pq[0][m] += (double)pi.v[m] * (double)qi.v[m];
        }
    }
    if (!column_sums<1>(a, pq, total)) return;
    const int c = threadIdx.x;
    if (c < NRHS && running(s[c]) && s[c].iteration >= 0) {
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
    const int row = threadIdx.x / MR_TPR, c0 = (threadIdx.x % MR_TPR) * MR_CPT;
    double sums[2][MR_CPT] = {};  // r.z, r.r of the new r
    bool on[MR_CPT], step[MR_CPT], any = false, steps = false;  // steps: any of the thread's columns steps
    real_t alpha[MR_CPT];
#pragma unroll
    for (int m = 0; m < MR_CPT; ++m) {
        on[m] = row < MR_ROWS && running(s[c0 + m]);
        step[m] = on[m] && s[c0 + m].iteration >= 0;  // else the set-up pass: sums only
        alpha[m] = (real_t)s[c0 + m].alpha;
        any = any || on[m];
        steps = steps || step[m];
    }
    if (any) {
        const real_t* p = s[c0 + first_on(on)].parity ? a.p0 : a.p1;  // the direction pass's p_new
        for (int i = blockIdx.x * MR_ROWS + row; i < a.n; i += gridDim.x * MR_ROWS) {
            Cols ri = load_cols(a.r, i, c0);
            if (steps) {
                const Cols qi = row_product(a, i, [&](int j) { return load_cols(p, j, c0); });
                const Cols pi = load_cols(p, i, c0);
                Cols xi = load_cols(a.x, i, c0);
#pragma unroll
                for (int m = 0; m < MR_CPT; ++m) {
                    xi.v[m] = fma(alpha[m], pi.v[m], xi.v[m]);
                    if (step[m]) ri.v[m] = fma(-alpha[m], qi.v[m], ri.v[m]);
                }
                store_cols(a.x, i, c0, xi, step);
                store_cols(a.r, i, c0, ri, step);
            }
            const Cols zi = mr_precondition(a.dinv, i, ri);
#pragma unroll
            for (int m = 0; m < MR_CPT; ++m) {
                if (!on[m]) continue;
                sums[0][m] += (double)ri.v[m] * (double)zi.v[m];
                sums[1][m] += (double)ri.v[m] * (double)ri.v[m];
            }
        }
    }
    if (!column_sums<2>(a, sums, total)) return;
    const int c = threadIdx.x;
    if (c < NRHS && running(s[c])) {
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
    const int row = threadIdx.x / MR_TPR, c0 = (threadIdx.x % MR_TPR) * MR_CPT;
    if (row >= MR_ROWS) return;
    bool on[MR_CPT];
#pragma unroll
    for (int m = 0; m < MR_CPT; ++m) on[m] = true;
    for (int i = blockIdx.x * MR_ROWS + row; i < a.n; i += gridDim.x * MR_ROWS) {
        const Cols ax = row_product(a, i, [&](int j) { return load_cols(x, j, c0); });
        Cols out_i = load_cols(b, i, c0);
#pragma unroll
        for (int m = 0; m < MR_CPT; ++m) out_i.v[m] -= ax.v[m];
        store_cols(out, i, c0, out_i, on);
    }
}
