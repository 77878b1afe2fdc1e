// Stop codes and the stopping rule every PCG kernel family shares (pcg.cu, dist.cu, batched.cu); the
// codes are solvers.pcg.Reason's, and pcg_ref.stop_reason says the same in NumPy.

enum { RUNNING = 0, CONVERGED = 1, MAX_ITERATIONS = 2, BREAKDOWN = 3, NOT_FINITE = 4 };

// The stopping rule of every PCG variant, in the order of solvers/pcg/cpu.py: `curvature` is r.z (or
// the variant's equivalent), which must be finite and positive for the next step to exist.
__device__ __forceinline__ int stop_reason(double rnorm, double tol, int it, int maxiter, double curvature,
                                           bool finite) {
    if (!isfinite(rnorm)) return NOT_FINITE;
    if (rnorm <= tol) return CONVERGED;
    if (it >= maxiter) return MAX_ITERATIONS;
    if (!finite || !isfinite(curvature)) return NOT_FINITE;
    if (curvature <= 0.0) return BREAKDOWN;
    return RUNNING;
}

