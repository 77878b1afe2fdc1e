// Building blocks of the GPU preconditioners that are not pointwise (Chebyshev, the AMG V-cycle):
// the kernels with a product. See precond_ref.py for the NumPy meaning of every kernel; the pointwise
// ones are precond_pointwise.cu. Host side: solvers/pcg/preconditioners/device.py, which strings them
// into a fixed sequence of launches.
//
// Compiled with real_t, the precision the preconditioner is stored in (outer_t: the solver's), after
// matrix.cu and one matrix format (ell.cu, sell.cu or csr.cu; solvers/formats): struct Matrix and
// for_each_row_product, the products the PCG kernels use. A level's operator, a transfer (P or R) or the coarsest level's dense
// inverse is one Matrix. The formats add in a fixed order and take no atomics in their sums, so every
// launch of the same sequence gives the same bits.
//
// Every kernel first reads the word `stop` and does nothing when it is non-zero: the solver points it
// at its status, so the launches of an iteration after the solve has stopped change nothing (the
// graph engine's rule for bodies). No kernel writes a vector its product reads.

#define BLOCK 256

__device__ __forceinline__ bool stopped(const int* stop) { return stop && *(const volatile int*)stop; }

// finish(i, (M v)_i) for every row i, once, with the row's whole sum (a long row's pieces of a SELL
// layout are added up by the format first). v is a vector, or a functor v(j) forming its entry j.
template <typename V, typename F>
__device__ __forceinline__ void for_each_row(const Matrix& M, V v, F finish) {
    for_each_row_product(M, v, [&](int i, real_t s, int part) {
        if (completes_row(part)) finish(i, s);
    });
}

template <typename F>
__device__ __forceinline__ void for_each_row(const Matrix& M, const real_t* __restrict__ v, F finish) {
    for_each_row(M, [&](int j) { return __ldg(&v[j]); }, finish);
}

// out = a M v + c y (y may be null: out = a M v). out may be y (x += P e), never v.
extern "C" __global__ void __launch_bounds__(BLOCK)
axpby(const Matrix M, const real_t* v, const real_t* y, real_t* out, real_t a, real_t c, const int* stop) {
    if (stopped(stop)) return;
    for_each_row(M, v, [&](int i, real_t s) { out[i] = y ? c * y[i] + a * s : a * s; });
}

// The start of the Chebyshev recurrence improving a given x on A x = b: rs = D^-1 (b - A x), d = first
// rs; with x_out (degree 1, no step follows) also x_out = x + d. x_out is never x (its neighbours'
// entries are still being read).
extern "C" __global__ void __launch_bounds__(BLOCK)
chebyshev_residual(const Matrix A, const real_t* x, const real_t* b, const real_t* dinv, real_t first, real_t* d,
                   real_t* rs, real_t* x_out, const int* stop) {
    if (stopped(stop)) return;
    for_each_row(A, x, [&](int i, real_t ax) {
        const real_t r = dinv[i] * (b[i] - ax);
        const real_t di = first * r;
        rs[i] = r;
        d[i] = di;
        if (x_out) x_out[i] = x[i] + di;
    });
}

// The recurrence from x = 0 and its first step in one pass: the start d_0 = first D^-1 b (x = d_0,
// rs = D^-1 b; chebyshev_begin's values) is formed on the fly wherever the product reads it, then
// rs -= D^-1 A d_0, d_new = c1 d_0 + c2 rs, x_out = d_0 + d_new. d_0 is never stored.
extern "C" __global__ void __launch_bounds__(BLOCK)
chebyshev_start_step(const Matrix A, const real_t* b, const real_t* dinv, real_t first, real_t* d_new, real_t* rs,
                     real_t* x_out, real_t c1, real_t c2, const int* stop) {
    if (stopped(stop)) return;
    const auto start = [&](int j) { return first * (__ldg(&dinv[j]) * __ldg(&b[j])); };
    for_each_row(A, start, [&](int i, real_t ad) {
        const real_t scaled = dinv[i] * b[i];
        const real_t old = first * scaled;
        const real_t r = scaled - dinv[i] * ad;
        const real_t di = c1 * old + c2 * r;
        rs[i] = r;
        d_new[i] = di;
        x_out[i] = old + di;
    });
}

// One later step: rs -= D^-1 A d_old, d_new = c1 d_old + c2 rs, x_out = x_in (+ d_old when add_old: the
// step that follows chebyshev_residual adds its d) + d_new. d is double-buffered (the product reads
// d_old at neighbouring rows); x_in may be x_out. x_out is a real_t vector, or the solver's (outer_t)
// in chebyshev_step_to_outer: the last launch of a cycle stored in a lower precision writes z itself,
// the same values converted, and no conversion launch follows.
template <typename X>
__device__ __forceinline__ void chebyshev_step_rows(const Matrix& A, const real_t* dinv, const real_t* d_old,
                                                    real_t* d_new, real_t* rs, const real_t* x_in, X* x_out,
                                                    real_t c1, real_t c2, int add_old) {
    for_each_row(A, d_old, [&](int i, real_t ad) {
        const real_t r = rs[i] - dinv[i] * ad;
        const real_t old = d_old[i];
        const real_t di = c1 * old + c2 * r;
        rs[i] = r;
        d_new[i] = di;
        real_t xi = x_in[i];
        if (add_old) xi += old;
        x_out[i] = (X)(xi + di);
    });
}

extern "C" __global__ void __launch_bounds__(BLOCK)
chebyshev_step(const Matrix A, const real_t* dinv, const real_t* d_old, real_t* d_new, real_t* rs,
               const real_t* x_in, real_t* x_out, real_t c1, real_t c2, int add_old, const int* stop) {
    if (stopped(stop)) return;
    chebyshev_step_rows(A, dinv, d_old, d_new, rs, x_in, x_out, c1, c2, add_old);
}

extern "C" __global__ void __launch_bounds__(BLOCK)
chebyshev_step_to_outer(const Matrix A, const real_t* dinv, const real_t* d_old, real_t* d_new, real_t* rs,
                        const real_t* x_in, outer_t* x_out, real_t c1, real_t c2, int add_old, const int* stop) {
    if (stopped(stop)) return;
    chebyshev_step_rows(A, dinv, d_old, d_new, rs, x_in, x_out, c1, c2, add_old);
}

// One weighted Jacobi sweep: out = y + s (b - A y), s = omega / rho D^-1. out is never y.
extern "C" __global__ void __launch_bounds__(BLOCK)
jacobi_sweep(const Matrix A, const real_t* y, const real_t* b, const real_t* s, real_t* out, const int* stop) {
    if (stopped(stop)) return;
    for_each_row(A, y, [&](int i, real_t ay) { out[i] = y[i] + s[i] * (b[i] - ay); });
}
