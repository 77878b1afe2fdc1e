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

// ---- Totals in every block: grid_sums -------------------------------------------------------
// Each block publishes its sums in its own slot with a release store of the reduction's tag; every
// block then polls all slots with acquire loads and adds them in a fixed order, so all blocks hold
// the same totals and take the same decisions. The release/acquire pairs also order every block's
// earlier writes before every block's later reads (and drop stale L1 lines). Slots alternate
// between two buffers from one tag to the next: a block that has gone ahead never overwrites a slot
// a slower block still has to read. Tags count reductions since set-up, so they never repeat within
// a buffer; a launch's first tag comes from *epoch (see end_epoch). Every block reads every slot:
// meant for grids of a few hundred blocks.

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

// Sums of K <= 3 values over the grid, in thread 0 of every block; `tag` is this thread's
// reduction counter (the same in every thread of the grid).
template <int B, int K>
__device__ void grid_sums(Slot* slots, double (&v)[K], unsigned int& tag) {
    block_sums<B>(v);
    double total[K];
#pragma unroll
    for (int k = 0; k < K; ++k) total[k] = 0.0;
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
}

// Barrier of the whole grid on the same slots and tags (a reduction of nothing): orders every
// block's earlier writes before every block's later reads.
template <int B>
__device__ void grid_barrier(Slot* slots, unsigned int& tag) {
    __syncthreads();
    grid_exchange<B>(slots, tag, [](Slot&) {}, [](const Slot&) {});
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
