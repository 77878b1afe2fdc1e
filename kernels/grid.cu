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

__device__ __forceinline__ void store_release(unsigned int* p, unsigned int v) {
    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
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
// in every thread of the grid) is the number of reductions and barriers since set-up, a launch's
// first from *epoch (see end_epoch). `slots` holds two buffers of one Slot a block, which alternate
// from one tag to the next (a block that has gone ahead never overwrites a slot a slower block still
// has to read), then the arrival counter (GRID_EXCHANGE 1). Every block adds the slots in block
// order, so all blocks hold the same totals and take the same decisions.
//
// GRID_EXCHANGE 1: each block writes its slot and adds 1 to the arrival counter (release); warp 0
// waits (acquire) until the counter reaches tag * gridDim.x, reads every slot and adds them. One
// word is polled a block, and the slots are read once, after the last arrival.
// GRID_EXCHANGE 0: each block releases its slot with the tag in it; threads 0 .. gridDim.x - 1
// poll one slot each until it carries the tag, and the block adds what they read.
// The release/acquire pairs also order every block's earlier writes before every block's later reads
// (and drop stale L1 lines).
#ifndef GRID_EXCHANGE
#define GRID_EXCHANGE 1
#endif

// Arrive at reduction or barrier `tag` and wait for every block (one thread a block, or a whole
// warp: then every lane acquires). Counter and targets wrap at 2^32 together.
__device__ __forceinline__ void arrive_and_wait(Slot* slots, unsigned int tag, bool arrive) {
    unsigned int* arrivals = &slots[2 * gridDim.x].tag;
    if (arrive) add_release(arrivals, 1u);
    const unsigned int target = tag * gridDim.x;
    while ((int)(load_acquire(arrivals) - target) < 0) {}
}

#if GRID_EXCHANGE == 0
// Publish this block's slot for reduction `tag` + 1 (thread 0 fills it with `publish(slot)`, then
// releases the tag), then wait for every block's slot and call `read(slot)` on each, in block order,
// spread over the block's threads.
template <int B, typename P, typename R>
__device__ __forceinline__ void grid_exchange(Slot* slots, unsigned int& tag, P publish, R read) {
    ++tag;
    Slot* buf = slots + (tag & 1u) * gridDim.x;
    if (threadIdx.x == 0) {
        publish(buf[blockIdx.x]);
        store_release(&buf[blockIdx.x].tag, tag);
    }
    for (int i = threadIdx.x; i < gridDim.x; i += B) {
        while (load_acquire(&buf[i].tag) != tag) {}
        read(buf[i]);
    }
}
#endif

// Sums of K <= 3 values over the grid, in thread 0 of every block.
template <int B, int K>
__device__ void grid_sums(Slot* slots, double (&v)[K], unsigned int& tag) {
    block_sums<B>(v);
    double total[K];
#pragma unroll
    for (int k = 0; k < K; ++k) total[k] = 0.0;
#if GRID_EXCHANGE == 0
    grid_exchange<B>(slots, tag, [&](Slot& own) {
#pragma unroll
        for (int k = 0; k < K; ++k) own.v[k] = v[k];
    }, [&](const Slot& other) {
#pragma unroll
        for (int k = 0; k < K; ++k) total[k] += other.v[k];
    });
#pragma unroll
    for (int k = 0; k < K; ++k) v[k] = total[k];
    block_sums<B>(v);
#else
    ++tag;
    if (threadIdx.x >= 32) return;  // the totals are wanted in thread 0 only
    const Slot* buf = slots + (tag & 1u) * gridDim.x;
    if (threadIdx.x == 0) {
#pragma unroll
        for (int k = 0; k < K; ++k) slots[(tag & 1u) * gridDim.x + blockIdx.x].v[k] = v[k];
    }
    arrive_and_wait(slots, tag, threadIdx.x == 0);
    for (int i = threadIdx.x; i < gridDim.x; i += 32) {
#pragma unroll
        for (int k = 0; k < K; ++k) total[k] += __ldcg(&buf[i].v[k]);
    }
#pragma unroll
    for (int k = 0; k < K; ++k) v[k] = warp_sum(total[k]);
#endif
}

// Barrier of the whole grid on the same slots and tags (a reduction of nothing): orders every
// block's earlier writes before every block's later reads.
template <int B>
__device__ void grid_barrier(Slot* slots, unsigned int& tag) {
    __syncthreads();
#if GRID_EXCHANGE == 0
    grid_exchange<B>(slots, tag, [](Slot&) {}, [](const Slot&) {});
#else
    ++tag;
    if (threadIdx.x == 0) arrive_and_wait(slots, tag, true);
#endif
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
