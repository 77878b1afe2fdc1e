// Lennard-Jones molecular dynamics: one timestep as a handful of kernels that a CUDA
// graph captures once. real_t (double, or float for mixed precision) is typedef'd by
// the loader; energies and virials are always accumulated in double.
//
// A step is three graph nodes:  md_integrate1 -> IF rebuild [md_cell_clear, md_cell_bin,
// (md_cell_scan), md_cell_sort, md_neigh_build] -> md_force.
// The list and force kernels work on lane groups g = 0..n-1, each for particle
// i = order[g] (cell order, so neighbouring groups share neighbours and loads hit the cache)
// or i = g (by_cell == 0). The neighbour list and its counts are indexed by g.
// The control block ctl (unsigned long long[CTL_SIZE]) carries everything the host and
// the kernels share. The last block to finish md_integrate1 counts the step and sets the IF
// node; the last block of md_force records why the chunk stops, sets the WHILE node and, at
// the chunk's last step, reduces the thermo sums. Steps launched past the stop (graph mode
// unrolls k steps per launch) find ctl says so and change nothing.
// kernels/md_ref.py states the same formulas in NumPy.

#define C_STEP 0      // last completed step
#define C_TARGET 1    // step at which the chunk stops
#define C_REQ 2       // some particle moved more than skin/2 (set by md_integrate1)
#define C_REBUILD 3   // rebuild in this step (set by md_integrate1 or by the host)
#define C_BUILDS 4    // list builds so far
#define C_STATUS 5    // ST_* below
#define C_NBMAX 6     // largest neighbour count that did not fit (0: all fit)
#define C_CELLMAX 7   // largest cell occupancy that did not fit (0: all fit)
#define C_BAD 8       // n - index of the lowest particle that moved implausibly (0: none)
#define C_FORCED 9    // step whose forces md_force computed last
#define C_ARRIVE1 10  // blocks of md_integrate1 done (last-block counter)
#define C_ARRIVE2 11  // blocks of md_force done
#define CTL_SIZE 16

#ifndef MD_BLOCK
#define MD_BLOCK 128  // threads per block of every per-particle kernel
#endif

#define ST_RUNNING 0
#define ST_DONE 1
#define ST_OVERFLOW 2
#define ST_UNSTABLE 3

typedef unsigned long long u64;

struct __align__(4 * sizeof(real_t)) vec4 {
    real_t x, y, z, w;
};

__device__ __forceinline__ real_t wrap_coord(real_t x, real_t L, int &im) {
    if (x >= L) { x -= L; ++im; }
    else if (x < (real_t)0) { x += L; --im; }
    return x >= L ? (real_t)0 : x;  // x + L can round up to exactly L
}

__device__ __forceinline__ real_t min_image(real_t d, real_t L, real_t inv_L) {
    return d - L * rint(d * inv_L);
}

__device__ __forceinline__ int cell_coord(real_t x, real_t per_length, int n) {
    int c = (int)(x * per_length);  // NaN converts to 0; the clamp keeps any value in range
    return c < 0 ? 0 : (c >= n ? n - 1 : c);
}

// Philox4x32-10 (Random123), as kernels/md_ref.philox4x32.
__device__ __forceinline__ void philox4x32_10(unsigned c[4], unsigned k0, unsigned k1) {
    for (int r = 0; r < 10; ++r) {
        if (r) { k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }
        unsigned hi0 = __umulhi(0xD2511F53u, c[0]), lo0 = 0xD2511F53u * c[0];
        unsigned hi1 = __umulhi(0xCD9E8D57u, c[2]), lo1 = 0xCD9E8D57u * c[2];
        unsigned n0 = hi1 ^ c[1] ^ k0, n2 = hi0 ^ c[3] ^ k1;
        c[0] = n0; c[1] = lo1; c[2] = n2; c[3] = lo0;
    }
}

// Read a value another block of the same kernel wrote: from L2, past this SM's L1.
__device__ __forceinline__ u64 ld_l2(const u64 *p) { return __ldcg(p); }

// Called by every thread of every block: true in all threads of the one block that
// finishes last; that block then sees every other block's global writes.
__device__ __forceinline__ bool last_block(u64 *counter) {
    __shared__ bool last;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(counter, 1ull) == (u64)gridDim.x - 1;
        if (last) atomicExch(counter, 0ull);
    }
    __syncthreads();
    return last;
}

// Lanes [base, base + tpp) of a warp work on one particle; tpp is a power of 2 <= 32.
__device__ __forceinline__ unsigned group_mask(int tpp, int base) {
    return tpp == 32 ? 0xffffffffu : ((1u << tpp) - 1u) << base;
}

__device__ __forceinline__ double uniform_centered(unsigned bits) {
    return ((double)bits + 0.5) * 2.3283064365386963e-10 - 0.5;  // 2^-32
}

// First half kick and drift; wrap into the box; flag a list rebuild when a particle has
// moved more than skin/2 since the last build, and an unstable run when it moved more than
// half the list cutoff in this one step (or is not finite). The last block counts the step
// and decides the rebuild (IF node); an unstable run stops the WHILE node here.
extern "C" __global__ void __launch_bounds__(MD_BLOCK)
md_integrate1(vec4 *__restrict__ pos, vec4 *__restrict__ vel, const vec4 *__restrict__ frc,
              int4 *__restrict__ img, const vec4 *__restrict__ hold, u64 *ctl, int n,
              real_t dt, real_t half_dt_m, real_t lx, real_t ly, real_t lz,
              real_t trigger_sq, real_t max_move_sq, u64 if_handle, u64 while_handle) {
    // Every block reads these before any block can change them (only the last one does).
    if (ctl[C_STATUS] != ST_RUNNING || ctl[C_STEP] >= ctl[C_TARGET]) {
        if (blockIdx.x == 0 && threadIdx.x == 0) {
            if (if_handle) cudaGraphSetConditional(if_handle, 0u);
            if (while_handle) cudaGraphSetConditional(while_handle, 0u);
        }
        return;
    }
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    bool req = false;
    if (i < n) {
        vec4 v = vel[i], f = frc[i], x = pos[i];
        int4 im = img[i];
        v.x += half_dt_m * f.x; v.y += half_dt_m * f.y; v.z += half_dt_m * f.z;
        real_t dx = dt * v.x, dy = dt * v.y, dz = dt * v.z;
        real_t move = dx * dx + dy * dy + dz * dz;
        x.x = wrap_coord(x.x + dx, lx, im.x);
        x.y = wrap_coord(x.y + dy, ly, im.y);
        x.z = wrap_coord(x.z + dz, lz, im.z);
        vec4 h = hold[i];
        real_t hx = min_image(x.x - h.x, lx, (real_t)1 / lx);
        real_t hy = min_image(x.y - h.y, ly, (real_t)1 / ly);
        real_t hz = min_image(x.z - h.z, lz, (real_t)1 / lz);
        req = hx * hx + hy * hy + hz * hz > trigger_sq;
        if (!(move <= max_move_sq)) atomicMax(&ctl[C_BAD], (u64)(n - i));  // max of n - i: lowest i
        pos[i] = x; vel[i] = v; img[i] = im;
    }
    // One atomic per warp at most: the flag only needs to become non-zero.
    if (__any_sync(0xffffffffu, req) && (threadIdx.x & 31) == 0) atomicOr(&ctl[C_REQ], 1ull);
    if (last_block(&ctl[C_ARRIVE1]) && threadIdx.x == 0) {
        bool bad = ld_l2(&ctl[C_BAD]) != 0;
        unsigned go = (!bad && ld_l2(&ctl[C_REQ])) ? 1u : 0u;
        ctl[C_STEP] += 1;
        ctl[C_REQ] = 0;
        ctl[C_REBUILD] = go;
        ctl[C_BUILDS] += go;
        if (if_handle) cudaGraphSetConditional(if_handle, go);
        if (bad) {
            ctl[C_STATUS] = ST_UNSTABLE;
            if (while_handle) cudaGraphSetConditional(while_handle, 0u);
        }
    }
}

extern "C" __global__ void md_cell_clear(int *cell_count, int ncells, const u64 *ctl) {
    if (!ctl[C_REBUILD]) return;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < ncells; c += gridDim.x * blockDim.x)
        cell_count[c] = 0;
}

// Bin particles (src) into cells of capacity cap; with copy != 0 also record src as the
// positions of this build (hold), against which later displacements are measured.
extern "C" __global__ void md_cell_bin(const vec4 *__restrict__ src, vec4 *__restrict__ hold,
                                       int *cell_count, int *cell_atoms, int cap, u64 *ctl, int n,
                                       int nx, int ny, int nz, real_t sx, real_t sy, real_t sz, int copy) {
    if (!ctl[C_REBUILD]) return;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    vec4 p = src[i];
    if (copy) hold[i] = p;
    int c = (cell_coord(p.x, sx, nx) * ny + cell_coord(p.y, sy, ny)) * nz + cell_coord(p.z, sz, nz);
    int slot = atomicAdd(&cell_count[c], 1);
    if (slot < cap) cell_atoms[(long long)c * cap + slot] = i;
    else atomicMax(&ctl[C_CELLMAX], (u64)slot + 1);
}

// One block: cell_start[c] = particles in cells before c (exclusive prefix sum), so that
// md_cell_sort can lay all particles out in cell order without gaps.
#define SCAN_THREADS 1024
extern "C" __global__ void __launch_bounds__(SCAN_THREADS)
md_cell_scan(const int *__restrict__ cell_count, int *__restrict__ cell_start, int cap, int ncells,
             const u64 *ctl) {
    __shared__ int part[SCAN_THREADS];
    if (!ctl[C_REBUILD]) return;
    int per = (ncells + SCAN_THREADS - 1) / SCAN_THREADS;
    int lo = min((int)threadIdx.x * per, ncells), hi = min(lo + per, ncells);
    int sum = 0;
    for (int c = lo; c < hi; ++c) sum += min(cell_count[c], cap);
    part[threadIdx.x] = sum;
    __syncthreads();
    for (int off = 1; off < SCAN_THREADS; off <<= 1) {  // inclusive scan (Hillis-Steele)
        int v = threadIdx.x >= off ? part[threadIdx.x - off] : 0;
        __syncthreads();
        part[threadIdx.x] += v;
        __syncthreads();
    }
    int run = threadIdx.x ? part[threadIdx.x - 1] : 0;
    for (int c = lo; c < hi; ++c) {
        cell_start[c] = run;
        run += min(cell_count[c], cap);
    }
}

// One thread per (cell, slot): put each particle at its rank by index within its cell,
// with a copy of its build position next to it, and (by_cell) at cell_start + rank in
// order. Atomics fill cells in a racy order; a deterministic list order makes force sums,
// hence whole runs, reproducible bit for bit.
extern "C" __global__ void md_cell_sort(const int *__restrict__ cell_count, const int *__restrict__ cell_atoms,
                                        int *__restrict__ cell_sorted, vec4 *__restrict__ cell_pos,
                                        const int *__restrict__ cell_start, int *__restrict__ order, int by_cell,
                                        const vec4 *__restrict__ hold, int cap, int ncells, const u64 *ctl) {
    if (!ctl[C_REBUILD]) return;
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    int c = (int)(t / cap), s = (int)(t % cap);
    if (c >= ncells) return;
    int m = min(cell_count[c], cap);
    if (s >= m) return;
    const int *a = cell_atoms + (long long)c * cap;
    int v = a[s], rank = 0;
    for (int k = 0; k < m; ++k) rank += a[k] < v;
    cell_sorted[(long long)c * cap + rank] = v;
    cell_pos[(long long)c * cap + rank] = hold[v];
    if (by_cell) order[cell_start[c] + rank] = v;
}

// Slot s of group g's neighbour list. Lanes of a group read consecutive slots and
// neighbouring groups' slots follow, so every warp load in md_force is contiguous.
__device__ __forceinline__ long long nlist_index(int g, int s, int n, int tpp) {
    return ((long long)(s / tpp) * n + g) * tpp + (s % tpp);
}

// Full Verlet list from the build positions, tpp lanes per particle. Candidates are taken
// in a fixed order (cells of the stencil, then rank in the cell) and appended in that
// order through a ballot, so a particle's list does not depend on scheduling or on by_cell.
extern "C" __global__ void __launch_bounds__(MD_BLOCK)
md_neigh_build(const vec4 *__restrict__ hold, const int *__restrict__ cell_count,
               const int *__restrict__ cell_sorted, const vec4 *__restrict__ cell_pos, int cap,
               const int *__restrict__ order, int by_cell,
               int *__restrict__ nlist, int *__restrict__ ncount, int maxnb, u64 *ctl, int n, int tpp,
               int nx, int ny, int nz, real_t sx, real_t sy, real_t sz,
               real_t lx, real_t ly, real_t lz, real_t rlist_sq) {
    if (!ctl[C_REBUILD]) return;
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    int g = t / tpp, lane = t & (tpp - 1);
    if (g >= n) return;  // whole groups of lanes leave together
    if (ctl[C_CELLMAX]) {  // cells overflowed (order is incomplete): the host redoes the chunk
        if (lane == 0) ncount[g] = 0;
        return;
    }
    int i = by_cell ? order[g] : g;
    int base = (threadIdx.x & 31) & ~(tpp - 1);
    unsigned gmask = group_mask(tpp, base);
    vec4 p = hold[i];
    int cx = cell_coord(p.x, sx, nx), cy = cell_coord(p.y, sy, ny), cz = cell_coord(p.z, sz, nz);
    real_t ix = (real_t)1 / lx, iy = (real_t)1 / ly, iz = (real_t)1 / lz;
    // With fewer than 3 cells along an edge, -1 and +1 are the same cell: visit each once.
    int x0 = nx >= 3 ? cx - 1 + nx : 0, y0 = ny >= 3 ? cy - 1 + ny : 0, z0 = nz >= 3 ? cz - 1 + nz : 0;
    int mx = min(nx, 3), my = min(ny, 3), mz = min(nz, 3);
    int cnt = 0;
    for (int a = 0; a < mx; ++a) {
        int ax = (x0 + a) % nx;
        for (int b = 0; b < my; ++b) {
            int by = (y0 + b) % ny;
            for (int d = 0; d < mz; ++d) {
                long long cell = (long long)(ax * ny + by) * nz + (z0 + d) % nz;
                int m = min(cell_count[cell], cap);
                const int *ids = cell_sorted + cell * cap;
                const vec4 *cp = cell_pos + cell * cap;
                for (int k0 = 0; k0 < m; k0 += tpp) {
                    int k = k0 + lane, j = -1;
                    bool hit = false;
                    if (k < m) {
                        j = ids[k];
                        vec4 q = cp[k];
                        real_t dx = min_image(q.x - p.x, lx, ix);
                        real_t dy = min_image(q.y - p.y, ly, iy);
                        real_t dz = min_image(q.z - p.z, lz, iz);
                        hit = j != i && dx * dx + dy * dy + dz * dz < rlist_sq;
                    }
                    unsigned bits = __ballot_sync(gmask, hit) >> base;
                    if (hit) {
                        int slot = cnt + __popc(bits & ((1u << lane) - 1u));
                        if (slot < maxnb) nlist[nlist_index(g, slot, n, tpp)] = j;
                    }
                    cnt += __popc(bits);
                }
            }
        }
    }
    if (lane == 0) {
        ncount[g] = min(cnt, maxnb);
        if (cnt > maxnb) atomicMax(&ctl[C_NBMAX], (u64)cnt);
    }
}

// Lennard-Jones forces over the full list with tpp lanes per particle, the Langevin force
// (langevin != 0) and the second half kick. setup != 0: forces of the current state (no
// kick, no control changes), as after a build on the host. At the chunk's last step (and
// at setup) per-atom halves of energy and virial are stored and the last block reduces
// thermo[0..2] = (sum m v^2, sum E_pair, sum r.F) in a fixed order (deterministic).
extern "C" __global__ void __launch_bounds__(MD_BLOCK)
md_force(const vec4 *__restrict__ pos, vec4 *__restrict__ vel, vec4 *__restrict__ frc,
         double *__restrict__ pe, double *__restrict__ vir, double *partial, double *thermo,
         const int *__restrict__ nlist, const int *__restrict__ ncount, const int *__restrict__ order,
         int by_cell, const long long *__restrict__ ids, u64 *ctl, int n, int tpp, real_t lx, real_t ly, real_t lz,
         real_t rc_sq, real_t sigma_sq, real_t eps4, real_t eps24, double eshift,
         real_t half_dt_m, double mass, int setup, int langevin, double gamma_m, double noise,
         unsigned seed_lo, unsigned seed_hi, u64 while_handle) {
    __shared__ double red[3][MD_BLOCK];
    u64 step = ctl[C_STEP];
    if (!setup && (ctl[C_STATUS] != ST_RUNNING || ctl[C_FORCED] == step)) return;  // past the stop
    bool reduce = setup || step >= ctl[C_TARGET];
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    int g = t / tpp, lane = t & (tpp - 1);
    int base = (threadIdx.x & 31) & ~(tpp - 1);
    unsigned gmask = group_mask(tpp, base);
    bool active = g < n;
    int i = active ? (by_cell ? order[g] : g) : 0;
    real_t fx = 0, fy = 0, fz = 0;
    double e = 0.0, w = 0.0;
    if (active) {
        vec4 p = pos[i];
        real_t ix = (real_t)1 / lx, iy = (real_t)1 / ly, iz = (real_t)1 / lz;
        int m = ncount[g];
        long long stride = (long long)n * tpp;
        const int *slot = nlist + (long long)g * tpp + lane;
        auto pair = [&](const vec4 &q) {
            real_t dx = min_image(q.x - p.x, lx, ix);
            real_t dy = min_image(q.y - p.y, ly, iy);
            real_t dz = min_image(q.z - p.z, lz, iz);
            real_t rsq = dx * dx + dy * dy + dz * dz;
            if (rsq < rc_sq) {
                real_t sr2 = sigma_sq / rsq;
                real_t sr6 = sr2 * sr2 * sr2;
                real_t wp = eps24 * sr6 * ((real_t)2 * sr6 - (real_t)1);
                real_t fr = wp / rsq;
                fx -= fr * dx; fy -= fr * dy; fz -= fr * dz;
                e += (double)(eps4 * sr6 * (sr6 - (real_t)1)) - eshift;
                w += (double)wp;
            }
        };
        // Four neighbours' index and position loads in flight at once (a lane's gathers are
        // otherwise a chain of dependent round trips); summed in list order as before.
        int k = lane;
        for (; k + 3 * tpp < m; k += 4 * tpp, slot += 4 * stride) {
            int j0 = slot[0], j1 = slot[stride], j2 = slot[2 * stride], j3 = slot[3 * stride];
            vec4 q0 = pos[j0], q1 = pos[j1], q2 = pos[j2], q3 = pos[j3];
            pair(q0); pair(q1); pair(q2); pair(q3);
        }
        for (; k < m; k += tpp, slot += stride) pair(pos[*slot]);
    }
    // Butterfly sum over the particle's lanes: every lane ends with the same sums.
    for (int off = 1; off < tpp; off <<= 1) {
        fx += __shfl_xor_sync(gmask, fx, off);
        fy += __shfl_xor_sync(gmask, fy, off);
        fz += __shfl_xor_sync(gmask, fz, off);
        e += __shfl_xor_sync(gmask, e, off);
        w += __shfl_xor_sync(gmask, w, off);
    }
    double ke = 0.0;
    if (active && lane == 0) {
        vec4 v = vel[i];
        if (langevin) {
            unsigned c[4] = {(unsigned)ids[i], (unsigned)step, (unsigned)(step >> 32), 0x4C414E47u};
            philox4x32_10(c, seed_lo, seed_hi);
            fx += (real_t)(-gamma_m * (double)v.x + noise * uniform_centered(c[0]));
            fy += (real_t)(-gamma_m * (double)v.y + noise * uniform_centered(c[1]));
            fz += (real_t)(-gamma_m * (double)v.z + noise * uniform_centered(c[2]));
        }
        vec4 f = {fx, fy, fz, (real_t)0};
        frc[i] = f;
        if (!setup) {
            v.x += half_dt_m * fx; v.y += half_dt_m * fy; v.z += half_dt_m * fz;
            vel[i] = v;
        }
        if (reduce) {
            pe[i] = 0.5 * e;
            vir[i] = 0.5 * w;
            ke = (double)v.x * v.x + (double)v.y * v.y + (double)v.z * v.z;
            e *= 0.5;
            w *= 0.5;
        }
    }
    if (reduce) {  // uniform over the grid
        bool mine = active && lane == 0;
        red[0][threadIdx.x] = ke;
        red[1][threadIdx.x] = mine ? e : 0.0;
        red[2][threadIdx.x] = mine ? w : 0.0;
        __syncthreads();
        for (int h = MD_BLOCK / 2; h > 0; h >>= 1) {
            if (threadIdx.x < h)
                for (int q = 0; q < 3; ++q) red[q][threadIdx.x] += red[q][threadIdx.x + h];
            __syncthreads();
        }
        if (threadIdx.x < 3) partial[3 * blockIdx.x + threadIdx.x] = red[threadIdx.x][0];
    }
    if (!last_block(&ctl[C_ARRIVE2])) return;
    if (reduce) {
        double s[3] = {0.0, 0.0, 0.0};
        for (int b = threadIdx.x; b < gridDim.x; b += MD_BLOCK)
            for (int q = 0; q < 3; ++q) s[q] += __ldcg(&partial[3 * b + q]);
        __syncthreads();
        for (int q = 0; q < 3; ++q) red[q][threadIdx.x] = s[q];
        __syncthreads();
        for (int h = MD_BLOCK / 2; h > 0; h >>= 1) {
            if (threadIdx.x < h)
                for (int q = 0; q < 3; ++q) red[q][threadIdx.x] += red[q][threadIdx.x + h];
            __syncthreads();
        }
        if (threadIdx.x == 0) {
            thermo[0] = mass * red[0][0];
            thermo[1] = red[1][0];
            thermo[2] = red[2][0];
        }
    }
    if (threadIdx.x == 0) {
        ctl[C_FORCED] = step;
        if (!setup) {
            u64 status = (ld_l2(&ctl[C_NBMAX]) || ld_l2(&ctl[C_CELLMAX])) ? ST_OVERFLOW
                         : (step >= ctl[C_TARGET] ? ST_DONE : ST_RUNNING);
            ctl[C_STATUS] = status;
            ctl[C_REBUILD] = 0;
            if (while_handle) cudaGraphSetConditional(while_handle, status == ST_RUNNING ? 1u : 0u);
        }
    }
}
