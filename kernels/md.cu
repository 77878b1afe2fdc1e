// Pair-potential molecular dynamics: timesteps as a handful of kernels that a CUDA graph
// captures once. real_t (double, or float for mixed precision) is typedef'd by the loader;
// energies and virials are always accumulated in double.
// Every kernel takes one MdParams (and at most a few per-launch values); the loader puts its
// definition, and that of Box, Cells, Bath and the pair parameters, ahead of this file
// (kernels/md_params.py, the single definition of their fields, through kernels/structs.py). MD_PAIR, defined by the
// loader, names the pair functor below (PairLJ or PairMorse) the kernels are compiled for.
//
// The graph body is three nodes:  md_run -> IF rebuild [md_cell_clear, md_cell_bin,
// (md_cell_scan), md_cell_sort, md_neigh_build] -> md_force.
// md_run is a persistent (cooperative) kernel that takes whole steps (kick, drift, forces, kick)
// with grid barriers between the phases, up to `count` steps a launch. A step whose drift asks for
// a list rebuild ends the launch there: the IF node rebuilds and md_force finishes that step
// (forces and second kick); otherwise md_force finds the step's forces done and returns.
// The list and force code work on lane groups g = 0..n-1, each for particle
// i = order[g] (cell order, so neighbouring groups share neighbours and loads hit the cache)
// or i = g (by_cell == 0). The neighbour list and its counts are indexed by g.
// The control block ctl (unsigned long long[CTL_SIZE]) carries everything the host and
// the kernels share. Whichever kernel ends the chunk (its last step, an overflow, an unstable
// particle) records why, stops the WHILE node and, at the chunk's last step, reduces the thermo
// sums. Launches past the stop (the host checks only after each launch) find ctl says so and change nothing.
// kernels/md_ref.py states the same formulas in NumPy.

// Its slots (C_*), its size (CTL_SIZE) and the chunk's states (ST_*) are defined by the loader from
// kernels/md_params.py, where each is described.

#ifndef MD_BLOCK
#define MD_BLOCK 128  // threads per block of every per-particle kernel
#endif

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

// Pair functors: the terms of one pair at squared distance rsq. Inside the cutoff they set
// fr = F/r (force on j along r_j - r_i over r), wp = r.F and e (the pair energy, in double) and
// return true. Each holds its parameters (kernels/md_params.py); MD_PAIR picks one at compile time.
struct PairLJ {  // LAMMPS lj/cut; kernels/md_ref.lj_pair
    PairLJParams c;
    __device__ __forceinline__ bool operator()(real_t rsq, real_t &fr, real_t &wp, double &e) const {
        if (!(rsq < c.rc_sq)) return false;
        real_t sr2 = c.sigma_sq / rsq;
        real_t sr6 = sr2 * sr2 * sr2;
        wp = c.eps24 * sr6 * ((real_t)2 * sr6 - (real_t)1);
        fr = wp / rsq;
        e = (double)(c.eps4 * sr6 * (sr6 - (real_t)1)) - c.eshift;
        return true;
    }
};

struct PairMorse {  // LAMMPS morse; kernels/md_ref.morse_pair
    PairMorseParams c;
    __device__ __forceinline__ bool operator()(real_t rsq, real_t &fr, real_t &wp, double &e) const {
        if (!(rsq < c.rc_sq)) return false;
        real_t r = sqrt(rsq);
        real_t ex = exp(-c.alpha * (r - c.r0));
        wp = (real_t)2 * c.alpha * c.d0 * ex * (ex - (real_t)1) * r;
        fr = wp / rsq;
        e = (double)(c.d0 * ex * (ex - (real_t)2)) - c.eshift;
        return true;
    }
};

// First half kick and drift of particle i from pos to pos_next; wrap into the box. Returns true when it has moved more
// than skin/2 since the last build (a list rebuild is due); records an unstable run in ctl when it
// moved more than half the list cutoff in this one step (or is not finite).
__device__ __forceinline__ bool kick_drift(int i, const vec4 *pos, vec4 *pos_next, vec4 *vel, const vec4 *frc,
                                           int4 *img, const vec4 *hold, u64 *ctl, int n, real_t dt,
                                           real_t half_dt_m, Box box, real_t trigger_sq, real_t max_move_sq) {
    vec4 v = vel[i], f = frc[i], x = pos[i];
    int4 im = img[i];
    v.x += half_dt_m * f.x; v.y += half_dt_m * f.y; v.z += half_dt_m * f.z;
    real_t dx = dt * v.x, dy = dt * v.y, dz = dt * v.z;
    real_t move = dx * dx + dy * dy + dz * dz;
    x.x = wrap_coord(x.x + dx, box.lx, im.x);
    x.y = wrap_coord(x.y + dy, box.ly, im.y);
    x.z = wrap_coord(x.z + dz, box.lz, im.z);
    vec4 h = hold[i];
    real_t hx = min_image(x.x - h.x, box.lx, (real_t)1 / box.lx);
    real_t hy = min_image(x.y - h.y, box.ly, (real_t)1 / box.ly);
    real_t hz = min_image(x.z - h.z, box.lz, (real_t)1 / box.lz);
    if (!(move <= max_move_sq)) atomicMax(&ctl[C_BAD], (u64)(n - i));  // max of n - i: lowest i
    pos_next[i] = x; vel[i] = v; img[i] = im;
    return hx * hx + hy * hy + hz * hz > trigger_sq;
}

__device__ __forceinline__ int cell_of(const vec4 &p, const Cells &cl) {
    return (cell_coord(p.x, cl.sx, cl.nx) * cl.ny + cell_coord(p.y, cl.sy, cl.ny)) * cl.nz + cell_coord(p.z, cl.sz, cl.nz);
}

// The list build's phases (bin, scan, sort, neighbour lists) are device functions over one item;
// the md_cell_* / md_neigh_build* kernels run them between launches, md_run within its own.

// Bin particle i (at src[i]) into its cell; with copy != 0 also record src as the positions of this
// build (hold), against which later displacements are measured.
__device__ __forceinline__ void bin_particle(int i, const vec4 *src, vec4 *hold, int *cell_count, int *cell_atoms,
                                             const Cells &cl, u64 *ctl, int copy) {
    vec4 p = src[i];
    if (copy) hold[i] = p;
    int c = cell_of(p, cl);
    int slot = atomicAdd(&cell_count[c], 1);
    if (slot < cl.cap) cell_atoms[(long long)c * cl.cap + slot] = i;
    else atomicMax(&ctl[C_CELLMAX], (u64)slot + 1);
}

// One block of B threads: cell_start[c] = particles in cells before c (exclusive prefix sum), so
// that the sort can lay all particles out in cell order without gaps.
template <int B>
__device__ void scan_cells(const int *cell_count, int *cell_start, int cap, int ncells) {
    __shared__ int part[B];
    int per = (ncells + B - 1) / B;
    int lo = min((int)threadIdx.x * per, ncells), hi = min(lo + per, ncells);
    int sum = 0;
    for (int c = lo; c < hi; ++c) sum += min(cell_count[c], cap);
    part[threadIdx.x] = sum;
    __syncthreads();
    for (int off = 1; off < B; off <<= 1) {  // inclusive scan (Hillis-Steele)
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

// Slot t = (cell, s): put the particle there at its rank by index within its cell, with a copy of
// its build position next to it, and (by_cell) at cell_start + rank in order. Atomics fill cells in
// a racy order; a deterministic list order makes force sums, hence whole runs, reproducible bit for bit.
__device__ __forceinline__ void sort_slot(long long t, const int *cell_count, const int *cell_atoms, int *cell_sorted,
                                          vec4 *cell_pos, const int *cell_start, int *order, int by_cell,
                                          const vec4 *hold, int cap) {
    int c = (int)(t / cap), s = (int)(t % cap);
    int m = min(cell_count[c], cap);
    if (s >= m) return;
    const int *a = cell_atoms + (long long)c * cap;
    int v = a[s], rank = 0;
    for (int k = 0; k < m; ++k) rank += a[k] < v;
    cell_sorted[(long long)c * cap + rank] = v;
    cell_pos[(long long)c * cap + rank] = hold[v];
    if (by_cell) order[cell_start[c] + rank] = v;
}

extern "C" __global__ void md_cell_clear(const MdParams p) {
    if (!p.ctl[C_REBUILD]) return;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < p.ncells; c += gridDim.x * blockDim.x)
        p.cell_count[c] = 0;
}

// Bins the n_local particles of src (the own, then any ghost copies).
extern "C" __global__ void md_cell_bin(const MdParams p, const vec4 *__restrict__ src, int copy) {
    if (!p.ctl[C_REBUILD]) return;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < p.n_local) bin_particle(i, src, p.hold, p.cell_count, p.cell_atoms, p.cells, p.ctl, copy);
}

#define SCAN_THREADS 1024
extern "C" __global__ void __launch_bounds__(SCAN_THREADS) md_cell_scan(const MdParams p) {
    if (!p.ctl[C_REBUILD]) return;
    scan_cells<SCAN_THREADS>(p.cell_count, p.cell_start, p.cells.cap, p.ncells);
}

extern "C" __global__ void md_cell_sort(const MdParams p) {
    if (!p.ctl[C_REBUILD]) return;
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t < (long long)p.ncells * p.cells.cap)
        sort_slot(t, p.cell_count, p.cell_atoms, p.cell_sorted, p.cell_pos, p.cell_start, p.order, p.by_cell, p.hold,
                  p.cells.cap);
}

// Slot s of group g's neighbour list. Lanes of a group read consecutive slots and
// neighbouring groups' slots follow, so every warp load in md_force is contiguous.
__device__ __forceinline__ long long nlist_index(int g, int s, int n, int tpp) {
    return ((long long)(s / tpp) * n + g) * tpp + (s % tpp);
}

// Full Verlet list from the build positions, tpp lanes per particle. Candidates are taken in a
// fixed order (cells of the stencil, then rank in the cell) and appended in that order through a
// ballot, so a particle's list does not depend on scheduling, on by_cell or on the walk below.
//
// Two walks over the same candidates, chosen by system size (solvers/md/gpu.py, from measurement):
// nested (cell by cell: few registers, no shared memory; for large systems, where the build is
// throughput bound) and flat (the group first lists its stencil cells and their counts in shared
// memory, lanes in parallel, then walks the candidates as one sequence with BUILD_AHEAD loads per
// lane in flight at once: no load waits on a cell's count or on the previous candidate; for small
// systems, where the build is latency bound).
#define STENCIL 27
#define BUILD_AHEAD 4

// The group's neighbour list: lanes test one candidate each (j < 0: none) and the hits are appended
// in lane order.
struct ListAppender {
    int *nlist;
    int g, n, tpp, lane, base, maxnb, cnt;
    unsigned gmask;

    __device__ __forceinline__ void take(bool hit, int j) {
        unsigned bits = __ballot_sync(gmask, hit) >> base;
        if (hit) {
            int slot = cnt + __popc(bits & ((1u << lane) - 1u));
            if (slot < maxnb) nlist[nlist_index(g, slot, n, tpp)] = j;
        }
        cnt += __popc(bits);
    }
};

// Group g's list (all its lanes call this). FLAT needs this group's rows `cells` (STENCIL ints) and
// `first` (STENCIL + 1) of shared memory.
template <bool FLAT>
__device__ __forceinline__ void build_list(int g, int lane, int base, int *cells, int *first, const vec4 *hold,
                                           const int *cell_count, const int *cell_sorted, const vec4 *cell_pos,
                                           const Cells &cl, const int *order, int by_cell, int *nlist, int *ncount,
                                           int maxnb, u64 *ctl, int n, int tpp, Box box, real_t rlist_sq) {
    const int cap = cl.cap, nx = cl.nx, ny = cl.ny, nz = cl.nz;
    int i = by_cell ? order[g] : g;
    ListAppender list{nlist, g, n, tpp, lane, base, maxnb, 0, group_mask(tpp, base)};
    vec4 p = hold[i];
    int cx = cell_coord(p.x, cl.sx, nx), cy = cell_coord(p.y, cl.sy, ny), cz = cell_coord(p.z, cl.sz, nz);
    real_t ix = (real_t)1 / box.lx, iy = (real_t)1 / box.ly, iz = (real_t)1 / box.lz;
    auto near = [&](int j, const vec4 &q) {
        real_t dx = min_image(q.x - p.x, box.lx, ix);
        real_t dy = min_image(q.y - p.y, box.ly, iy);
        real_t dz = min_image(q.z - p.z, box.lz, iz);
        return j >= 0 && j != i && dx * dx + dy * dy + dz * dz < rlist_sq;
    };
    // With fewer than 3 cells along an edge, -1 and +1 are the same cell: visit each once.
    int x0 = nx >= 3 ? cx - 1 + nx : 0, y0 = ny >= 3 ? cy - 1 + ny : 0, z0 = nz >= 3 ? cz - 1 + nz : 0;
    int mx = min(nx, 3), my = min(ny, 3), mz = min(nz, 3), ns = mx * my * mz;
    auto stencil_cell = [&](int s) {
        int a = s / (my * mz), b = (s / mz) % my, d = s % mz;
        return (((x0 + a) % nx) * ny + (y0 + b) % ny) * nz + (z0 + d) % nz;
    };
    if constexpr (!FLAT) {
        for (int s = 0; s < ns; ++s) {
            long long cell = stencil_cell(s);
            int m = min(cell_count[cell], cap);
            for (int k0 = 0; k0 < m; k0 += tpp) {
                int k = k0 + lane, j = -1;
                vec4 q;
                if (k < m) {
                    j = cell_sorted[cell * cap + k];
                    q = cell_pos[cell * cap + k];
                }
                list.take(near(j, q), j);
            }
        }
    } else {
        __syncwarp(list.gmask);  // the rows may still hold the group's previous particle (grid-stride callers)
        for (int s = lane; s < ns; s += tpp) {
            cells[s] = stencil_cell(s);
            first[s + 1] = min(cell_count[cells[s]], cap);
        }
        __syncwarp(list.gmask);
        if (lane == 0) {
            first[0] = 0;
            for (int s = 0; s < ns; ++s) first[s + 1] += first[s];
        }
        __syncwarp(list.gmask);
        const int total = first[ns];
        // This lane's current stencil cell s (its candidates only move forward): candidate f < next
        // sits at index at + f of the cell arrays.
        int s = 0, next = first[1];
        long long at = (long long)cells[0] * cap;
        for (int f0 = 0; f0 < total; f0 += BUILD_AHEAD * tpp) {
            int j[BUILD_AHEAD];
            vec4 q[BUILD_AHEAD];
#pragma unroll
            for (int u = 0; u < BUILD_AHEAD; ++u) {
                int f = f0 + u * tpp + lane;
                j[u] = -1;
                if (f < total) {
                    while (next <= f) {
                        ++s;
                        at = (long long)cells[s] * cap - first[s];
                        next = first[s + 1];
                    }
                    j[u] = cell_sorted[at + f];
                    q[u] = cell_pos[at + f];
                }
            }
#pragma unroll
            for (int u = 0; u < BUILD_AHEAD; ++u) list.take(near(j[u], q[u]), j[u]);
        }
    }
    if (lane == 0) {
        ncount[g] = min(list.cnt, maxnb);
        if (list.cnt > maxnb) atomicMax(&ctl[C_NBMAX], (u64)list.cnt);
    }
}

// One lane group a particle. FLAT: shared rows for the block's groups.
template <bool FLAT>
__device__ __forceinline__ void neigh_build(const MdParams &p) {
    __shared__ int stencil[FLAT ? MD_BLOCK : 1][STENCIL];       // per group of the block: its stencil cells
    __shared__ int first_of[FLAT ? MD_BLOCK : 1][STENCIL + 1];  // and the candidates before each
    if (!p.ctl[C_REBUILD]) return;
    const int tpp = p.tpp;
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    int g = t / tpp, lane = t & (tpp - 1);
    if (g >= p.n) return;  // whole groups of lanes leave together
    if (p.ctl[C_CELLMAX]) {  // cells overflowed (order is incomplete): the host redoes the chunk
        if (lane == 0) p.ncount[g] = 0;
        return;
    }
    int here = FLAT ? threadIdx.x / tpp : 0;
    build_list<FLAT>(g, lane, (threadIdx.x & 31) & ~(tpp - 1), stencil[here], first_of[here], p.hold, p.cell_count,
                     p.cell_sorted, p.cell_pos, p.cells, p.order, p.by_cell, p.nlist, p.ncount, p.maxnb, p.ctl, p.n,
                     tpp, p.box, p.rlist_sq);
}

extern "C" __global__ void __launch_bounds__(MD_BLOCK) md_neigh_build(const MdParams p) { neigh_build<false>(p); }
extern "C" __global__ void __launch_bounds__(MD_BLOCK) md_neigh_build_flat(const MdParams p) { neigh_build<true>(p); }

// The pair force on particle i = order[g] (or g) from its list, by the tpp lanes of group
// g: every lane of the group calls this, active or not (the shuffles need them all). Then in lane 0:
// the Langevin force, frc[i], the second half kick (unless setup) and, at a reduce step, the
// per-atom halves of energy and virial, with the particle's (v^2, e/2, w/2) added to acc.
// Positions and lists are read through plain pointers: in md_run other blocks may just have written them.
__device__ __forceinline__ void force_group(int g, int lane, unsigned gmask, bool active, const vec4 *pos,
                                            vec4 *vel, vec4 *frc, double *pe, double *vir, const int *nlist,
                                            const int *ncount, const int *order, int by_cell,
                                            const long long *__restrict__ ids, int n, int tpp, Box box,
                                            const MD_PAIR &potential, const Bath &bath, real_t half_dt_m, bool setup,
                                            bool reduce,
                                            u64 step, double (&acc)[3]) {
    int i = active ? (by_cell ? order[g] : g) : 0;
    real_t fx = 0, fy = 0, fz = 0;
    double e = 0.0, w = 0.0;
    if (active) {
        vec4 p = pos[i];
        real_t ix = (real_t)1 / box.lx, iy = (real_t)1 / box.ly, iz = (real_t)1 / box.lz;
        int m = ncount[g];
        long long stride = (long long)n * tpp;
        const int *slot = nlist + (long long)g * tpp + lane;
        auto pair = [&](const vec4 &q) {
            real_t dx = min_image(q.x - p.x, box.lx, ix);
            real_t dy = min_image(q.y - p.y, box.ly, iy);
            real_t dz = min_image(q.z - p.z, box.lz, iz);
            real_t rsq = dx * dx + dy * dy + dz * dz;
            real_t fr, wp;
            double ep;
            if (potential(rsq, fr, wp, ep)) {
                fx -= fr * dx; fy -= fr * dy; fz -= fr * dz;
                e += ep;
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
    if (!active || lane != 0) return;
    vec4 v = vel[i];
    if (bath.on) {
        unsigned c[4] = {(unsigned)ids[i], (unsigned)step, (unsigned)(step >> 32), 0x4C414E47u};
        philox4x32_10(c, bath.seed_lo, bath.seed_hi);
        fx += (real_t)(-bath.gamma_m * (double)v.x + bath.noise * uniform_centered(c[0]));
        fy += (real_t)(-bath.gamma_m * (double)v.y + bath.noise * uniform_centered(c[1]));
        fz += (real_t)(-bath.gamma_m * (double)v.z + bath.noise * uniform_centered(c[2]));
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
        acc[0] += (double)v.x * v.x + (double)v.y * v.y + (double)v.z * v.z;
        acc[1] += 0.5 * e;
        acc[2] += 0.5 * w;
    }
}

// thermo[0..2] = (m sum v^2, sum E_pair, sum r.F) from the per-block partial sums, in block order
// (deterministic), by one block of B threads.
template <int B>
__device__ void reduce_thermo(const double *partial, double *thermo, double mass) {
    double s[3] = {0.0, 0.0, 0.0};
    for (int b = threadIdx.x; b < gridDim.x; b += B)
        for (int q = 0; q < 3; ++q) s[q] += __ldcg(&partial[3 * b + q]);
    block_sums<B>(s);
    if (threadIdx.x == 0) {
        thermo[0] = mass * s[0];
        thermo[1] = s[1];
        thermo[2] = s[2];
    }
}

// This block's (B threads) sums of acc into partial[3 * blockIdx.x + q].
template <int B>
__device__ __forceinline__ void publish_block_sums(double (&acc)[3], double *partial) {
    block_sums<B>(acc);
    if (threadIdx.x == 0)
        for (int q = 0; q < 3; ++q) partial[3 * blockIdx.x + q] = acc[q];
}

// Forces of the current step, one lane group per particle, after a list rebuild (and at setup, with
// setup != 0: forces of the current state, no kick, no control changes). Returns at once when md_run
// has computed this step's forces. The last block records why the chunk stops (or that it goes on).
// ranks != 0 (a distributed run, where ctl[C_REQ], ctl[C_FAR] and ctl[C_BAD] hold the values reduced
// over the ranks): an unstable particle, a list build that md_build_gate left to the host, or lists
// that did not fit the build md_build_gate started are recorded in ctl[C_STATUS] instead, for the host.
extern "C" __global__ void __launch_bounds__(MD_BLOCK)
md_force(const MdParams p, int setup, u64 while_handle, int ranks) {
    u64 *const ctl = p.ctl;
    const int n = p.n, tpp = p.tpp;
    u64 step = ctl[C_STEP];
    if (!setup && (ctl[C_STATUS] != ST_RUNNING || ctl[C_FORCED] == step)) return;  // done, or past the stop
    if (ranks && !setup && (ctl[C_BAD] || (ctl[C_REQ] && !ctl[C_REBUILD]) || ctl[C_NBMAX] || ctl[C_CELLMAX])) {
        if (blockIdx.x == 0 && threadIdx.x == 0)
            ctl[C_STATUS] = ctl[C_BAD] ? ST_UNSTABLE : (ctl[C_REBUILD] ? ST_OVERFLOW : ST_REBUILD);
        return;
    }
    bool reduce = setup || step >= ctl[C_TARGET];
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    int base = (threadIdx.x & 31) & ~(tpp - 1);
    double acc[3] = {0.0, 0.0, 0.0};
    force_group(t / tpp, t & (tpp - 1), group_mask(tpp, base), t / tpp < n, p.pos, p.vel, p.frc, p.pe, p.vir,
                p.nlist, p.ncount, p.order, p.by_cell, p.ids, n, tpp, p.box, MD_PAIR{p.pair}, p.bath, p.half_dt_m,
                setup, reduce, step, acc);
    if (reduce) publish_block_sums<MD_BLOCK>(acc, p.partial);  // uniform over the grid
    if (!last_block(&ctl[C_ARRIVE])) return;
    if (reduce) reduce_thermo<MD_BLOCK>(p.partial, p.thermo, p.mass);
    if (threadIdx.x == 0) {
        ctl[C_FORCED] = step;
        if (!setup) {
            u64 status = (ld_l2(&ctl[C_NBMAX]) || ld_l2(&ctl[C_CELLMAX])) ? ST_OVERFLOW
                         : (step >= ctl[C_TARGET] ? ST_DONE : ST_RUNNING);
            ctl[C_STATUS] = status;
            if (ranks && ctl[C_REQ]) ctl[C_BUILDS] += 1;  // md_build_gate's build (the host counts its own)
            ctl[C_REBUILD] = 0;
            ctl[C_REQ] = 0;
            ctl[C_FAR] = 0;
            if (while_handle) cudaGraphSetConditional(while_handle, status == ST_RUNNING ? 1u : 0u);
        }
    }
}

// Distributed runs, a step in kernels between which the ranks exchange ghosts: md_kick_drift (the
// first kick and the drift of the own particles, in place; any rebuild request, particle past the
// ghost margin or unstable particle in ctl), md_pack (the send buffer), then, once the flags are
// reduced over the ranks, md_build_gate, the list build's kernels (which return at once unless it
// set ctl[C_REBUILD]) and md_force with ranks != 0. Past the chunk's stop, or once the status is not
// ST_RUNNING, nothing moves.
extern "C" __global__ void __launch_bounds__(MD_BLOCK) md_kick_drift(const MdParams p) {
    u64 *const ctl = p.ctl;
    const u64 step = ctl[C_STEP];
    const bool live = ctl[C_STATUS] == ST_RUNNING && ctl[C_FORCED] == step && step < ctl[C_TARGET];
    if (!live) return;  // the same in every block: the previous kernels set these
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    bool req = false, far = false;
    if (i < p.n) {
        req = kick_drift(i, p.pos, p.pos, p.vel, p.frc, p.img, p.hold, ctl, p.n, p.dt, p.half_dt_m, p.box,
                         p.trigger_sq, p.max_move_sq);
        vec4 x = p.pos[i], a = p.planned[i];
        real_t dx = x.x - a.x, dy = x.y - a.y, dz = x.z - a.z;
        far = !(dx * dx + dy * dy + dz * dz <= p.margin_sq);  // NaN counts as far
    }
    if (__any_sync(0xffffffffu, req) && (threadIdx.x & 31) == 0) atomicOr(&ctl[C_REQ], 1ull);
    if (__any_sync(0xffffffffu, far) && (threadIdx.x & 31) == 0) atomicOr(&ctl[C_FAR], 1ull);
    if (last_block(&ctl[C_DRIFTED]) && threadIdx.x == 0) ctl[C_STEP] = step + 1;
}

// Distributed runs, after the flags are reduced: a list build the ranks agreed on is done here, on the
// particles and ghosts held, when no particle on any rank has moved past the ghost margin; otherwise
// md_force leaves it to the host (which migrates particles first). One thread.
extern "C" __global__ void md_build_gate(const MdParams p) {
    u64 *const ctl = p.ctl;
    const u64 step = ctl[C_STEP];
    if (ctl[C_STATUS] != ST_RUNNING || ctl[C_FORCED] == step) return;
    if (ctl[C_REQ] && !ctl[C_FAR] && !ctl[C_BAD]) ctl[C_REBUILD] = 1;
}

// sendbuf[k] = pos[send_index[k]] + shift[k]: the own particles a neighbour holds as ghosts, in its frame.
extern "C" __global__ void md_pack(const MdParams p, const int *__restrict__ send_index,
                                   const vec4 *__restrict__ shift, vec4 *__restrict__ sendbuf, int count) {
    int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= count) return;
    vec4 a = p.pos[send_index[k]], b = shift[k];
    sendbuf[k] = vec4{a.x + b.x, a.y + b.y, a.z + b.z, (real_t)0};
}

// Distributed runs, at an agreed list build (solvers/md/parallel_gpu.py). A record of MD_RECORD
// doubles per own particle: its position wrapped into the periodic box (global coordinates), velocity,
// image counts, index in the starting state, id and owning rank; as kernels/md_ref.migration_records.
#define MD_RECORD 12
// Also the particle's migration key, as bit key of mask[i]: 0 if it stays, 1 + r if it goes along route r
// (to the neighbour at offsets[r]), MD_LOST if its new owner is no neighbour (kernels/md_ref.migration_keys).
#define MD_LOST 27
extern "C" __global__ void md_records(const MdParams p, const long long *__restrict__ gidx, const RankFrame fr,
                                      double *__restrict__ rec, unsigned *__restrict__ mask) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= p.n) return;
    vec4 x = p.pos[i], v = p.vel[i];
    int4 im = p.img[i];
    double q[3] = {(double)x.x + fr.origin[0], (double)x.y + fr.origin[1], (double)x.z + fr.origin[2]};
    int m[3] = {im.x, im.y, im.z};
    int owner = 0, offset = 0;
    bool lost = false;
    double *r = rec + (long long)i * MD_RECORD;
    for (int d = 0; d < 3; ++d) {
        double w = floor(q[d] / fr.box[d]);
        q[d] -= w * fr.box[d];  // w is 0 or +-1: the product is exact, so no contraction changes it
        long long c = (long long)floor(q[d] / fr.width[d]);
        const int g = fr.grid[d];
        c = c < 0 ? 0 : (c >= g ? g - 1 : c);
        owner = owner * g + (int)c;
        int step = (int)c - fr.coords[d];  // to the owner's sub-box, across the periodic boundary if shorter
        if (g > 2 && step == g - 1) step = -1;
        else if (g > 2 && step == 1 - g) step = 1;
        lost |= step < -1 || step > 1;
        offset = offset * 3 + step + 1;
        r[d] = q[d];
        r[6 + d] = (double)(m[d] + (int)w);
    }
    r[3] = (double)v.x; r[4] = (double)v.y; r[5] = (double)v.z;
    r[9] = (double)gidx[i];
    r[10] = (double)p.ids[i];
    r[11] = (double)owner;
    int key = 0;
    if (lost) key = MD_LOST;
    else if (offset != 13)  // 13: no offset, this rank
        for (int k = 0; k < 26; ++k) key = fr.offsets[k] == offset ? 1 + k : key;
    mask[i] = 1u << key;
}

// The own particles from `count` records (kernels/md_ref.unpack_records): positions in this rank's frame.
extern "C" __global__ void md_unpack(const double *__restrict__ rec, int count, const RankFrame fr, vec4 *pos,
                                     vec4 *vel, int4 *img, long long *gidx, long long *ids) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    const double *r = rec + (long long)i * MD_RECORD;
    pos[i] = vec4{(real_t)(r[0] - fr.origin[0]), (real_t)(r[1] - fr.origin[1]), (real_t)(r[2] - fr.origin[2]),
                  (real_t)0};
    vel[i] = vec4{(real_t)r[3], (real_t)r[4], (real_t)r[5], (real_t)0};
    img[i] = make_int4((int)r[6], (int)r[7], (int)r[8], 0);
    gidx[i] = (long long)r[9];
    ids[i] = (long long)r[10];
}

// Bit r of mask[i]: own particle i (frame position pos[i]) goes along route r as a ghost, being within
// reach (the ghost shell's width) of every face the route's offset points through (kernels/md_ref.route_masks).
extern "C" __global__ void md_ghost_routes(const vec4 *__restrict__ pos, int n, const RankFrame fr,
                                           unsigned *__restrict__ mask) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    vec4 x = pos[i];
    double q[3] = {(double)x.x + fr.origin[0], (double)x.y + fr.origin[1], (double)x.z + fr.origin[2]};
    bool lo[3], hi[3];
    for (int d = 0; d < 3; ++d) {
        lo[d] = q[d] - fr.lo[d] < fr.reach;
        hi[d] = fr.hi[d] - q[d] < fr.reach;
    }
    unsigned bits = 0;
    for (int r = 0; r < 26; ++r) {
        int o = fr.offsets[r], along[3] = {o / 9, (o / 3) % 3, o % 3};  // 0, 1, 2: offset -1, 0, +1
        bool ok = true;
        for (int d = 0; d < 3; ++d) ok = ok && (along[d] == 1 || (along[d] == 0 ? lo[d] : hi[d]));
        bits |= (unsigned)ok << r;
    }
    mask[i] = bits;
}

// Partition by key bits (kernels/md_ref.partition_bits): item i has mask[i], bit k set when it belongs to
// key k (nkeys <= 32). Lists (index, key) of all set bits, grouped by key, indices ascending within a key:
// md_bits_count (counts[k * blocks + b]: items of key k in block b of MD_BLOCK items), then, after the host
// has made those counts exclusive prefix sums (key-major, so that key k's items of block b start at
// offsets[k * blocks + b]), md_bits_scatter (each item's place in its block from warp ballots).
extern "C" __global__ void __launch_bounds__(MD_BLOCK)
md_bits_count(const unsigned *__restrict__ mask, int n, int nkeys, int *__restrict__ counts) {
    __shared__ int count[32];
    if (threadIdx.x < 32) count[threadIdx.x] = 0;
    __syncthreads();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned m = i < n ? mask[i] : 0u;
    for (int k = 0; k < nkeys; ++k) {
        unsigned b = __ballot_sync(0xffffffffu, (m >> k) & 1u);
        if ((threadIdx.x & 31) == 0 && b) atomicAdd(&count[k], __popc(b));
    }
    __syncthreads();
    if (threadIdx.x < nkeys) counts[(long long)threadIdx.x * gridDim.x + blockIdx.x] = count[threadIdx.x];
}

extern "C" __global__ void __launch_bounds__(MD_BLOCK)
md_bits_scatter(const unsigned *__restrict__ mask, int n, int nkeys, const int *__restrict__ offsets,
                int *__restrict__ index, int *__restrict__ key) {
    __shared__ int per_warp[32][MD_BLOCK / 32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned m = i < n ? mask[i] : 0u;
    for (int k = 0; k < nkeys; ++k) {
        unsigned b = __ballot_sync(0xffffffffu, (m >> k) & 1u);
        if (lane == 0) per_warp[k][warp] = __popc(b);
    }
    __syncthreads();
    for (int k = 0; k < nkeys; ++k) {
        unsigned b = __ballot_sync(0xffffffffu, (m >> k) & 1u);
        if (!((m >> k) & 1u)) continue;
        int at = offsets[(long long)k * gridDim.x + blockIdx.x] + __popc(b & ((1u << lane) - 1u));
        for (int w = 0; w < warp; ++w) at += per_warp[k][w];
        index[at] = i;
        key[at] = k;
    }
}

// Up to `count` steps of the chunk (see the top of this file). Every block tracks the step and the
// decisions itself (all see the same flags after each barrier); block 0 writes them back at the end.
// A step: kick and drift | barrier: every position is written, and any rebuild request or unstable
// particle is visible to all | forces and second kick. The lane that computes a particle's force also
// kicks and drifts it, and the drift writes the other of two position buffers (pos, pos_alt), so the
// next step needs no barrier before its drift: no one reads a particle's force or velocity but its
// own lane, and the positions being read are not the ones being written. Positions end in pos.
// A rebuild request ends the launch (md_run: the IF node rebuilds between launches) or is served in
// place (md_run_rebuilding, for small systems; its registers would slow the large ones' steps): clear | bin | (scan) | sort | lists, a barrier after each; an overflow ends the
// launch with ST_OVERFLOW (the host grows the buffers and redoes the chunk).
// Blocks of RUN_BLOCK threads: fewer, larger blocks than the other kernels' make the barriers cheaper.
#define RUN_BLOCK 256
template <bool REBUILD_HERE>
__device__ __forceinline__ void run_steps(const MdParams &p, u64 if_handle, u64 while_handle) {
    // The fields the loop reads, under the names it uses.
    vec4 *const pos = p.pos, *const pos_alt = p.pos_alt, *const vel = p.vel, *const frc = p.frc, *const hold = p.hold;
    int4 *const img = p.img;
    double *const pe = p.pe, *const vir = p.vir, *const partial = p.partial, *const thermo = p.thermo;
    int *const nlist = p.nlist, *const ncount = p.ncount, *const order = p.order;
    const long long *__restrict__ ids = p.ids;
    u64 *const ctl = p.ctl;
    int *const cell_count = p.cell_count, *const cell_atoms = p.cell_atoms, *const cell_sorted = p.cell_sorted;
    vec4 *const cell_pos = p.cell_pos;
    int *const cell_start = p.cell_start;
    const int n = p.n, n_local = p.n_local, tpp = p.tpp, by_cell = p.by_cell, cap = p.cells.cap;
    const int ncells = p.ncells, maxnb = p.maxnb, count = p.count;
    const real_t dt = p.dt, half_dt_m = p.half_dt_m, trigger_sq = p.trigger_sq, max_move_sq = p.max_move_sq;
    const real_t rlist_sq = p.rlist_sq;
    const double mass = p.mass;
    __shared__ u64 sync_target;
    __shared__ int verdict;  // 0: go on, 1: rebuild, 2: unstable / overflow
    const Box &box = p.box;
    const MD_PAIR pair{p.pair};
    const Bath &bath = p.bath;
    const Cells &cl = p.cells;
    u64 step = ctl[C_STEP], forced = ctl[C_FORCED], status = ctl[C_STATUS];
    const u64 target = ctl[C_TARGET];
    if (threadIdx.x == 0) sync_target = sync_base(&ctl[C_SYNC]);
    const int threads = gridDim.x * RUN_BLOCK, t0 = blockIdx.x * RUN_BLOCK + threadIdx.x;
    const int lane = threadIdx.x & (tpp - 1);
    const int base = (threadIdx.x & 31) & ~(tpp - 1);
    const unsigned gmask = group_mask(tpp, base);
    vec4 *const buffers[2] = {pos, pos_alt};
    int cur = 0;  // buffers[cur] holds the current positions
    // Lane groups g over the particles, a block-uniform loop (the shuffles need whole warps).
    auto for_each_group = [&](auto body) {
        for (int t = blockIdx.x * RUN_BLOCK; t < n * tpp; t += threads) {
            const int g = (t + threadIdx.x) / tpp;
            body(g, g < n);
        }
    };
    auto sync = [&]() { grid_sync(&ctl[C_SYNC], sync_target); };
    // After a barrier: what ctl says (thread 0 reads it past L1, every thread gets it).
    auto agree = [&](auto read) {
        __syncthreads();
        if (threadIdx.x == 0) verdict = read();
        __syncthreads();
        return verdict;
    };
    int verdict_here = 0, builds = 0;
    for (int c = 0; c < count && status == ST_RUNNING && step < target; ++c) {
        bool req = false;
        for_each_group([&](int g, bool active) {
            if (active && lane == 0)
                req |= kick_drift(by_cell ? order[g] : g, buffers[cur], buffers[cur ^ 1], vel, frc, img, hold, ctl,
                                  n, dt, half_dt_m, box, trigger_sq, max_move_sq);
        });
        cur ^= 1;
        // One atomic per warp at most: the flag only needs to become non-zero.
        if (__any_sync(0xffffffffu, req) && (threadIdx.x & 31) == 0) atomicOr(&ctl[C_REQ], 1ull);
        sync();
        ++step;
        verdict_here = agree([&] { return ld_l2(&ctl[C_BAD]) ? 2 : (ld_l2(&ctl[C_REQ]) ? 1 : 0); });
        if (verdict_here == 2) status = ST_UNSTABLE;
        if (verdict_here == 2 || (verdict_here == 1 && !REBUILD_HERE)) break;
        if constexpr (REBUILD_HERE) {
            if (verdict_here == 1) {
                __shared__ int stencil[RUN_BLOCK / 2][STENCIL];  // flat walk (tpp >= 2): the block's groups' rows
                __shared__ int first_of[RUN_BLOCK / 2][STENCIL + 1];
                for (int k = t0; k < ncells; k += threads) cell_count[k] = 0;
                sync();
                if (blockIdx.x == 0 && threadIdx.x == 0) ctl[C_REQ] = 0;  // every block has read it by now
                for (int i = t0; i < n_local; i += threads)
                    bin_particle(i, buffers[cur], hold, cell_count, cell_atoms, cl, ctl, 1);
                sync();
                if (by_cell) {
                    if (blockIdx.x == 0) scan_cells<RUN_BLOCK>(cell_count, cell_start, cap, ncells);
                    sync();
                }
                for (long long k = t0; k < (long long)ncells * cap; k += threads)
                    sort_slot(k, cell_count, cell_atoms, cell_sorted, cell_pos, cell_start, order, by_cell, hold, cap);
                sync();
                ++builds;
                if (agree([&] { return ld_l2(&ctl[C_CELLMAX]) ? 2 : 0; })) {
                    verdict_here = 0;
                    status = ST_OVERFLOW;
                    break;
                }
                for_each_group([&](int g, bool active) {
                    if (!active) return;
                    int here = threadIdx.x / tpp;
                    if (tpp >= 2)
                        build_list<true>(g, lane, base, stencil[here], first_of[here], hold, cell_count,
                                         cell_sorted, cell_pos, cl, order, by_cell, nlist, ncount, maxnb, ctl, n,
                                         tpp, box, rlist_sq);
                    else
                        build_list<false>(g, lane, base, nullptr, nullptr, hold, cell_count, cell_sorted, cell_pos, cl,
                                          order, by_cell, nlist, ncount, maxnb, ctl, n, tpp, box, rlist_sq);
                });
                sync();
                if (agree([&] { return ld_l2(&ctl[C_NBMAX]) ? 2 : 0; })) {
                    verdict_here = 0;
                    status = ST_OVERFLOW;
                    break;
                }
                verdict_here = 0;
            }
        }
        const bool reduce = step >= target;
        double acc[3] = {0.0, 0.0, 0.0};
        for_each_group([&](int g, bool active) {
            force_group(g, lane, gmask, active, buffers[cur], vel, frc, pe, vir, nlist, ncount, order, by_cell, ids,
                        n, tpp, box, pair, bath, half_dt_m, false, reduce, step, acc);
        });
        forced = step;
        if (reduce) {
            publish_block_sums<RUN_BLOCK>(acc, partial);
            status = ST_DONE;
            sync();
        }
    }
    if (cur) {  // each lane group's own particle, as in the phases above: no barrier needed
        for_each_group([&](int g, bool active) {
            if (active && lane == 0) {
                const int i = by_cell ? order[g] : g;
                pos[i] = pos_alt[i];
            }
        });
    }
    if (blockIdx.x != 0) return;
    if (status == ST_DONE) reduce_thermo<RUN_BLOCK>(partial, thermo, mass);
    if (threadIdx.x != 0) return;
    // The other blocks read ctl[C_STEP], [C_FORCED], [C_STATUS] only before their first barrier. After
    // a rebuild request or an unstable particle they may still be reading ctl[C_REQ] / ctl[C_BAD]:
    // those two are left for md_force (and the host) to clear.
    ctl[C_STEP] = step;
    ctl[C_FORCED] = forced;
    ctl[C_STATUS] = status;
    ctl[C_BUILDS] += builds + (verdict_here == 1);
    if (verdict_here == 1) ctl[C_REBUILD] = 1;
    if (if_handle) cudaGraphSetConditional(if_handle, verdict_here == 1 ? 1u : 0u);
    if (while_handle && status != ST_RUNNING) cudaGraphSetConditional(while_handle, 0u);
}

extern "C" __global__ void __launch_bounds__(RUN_BLOCK)
md_run(__grid_constant__ const MdParams p, u64 if_handle, u64 while_handle) { run_steps<false>(p, if_handle, while_handle); }
// Minimum one block an SM: ptxas then gives the small systems' kernel 111 registers instead of 101 (two
// blocks an SM either way) and a 4,000-particle step takes 3% less time (H200, MEASUREMENTS.md).
extern "C" __global__ void __launch_bounds__(RUN_BLOCK, 1)
md_run_rebuilding(__grid_constant__ const MdParams p, u64 if_handle, u64 while_handle) { run_steps<true>(p, if_handle, while_handle); }
