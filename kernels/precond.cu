// Building blocks of the GPU preconditioners that are not pointwise (Chebyshev, the AMG V-cycle);
// see precond_ref.py for the NumPy meaning of every kernel. Host side:
// solvers/pcg/preconditioners/device.py, which strings them into a fixed sequence of launches.
//
// Compiled with real_t, the precision the preconditioner is stored in, and outer_t, the solver's
// (they differ for a float32 hierarchy inside float64 CG), and the generated struct CsrMatrix
// { rowptr, col, val, rows, lanes }: a level's operator, a transfer (P or R) or the coarsest
// level's dense inverse, held as CSR with all its entries. Every product is a plain grid-stride
// kernel with `lanes` threads a row and a fixed shuffle tree: no atomics, so every launch of the same
// sequence gives the same bits.
//
// Every kernel first reads the word `stop` and does nothing when it is non-zero: the solver points it
// at its status, so the launches of an iteration after the solve has stopped change nothing (the
// graph engine's rule for bodies).

#define BLOCK 256

__device__ __forceinline__ bool stopped(const int* stop) { return stop && *(const volatile int*)stop; }

// finish(i, (M v)_i) for every row i, from the row's first lane. Each group of LANES lanes takes
// ROWS rows a pass, loading their first entries before any row's remainder: ROWS independent chains
// of loads (row pointer, entry, gathered value) in flight instead of one, which is what a product of
// short rows is bound by. The loop bound is the same for the whole block, so every lane reaches the
// shuffles.
#define ROWS 4
template <int LANES, typename F>
__device__ __forceinline__ void csr_rows(const CsrMatrix& M, const real_t* __restrict__ v, F finish) {
    const int lane = threadIdx.x % LANES;
    const int rows_per_block = BLOCK / LANES;
    const int stride = gridDim.x * rows_per_block;
    for (int base = blockIdx.x * rows_per_block; base < M.rows; base += ROWS * stride) {
        int k[ROWS], end[ROWS];
        real_t s[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            const int i = base + threadIdx.x / LANES + r * stride;
            k[r] = end[r] = 0;
            if (i < M.rows) {
                k[r] = __ldg(&M.rowptr[i]) + lane;
                end[r] = __ldg(&M.rowptr[i + 1]);
            }
        }
#pragma unroll
        for (int r = 0; r < ROWS; ++r)
            s[r] = k[r] < end[r] ? __ldg(&M.val[k[r]]) * __ldg(&v[__ldg(&M.col[k[r]])]) : real_t(0);
#pragma unroll
        for (int r = 0; r < ROWS; ++r)
            for (int kk = k[r] + LANES; kk < end[r]; kk += LANES)
                s[r] += __ldg(&M.val[kk]) * __ldg(&v[__ldg(&M.col[kk])]);
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
#pragma unroll
            for (int o = LANES / 2; o > 0; o >>= 1) s[r] += __shfl_xor_sync(0xffffffffu, s[r], o, LANES);
            const int i = base + threadIdx.x / LANES + r * stride;
            if (lane == 0 && i < M.rows) finish(i, s[r]);
        }
    }
}

// csr_rows with the matrix's lanes a row (a power of two, 2 to 32: solvers/formats/csr.py's row_lanes).
template <typename F>
__device__ __forceinline__ void for_each_csr_row(const CsrMatrix& M, const real_t* __restrict__ v, F finish) {
    switch (M.lanes) {
        case 2: csr_rows<2>(M, v, finish); break;
        case 4: csr_rows<4>(M, v, finish); break;
        case 8: csr_rows<8>(M, v, finish); break;
        case 16: csr_rows<16>(M, v, finish); break;
        default: csr_rows<32>(M, v, finish); break;
    }
}

// out = a M v + c y (y may be null: out = a M v). out may be y (x += P e), never v: no kernel here
// writes the vector it multiplies, so the product reads it through the read-only cache.
extern "C" __global__ void __launch_bounds__(BLOCK)
csr_axpby(const CsrMatrix M, const real_t* v, const real_t* y, real_t* out, real_t a, real_t c, const int* stop) {
    if (stopped(stop)) return;
    for_each_csr_row(M, v, [&](int i, real_t s) { out[i] = y ? c * y[i] + a * s : a * s; });
}

// The first step of the Chebyshev recurrence on A x = b: rs = D^-1 b, d = first rs, x = d (or x += d
// with `accumulate`, improving a given x whose residual b is).
extern "C" __global__ void __launch_bounds__(BLOCK)
chebyshev_begin(int n, const real_t* b, const real_t* dinv, real_t first, real_t* x, real_t* d, real_t* rs,
                int accumulate, const int* stop) {
    if (stopped(stop)) return;
    for (int i = blockIdx.x * BLOCK + threadIdx.x; i < n; i += gridDim.x * BLOCK) {
        const real_t r = dinv[i] * b[i];
        const real_t di = first * r;
        rs[i] = r;
        d[i] = di;
        x[i] = accumulate ? x[i] + di : di;
    }
}

// One later step: rs -= D^-1 A d_old, d_new = c1 d_old + c2 rs, x += d_new (d double-buffered: the
// product reads d_old at neighbouring rows).
extern "C" __global__ void __launch_bounds__(BLOCK)
chebyshev_step(const CsrMatrix A, const real_t* dinv, const real_t* d_old, real_t* d_new, real_t* rs, real_t* x,
               real_t c1, real_t c2, const int* stop) {
    if (stopped(stop)) return;
    for_each_csr_row(A, d_old, [&](int i, real_t ad) {
        const real_t r = rs[i] - dinv[i] * ad;
        const real_t di = c1 * d_old[i] + c2 * r;
        rs[i] = r;
        d_new[i] = di;
        x[i] += di;
    });
}

// x = s v, or x += s v with `accumulate` (a weighted Jacobi sweep: s = omega / rho D^-1, v a residual).
extern "C" __global__ void __launch_bounds__(BLOCK)
scaled_add(int n, const real_t* s, const real_t* v, real_t* x, int accumulate, const int* stop) {
    if (stopped(stop)) return;
    for (int i = blockIdx.x * BLOCK + threadIdx.x; i < n; i += gridDim.x * BLOCK) {
        const real_t t = s[i] * v[i];
        x[i] = accumulate ? x[i] + t : t;
    }
}

// The solver's vector in the preconditioner's precision and back.
extern "C" __global__ void __launch_bounds__(BLOCK)
to_inner(int n, const outer_t* in, real_t* out, const int* stop) {
    if (stopped(stop)) return;
    for (int i = blockIdx.x * BLOCK + threadIdx.x; i < n; i += gridDim.x * BLOCK) out[i] = (real_t)in[i];
}

extern "C" __global__ void __launch_bounds__(BLOCK)
to_outer(int n, const real_t* in, outer_t* out, const int* stop) {
    if (stopped(stop)) return;
    for (int i = blockIdx.x * BLOCK + threadIdx.x; i < n; i += gridDim.x * BLOCK) out[i] = (outer_t)in[i];
}
