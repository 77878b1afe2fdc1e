// PCG on chip: each system's solve runs inside one thread block, or one thread-block cluster
// (Hopper), with block or cluster barriers only; see onchip_ref.py for the NumPy meaning. One launch
// solves B independent systems (a batch) or one (the small-system path of PCG).
//
// A system is split over ONCHIP_TEAM blocks (a cluster when > 1) of ONCHIP_BLOCK threads; block c of
// a team owns the system's rows [c * CHUNK, (c + 1) * CHUNK) and thread t of it the rows
// c * CHUNK + t + k * ONCHIP_BLOCK, k < ONCHIP_ROWS. A thread keeps its rows' x, r, q and inverse
// diagonal in registers; z and the two direction buffers live in the block's shared memory, where
// the team's other blocks read them through distributed shared memory. With a matrix capacity the
// block's rows of the matrix are copied into shared memory first, else they are read from global
// memory. The iteration is pcg_ref's (direction_product, then pcg_update): the product forms the new
// direction on the fly from z and the old one, so an iteration has two reductions and two barriers.
// Reductions add warp partials, then block partials, in a fixed order: results depend on nothing but
// the compile-time shape.
//
// A launch runs up to `count` iterations of every system and keeps the state of a system still
// running in global memory (x, r, z, p and its State), so the next launch resumes it exactly: eager,
// graph and WHILE drivers give the same bits whatever the iterations per launch. With `fresh` set the
// launch starts every system, its stopping rule max(atol, rtol ||b||) and maxiter taken from the
// arguments; otherwise a system starts when its State's iteration is -1, with the State's tol and
// maxiter. A finished system gets its true residual ||b - A x|| and ||b|| in norms[2s], norms[2s + 1].
//
// Compiled after grid.cu and stopping.cu, with ONCHIP_BLOCK, ONCHIP_ROWS, ONCHIP_TEAM and
// ONCHIP_MIN_BLOCKS (blocks an SM should hold: the registers a thread may use follow) defined and the
// structs State, Progress, OnchipRun generated (solvers/pcg/onchip.py).

#define CHUNK (ONCHIP_BLOCK * ONCHIP_ROWS)
#define ONCHIP_WARPS (ONCHIP_BLOCK / 32)

__device__ __forceinline__ unsigned team_rank() {
#if ONCHIP_TEAM > 1
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
#else
    return 0;
#endif
}

// Barrier of the team; orders every thread's earlier shared-memory writes before the team's later reads.
__device__ __forceinline__ void team_barrier() {
#if ONCHIP_TEAM > 1
    asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
#else
    __syncthreads();
#endif
}

// The address of `p` (this block's shared memory) in the shared memory of the team's block `rank`.
template <typename T>
__device__ __forceinline__ const T* team_peer(const T* p, unsigned rank) {
#if ONCHIP_TEAM > 1
    unsigned long long out;
    asm volatile("mapa.u64 %0, %1, %2;" : "=l"(out) : "l"((unsigned long long)p), "r"(rank));
    return (const T*)out;
#else
    return p;
#endif
}

// Entry j (a row of the system) of a vector spread over the team's shared memory as `own` is here.
__device__ __forceinline__ real_t team_load(const real_t* own, int j, unsigned rank) {
#if ONCHIP_TEAM > 1
    const unsigned c = (unsigned)j / CHUNK;
    const int off = j - (int)c * CHUNK;
    return c == rank ? own[off] : *team_peer(own + off, c);
#else
    return own[j];
#endif
}

// Reduction scratch: two buffers used alternately, so that a reduction never overwrites partials
// a thread may still be reading from the previous one (the barrier between them orders the rest).
struct TeamScratch {
    double warp[2][3][ONCHIP_WARPS];
    double block[2][3];
};

// Sums of K <= 3 values over the team, in every thread; `round` counts the reductions.
template <int K>
__device__ void team_sums(double (&v)[K], TeamScratch& sc, int& round) {
    const int buf = round & 1;
    ++round;
#pragma unroll
    for (int k = 0; k < K; ++k) v[k] = warp_sum(v[k]);
    if ((threadIdx.x & 31) == 0) {
#pragma unroll
        for (int k = 0; k < K; ++k) sc.warp[buf][k][threadIdx.x >> 5] = v[k];
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < K; ++k) {
        double t = 0.0;
        for (int w = 0; w < ONCHIP_WARPS; ++w) t += sc.warp[buf][k][w];
        v[k] = t;
    }
#if ONCHIP_TEAM > 1
    if (threadIdx.x == 0) {
#pragma unroll
        for (int k = 0; k < K; ++k) sc.block[buf][k] = v[k];
    }
    team_barrier();
#pragma unroll
    for (int k = 0; k < K; ++k) {
        double t = 0.0;
        for (unsigned c = 0; c < ONCHIP_TEAM; ++c) t += *team_peer(&sc.block[buf][k], c);
        v[k] = t;
    }
#endif
}

// This block's rows of system s: where their entries are and how to read them.
struct TeamRows {
    const real_t* val;  // values, shared or global
    const int* col;     // columns; minus `shift`, the row within the system
    int shift;
    int begin[ONCHIP_ROWS], end[ONCHIP_ROWS];  // entry ranges of the thread's rows (empty past the end)
};

// (A v)_i for the thread's k-th row, v(j) giving entry j of the system's vector.
template <typename V>
__device__ __forceinline__ real_t row_product(const TeamRows& m, int k, V v) {
    real_t sum = 0;
    for (int e = m.begin[k]; e < m.end[k]; ++e) sum += m.val[e] * v(m.col[e] - m.shift);
    return sum;
}

extern "C" __global__ void
#if ONCHIP_TEAM > 1
__cluster_dims__(ONCHIP_TEAM, 1, 1)
#endif
__launch_bounds__(ONCHIP_BLOCK, ONCHIP_MIN_BLOCKS) onchip_pcg(const OnchipRun a, unsigned long long handle) {
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ TeamScratch sc;
    real_t* z_s = (real_t*)smem;
    real_t* pbuf[2] = {z_s + CHUNK, z_s + 2 * CHUNK};
    real_t* val_s = z_s + 3 * CHUNK;
    int* col_s = (int*)(val_s + a.matrix_capacity);
    const unsigned rank = team_rank();
    const int t = threadIdx.x;
    int round = 0;

    for (int s = blockIdx.x / ONCHIP_TEAM; s < a.systems; s += gridDim.x / ONCHIP_TEAM) {
        State* st = a.st + s;
        // Team-uniform decisions read the State before any thread of the team may write it.
        const bool start = a.fresh || st->iteration < 0;
        int status = start ? RUNNING : st->status;
        team_barrier();
        if (status != RUNNING) {
            if (handle && rank == 0 && t == 0) cudaGraphSetConditional(handle, 0);
            continue;
        }
        const int lo = a.start[s], n = a.start[s + 1] - lo;
        const int first = (int)rank * CHUNK;  // this block's first row of the system
        TeamRows m;
        if (a.matrix_capacity) {
            const int e0 = a.rowptr[lo + min(first, n)], e1 = a.rowptr[lo + min(first + CHUNK, n)];
            for (int e = t; e < e1 - e0; e += ONCHIP_BLOCK) {
                val_s[e] = a.val[e0 + e];
                col_s[e] = a.col[e0 + e] - lo;
            }
            __syncthreads();  // the copy is read by every thread of the block
            m.val = val_s, m.col = col_s, m.shift = 0;
#pragma unroll
            for (int k = 0; k < ONCHIP_ROWS; ++k) {
                const int i = first + t + k * ONCHIP_BLOCK;
                m.begin[k] = i < n ? a.rowptr[lo + i] - e0 : 0;
                m.end[k] = i < n ? a.rowptr[lo + i + 1] - e0 : 0;
            }
        } else {
            m.val = a.val, m.col = a.col, m.shift = lo;
#pragma unroll
            for (int k = 0; k < ONCHIP_ROWS; ++k) {
                const int i = first + t + k * ONCHIP_BLOCK;
                m.begin[k] = i < n ? a.rowptr[lo + i] : 0;
                m.end[k] = i < n ? a.rowptr[lo + i + 1] : 0;
            }
        }
        real_t x[ONCHIP_ROWS], r[ONCHIP_ROWS], q[ONCHIP_ROWS], d[ONCHIP_ROWS];
        int parity = 0;  // p_old is pbuf[parity], the new direction goes to pbuf[parity ^ 1]
        double tol, rz, beta, rnorm, b_norm = 0.0;
        int it, maxiter;
        if (start) {  // r = b - A x0, z = M^-1 r, p_old = 0: the set-up pass
            double sums[3] = {0.0, 0.0, 0.0};  // b.b, r.z, r.r
            const real_t* x0 = a.x + lo;
#pragma unroll
            for (int k = 0; k < ONCHIP_ROWS; ++k) {
                const int i = first + t + k * ONCHIP_BLOCK, own = t + k * ONCHIP_BLOCK;
                x[k] = r[k] = q[k] = d[k] = 0;
                if (i >= n) continue;
                const real_t bi = a.b[lo + i];
                x[k] = x0[i];
                r[k] = bi - row_product(m, k, [&](int j) { return x0[j]; });
                d[k] = a.dinv ? a.dinv[lo + i] : real_t(1);
                const real_t zi = a.dinv ? d[k] * r[k] : r[k];
                z_s[own] = zi;
                pbuf[0][own] = 0;
                sums[0] += (double)bi * (double)bi;
                sums[1] += (double)r[k] * (double)zi;
                sums[2] += (double)r[k] * (double)r[k];
            }
            team_sums(sums, sc, round);
            b_norm = sqrt(sums[0]);
            tol = a.fresh ? fmax(a.atol, a.rtol * b_norm) : st->tol;
            maxiter = a.fresh ? a.maxiter : st->maxiter;
            rz = sums[1];
            rnorm = sqrt(sums[2]);
            beta = 0.0;
            it = 0;
            status = stop_reason(rnorm, tol, it, maxiter, rz, true);
        } else {  // resume: the vectors and scalars the previous launch left
#pragma unroll
            for (int k = 0; k < ONCHIP_ROWS; ++k) {
                const int i = first + t + k * ONCHIP_BLOCK, own = t + k * ONCHIP_BLOCK;
                x[k] = r[k] = q[k] = d[k] = 0;
                if (i >= n) continue;
                x[k] = a.x[lo + i];
                r[k] = a.r[lo + i];
                d[k] = a.dinv ? a.dinv[lo + i] : real_t(1);
                z_s[own] = a.z[lo + i];
                pbuf[0][own] = a.p[lo + i];
            }
            tol = st->tol, maxiter = st->maxiter, rz = st->rz, beta = st->beta, rnorm = st->rnorm;
            it = st->iteration;
            b_norm = a.norms[2 * s + 1];
            team_barrier();
        }
        const bool recorder = rank == 0 && t == 0;
        if (recorder) {
            st->tol = tol;
            st->maxiter = maxiter;
            if (start) record_decision(st, it, rnorm, status, a.history, a.progress, handle);
        }
        for (int c = 0; c < a.count && status == RUNNING; ++c) {
            // direction_product: p_new = beta p_old + z (formed where read), q = A p_new, p_new . q
            const real_t* z_c = z_s;
            const real_t* po = pbuf[parity];
            real_t* pn = pbuf[parity ^ 1];
            const real_t b_ = (real_t)beta;
            double pq[1] = {0.0};
#pragma unroll
            for (int k = 0; k < ONCHIP_ROWS; ++k) {
                const int own = t + k * ONCHIP_BLOCK;
                if (first + own >= n) continue;
                q[k] = row_product(m, k, [&](int j) { return fma(b_, team_load(po, j, rank), team_load(z_c, j, rank)); });
                const real_t p_i = fma(b_, po[own], z_s[own]);
                pn[own] = p_i;
                pq[0] += (double)p_i * (double)q[k];
            }
            team_sums(pq, sc, round);
            if (!isfinite(pq[0]) || pq[0] <= 0.0) {  // no step along this direction
                status = isfinite(pq[0]) ? BREAKDOWN : NOT_FINITE;
                if (recorder) {
                    st->pq = pq[0];
                    record_decision(st, it, rnorm, status, a.history, a.progress, handle);
                }
                break;
            }
            // pcg_update: x += alpha p_new, r -= alpha q, z = M^-1 r, then decide
            const real_t alpha = (real_t)(rz / pq[0]);
            double sums[2] = {0.0, 0.0};  // r.z, r.r
#pragma unroll
            for (int k = 0; k < ONCHIP_ROWS; ++k) {
                const int own = t + k * ONCHIP_BLOCK;
                if (first + own >= n) continue;
                x[k] = fma(alpha, pn[own], x[k]);
                r[k] = fma(-alpha, q[k], r[k]);
                const real_t zi = a.dinv ? d[k] * r[k] : r[k];
                z_s[own] = zi;
                sums[0] += (double)r[k] * (double)zi;
                sums[1] += (double)r[k] * (double)r[k];
            }
            team_sums(sums, sc, round);
            ++it;
            rnorm = sqrt(sums[1]);
            status = stop_reason(rnorm, tol, it, maxiter, sums[0], true);
            if (status == RUNNING) {
                beta = sums[0] / rz;
                rz = sums[0];
                parity ^= 1;
            }
            if (recorder) record_decision(st, it, rnorm, status, a.history, a.progress, handle);
        }
        // Keep what the next launch needs, or finish: the true residual from x gathered over the team.
#pragma unroll
        for (int k = 0; k < ONCHIP_ROWS; ++k) {
            const int i = first + t + k * ONCHIP_BLOCK, own = t + k * ONCHIP_BLOCK;
            if (i >= n) continue;
            a.x[lo + i] = x[k];
            if (status == RUNNING) {
                a.r[lo + i] = r[k];
                a.z[lo + i] = z_s[own];
                a.p[lo + i] = pbuf[parity][own];
            }
        }
        if (status == RUNNING) {
            if (recorder) {
                st->rz = rz;
                st->beta = beta;
                if (start) a.norms[2 * s + 1] = b_norm;
            }
            team_barrier();  // peers done reading this block's shared memory before the next system
            continue;
        }
        team_barrier();  // z_s is free once every peer has passed the last reduction's reads
#pragma unroll
        for (int k = 0; k < ONCHIP_ROWS; ++k) {
            const int own = t + k * ONCHIP_BLOCK;
            if (first + own < n) z_s[own] = x[k];
        }
        team_barrier();
        double rr[1] = {0.0};
#pragma unroll
        for (int k = 0; k < ONCHIP_ROWS; ++k) {
            const int i = first + t + k * ONCHIP_BLOCK;
            if (i >= n) continue;
            const double ri = (double)(a.b[lo + i] - row_product(m, k, [&](int j) { return team_load(z_s, j, rank); }));
            rr[0] += ri * ri;
        }
        team_sums(rr, sc, round);
        if (recorder) {
            a.norms[2 * s] = sqrt(rr[0]);
            a.norms[2 * s + 1] = b_norm;
        }
        team_barrier();  // peers done reading this block's shared memory before the next system
    }
}
