// PCG on chip: each system's solve runs inside one thread block, or one thread-block cluster
// (Hopper), with block or cluster barriers only; see onchip_ref.py for the NumPy meaning. One launch
// solves B independent systems (a batch) or one (the small-system path of PCG).
//
// A system is split over ONCHIP_GROUPS teams of ONCHIP_TEAM blocks (a team is a cluster when
// ONCHIP_TEAM > 1) of ONCHIP_BLOCK threads; the system's block c (its team c / ONCHIP_TEAM, its rank in
// the team c % ONCHIP_TEAM) owns the system's rows [c * CHUNK, (c + 1) * CHUNK) and thread t of it the
// rows c * CHUNK + t + k * ONCHIP_BLOCK, k < ONCHIP_ROWS. A thread keeps its rows' vectors in registers;
// the vectors other threads read (the product's input and, in a team, what the other blocks need to
// form it) live in the block's shared memory, where the team's other blocks read them through
// distributed shared memory.
//
// Thread slots: slot i of a system holds its row a.order[lo + i] (counted from the system's first row
// lo) with ONCHIP_ORDERED, else row i; a.slot is the inverse (a.slot[lo + j]: the slot of row j). The
// kernel works in slots (its columns are slots, its shared vectors indexed by slot) and reads b, x0
// and the inverse diagonal and keeps x and its state at the given rows, so the order is invisible
// outside. solvers/pcg/onchip.py's length_order sets one for a system in one block: its rows by
// length, each thread's k-th rows holding held_of(k) entries in registers.
//
// The matrix: the first ONCHIP_HELD entries of a thread's rows sit in its registers (the warp's rows
// padded to the warp's longest, with zeros on the row's own column; a row past the system's end on the
// system's last row, a column of the same block). The rest of a block's rows are
// laid out as slices of 32 rows (a warp's rows for one k), each slice as many columns wide as its
// longest row's remainder, entry w of a slice's lane-th row at slice start + 32 w + lane
// (conflict-free reads, a warp's loop the same length in every lane). A block's slices hold
// matrix_capacity entries; the first matrix_shared of them (a multiple of 32) live in shared memory,
// built from the CSR arrays at every launch, the rest in a global workspace (a.sell_val, a.sell_col:
// matrix_capacity - matrix_shared entries a block), built once per solve.
//
// Two iterations, chosen at compile time (ONCHIP_SINGLE):
// * classic (0), pcg_ref's direction_product then pcg_update, two reductions an iteration. The new
//   direction p = beta p_old + z is stored for the block's own rows behind a block barrier, and the
//   product reads it there; at rows of other blocks it forms it from their z and p_old, which the
//   last reduction published. Shared memory: z and the two directions, or with ONCHIP_ZP_REGISTERS
//   (one block, batches) the new direction only, the thread's rows of p_old in its registers and z
//   made again from r where read.
// * single-reduction (1), pcg_ref.pcg1_step (Chronopoulos-Gear), one reduction an iteration. u = M^-1 r
//   is stored for the block's own rows behind a block barrier; at rows of other blocks the product
//   forms it from their r, s and w of the previous iteration (double-buffered by iteration parity)
//   and their inverse diagonal, all read through distributed shared memory, with the owners'
//   operations, so it is exactly their u. With several teams (ONCHIP_GROUPS > 1, single-reduction
//   only) every block also publishes r, s and w in a global mirror (a.mirror), where blocks of other
//   teams read them (through L2) and the inverse diagonal from a.dinv. Shared memory: u, and in a
//   team r, s, w twice, the inverse diagonal (a global load there instead cost 0.2-0.3 us an
//   iteration, MEASUREMENTS.md) and x, which only the thread reads: the registers x and the inverse
//   diagonal leave hold matrix entries (Poisson 128^2 its rows whole, 2.67 -> 2.41 us an iteration).
//
// A reduction adds lanes by a butterfly (every lane ends with the same bits), then the warps' totals
// the same way: in one block every warp adds them itself, behind one block barrier (gr_900 0.64 us an
// iteration faster than warp 0 handing them on, MEASUREMENTS.md); in a team warp 0 adds them. In a
// team, warp 0 pushes the block's totals into every member's
// shared memory with st.async, each store completing bytes on the receiver's mbarrier, waits on its
// own block's mbarrier only (no cluster barrier) and adds the team's totals by a butterfly too; the
// block's threads read the result behind a block barrier: results depend on nothing but the
// compile-time shape. The push follows a block barrier and completes with release semantics at
// cluster scope, the wait acquires and a block barrier follows: everything a block wrote or read
// before a reduction happens before everything any team member does after it, so a reduction also
// serves as the team barrier between iterations. Totals and mbarriers alternate between two
// buffers: a block can run at most one reduction ahead of a slower one. With several teams, warp 0 of
// each team's rank-0 block then writes the team's totals into its team's slot of a global buffer
// (a.group_sums, alternating the same way) and adds 1 to a global counter (release); warp 0 of every
// block waits (acquire) until every team has arrived at this reduction and adds the teams' slots by a
// butterfly: the system's totals, the same bits in every block. The counter only grows; a launch's
// targets count on from what it reads at its start (group_base). The chain (a block's writes, block
// barrier, its push, the rank-0 block's wait, the release on the counter, another team's acquire)
// orders every block's writes before a reduction before every block's reads after it.
//
// A launch runs up to `count` iterations of every system and keeps the state of a system still
// running in global memory (x, r and p, with z for classic or s and w for single-reduction, and its
// State), so the next launch resumes it exactly: eager, graph and WHILE drivers give the same bits
// whatever the iterations per launch. With `fresh` set the launch starts every system, its stopping
// rule max(atol, rtol ||b||) and maxiter taken from the arguments; otherwise a system starts when its
// State's iteration is -1, with the State's tol and maxiter. A finished system gets its true residual
// ||b - A x|| and ||b|| in norms[2s], norms[2s + 1].
//
// Compiled after grid.cu and stopping.cu, with ONCHIP_BLOCK, ONCHIP_ROWS, ONCHIP_TEAM, ONCHIP_HELD,
// ONCHIP_GROUPS, ONCHIP_MAX_SUMS, ONCHIP_MIRROR_VECTORS, ONCHIP_SINGLE, ONCHIP_ORDERED (rows in slots by
// a.order), ONCHIP_HELD_K (optional: the held entries of each row group), ONCHIP_SLICED (0 when every entry
// is held: no slice code), ONCHIP_SPLIT (1 where slices share their long rows: see share_slice),
// ONCHIP_GLOBAL (1 when some slices live in the global workspace), ONCHIP_ZP_REGISTERS
// (classic, one block: p_old in registers, z made from r where read), ONCHIP_SHARED_VECTORS
// and ONCHIP_MIN_BLOCKS (blocks an SM should hold:
// the registers a thread may use follow) defined and the structs State, Progress, OnchipRun generated
// (solvers/pcg/onchip.py). A team of more than 8 blocks needs the non-portable cluster size allowed
// on the function.

#define CHUNK (ONCHIP_BLOCK * ONCHIP_ROWS)
#define ONCHIP_MEMBERS (ONCHIP_TEAM * ONCHIP_GROUPS)  // blocks a system
#define ONCHIP_WARPS (ONCHIP_BLOCK / 32)
#define ONCHIP_SLICES (CHUNK / 32)
#define FULL_WARP 0xffffffffu
#define MAX_SUMS ONCHIP_MAX_SUMS  // values a reduction adds at most (solvers/pcg/onchip.py's TEAM_SUMS)
#define ROW_GROUP 4  // rows of a slice step whose loads are issued together (more spill a batch's registers)
#define HELD_SIZE (ONCHIP_HELD > 0 ? ONCHIP_HELD : 1)
// Entries held in registers of a thread's k-th rows: ONCHIP_HELD, or where ONCHIP_HELD_K lists one
// count a row k (rows laid out by length, the k-th rows shorter as k grows), that count.
__host__ __device__ constexpr int held_of(int k) {
#ifdef ONCHIP_HELD_K
    constexpr int counts[ONCHIP_ROWS] = {ONCHIP_HELD_K};
    return counts[k];
#else
    return (void)k, ONCHIP_HELD;
#endif
}
// Vectors of CHUNK entries in a block's shared memory, ahead of its matrix slices (ONCHIP_SHARED_VECTORS,
// from solvers/pcg/onchip.py's shared_vectors: what iterate() below keeps there).
#define SHARED_VECTORS ONCHIP_SHARED_VECTORS

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

#if ONCHIP_TEAM > 1
__device__ __forceinline__ unsigned shared_address(const void* p) {
    unsigned out;
    asm("{\n\t.reg .u64 a;\n\tcvta.to.shared.u64 a, %1;\n\tcvt.u32.u64 %0, a;\n\t}" : "=r"(out) : "l"(p));
    return out;
}

// This block's arrival on its own mbarrier, announcing the bytes the team's pushes will bring.
__device__ __forceinline__ void expect_bytes(unsigned long long* bar, unsigned bytes) {
    asm volatile("{\n\t.reg .b64 state;\n\tmbarrier.arrive.expect_tx.release.cta.shared::cta.b64 state, [%0], %1;\n\t}"
                 ::"r"(shared_address(bar)), "r"(bytes) : "memory");
}

// v into `slot` of the team's block `rank`, completing 8 bytes on its mbarrier `bar` (both given as
// this block's addresses of the same variables).
__device__ __forceinline__ void push(double* slot, double v, unsigned long long* bar, unsigned rank) {
    unsigned remote_slot, remote_bar;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote_slot) : "r"(shared_address(slot)), "r"(rank));
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote_bar) : "r"(shared_address(bar)), "r"(rank));
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b64 [%0], %1, [%2];"
                 ::"r"(remote_slot), "l"(__double_as_longlong(v)), "r"(remote_bar) : "memory");
}

// Wait until the phase of `bar` with this parity has completed.
__device__ __forceinline__ void wait_phase(unsigned long long* bar, unsigned parity) {
    const unsigned address = shared_address(bar);
    unsigned done;
    do {
        asm volatile("{\n\t.reg .pred complete;\n\t"
                     "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 complete, [%1], %2;\n\t"
                     "selp.u32 %0, 1, 0, complete;\n\t}"
                     : "=r"(done) : "r"(address), "r"(parity) : "memory");
    } while (!done);
}
#endif

// Sum over each group of LANES lanes (a power of two) by a butterfly: IEEE addition commutes, so every
// lane of a group ends with the same bits.
template <int LANES>
__device__ __forceinline__ double group_total(double v) {
#pragma unroll
    for (int o = LANES / 2; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_WARP, v, o);
    return v;
}

__device__ __forceinline__ double warp_total(double v) { return group_total<32>(v); }

// Reduction scratch: two buffers used alternately, so that a reduction never overwrites totals a
// thread may still be reading from the previous one.
struct TeamScratch {
    double warp[2][MAX_SUMS][ONCHIP_WARPS];
    double team[2][MAX_SUMS][ONCHIP_TEAM];  // pushed by every team member, each into its rank's place
    double total[2][MAX_SUMS];              // the team's totals, for the block's threads
    unsigned long long arrived[2];          // mbarriers: the team's totals of team[buf] have arrived
    int slice_width[ONCHIP_SLICES];
#if ONCHIP_GROUPS > 1
    double* group_sums;                      // the teams' totals: [buf][team][MAX_SUMS] (global)
    unsigned long long* group_arrivals;      // the global counter of teams' arrivals
    unsigned long long group_base;           // its value before this launch's first reduction
#endif
};

// Make the team's mbarriers (one arrival a phase: the block's own expect_bytes); the first team
// barrier after this publishes them to the team.
__device__ __forceinline__ void init_team_scratch(TeamScratch& sc) {
#if ONCHIP_TEAM > 1
    if (threadIdx.x == 0) {
        for (int b = 0; b < 2; ++b)
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(shared_address(&sc.arrived[b])) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
#endif
}

// The block's warps and the team's blocks as powers of two: the lanes of the butterflies over their
// totals (no longer than they need: Poisson 64^2 on 8 blocks 0.1 us an iteration faster than whole-warp
// butterflies, MEASUREMENTS.md).
#define POWER_OF_TWO_AT_LEAST(n) ((n) > 16 ? 32 : (n) > 8 ? 16 : (n) > 4 ? 8 : (n) > 2 ? 4 : 2)
#define WARP_GROUP POWER_OF_TWO_AT_LEAST(ONCHIP_WARPS)
#define TEAM_GROUP POWER_OF_TWO_AT_LEAST(ONCHIP_TEAM)
#define GROUPS_GROUP POWER_OF_TWO_AT_LEAST(ONCHIP_GROUPS)

// Sums of K <= 3 values over the team, the same bits in every thread; `round` counts the reductions.
// Every warp adds its lanes. In one block every warp then adds the warps' totals itself, each group
// of WARP_GROUP lanes by the same butterfly (one block barrier a reduction). In a team warp 0 adds
// them, pushes them to every member, waits for the others' and adds them; the block's threads read
// the result behind a second block barrier. Also a barrier of the team for the shared memory
// accessed before and after the call.
template <int K>
__device__ __forceinline__ void team_sums(double (&v)[K], TeamScratch& sc, int& round) {
    const int buf = round & 1;
    const unsigned parity = (unsigned)(round >> 1) & 1u;  // of this buffer's mbarrier phase
    ++round;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int k = 0; k < K; ++k) v[k] = warp_total(v[k]);
    if (lane == 0) {
#pragma unroll
        for (int k = 0; k < K; ++k) sc.warp[buf][k][warp] = v[k];
    }
    __syncthreads();
    const int from = lane % WARP_GROUP;  // every group of lanes adds all the warps' totals
#if ONCHIP_TEAM == 1
    (void)parity;
#pragma unroll
    for (int k = 0; k < K; ++k) v[k] = group_total<WARP_GROUP>(from < ONCHIP_WARPS ? sc.warp[buf][k][from] : 0.0);
#else
    if (warp == 0) {
#pragma unroll
        for (int k = 0; k < K; ++k) v[k] = group_total<WARP_GROUP>(from < ONCHIP_WARPS ? sc.warp[buf][k][from] : 0.0);
        if (lane == 0) expect_bytes(&sc.arrived[buf], ONCHIP_TEAM * K * sizeof(double));
        if (lane < ONCHIP_TEAM) {  // lane c pushes the block's totals into block c
            const unsigned me = team_rank();
#pragma unroll
            for (int k = 0; k < K; ++k) push(&sc.team[buf][k][me], v[k], &sc.arrived[buf], lane);
        }
        wait_phase(&sc.arrived[buf], parity);
#pragma unroll
        for (int k = 0; k < K; ++k) v[k] = group_total<TEAM_GROUP>(lane < ONCHIP_TEAM ? sc.team[buf][k][lane] : 0.0);
#if ONCHIP_GROUPS > 1
        {  // the teams' totals, through global memory
            double* slots = sc.group_sums + buf * ONCHIP_GROUPS * MAX_SUMS;
            const int group = (int)(blockIdx.x % ONCHIP_MEMBERS) / ONCHIP_TEAM;
            if (team_rank() == 0 && lane == 0) {
#pragma unroll
                for (int k = 0; k < K; ++k) slots[group * MAX_SUMS + k] = v[k];
                add_release(sc.group_arrivals, 1ull);
            }
            const unsigned long long target = sc.group_base + (unsigned long long)round * ONCHIP_GROUPS;
            while (load_acquire(sc.group_arrivals) < target) {}  // every lane acquires before it reads
#pragma unroll
            for (int k = 0; k < K; ++k)
                v[k] = group_total<GROUPS_GROUP>(lane < ONCHIP_GROUPS ? __ldcg(&slots[lane * MAX_SUMS + k]) : 0.0);
        }
#endif
        if (lane == 0) {  // lanes 0.. TEAM_GROUP - 1 hold the team's totals
#pragma unroll
            for (int k = 0; k < K; ++k) sc.total[buf][k] = v[k];
        }
    }
    __syncthreads();  // orders the team's accesses before warp 0's wait before the block's later ones
#pragma unroll
    for (int k = 0; k < K; ++k) v[k] = sc.total[buf][k];
#endif
}

// Barrier of the system's blocks: the team's, or with several teams a reduction of nothing (the only
// barrier they share).
__device__ __forceinline__ void system_barrier(TeamScratch& sc, int& round) {
#if ONCHIP_GROUPS > 1
    double none[1] = {0.0};
    team_sums(none, sc, round);
#else
    (void)round;
    team_barrier();
#endif
}

// The system's row (counted from its first row lo) in slot i, and the slot of column (stacked row) j:
// through a.order and a.slot where the layout orders the rows (ONCHIP_ORDERED), else the same numbers,
// with no load (a system over several clusters forms other teams' u at their rows in every iteration).
__device__ __forceinline__ int given_row(const OnchipRun& a, int lo, int i) {
    return ONCHIP_ORDERED ? a.order[lo + i] : i;
}
__device__ __forceinline__ int slot_of(const OnchipRun& a, int lo, int j) {
    return ONCHIP_ORDERED ? a.slot[j] : j - lo;
}

// This thread's rows of a system's matrix. Entry w < held of its k-th row is held_val[k][w] (column
// held_col[k][w]; past the row's end value 0 and column the row's own), held = min(held_of(k), the
// longest of the warp's k-th rows); entry held + w, w < width[k], is entry e = at[k] + 32 w of the
// block's slices (where the slice shares long rows, see share_slice): val_s[e] below `split` (shared
// memory), else val_g[e] (global; the pointers are offset by -split), and likewise for the columns
// (within the system). width is the same in a warp.
struct ThreadRows {
    real_t held_val[ONCHIP_ROWS][HELD_SIZE];
    int held_col[ONCHIP_ROWS][HELD_SIZE];
    real_t* val_s;
    int* col_s;
    real_t* val_g;
    int* col_g;
    int split;
    int at[ONCHIP_ROWS];
    int width[ONCHIP_ROWS];
#if ONCHIP_SPLIT
    int share[ONCHIP_ROWS];  // how the k-th rows of the warp share their slices (see share_pull)
#endif
};

#if ONCHIP_SPLIT
// A slice's long rows shared with the warp's other lanes. The slice of the k-th rows of a warp is as
// wide as their longest row less the held entries, and the warp walks it step by step, each step a
// column, a gather and an add: one long row makes its warp walk alone (a power-law graph of 500 rows:
// a row of 444 entries, 420 steps a product, 22.6 us an iteration). So a row longer than held + W
// entries, W the slice's width, gives its entries past held + W to helpers, W at a time: lanes of
// the warp whose own row has no entry past held. After the slice steps each helper's sum reaches its
// row's lane by a shuffle and is added there in the helpers' order (the same bits every run). W is
// the width with the fewest slice steps and shuffles for which the warp has helpers enough (that
// graph: 40, 3.9 us an iteration; solvers/pcg/onchip.py's shared_slice does the same count).
// A row's word: the lane to pull from, whose helper rank is this lane (bits 0-4); the rank of this
// row's first helper (5-9) and its count (10-14); whether this lane helps (15); the shuffles the warp
// makes (16-20, the most helpers of its rows).
__device__ __forceinline__ int share_pull(int w) { return w & 31; }
__device__ __forceinline__ int share_first(int w) { return (w >> 5) & 31; }
__device__ __forceinline__ int share_helpers(int w) { return (w >> 10) & 31; }
__device__ __forceinline__ bool share_helps(int w) { return (w >> 15) & 1; }
__device__ __forceinline__ int share_rounds(int w) { return (w >> 16) & 31; }
#endif

// The rank in its team of the system's block `owner` (unsigned arithmetic: fewer instructions).
__device__ __forceinline__ unsigned rank_of(unsigned owner) {
    return ONCHIP_GROUPS > 1 ? owner % ONCHIP_TEAM : owner;
}

// A load from shared memory that the compiler keeps where it is written (a volatile access) instead of
// moving it next to its use: loads issued together stay together.
template <typename T>
__device__ __forceinline__ T ahead(const T* p) { return *(const volatile T*)p; }

// (A v) at the thread's rows, v(j) giving entry j of the system's vector; each row adds its entries in
// CSR order, the held ones first, then its slice steps. The loads are issued before their uses: every
// held entry's gather, then the products added (padding entries too: their value 0 and their column
// the row's own, whose entry of v the row reads anyway, so that adding 0 v_i changes no bit while v_i
// is finite; selecting the products to add took two instructions an entry: 1138_bus 2.23 -> 2.11 us
// an iteration without them, MEASUREMENTS.md); at each slice step, for ROW_GROUP rows at a time, the
// columns and values, then the gathers, then the products (a row past its width loads nothing). Each
// row loading and adding in turn, in a branch of its own, made the rows' chains wait on each other's
// loads: H200, us an iteration, 1138_bus 2.39 -> 2.30, lap2D_5pt_n100 2.26 -> 2.06, 10,000 batched
// systems of 1,024 rows 15.2 -> 12.5 ms (MEASUREMENTS.md). `split` is a multiple of 32 and slices start
// at multiples of 32: a warp's entries are on one side together.
template <typename V>
__device__ __forceinline__ void rows_product(const ThreadRows& m, V v, real_t (&out)[ONCHIP_ROWS]) {
    real_t gathered[ONCHIP_ROWS][HELD_SIZE];
#pragma unroll
    for (int w = 0; w < ONCHIP_HELD; ++w) {
#pragma unroll
        for (int k = 0; k < ONCHIP_ROWS; ++k)
            if (w < held_of(k)) gathered[k][w] = v(m.held_col[k][w]);
    }
#pragma unroll
    for (int k = 0; k < ONCHIP_ROWS; ++k) out[k] = 0;
#pragma unroll
    for (int w = 0; w < ONCHIP_HELD; ++w) {
#pragma unroll
        for (int k = 0; k < ONCHIP_ROWS; ++k)
            if (w < held_of(k)) out[k] = fma(m.held_val[k][w], gathered[k][w], out[k]);
    }
#if ONCHIP_SLICED
#if ONCHIP_SPLIT
    real_t own[ONCHIP_ROWS];  // a helper's own row: its held entries' sum, put aside while it helps
#pragma unroll
    for (int k = 0; k < ONCHIP_ROWS; ++k) {
        own[k] = out[k];
        if (share_helps(m.share[k])) out[k] = 0;
    }
#endif
    int widest = 0;
#pragma unroll
    for (int k = 0; k < ONCHIP_ROWS; ++k) widest = max(widest, m.width[k]);
#pragma unroll 1
    for (int w = 0; w < widest; ++w) {
#pragma unroll
        for (int g = 0; g < ONCHIP_ROWS; g += ROW_GROUP) {  // ROW_GROUP rows' loads in flight together
            int col[ROW_GROUP];
            real_t val[ROW_GROUP], step[ROW_GROUP];
#pragma unroll
            for (int k = g; k < g + ROW_GROUP && k < ONCHIP_ROWS; ++k) {
                const int e = m.at[k] + 32 * w;
                const bool shared = !ONCHIP_GLOBAL || e < m.split;
                if (w < m.width[k]) {
                    col[k - g] = shared ? ahead(m.col_s + e) : m.col_g[e];
                    val[k - g] = shared ? ahead(m.val_s + e) : m.val_g[e];
                }
            }
#pragma unroll
            for (int k = g; k < g + ROW_GROUP && k < ONCHIP_ROWS; ++k)
                if (w < m.width[k]) step[k - g] = v(col[k - g]);
#pragma unroll
            for (int k = g; k < g + ROW_GROUP && k < ONCHIP_ROWS; ++k)
                if (w < m.width[k]) out[k] = fma(val[k - g], step[k - g], out[k]);
        }
    }
#if ONCHIP_SPLIT
#pragma unroll
    for (int k = 0; k < ONCHIP_ROWS; ++k) {
        const int share = m.share[k], rounds = share_rounds(share);  // the same in the warp
        if (rounds == 0) continue;
        const bool helps = share_helps(share);
        const real_t lent = helps ? out[k] : real_t(0);
        out[k] = helps ? own[k] : out[k];
        const real_t ranked = __shfl_sync(FULL_WARP, lent, share_pull(share));  // lane q: helper q's sum
        const int first = share_first(share), helpers = share_helpers(share);
        for (int q = 0; q < rounds; ++q) {
            const real_t sum = __shfl_sync(FULL_WARP, ranked, first + q);
            if (q < helpers) out[k] += sum;
        }
    }
#endif
#endif
}

#if ONCHIP_SPLIT
// The sharing of a slice whose rows (this lane's: `begin`, `length`) keep `held` entries in registers
// and whose width, `width`, is their longest row less `held`: its width W, this lane's word (see
// share_pull), and its slice's row and first entry there (a helper's: a piece of W entries of the row
// it helps).
__device__ __forceinline__ void share_slice(int lane, int held, int& width, int& share, int& begin, int& length,
                                            int& from) {
    const int tail = max(length - held, 0);
    const unsigned idle = __ballot_sync(FULL_WARP, tail == 0);
    int least = width;  // slice steps and shuffles: unshared, the slice's steps
    for (int w = 1; w < least; ++w) {  // the same trips in the warp; a wider W could not take fewer
        const int need = tail > w ? (tail - 1) / w : 0;  // helpers of W = w entries each
        if (__reduce_add_sync(FULL_WARP, need) > __popc(idle)) continue;
        const int cost = w + __reduce_max_sync(FULL_WARP, need);
        if (cost < least) least = cost, width = w;
    }
    const int helpers = tail > width ? (tail - 1) / width : 0;
    int ranks = helpers;  // the helpers of this lane and the lanes before it
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int before = __shfl_up_sync(FULL_WARP, ranks, o);
        if (lane >= o) ranks += before;
    }
    const int first = ranks - helpers, rounds = __reduce_max_sync(FULL_WARP, helpers);
    const int rank = __popc(idle & ((1u << lane) - 1));  // among the idle lanes, if this one is
    bool helps = false;
    int help_begin = begin, help_length = length, help_from = from;
    for (unsigned long_rows = __ballot_sync(FULL_WARP, helpers > 0); long_rows; long_rows &= long_rows - 1) {
        const int j = __ffs(long_rows) - 1;
        const int j_first = __shfl_sync(FULL_WARP, first, j), j_helpers = __shfl_sync(FULL_WARP, helpers, j);
        const int j_begin = __shfl_sync(FULL_WARP, begin, j), j_length = __shfl_sync(FULL_WARP, length, j);
        if (tail == 0 && rank >= j_first && rank < j_first + j_helpers) {
            helps = true;
            help_begin = j_begin, help_length = j_length, help_from = held + width * (1 + rank - j_first);
        }
    }
    begin = help_begin, length = help_length, from = help_from;
    const int pull = lane < __popc(idle) ? (int)__fns(idle, 0, lane + 1) : lane;
    share = rounds == 0 ? 0 : pull | first << 5 | helpers << 10 | (int)helps << 15 | rounds << 16;
}
#endif

// Lay out the block's rows of the system (rows lo.. of the stacked CSR, n of them): the held entries
// in registers, the slices' widths and this thread's places always, their entries in shared memory,
// and in the global workspace when `build_global`. The block's shared slices start at `shared`.
__device__ __forceinline__ void lay_out_rows(const OnchipRun& a, int lo, int n, int first, real_t* shared,
                                             bool build_global, TeamScratch& sc, ThreadRows& m) {
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    int begin[ONCHIP_ROWS], length[ONCHIP_ROWS], from[ONCHIP_ROWS];  // a slice's row and its first entry there
#pragma unroll
    for (int k = 0; k < ONCHIP_ROWS; ++k) {
        const int i = first + t + k * ONCHIP_BLOCK;
        const int row = i < n ? lo + given_row(a, lo, i) : 0;
        begin[k] = i < n ? a.rowptr[row] : 0;
        length[k] = i < n ? a.rowptr[row + 1] - begin[k] : 0;
        const int longest = __reduce_max_sync(FULL_WARP, length[k]);
        const int held = min(longest, held_of(k));
        m.width[k] = longest - held;
#pragma unroll
        for (int w = 0; w < ONCHIP_HELD; ++w) {
            m.held_val[k][w] = w < length[k] ? a.val[begin[k] + w] : real_t(0);
            m.held_col[k][w] = w < length[k] ? slot_of(a, lo, a.col[begin[k] + w]) : min(i, n - 1);
        }
        from[k] = held;
#if ONCHIP_SPLIT
        share_slice(lane, held, m.width[k], m.share[k], begin[k], length[k], from[k]);
#endif
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
            const int e = m.at[k] + 32 * w, entry = from[k] + w;
            if (e >= m.split && !build_global) break;
            const real_t v = entry < length[k] ? a.val[begin[k] + entry] : real_t(0);
            const int j = entry < length[k] ? slot_of(a, lo, a.col[begin[k] + entry]) : min(i, n - 1);
            if (e < m.split) {
                m.val_s[e] = v, m.col_s[e] = j;
            } else {
                m.val_g[e] = v, m.col_g[e] = j;
            }
        }
    }
    // Each thread reads back only the entries it wrote: no barrier needed.
}

// What every iteration body shares: the system, the thread's rows, the team's reductions.
struct SystemRun {
    const OnchipRun& a;
    State* st;
    ThreadRows m;
    real_t* vec;  // the block's shared vectors (SHARED_VECTORS of CHUNK entries)
    TeamScratch& sc;
    int& round;
    unsigned long long handle;
    int system, lo, n, first, t;
    unsigned rank;  // in the team
    unsigned member;  // the system's block this is (first = member * CHUNK)
    bool start, recorder;
    double b_norm;
    __device__ bool owns(int k) const { return first + t + k * ONCHIP_BLOCK < n; }
    __device__ int own(int k) const { return t + k * ONCHIP_BLOCK; }
    __device__ int row(int k) const { return given(first + t + k * ONCHIP_BLOCK); }
    __device__ int given(int j) const { return lo + given_row(a, lo, j); }  // the row in slot j
    // The stopping rule and iteration limit of a starting system, from its ||b||.
    __device__ void take_rule(double bb, double& tol, int& maxiter) {
        b_norm = sqrt(bb);
        tol = a.fresh ? fmax(a.atol, a.rtol * b_norm) : st->tol;
        maxiter = a.fresh ? a.maxiter : st->maxiter;
    }
};

#if ONCHIP_SINGLE
// Chronopoulos-Gear iterations of one system (pcg_ref.pcg1_step): the set-up pass when starting (the
// iteration with alpha = beta = 0 on zero p, s, w), then up to `count` iterations. Returns the status;
// x holds the thread's rows of the iterate.
__device__ __forceinline__ int iterate(SystemRun& sr, real_t (&x)[ONCHIP_ROWS]) {
    const OnchipRun& a = sr.a;
    real_t* u_s = sr.vec;
    real_t* r_b = sr.vec + CHUNK;  // r, s, w of iteration parity q at [q * CHUNK] (a team only)
    real_t* s_b = sr.vec + 3 * CHUNK;
    real_t* w_b = sr.vec + 5 * CHUNK;
    // The inverse diagonal (1 without Jacobi, which gives the same bits) and the iterate of the block's
    // rows are read from shared memory (other blocks of a team read d_s there too): the registers they
    // would take hold matrix entries (Poisson 128^2 its rows whole, 2.67 -> 2.41 us an iteration).
    real_t* d_s = sr.vec + (ONCHIP_TEAM > 1 ? 7 : 1) * CHUNK;
    real_t* x_s = sr.vec + (ONCHIP_TEAM > 1 ? 8 : 2) * CHUNK;
    auto xr = [&](int k) -> real_t& { return x_s[sr.own(k)]; };
    auto dvr = [&](int k) { return d_s[sr.own(k)]; };
#if ONCHIP_GROUPS > 1
    // r, s and w of iteration parity q for other teams: mirror[q * n3 + v * n + row], v = 0, 1, 2
    static_assert(ONCHIP_MIRROR_VECTORS == 6, "the host allocates ONCHIP_MIRROR_VECTORS vectors for the mirror");
    real_t* mirror = a.mirror;
    const int n3 = 3 * sr.n;
#endif
    real_t p[ONCHIP_ROWS], r[ONCHIP_ROWS], s[ONCHIP_ROWS], w[ONCHIP_ROWS];
    State ls = {};  // the decisions' state: tol, maxiter, rz, rz_inv, alpha, beta, pq
    int it, status = RUNNING;
    int parity = 0;  // this iteration writes r, s, w at [parity], the others' previous ones are at [parity ^ 1]
#pragma unroll
    for (int k = 0; k < ONCHIP_ROWS; ++k) {
        xr(k) = p[k] = r[k] = s[k] = w[k] = 0;
        d_s[sr.own(k)] = sr.owns(k) && a.dinv ? a.dinv[sr.row(k)] : real_t(1);  // others read it after a barrier
    }
    if (sr.start) {  // r = b - A x0
        real_t ax[ONCHIP_ROWS];
        rows_product(sr.m, [&](int j) { return a.x[sr.given(j)]; }, ax);
        double bb[1] = {0.0};
#pragma unroll
        for (int k = 0; k < ONCHIP_ROWS; ++k) {
            if (!sr.owns(k)) continue;
            const real_t bi = a.b[sr.row(k)];
            xr(k) = a.x[sr.row(k)];
            r[k] = bi - ax[k];
            bb[0] += (double)bi * (double)bi;
            if (ONCHIP_TEAM > 1) r_b[CHUNK + sr.own(k)] = r[k], s_b[CHUNK + sr.own(k)] = 0, w_b[CHUNK + sr.own(k)] = 0;
#if ONCHIP_GROUPS > 1
            const int j = sr.first + sr.own(k);
            mirror[n3 + j] = r[k], mirror[n3 + sr.n + j] = 0, mirror[n3 + 2 * sr.n + j] = 0;
#endif
        }
        team_sums(bb, sr.sc, sr.round);  // also publishes r for the set-up pass's product
        sr.take_rule(bb[0], ls.tol, ls.maxiter);
        it = -1;
    } else {  // resume: the vectors and scalars the previous launch left
#pragma unroll
        for (int k = 0; k < ONCHIP_ROWS; ++k) {
            if (!sr.owns(k)) continue;
            const int i = sr.row(k);
            xr(k) = a.x[i], p[k] = a.p[i], r[k] = a.r[i], s[k] = a.s[i], w[k] = a.w[i];
            if (ONCHIP_TEAM > 1) r_b[CHUNK + sr.own(k)] = r[k], s_b[CHUNK + sr.own(k)] = s[k], w_b[CHUNK + sr.own(k)] = w[k];
#if ONCHIP_GROUPS > 1
            const int j = sr.first + sr.own(k);
            mirror[n3 + j] = r[k], mirror[n3 + sr.n + j] = s[k], mirror[n3 + 2 * sr.n + j] = w[k];
#endif
        }
        const State* st = sr.st;
        ls.tol = st->tol, ls.maxiter = st->maxiter, ls.rz = st->rz, ls.alpha = st->alpha, ls.beta = st->beta;
        ls.pq = st->pq, ls.rz_inv = st->rz_inv;
        it = st->iteration;
        sr.b_norm = a.norms[2 * sr.system + 1];
        system_barrier(sr.sc, sr.round);
    }
    if (sr.recorder) {
        sr.st->tol = ls.tol;
        sr.st->maxiter = ls.maxiter;
    }
    // Every thread of the team takes the same decisions from the same bits: the loop's trip count,
    // and so its barriers, are the same in every thread.
    for (int c = sr.start ? -1 : 0; c < a.count && status == RUNNING; ++c) {
        const bool setup = c < 0;
        const real_t alpha = (real_t)ls.alpha, beta = (real_t)ls.beta;
        const int mine = parity * CHUNK, theirs = (parity ^ 1) * CHUNK;
        real_t u[ONCHIP_ROWS];
        // u at row `at` of the system's block `owner` (not this one), formed from what it published:
        // through distributed shared memory in the team, else from the global mirror
        auto other_u = [&](unsigned owner, int at) {
#if ONCHIP_GROUPS > 1
            if (owner / ONCHIP_TEAM != sr.member / ONCHIP_TEAM) {
                const int j = (int)owner * CHUNK + at;
                const real_t* m = mirror + (parity ^ 1) * n3;
                const real_t sj = fma(beta, __ldcg(m + sr.n + j), __ldcg(m + 2 * sr.n + j));
                return (a.dinv ? __ldg(&a.dinv[sr.given(j)]) : real_t(1)) * fma(-alpha, sj, __ldcg(m + j));
            }
#endif
            const unsigned rank = rank_of(owner);
            const real_t sj = fma(beta, *team_peer(s_b + theirs + at, rank), *team_peer(w_b + theirs + at, rank));
            return *team_peer(d_s + at, rank) * fma(-alpha, sj, *team_peer(r_b + theirs + at, rank));
        };
        (void)other_u;
#pragma unroll
        for (int k = 0; k < ONCHIP_ROWS; ++k) {  // s = w + beta s; p = u + beta p; x += alpha p; r -= alpha s
            const real_t d = dvr(k);  // one read of shared memory (the stores below might alias it)
            const real_t u_old = d * r[k];
            s[k] = fma(beta, s[k], w[k]);
            p[k] = fma(beta, p[k], u_old);
            xr(k) = fma(alpha, p[k], xr(k));
            r[k] = fma(-alpha, s[k], r[k]);
            u[k] = d * r[k];
            if (!sr.owns(k)) continue;
            u_s[sr.own(k)] = u[k];
            if (ONCHIP_TEAM > 1) r_b[mine + sr.own(k)] = r[k], s_b[mine + sr.own(k)] = s[k];
#if ONCHIP_GROUPS > 1
            mirror[parity * n3 + sr.first + sr.own(k)] = r[k], mirror[parity * n3 + sr.n + sr.first + sr.own(k)] = s[k];
#endif
        }
        __syncthreads();  // the block's u, read by its threads
        rows_product(sr.m, [&](int j) {
#if ONCHIP_TEAM > 1
            const unsigned owner = (unsigned)j / CHUNK;
            const int at = j - (int)owner * CHUNK;
            if (owner == sr.member) return u_s[at];
            return other_u(owner, at);
#else
            return ahead(u_s + j);
#endif
        }, w);
        double sums[3] = {0.0, 0.0, 0.0};  // r.r, r.u, w.u
#pragma unroll
        for (int k = 0; k < ONCHIP_ROWS; ++k) {
            if (!sr.owns(k)) continue;
            if (ONCHIP_TEAM > 1) w_b[mine + sr.own(k)] = w[k];
#if ONCHIP_GROUPS > 1
            mirror[parity * n3 + 2 * sr.n + sr.first + sr.own(k)] = w[k];
#endif
            sums[0] += (double)r[k] * (double)r[k];
            sums[1] += (double)r[k] * (double)u[k];
            sums[2] += (double)w[k] * (double)u[k];
        }
        (void)theirs;
        team_sums(sums, sr.sc, sr.round);
        ++it;
        const double rnorm = sqrt(sums[0]);
        status = single_reduction_decision(&ls, setup, it, rnorm, sums[1], sums[2]);
        if (status == RUNNING) parity ^= 1;
        if (sr.recorder) record_decision(sr.st, it, rnorm, status, a.history, a.progress, sr.handle);
    }
    if (status == RUNNING) {  // what the next launch needs
#pragma unroll
        for (int k = 0; k < ONCHIP_ROWS; ++k) {
            if (!sr.owns(k)) continue;
            const int i = sr.row(k);
            a.p[i] = p[k], a.r[i] = r[k], a.s[i] = s[k], a.w[i] = w[k];
        }
        if (sr.recorder) {
            State* st = sr.st;
            st->rz = ls.rz, st->alpha = ls.alpha, st->beta = ls.beta, st->pq = ls.pq, st->rz_inv = ls.rz_inv;
        }
    }
#pragma unroll
    for (int k = 0; k < ONCHIP_ROWS; ++k) x[k] = xr(k);
    return status;
}
#else
#if ONCHIP_GROUPS > 1
#error "classic PCG on chip runs in one team: its two reductions an iteration would cross teams twice"
#endif
// Classic iterations of one system (pcg_ref.direction_product, pcg_update): the set-up pass when
// starting (r = b - A x0, z = M^-1 r, p_old = 0), then up to `count` iterations. Returns the status;
// x holds the thread's rows of the iterate.
__device__ __forceinline__ int iterate(SystemRun& sr, real_t (&x)[ONCHIP_ROWS]) {
    const OnchipRun& a = sr.a;
    // The product reads the new direction from shared memory. With ONCHIP_ZP_REGISTERS (one block of a
    // batch) a thread keeps its rows of the previous direction in registers and makes z = M^-1 r again
    // where it is read (the same bits as stored: registers kept across the product spill), and shared
    // memory holds only the new direction; otherwise shared memory holds z and the two directions (the
    // other blocks of a team form the new direction from them; one system's registers hold matrix
    // entries).
    real_t* z_s = sr.vec;
    auto direction = [&](int which) { return ONCHIP_ZP_REGISTERS ? sr.vec : z_s + CHUNK * (1 + which); };
    int parity = 0;  // p_old is direction(parity), the new direction goes to direction(parity ^ 1)
    real_t r[ONCHIP_ROWS], q[ONCHIP_ROWS], dv[ONCHIP_ROWS];
#if ONCHIP_ZP_REGISTERS
    real_t p[ONCHIP_ROWS] = {};
    auto z_of = [&](int k) { return dv[k] * r[k]; };
    auto set_z = [&](int, real_t) {};
    auto pr = [&](int k) -> real_t& { return p[k]; };
#else
    auto z_of = [&](int k) { return z_s[sr.own(k)]; };
    auto set_z = [&](int k, real_t v) { z_s[sr.own(k)] = v; };
    auto pr = [&](int k) -> real_t& { return direction(parity)[sr.own(k)]; };
#endif
    double tol, rz, beta, rnorm;
    int it, maxiter, status;
#pragma unroll
    for (int k = 0; k < ONCHIP_ROWS; ++k) {
        x[k] = r[k] = q[k] = 0;
        dv[k] = sr.owns(k) && a.dinv ? a.dinv[sr.row(k)] : real_t(1);
    }
    if (sr.start) {  // r = b - A x0, z = M^-1 r, p_old = 0: the set-up pass
        real_t ax[ONCHIP_ROWS];
        rows_product(sr.m, [&](int j) { return a.x[sr.given(j)]; }, ax);
        double sums[3] = {0.0, 0.0, 0.0};  // b.b, r.z, r.r
#pragma unroll
        for (int k = 0; k < ONCHIP_ROWS; ++k) {
            if (!sr.owns(k)) continue;
            const real_t bi = a.b[sr.row(k)];
            x[k] = a.x[sr.row(k)];
            r[k] = bi - ax[k];
            const real_t z = dv[k] * r[k];
            set_z(k, z);
            pr(k) = 0;
            sums[0] += (double)bi * (double)bi;
            sums[1] += (double)r[k] * (double)z;
            sums[2] += (double)r[k] * (double)r[k];
        }
        team_sums(sums, sr.sc, sr.round);
        sr.take_rule(sums[0], tol, maxiter);
        rz = sums[1];
        rnorm = sqrt(sums[2]);
        beta = 0.0;
        it = 0;
        status = stop_reason(rnorm, tol, it, maxiter, rz, true);
    } else {  // resume: the vectors and scalars the previous launch left
#pragma unroll
        for (int k = 0; k < ONCHIP_ROWS; ++k) {
            if (!sr.owns(k)) continue;
            const int i = sr.row(k);
            x[k] = a.x[i];
            r[k] = a.r[i];
            set_z(k, a.z[i]);
            pr(k) = a.p[i];
        }
        const State* st = sr.st;
        tol = st->tol, maxiter = st->maxiter, rz = st->rz, beta = st->beta, rnorm = st->rnorm;
        it = st->iteration;
        status = RUNNING;
        sr.b_norm = a.norms[2 * sr.system + 1];
        team_barrier();
    }
    if (sr.recorder) {
        sr.st->tol = tol;
        sr.st->maxiter = maxiter;
        if (sr.start) record_decision(sr.st, it, rnorm, status, a.history, a.progress, sr.handle);
    }
    // Every thread of the team takes the same decisions from the same bits: the loop's trip count,
    // and so its barriers, are the same in every thread.
    for (int c = 0; c < a.count && status == RUNNING; ++c) {
        // direction_product: p_new = beta p_old + z (stored for own rows, formed where read at
        // other blocks' rows), q = A p_new, p_new . q
        const real_t* po = direction(parity);
        real_t* pn = direction(parity ^ 1);
        const real_t b_ = (real_t)beta;
        real_t p_new[ONCHIP_ROWS];
#pragma unroll
        for (int k = 0; k < ONCHIP_ROWS; ++k) {
            p_new[k] = fma(b_, pr(k), z_of(k));
            if (sr.owns(k)) pn[sr.own(k)] = p_new[k];
        }
        (void)po;
        __syncthreads();  // the block's new direction, read by its threads
        rows_product(sr.m, [&](int j) {
#if ONCHIP_TEAM > 1
            const unsigned owner = (unsigned)j / CHUNK;
            const int at = j - (int)owner * CHUNK;
            if (owner != sr.rank) return fma(b_, *team_peer(po + at, owner), *team_peer(z_s + at, owner));
            return (real_t)pn[at];
#else
            return ahead(pn + j);
#endif
        }, q);
        double pq[1] = {0.0};
#pragma unroll
        for (int k = 0; k < ONCHIP_ROWS; ++k)
            if (sr.owns(k)) pq[0] += (double)p_new[k] * (double)q[k];
        team_sums(pq, sr.sc, sr.round);
        if (!isfinite(pq[0]) || pq[0] <= 0.0) {  // no step along this direction
            status = isfinite(pq[0]) ? BREAKDOWN : NOT_FINITE;
            if (sr.recorder) {
                sr.st->pq = pq[0];
                record_decision(sr.st, it, rnorm, status, a.history, a.progress, sr.handle);
            }
            break;
        }
        // pcg_update: x += alpha p_new, r -= alpha q, z = M^-1 r, then decide
        const real_t alpha = (real_t)(rz / pq[0]);
        double sums[2] = {0.0, 0.0};  // r.z, r.r
#pragma unroll
        for (int k = 0; k < ONCHIP_ROWS; ++k) {
            if (!sr.owns(k)) continue;
            x[k] = fma(alpha, p_new[k], x[k]);
            r[k] = fma(-alpha, q[k], r[k]);
            const real_t z = dv[k] * r[k];
            set_z(k, z);
            sums[0] += (double)r[k] * (double)z;
            sums[1] += (double)r[k] * (double)r[k];
        }
        team_sums(sums, sr.sc, sr.round);
        ++it;
        rnorm = sqrt(sums[1]);
        status = stop_reason(rnorm, tol, it, maxiter, sums[0], true);
        if (status == RUNNING) {
            beta = sums[0] / rz;
            rz = sums[0];
            parity ^= 1;
#if ONCHIP_ZP_REGISTERS
#pragma unroll
            for (int k = 0; k < ONCHIP_ROWS; ++k) p[k] = p_new[k];
#endif
        }
        if (sr.recorder) record_decision(sr.st, it, rnorm, status, a.history, a.progress, sr.handle);
    }
    if (status == RUNNING) {  // what the next launch needs
#pragma unroll
        for (int k = 0; k < ONCHIP_ROWS; ++k) {
            if (!sr.owns(k)) continue;
            const int i = sr.row(k);
            a.r[i] = r[k], a.z[i] = z_of(k), a.p[i] = pr(k);
        }
        if (sr.recorder) {
            sr.st->rz = rz;
            sr.st->beta = beta;
        }
    }
    return status;
}
#endif

extern "C" __global__ void
#if ONCHIP_TEAM > 1
__cluster_dims__(ONCHIP_TEAM, 1, 1)
#endif
__launch_bounds__(ONCHIP_BLOCK, ONCHIP_MIN_BLOCKS) onchip_pcg(const OnchipRun a, unsigned long long handle) {
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ TeamScratch sc;
    real_t* vec = (real_t*)smem;  // SHARED_VECTORS vectors of CHUNK entries, then the matrix slices
    const unsigned rank = team_rank();
    const int t = threadIdx.x;
    const unsigned member = blockIdx.x % ONCHIP_MEMBERS;
    int round = 0;
    init_team_scratch(sc);
#if ONCHIP_GROUPS > 1
    static_assert(ONCHIP_TEAM > 1, "several teams are clusters");
    if (t == 0) {  // read before this block's first push, so no team can have arrived at its first reduction
        sc.group_sums = a.group_sums;
        sc.group_arrivals = a.group_arrivals;
        sc.group_base = *(volatile unsigned long long*)a.group_arrivals / ONCHIP_GROUPS * ONCHIP_GROUPS;
    }
#endif

    for (int s = blockIdx.x / ONCHIP_MEMBERS; s < a.systems; s += gridDim.x / ONCHIP_MEMBERS) {
        State* st = a.st + s;
        // Team-uniform decisions read the State before any thread of the team may write it.
        const bool start = a.fresh || st->iteration < 0;
        const int status_before = start ? RUNNING : st->status;
        team_barrier();
        if (status_before != RUNNING) {
            if (handle && member == 0 && t == 0) cudaGraphSetConditional(handle, 0);
            continue;
        }
        const int lo = a.start[s];
        SystemRun sr{a, st, {}, vec, sc, round, handle, s, lo, a.start[s + 1] - lo, (int)member * CHUNK, t, rank, member,
                     start, member == 0 && t == 0, 0.0};
        {  // the block's part of the workspace, addressed as entries split.. of its slices
            const long long base = ((long long)s * ONCHIP_MEMBERS + member) * (a.matrix_capacity - a.matrix_shared);
            sr.m.val_g = a.sell_val + base - a.matrix_shared;
            sr.m.col_g = a.sell_col + base - a.matrix_shared;
        }
        lay_out_rows(a, lo, sr.n, sr.first, vec + SHARED_VECTORS * CHUNK, start, sc, sr.m);
        real_t x[ONCHIP_ROWS];
        const int status = iterate(sr, x);
#pragma unroll
        for (int k = 0; k < ONCHIP_ROWS; ++k)
            if (sr.owns(k)) a.x[sr.row(k)] = x[k];
        if (status == RUNNING) {
            if (sr.recorder && start) a.norms[2 * s + 1] = sr.b_norm;
            team_barrier();  // peers done reading this block's shared memory before the next system
            continue;
        }
        // Finished: the true residual from x gathered over the team.
        team_barrier();  // the first vector is free once every peer has passed the last reduction's reads
#pragma unroll
        for (int k = 0; k < ONCHIP_ROWS; ++k)
            if (sr.owns(k)) vec[sr.own(k)] = x[k];
        system_barrier(sc, round);  // x in the team's shared memory, and in a.x for other teams
        real_t ax[ONCHIP_ROWS];
        rows_product(sr.m, [&](int j) {
            const unsigned owner = (unsigned)j / CHUNK;
#if ONCHIP_GROUPS > 1
            if (owner / ONCHIP_TEAM != member / ONCHIP_TEAM) return __ldcg(&a.x[sr.given(j)]);
#endif
            const real_t* at = vec + (j - (int)owner * CHUNK);
            return owner == member ? *at : *team_peer(at, rank_of(owner));
        }, ax);
        double rr[1] = {0.0};
#pragma unroll
        for (int k = 0; k < ONCHIP_ROWS; ++k) {
            if (!sr.owns(k)) continue;
            const double ri = (double)(a.b[sr.row(k)] - ax[k]);
            rr[0] += ri * ri;
        }
        team_sums(rr, sc, round);
        if (sr.recorder) {
            a.norms[2 * s] = sqrt(rr[0]);
            a.norms[2 * s + 1] = sr.b_norm;
        }
        team_barrier();  // peers done reading this block's shared memory before the next system
    }
}
