// Stop codes, the stopping rule, the single-reduction decision and the record of a decision that every
// PCG kernel family shares (pcg.cu, dist.cu, onchip.cu); the codes are solvers.pcg.Reason's, and
// pcg_ref.stop_reason and single_reduction_decision say the same in NumPy. Compiled with the
// generated State and Progress structs.

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

// Chronopoulos-Gear decision from gamma = r.u, delta = w.u (u = M^-1 r, w = A u) and ||r||: the
// next step length alpha = gamma / (delta - beta gamma / alpha_old) needs no second reduction. st->rz
// holds gamma, st->rz_inv its reciprocal and st->pq the next direction's p.Ap, so that beta = gamma /
// rz_old and 1 / alpha_old = pq_old / rz_old are products: after the reduction come alpha's division
// and the next reciprocal, independent of each other, instead of three divisions each waiting on the
// last (some 90 cycles of dependent operations each, on the path of every iteration of a system on
// chip: H200, us an iteration, Poisson 64^2 1.75 -> 1.67, 1138_bus 1.98 -> 1.89, lap2D_5pt_n100 2.02
// -> 1.90, MEASUREMENTS.md). Returns the stop reason (RUNNING to go on).
__device__ __forceinline__ int single_reduction_decision(State* st, bool start, int it, double rnorm,
                                                         double gamma, double delta) {
    const double beta = start ? 0.0 : gamma * st->rz_inv;
    const double pap = start ? delta : delta - beta * gamma * (st->pq * st->rz_inv);
    const double alpha = gamma / pap, rz_inv = 1.0 / gamma;
    int status = stop_reason(rnorm, st->tol, it, st->maxiter, gamma, isfinite(delta));
    if (status != RUNNING) return status;
    if (!isfinite(pap)) return NOT_FINITE;
    if (pap <= 0.0) return BREAKDOWN;
    st->beta = beta;
    st->alpha = alpha;
    st->rz = gamma;
    st->rz_inv = rz_inv;
    st->pq = pap;
    return RUNNING;
}

// Record the decision taken at iteration `it` (one thread): state and history; the host-mapped
// progress word every PROGRESS_STRIDE iterations and at the stop (a write over the bus each
// iteration would lengthen every kernel); and, in a WHILE body, the end of the loop (the condition's
// default, re-applied at every launch, is "go on", so only the stop needs setting).
#define PROGRESS_STRIDE 16
__device__ void record_decision(State* st, int it, double rnorm, int status, double* history,
                                Progress* progress, unsigned long long handle) {
    st->iteration = it;
    st->rnorm = rnorm;
    st->status = status;
    if (history) history[it] = rnorm;
    if (progress && (status != RUNNING || it % PROGRESS_STRIDE == 0)) {
        // Posted writes, no fence: the host reads them for display while the graph runs, and
        // exactly only after synchronising with the stream.
        volatile Progress* pr = progress;
        pr->rnorm = rnorm;
        pr->iteration = it;
        pr->status = status;
    }
    if (handle && status != RUNNING) cudaGraphSetConditional(handle, 0);
}

// A finished solve leaves the WHILE loop; a launch after the stop (graph and eager modes) does nothing.
__device__ __forceinline__ bool finished(const State& s, unsigned long long handle) {
    if (s.status == RUNNING) return false;
    if (handle && blockIdx.x == 0 && threadIdx.x == 0) cudaGraphSetConditional(handle, 0);
    return true;
}

// The start of a solve decided on the device (a solve inside a caller's graph): the State of a fresh
// solve, with tol = max(atol, rtol ||b||) from b here, and the progress word cleared. One block.
#define PREPARE_BLOCK 1024
extern "C" __global__ void __launch_bounds__(PREPARE_BLOCK)
solve_prepare(State* st, Progress* progress, const real_t* b, int n, double rtol, double atol, int maxiter) {
    double bb[1] = {0.0};
    for (int i = threadIdx.x; i < n; i += PREPARE_BLOCK) bb[0] += (double)b[i] * (double)b[i];
    block_sums<PREPARE_BLOCK>(bb);
    if (threadIdx.x == 0) {
        State s = {};
        s.tol = fmax(atol, rtol * sqrt(bb[0]));
        s.maxiter = maxiter;
        s.iteration = -1;
        s.status = RUNNING;
        *st = s;
        if (progress) {
            volatile Progress* pr = progress;
            pr->rnorm = 0.0;
            pr->iteration = 0;
            pr->status = RUNNING;
        }
    }
}
