// PCG on chip: each system's solve runs inside one thread block, or one thread-block cluster
// (Hopper), with block or cluster barriers only; see onchip_ref.py for the NumPy meaning. One launch
// solves B independent systems (a batch) or one (the small-system path of PCG).
//
// A system is split over ONCHIP_TEAM blocks (a cluster when > 1) of ONCHIP_BLOCK threads; block c of
// a team owns the system's rows [c * CHUNK, (c + 1) * CHUNK) and thread t of it the rows
// c * CHUNK + t + k * ONCHIP_BLOCK, k < ONCHIP_ROWS. A thread keeps its rows' x, r and q in
// registers; z and the two direction buffers live in the block's shared memory, where the team's
// other blocks read them through distributed shared memory.
//
// The matrix: a block's rows are laid out as slices of 32 rows (a warp's rows for one k), each slice
// as many columns wide as its longest row, entry w of a slice's lane-th row at slice start + 32 w +
// lane (conflict-free reads, a warp's loop the same length in every lane; short rows are padded with
// zeros on their own column). A block's slices hold matrix_capacity entries; the first matrix_shared
// of them (a multiple of 32) live in shared memory, built from the CSR arrays at every launch, the
// rest in a global workspace (a.sell_val, a.sell_col: matrix_capacity - matrix_shared entries a
// block), built once per solve.
//
// The iteration is pcg_ref's (direction_product, then pcg_update). The new direction p = beta p_old
// + z is stored for the block's own rows behind a block barrier, and the product reads it there; at
// rows of other blocks it forms it from their z and p_old, which the last team barrier published: an
// iteration has two reductions and two team barriers. A reduction adds lanes by a butterfly (every
// lane ends with the same bits), then the block's warp totals the same way in every warp, then each
// block writes its total into every team member's shared memory before the team barrier, and every
// thread adds the team's totals in rank order: results depend on nothing but the compile-time shape.
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
// structs State, Progress, OnchipRun generated (solvers/pcg/onchip.py). A team of more than 8 blocks
// needs the non-portable cluster size allowed on the function.

#define CHUNK (ONCHIP_BLOCK * ONCHIP_ROWS)
#define ONCHIP_WARPS (ONCHIP_BLOCK / 32)
#define ONCHIP_SLICES (CHUNK / 32)
#define FULL_WARP 0xffffffffu

__device__ __forceinline__ unsigned team_rank() {
#if ONCHIP_TEAM > 1
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
#else
    return 0;
#endif
}

// Barrier of the team; orders every thread's earlier shared-memory accesses (its own block's and,
// through distributed shared memory, the others') before the team's later ones.
__device__ __forceinline__ void team_barrier() {
#if ONCHIP_TEAM > 1
    asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
#else
    __syncthreads();
#endif
}

// The address of `p` (this block's shared memory) in the shared memory of the team's block `rank`.
template <typename T>
__device__ __forceinline__ T* team_peer(T* p, unsigned rank) {
#if ONCHIP_TEAM > 1
    unsigned long long out;
    asm volatile("mapa.u64 %0, %1, %2;" : "=l"(out) : "l"((unsigned long long)p), "r"(rank));
    return (T*)out;
#else
    return p;
#endif
}

// Sum over the warp by a butterfly: IEEE addition commutes, so every lane ends with the same bits.
__device__ __forceinline__ double warp_total(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_WARP, v, o);
    return v;
}

// Reduction scratch: two buffers used alternately, so that a reduction never overwrites totals a
// thread may still be reading from the previous one (the barrier between them orders the rest).
struct TeamScratch {
    double warp[2][3][ONCHIP_WARPS];
    double team[2][3][ONCHIP_TEAM];  // written by every team member, each into its rank's place
    int slice_width[ONCHIP_SLICES];
};

// Sums of K <= 3 values over the team, the same bits in every thread; `round` counts the reductions.
// Ends with a team barrier, which also publishes the shared memory written before the call.
template <int K>
__device__ void team_sums(double (&v)[K], TeamScratch& sc, int& round) {
    const int buf = round & 1;
    ++round;
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int k = 0; k < K; ++k) v[k] = warp_total(v[k]);
    if (lane == 0) {
#pragma unroll
        for (int k = 0; k < K; ++k) sc.warp[buf][k][threadIdx.x >> 5] = v[k];
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < K; ++k) v[k] = warp_total(lane < ONCHIP_WARPS ? sc.warp[buf][k][lane] : 0.0);
#if ONCHIP_TEAM > 1
    if (threadIdx.x < ONCHIP_TEAM) {  // thread c writes the block's totals into block c
        const unsigned me = team_rank();
#pragma unroll
        for (int k = 0; k < K; ++k) *team_peer(&sc.team[buf][k][me], threadIdx.x) = v[k];
    }
    team_barrier();
#pragma unroll
    for (int k = 0; k < K; ++k) {
        double t = 0.0;
#pragma unroll
        for (int c = 0; c < ONCHIP_TEAM; ++c) t += sc.team[buf][k][c];
        v[k] = t;
    }
#endif
}

// z = M^-1 r at row i of the stacked systems (Jacobi when dinv is set, else the identity); the inverse
// diagonal is read where needed (cached) rather than held in registers.
__device__ __forceinline__ real_t precondition(const real_t* dinv, int i, real_t r) {
    return dinv ? __ldg(&dinv[i]) * r : r;
}

// This thread's slices of the block's rows of a system: where their entries are. Entry e of the
// block's slices is val_s[e] below `split` (shared memory), else val_g[e] (global; the pointers are
// offset by -split), and likewise for the columns (within the system).
struct ThreadRows {
    real_t* val_s;
    int* col_s;
    real_t* val_g;
    int* col_g;
    int split;
    int at[ONCHIP_ROWS];     // entry 0 of the thread's k-th row (slice start + lane)
    int width[ONCHIP_ROWS];  // entries of its slice's rows (padded)
};

// (A v)_i for the thread's k-th row, v(j) giving entry j of the system's vector. `split` is a
// multiple of 32 and slices start at multiples of 32: a warp's entries are on one side together.
template <typename V>
__device__ __forceinline__ real_t row_product(const ThreadRows& m, int k, V v) {
    real_t sum = 0;
#pragma unroll 4
    for (int w = 0; w < m.width[k]; ++w) {
        const int e = m.at[k] + 32 * w;
        const bool shared = e < m.split;
        sum = fma(shared ? m.val_s[e] : m.val_g[e], v(shared ? m.col_s[e] : m.col_g[e]), sum);
    }
    return sum;
}

// Lay out the block's rows of the system (rows lo.. of the stacked CSR, n of them) as slices: their
// widths and this thread's places always; the entries themselves in shared memory, and in the
// global workspace when `build_global`. The block's shared slices start at `shared`.
__device__ void slice_rows(const OnchipRun& a, int lo, int n, int first, real_t* shared, bool build_global,
                           TeamScratch& sc, ThreadRows& m) {
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    int begin[ONCHIP_ROWS], length[ONCHIP_ROWS];
#pragma unroll
    for (int k = 0; k < ONCHIP_ROWS; ++k) {
        const int i = first + t + k * ONCHIP_BLOCK;
        begin[k] = i < n ? a.rowptr[lo + i] : 0;
        length[k] = i < n ? a.rowptr[lo + i + 1] - begin[k] : 0;
        m.width[k] = __reduce_max_sync(FULL_WARP, length[k]);
        if (lane == 0) sc.slice_width[k * ONCHIP_WARPS + warp] = m.width[k];
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < ONCHIP_ROWS; ++k) {  // slices before this one, in (k, warp) order
        const int slice = k * ONCHIP_WARPS + warp;
        int before = 0;
        for (int s = lane; s < slice; s += 32) before += sc.slice_width[s];
        m.at[k] = 32 * __reduce_add_sync(FULL_WARP, before) + lane;
    }
    __syncthreads();  // slice_width is free for the next system
    m.val_s = shared;
    m.col_s = (int*)(m.val_s + a.matrix_shared);
    m.split = a.matrix_shared;
#pragma unroll
    for (int k = 0; k < ONCHIP_ROWS; ++k) {
        const int i = first + t + k * ONCHIP_BLOCK;
        for (int w = 0; w < m.width[k]; ++w) {
            const int e = m.at[k] + 32 * w;
            if (e >= m.split && !build_global) break;
            const real_t v = w < length[k] ? a.val[begin[k] + w] : real_t(0);
            const int j = w < length[k] ? a.col[begin[k] + w] - lo : (i < n ? i : 0);
            if (e < m.split) {
                m.val_s[e] = v, m.col_s[e] = j;
            } else {
                m.val_g[e] = v, m.col_g[e] = j;
            }
        }
    }
    // Each thread reads back only the entries it wrote: no barrier needed.
}

extern "C" __global__ void
#if ONCHIP_TEAM > 1
__cluster_dims__(ONCHIP_TEAM, 1, 1)
#endif
__launch_bounds__(ONCHIP_BLOCK, ONCHIP_MIN_BLOCKS) onchip_pcg(const OnchipRun a, unsigned long long handle) {
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ TeamScratch sc;
    real_t* z_s = (real_t*)smem;  // then the two direction buffers: direction(parity)
    auto direction = [&](int which) { return z_s + CHUNK * (1 + which); };
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
        ThreadRows m;
        {  // the block's part of the workspace, addressed as entries split.. of its slices
            const long long base = ((long long)s * ONCHIP_TEAM + rank) * (a.matrix_capacity - a.matrix_shared);
            m.val_g = a.sell_val + base - a.matrix_shared;
            m.col_g = a.sell_col + base - a.matrix_shared;
        }
        slice_rows(a, lo, n, first, z_s + 3 * CHUNK, start, sc, m);
        real_t x[ONCHIP_ROWS], r[ONCHIP_ROWS], q[ONCHIP_ROWS];
        int parity = 0;  // p_old is direction(parity), the new direction goes to direction(parity ^ 1)
        double tol, rz, beta, rnorm, b_norm = 0.0;
        int it, maxiter;
        if (start) {  // r = b - A x0, z = M^-1 r, p_old = 0: the set-up pass
            double sums[3] = {0.0, 0.0, 0.0};  // b.b, r.z, r.r
            const real_t* x0 = a.x + lo;
#pragma unroll
            for (int k = 0; k < ONCHIP_ROWS; ++k) {
                const int i = first + t + k * ONCHIP_BLOCK, own = t + k * ONCHIP_BLOCK;
                x[k] = r[k] = q[k] = 0;
                if (i >= n) continue;
                const real_t bi = a.b[lo + i];
                x[k] = x0[i];
                r[k] = bi - row_product(m, k, [&](int j) { return x0[j]; });
                const real_t zi = precondition(a.dinv, lo + i, r[k]);
                z_s[own] = zi;
                direction(0)[own] = 0;
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
                x[k] = r[k] = q[k] = 0;
                if (i >= n) continue;
                x[k] = a.x[lo + i];
                r[k] = a.r[lo + i];
                z_s[own] = a.z[lo + i];
                direction(0)[own] = a.p[lo + i];
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
        // Every thread of the team takes the same decisions from the same bits: the loop's trip count,
        // and so its barriers, are the same in every thread.
        for (int c = 0; c < a.count && status == RUNNING; ++c) {
            // direction_product: p_new = beta p_old + z (stored for own rows, formed where read at
            // other blocks' rows), q = A p_new, p_new . q
            const real_t* po = direction(parity);
            real_t* pn = direction(parity ^ 1);
            const real_t b_ = (real_t)beta;
#pragma unroll
            for (int k = 0; k < ONCHIP_ROWS; ++k) {
                const int own = t + k * ONCHIP_BLOCK;
                if (first + own < n) pn[own] = fma(b_, po[own], z_s[own]);
            }
            __syncthreads();  // the block's new direction, read by its threads
            double pq[1] = {0.0};
#pragma unroll
            for (int k = 0; k < ONCHIP_ROWS; ++k) {
                const int own = t + k * ONCHIP_BLOCK;
                if (first + own >= n) continue;
                q[k] = row_product(m, k, [&](int j) {
#if ONCHIP_TEAM > 1
                    const unsigned owner = (unsigned)j / CHUNK;
                    const int at = j - (int)owner * CHUNK;
                    if (owner != rank) return fma(b_, *team_peer(po + at, owner), *team_peer(z_s + at, owner));
                    return (real_t)pn[at];
#else
                    return (real_t)pn[j];
#endif
                });
                pq[0] += (double)pn[own] * (double)q[k];
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
                const real_t zi = precondition(a.dinv, lo + first + own, r[k]);
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
                a.p[lo + i] = direction(parity)[own];
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
            const double ri = (double)(a.b[lo + i] - row_product(m, k, [&](int j) {
                const unsigned owner = (unsigned)j / CHUNK;
                const real_t* at = z_s + (j - (int)owner * CHUNK);
                return owner == rank ? *at : *team_peer(at, owner);
            }));
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
