// Block and grid reductions shared by the kernel families (the loader compiles this file ahead of
// each of them). The grid-wide ones are for persistent kernels, launched cooperatively so that every
// block is resident at once; B is the kernel's threads per block.

__device__ __forceinline__ double warp_sum(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    return v;
}

// Sums of K values over the block, all reduced together (two barriers whatever K); valid in thread 0.
template <int B, int K>
__device__ void block_sums(double (&v)[K]) {
    __shared__ double warp_totals[K][B / 32];
    __syncthreads();  // the shared array may still be in use by a previous call
#pragma unroll
    for (int k = 0; k < K; ++k) v[k] = warp_sum(v[k]);
    if ((threadIdx.x & 31) == 0) {
#pragma unroll
        for (int k = 0; k < K; ++k) warp_totals[k][threadIdx.x >> 5] = v[k];
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < K; ++k) {
        v[k] = threadIdx.x < B / 32 ? warp_totals[k][threadIdx.x] : 0.0;
        if (threadIdx.x < 32) v[k] = warp_sum(v[k]);
    }
}

__device__ __forceinline__ unsigned int load_acquire(const unsigned int* p) {
    unsigned int v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ unsigned long long load_acquire(const unsigned long long* p) {
    unsigned long long v;
    asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void add_release(unsigned long long* p, unsigned long long v) {
    asm volatile("red.release.gpu.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ void add_release(unsigned int* p, unsigned int v) {
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// ---- Totals in every block: grid_sums -------------------------------------------------------
// Reductions and barriers of a persistent kernel count from one launch to the next: `tag` (the same
// in every thread of the grid) is the number of them since set-up, a launch's first from *epoch (see
// end_epoch), and *arrivals, which only grows, is tag * gridDim.x once every block has arrived at
// reduction `tag` (both wrap at 2^32 together). A reduction: each block writes its sums into its
// slot, adds 1 to the arrival counter (release), and warp 0 waits (acquire) for the last arrival,
// then reads every slot and adds them in a fixed order (lane l the slots l, l + 32, ..., then the
// warp's tree), so all blocks hold the same totals and take the same decisions. The release/acquire
// pairs also order every block's earlier writes before every block's later reads (and drop stale L1
// lines). One word is polled a block and the slots are read once (H200, us an iteration, against
// every block polling every block's tagged slot: Poisson 256^2 6.63 -> 5.89, random geometric graph
// 50k rows 10.88 -> 10.23 at one block an SM;
// scripts/results/probe_grid_latency_2026-11-30_2050_NVIDIA_H200_a5b89d4.md). `slots` holds two
// buffers of one Slot a block, which alternate from one tag to the next: a block that has gone ahead
// never overwrites a slot a slower block still has to read.

// Arrive at reduction or barrier `tag` (unless `arrive` is false: another thread of the block does)
// and wait until every block has.
__device__ __forceinline__ void arrive_and_wait(unsigned int* arrivals, unsigned int tag, bool arrive) {
    if (arrive) add_release(arrivals, 1u);
    const unsigned int target = tag * gridDim.x;
    while ((int)(load_acquire(arrivals) - target) < 0) {}
}

// Sums of K <= 3 values over the grid, in thread 0 of every block.
template <int B, int K>
__device__ void grid_sums(Slot* slots, unsigned int* arrivals, double (&v)[K], unsigned int& tag) {
    block_sums<B>(v);
    ++tag;
    if (threadIdx.x >= 32) return;
    Slot* buf = slots + (tag & 1u) * gridDim.x;
    if (threadIdx.x == 0) {
#pragma unroll
        for (int k = 0; k < K; ++k) buf[blockIdx.x].v[k] = v[k];
    }
    arrive_and_wait(arrivals, tag, threadIdx.x == 0);  // every lane acquires before it reads
    double total[K];
#pragma unroll
    for (int k = 0; k < K; ++k) total[k] = 0.0;
    for (int i = threadIdx.x; i < gridDim.x; i += 32) {
#pragma unroll
        for (int k = 0; k < K; ++k) total[k] += __ldcg(&buf[i].v[k]);
    }
#pragma unroll
    for (int k = 0; k < K; ++k) v[k] = warp_sum(total[k]);
}

// Barrier of the whole grid on the same counter and tags (a reduction of nothing): orders every
// block's earlier writes before every block's later reads.
__device__ void grid_barrier(unsigned int* arrivals, unsigned int& tag) {
    __syncthreads();
    ++tag;
    if (threadIdx.x == 0) arrive_and_wait(arrivals, tag, true);
    __syncthreads();
}

// The tag the next launch starts from. Block 0 gets here only after every block has published its
// last sums, hence after every block has read *epoch at its start.
__device__ __forceinline__ void end_epoch(unsigned int* epoch, unsigned int tag) {
    if (blockIdx.x == 0 && threadIdx.x == 0) *epoch = tag;
}

// ---- Barrier only: grid_sync -----------------------------------------------------------------
// A counter that only grows: each block adds 1 per barrier (release) and waits (acquire) until all
// gridDim.x blocks have, i.e. until it reaches the block's next multiple of gridDim.x. One atomic a
// block, so it suits any grid a cooperative launch allows. The counter must start at a multiple of
// gridDim.x for a given grid (a fresh zeroed buffer whenever the grid changes).

// The first target of this launch (thread 0). Read before this block's first arrival; no barrier can
// complete without it, so the count is at most gridDim.x - 1 past the launch's base.
__device__ __forceinline__ unsigned long long sync_base(const unsigned long long* counter) {
    return *(const volatile unsigned long long*)counter / gridDim.x * gridDim.x;
}

// Barrier of the whole grid; `target` is thread 0's running target (start it at sync_base).
__device__ void grid_sync(unsigned long long* counter, unsigned long long& target) {
    __syncthreads();
    if (threadIdx.x == 0) {
        target += gridDim.x;
        add_release(counter, 1ull);
        while (load_acquire(counter) < target) __nanosleep(32);  // fewer polls queued with the arrivals
    }
    __syncthreads();
}
