// Lennard-Jones molecular dynamics: one timestep as a handful of kernels that a CUDA
// graph captures once. real_t (double, or float for mixed precision) is typedef'd by
// the loader; energies and virials are always accumulated in double.
//
// A step is:  md_integrate1 -> md_decide -> [IF rebuild: md_cell_clear, md_cell_bin,
// md_cell_sort, md_neigh_build] -> md_force -> md_condition.
// The control block ctl (unsigned long long[CTL_SIZE]) carries everything the host and
// the kernels share; every kernel of the step returns at once when ctl[C_STATUS] != 0,
// so extra (unrolled) steps after the stop change nothing.
// kernels/md_ref.py states the same formulas in NumPy.

#define C_STEP 0      // last completed step
#define C_TARGET 1    // step at which the chunk stops
#define C_REQ 2       // some particle moved more than skin/2 (set by md_integrate1)
#define C_REBUILD 3   // rebuild in this step (set by md_decide or by the host)
#define C_BUILDS 4    // list builds so far
#define C_STATUS 5    // ST_* below
#define C_NBMAX 6     // largest neighbour count that did not fit (0: all fit)
#define C_CELLMAX 7   // largest cell occupancy that did not fit (0: all fit)
#define C_BAD 8       // n - index of the lowest particle that moved implausibly (0: none)
#define CTL_SIZE 16

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

__device__ __forceinline__ double uniform_centered(unsigned bits) {
    return ((double)bits + 0.5) * 2.3283064365386963e-10 - 0.5;  // 2^-32
}

// First half kick and drift; wrap into the box; flag a list rebuild when a particle has
// moved more than skin/2 since the last build, and an unstable run when it moved more than
// half the list cutoff in this one step (or is not finite).
extern "C" __global__ void md_integrate1(vec4 *__restrict__ pos, vec4 *__restrict__ vel,
                                         const vec4 *__restrict__ frc, int4 *__restrict__ img,
                                         const vec4 *__restrict__ hold, u64 *ctl, int n,
                                         real_t dt, real_t half_dt_m, real_t lx, real_t ly, real_t lz,
                                         real_t trigger_sq, real_t max_move_sq) {
    if (ctl[C_STATUS]) return;
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
}

// One thread: turn the rebuild request into this step's decision (and the IF node's value).
extern "C" __global__ void md_decide(u64 *ctl, u64 if_handle) {
    unsigned go = (ctl[C_STATUS] == ST_RUNNING && ctl[C_REQ]) ? 1u : 0u;
    ctl[C_REQ] = 0;
    ctl[C_REBUILD] = go;
    ctl[C_BUILDS] += go;
    if (if_handle) cudaGraphSetConditional(if_handle, go);
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

// Sort each cell's particles by index: atomics fill cells in a racy order, and a
// deterministic list order makes force sums, hence whole runs, reproducible bit for bit.
extern "C" __global__ void md_cell_sort(const int *cell_count, int *cell_atoms, int cap, int ncells,
                                        const u64 *ctl) {
    if (!ctl[C_REBUILD]) return;
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= ncells) return;
    int m = min(cell_count[c], cap);
    int *a = cell_atoms + (long long)c * cap;
    for (int k = 1; k < m; ++k) {
        int v = a[k], j = k - 1;
        while (j >= 0 && a[j] > v) { a[j + 1] = a[j]; --j; }
        a[j + 1] = v;
    }
}

// Full Verlet list from the build positions: nlist[k * n + i] is particle i's k-th
// neighbour (column-major, so the force kernel's loads coalesce).
extern "C" __global__ void md_neigh_build(const vec4 *__restrict__ hold, const int *__restrict__ cell_count,
                                          const int *__restrict__ cell_atoms, int cap,
                                          int *__restrict__ nlist, int *__restrict__ ncount, int maxnb,
                                          u64 *ctl, int n, int nx, int ny, int nz,
                                          real_t sx, real_t sy, real_t sz,
                                          real_t lx, real_t ly, real_t lz, real_t rlist_sq) {
    if (!ctl[C_REBUILD]) return;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    if (ctl[C_CELLMAX]) { ncount[i] = 0; return; }  // cells overflowed: the host redoes the chunk
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
                int cell = (ax * ny + by) * nz + (z0 + d) % nz;
                int m = min(cell_count[cell], cap);
                const int *list = cell_atoms + (long long)cell * cap;
                for (int k = 0; k < m; ++k) {
                    int j = list[k];
                    if (j == i) continue;
                    vec4 q = hold[j];
                    real_t dx = min_image(q.x - p.x, lx, ix);
                    real_t dy = min_image(q.y - p.y, ly, iy);
                    real_t dz = min_image(q.z - p.z, lz, iz);
                    if (dx * dx + dy * dy + dz * dz < rlist_sq) {
                        if (cnt < maxnb) nlist[(long long)cnt * n + i] = j;
                        ++cnt;
                    }
                }
            }
        }
    }
    ncount[i] = min(cnt, maxnb);
    if (cnt > maxnb) atomicMax(&ctl[C_NBMAX], (u64)cnt);
}

// Lennard-Jones forces over the full list, per-atom halves of energy and virial (double),
// the Langevin force (langevin != 0), and the second half kick (stage 1). Stage 0 is the
// setup force evaluation at step ctl[C_STEP] (no kick); stage 1 computes step ctl[C_STEP] + 1.
extern "C" __global__ void md_force(const vec4 *__restrict__ pos, vec4 *__restrict__ vel,
                                    vec4 *__restrict__ frc, double *__restrict__ pe,
                                    double *__restrict__ vir, const int *__restrict__ nlist,
                                    const int *__restrict__ ncount, const long long *__restrict__ ids,
                                    const u64 *ctl, int n, real_t lx, real_t ly, real_t lz,
                                    real_t rc_sq, real_t sigma_sq, real_t eps4, real_t eps24, double eshift,
                                    real_t half_dt_m, int stage, int langevin, double gamma_m, double noise,
                                    unsigned seed_lo, unsigned seed_hi) {
    if (stage && ctl[C_STATUS]) return;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    vec4 p = pos[i];
    real_t ix = (real_t)1 / lx, iy = (real_t)1 / ly, iz = (real_t)1 / lz;
    real_t fx = 0, fy = 0, fz = 0;
    double e = 0.0, w = 0.0;
    int m = ncount[i];
    for (int k = 0; k < m; ++k) {
        vec4 q = pos[nlist[(long long)k * n + i]];
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
    }
    vec4 v = vel[i];
    if (langevin) {
        u64 step = ctl[C_STEP] + (u64)stage;
        unsigned c[4] = {(unsigned)ids[i], (unsigned)step, (unsigned)(step >> 32), 0x4C414E47u};
        philox4x32_10(c, seed_lo, seed_hi);
        fx += (real_t)(-gamma_m * (double)v.x + noise * uniform_centered(c[0]));
        fy += (real_t)(-gamma_m * (double)v.y + noise * uniform_centered(c[1]));
        fz += (real_t)(-gamma_m * (double)v.z + noise * uniform_centered(c[2]));
    }
    vec4 f = {fx, fy, fz, (real_t)0};
    frc[i] = f;
    pe[i] = 0.5 * e;
    vir[i] = 0.5 * w;
    if (stage) {
        v.x += half_dt_m * fx; v.y += half_dt_m * fy; v.z += half_dt_m * fz;
        vel[i] = v;
    }
}

#define COND_THREADS 512

// One block. setup == 0: close the step (count it, record why the loop stops, set the
// WHILE node's value); at the chunk's last step, and for setup != 0, reduce
// thermo[0..2] = (sum m v^2, sum E_pair, sum r.F) in a fixed order (deterministic).
extern "C" __global__ void __launch_bounds__(COND_THREADS)
md_condition(u64 *ctl, const vec4 *__restrict__ vel, const double *__restrict__ pe,
             const double *__restrict__ vir, double *thermo, int n, double mass, u64 while_handle,
             int setup) {
    __shared__ int reduce;
    __shared__ double s[3][COND_THREADS];
    if (threadIdx.x == 0) {
        int r = setup;
        if (!setup && ctl[C_STATUS] == ST_RUNNING) {
            u64 step = ctl[C_STEP] + 1;
            ctl[C_STEP] = step;
            if (ctl[C_BAD]) ctl[C_STATUS] = ST_UNSTABLE;
            else if (ctl[C_NBMAX] || ctl[C_CELLMAX]) ctl[C_STATUS] = ST_OVERFLOW;
            else if (step >= ctl[C_TARGET]) { ctl[C_STATUS] = ST_DONE; r = 1; }
        }
        reduce = r;
        if (while_handle) cudaGraphSetConditional(while_handle, ctl[C_STATUS] == ST_RUNNING ? 1u : 0u);
    }
    __syncthreads();
    if (!reduce) return;
    double a = 0.0, b = 0.0, c = 0.0;
    for (int i = threadIdx.x; i < n; i += COND_THREADS) {
        vec4 v = vel[i];
        a += (double)v.x * v.x + (double)v.y * v.y + (double)v.z * v.z;
        b += pe[i];
        c += vir[i];
    }
    s[0][threadIdx.x] = a; s[1][threadIdx.x] = b; s[2][threadIdx.x] = c;
    __syncthreads();
    for (int h = COND_THREADS / 2; h > 0; h >>= 1) {
        if (threadIdx.x < h)
            for (int q = 0; q < 3; ++q) s[q][threadIdx.x] += s[q][threadIdx.x + h];
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        thermo[0] = mass * s[0][0];
        thermo[1] = s[1][0];
        thermo[2] = s[2][0];
    }
}
