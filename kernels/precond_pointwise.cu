// The pointwise building blocks of the GPU preconditioners (no matrix): see precond_ref.py for their
// NumPy meaning and precond.cu for the kernels with a product. Compiled with real_t, the precision the
// preconditioner is stored in, and outer_t, the solver's (they differ for a float32 hierarchy inside
// float64 CG). Every kernel does nothing while the word `stop` is non-zero (as in precond.cu).

#define BLOCK 256

__device__ __forceinline__ bool stopped(const int* stop) { return stop && *(const volatile int*)stop; }

// The first step of the Chebyshev recurrence on A x = b from x = 0: rs = D^-1 b, d = first rs, x = d.
extern "C" __global__ void __launch_bounds__(BLOCK)
chebyshev_begin(int n, const real_t* b, const real_t* dinv, real_t first, real_t* x, real_t* d, real_t* rs,
                const int* stop) {
    if (stopped(stop)) return;
    for (int i = blockIdx.x * BLOCK + threadIdx.x; i < n; i += gridDim.x * BLOCK) {
        const real_t r = dinv[i] * b[i];
        const real_t di = first * r;
        rs[i] = r;
        d[i] = di;
        x[i] = di;
    }
}

// x = s v, or x += s v with `accumulate` (s = omega / rho D^-1: a weighted Jacobi sweep from x = 0).
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
