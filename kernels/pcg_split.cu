// Classic PCG in three plain kernels an iteration, for a preconditioner that is a sequence of kernels
// of its own (precond.cu) launched between the second and the third (see pcg_ref.py for the NumPy
// meaning). Compiled after pcg.cu, whose State, row products, decisions and block reductions these
// use, with the generated struct SplitRun { A, x, r, z, q, p0, p1, r_low, st, partials, history, progress }.
//
//   split_direction  p_new = z + beta p_old ; q = A p_new ; p_new.q ; alpha = rz / p_new.q
//   split_update     x += alpha p_new ; r -= alpha q (and r_low = float(r): the input of a preconditioner
//                    stored in float32 inside float64 CG, when r_low is not null)
//   (the preconditioner: z = M^-1 r, kernels that do nothing once st->status is set)
//   split_decide     r.z, r.r ; stop reason ; beta = rz_new / rz
//
// The set-up pass is the preconditioner and split_decide while st->iteration is -1. Grid totals are
// the blocks' partials summed by the last block to finish, in block order (pcg.cu's publish_partials
// and sum_partials), so every driver gives the same bits. Every kernel returns at once after the
// stop; split_direction and split_decide, which take the WHILE node's handle, then also end the loop.

// p_new = z + beta p_old and q = A p_new; the last block decides alpha from p_new.q (or the stop).
extern "C" __global__ void __launch_bounds__(BLOCK)
split_direction(const SplitRun a, unsigned long long handle) {
    if (finished(*a.st, handle)) return;
    const State s = *a.st;
    const real_t* p_old = s.parity ? a.p1 : a.p0;
    real_t* p_new = s.parity ? a.p0 : a.p1;
    double pq[1] = {direction_product(a.A, a.z, p_old, p_new, a.q, (real_t)s.beta)};
    if (!publish_partials(a.partials, pq, &a.st->ticket)) return;
    sum_partials(a.partials, pq);
    if (threadIdx.x == 0) {
        State* st = a.st;
        direction_decision(st, pq[0]);
        if (st->status != RUNNING)
            record_decision(st, st->iteration, st->rnorm, st->status, a.history, a.progress, handle);
    }
}

// x += alpha p_new, r -= alpha q; r_low = float(r) when given (the preconditioner's input, converted here
// instead of by a launch of its own that would read r again).
extern "C" __global__ void __launch_bounds__(BLOCK)
split_update(const SplitRun a) {
    const State* st = a.st;
    if (st->status != RUNNING) return;
    const real_t alpha = (real_t)st->alpha;
    const real_t* p = st->parity ? a.p0 : a.p1;
    for (int i = blockIdx.x * BLOCK + threadIdx.x; i < a.A.n; i += gridDim.x * BLOCK) {
        a.x[i] = fma(alpha, p[i], a.x[i]);
        const real_t ri = fma(-alpha, a.q[i], a.r[i]);
        a.r[i] = ri;
        if (a.r_low) a.r_low[i] = (float)ri;
    }
}

// r.z and r.r of the new r and z; the last block takes the decision of the iteration.
extern "C" __global__ void __launch_bounds__(BLOCK)
split_decide(const SplitRun a, unsigned long long handle) {
    if (finished(*a.st, handle)) return;
    double v[2] = {0.0, 0.0};  // r.z, r.r
    for (int i = blockIdx.x * BLOCK + threadIdx.x; i < a.A.n; i += gridDim.x * BLOCK) {
        const double ri = a.r[i];
        v[0] += ri * (double)a.z[i];
        v[1] += ri * ri;
    }
    if (!publish_partials(a.partials, v, &a.st->ticket)) return;
    sum_partials(a.partials, v);
    if (threadIdx.x == 0) {
        State* st = a.st;
        const bool start = st->iteration < 0;
        const int it = st->iteration + 1;
        const double rnorm = sqrt(v[1]);
        record_decision(st, it, rnorm, update_decision(st, start, it, v[0], rnorm), a.history, a.progress, handle);
    }
}
