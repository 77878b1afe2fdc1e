// A stable sort of non-negative int keys carrying int values (the NumPy meaning: order =
// numpy.argsort(keys, kind="stable"), values[order]; with no values, each element's index, so the result is
// the argsort itself), least significant digit first: each pass orders the elements by RADIX_BITS bits of
// their keys and keeps the order of equal digits, so the passes over all of the keys' bits leave them
// sorted, ties in their given order. A pass counts the digits of each tile of `tile` elements
// (radix_count_tile); after a barrier a block a digit turns its counts into the tiles' starts among the
// digit's elements and its total (radix_prefix); after another, each tile adds the smaller digits'
// totals and writes its elements in their order (radix_scatter_tile). Blocks of SORT_THREADS take the
// tiles in turn. Nothing depends on the scheduling, and nothing is read back to the host.
// struct RadixSort (generated): n, tile, tiles, passes, keys, values (null: each element's index), counts
// ((tiles + 1) x RADIX, tile-major: the tiles' counts, then the digits' totals), key_buffers and
// value_buffers (two of n each, alternating: the result is value_buffers + ((passes - 1) % 2) n).
// The sort runs as phases of a cooperative kernel (sell_build in sell_layout.cu), whose grid barriers
// radix_sort_passes takes.
// RADIX_BITS (a pass's digits), SORT_THREADS (a block's threads) and SORT_TILES (a sort's tiles at most, a
// multiple of SORT_THREADS) are generated from solvers/formats/base.py.
#define RADIX (1 << RADIX_BITS)

__device__ __forceinline__ int radix_digit(int key, int shift) { return (key >> shift) & (RADIX - 1); }

// Where pass p reads and writes: the input first, then the buffers in turn; the last pass writes no keys.
struct RadixIO {
    const int* keys;
    const int* values;
    int* keys_out;
    int* values_out;
};

__device__ __forceinline__ RadixIO radix_io(const RadixSort& s, int p) {
    const long long n = s.n;
    RadixIO io;
    io.keys = p == 0 ? s.keys : s.key_buffers + ((p - 1) % 2) * n;
    io.values = p == 0 ? s.values : s.value_buffers + ((p - 1) % 2) * n;
    io.keys_out = p + 1 == s.passes ? nullptr : s.key_buffers + (p % 2) * n;
    io.values_out = s.value_buffers + (p % 2) * n;
    return io;
}

__device__ void radix_count_tile(const RadixSort& s, int p, int tile) {
    __shared__ int tile_counts[RADIX];
    const RadixIO io = radix_io(s, p);
    for (int d = threadIdx.x; d < RADIX; d += blockDim.x) tile_counts[d] = 0;
    __syncthreads();
    const long long begin = (long long)tile * s.tile, end = min(begin + s.tile, (long long)s.n);
    for (long long i = begin + threadIdx.x; i < end; i += blockDim.x)
        atomicAdd(&tile_counts[radix_digit(io.keys[i], p * RADIX_BITS)], 1);
    __syncthreads();
    for (int d = threadIdx.x; d < RADIX; d += blockDim.x) s.counts[(long long)tile * RADIX + d] = tile_counts[d];
    __syncthreads();
}

// A block a digit: the tiles' counts of the digit become their exclusive prefix sums, and the digit's total
// goes after the tiles' counts. Each warp takes a run of SORT_TILES / (SORT_THREADS / 32) tiles, its lanes
// loading their PREFIX_TILES counts at once, where a warp walking all of a digit's tiles would wait for
// each load in turn; the warps' sums are added through shared memory.
__device__ void radix_prefix(const RadixSort& s) {
    constexpr int warps = SORT_THREADS / 32, PREFIX_TILES = SORT_TILES / SORT_THREADS;  // tiles a lane
    static_assert(SORT_TILES % SORT_THREADS == 0 && SORT_THREADS % 32 == 0,
                  "every lane of the block takes PREFIX_TILES tiles: SORT_TILES a multiple of SORT_THREADS");
    __shared__ int warp_sums[warps];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int d = blockIdx.x; d < RADIX; d += gridDim.x) {
        int count[PREFIX_TILES], below[PREFIX_TILES], sum = 0;
#pragma unroll
        for (int k = 0; k < PREFIX_TILES; ++k) {
            const int t = (warp * PREFIX_TILES + k) * 32 + lane;
            count[k] = t < s.tiles ? s.counts[(long long)t * RADIX + d] : 0;
        }
#pragma unroll
        for (int k = 0; k < PREFIX_TILES; ++k) {  // exclusive prefix within the warp's run
            int v = count[k];
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const int up = __shfl_up_sync(0xffffffffu, v, o);
                if (lane >= o) v += up;
            }
            below[k] = sum + v - count[k];
            sum += __shfl_sync(0xffffffffu, v, 31);
        }
        if (lane == 0) warp_sums[warp] = sum;
        __syncthreads();
        int base = 0, total = 0;
#pragma unroll
        for (int w = 0; w < warps; ++w) {
            base += w < warp ? warp_sums[w] : 0;
            total += warp_sums[w];
        }
#pragma unroll
        for (int k = 0; k < PREFIX_TILES; ++k) {
            const int t = (warp * PREFIX_TILES + k) * 32 + lane;
            if (t < s.tiles) s.counts[(long long)t * RADIX + d] = base + below[k];
        }
        if (threadIdx.x == 0) s.counts[(long long)s.tiles * RADIX + d] = total;
        __syncthreads();  // warp_sums is free for the block's next digit
    }
}

// With SORT_THREADS threads (RADIX of them at least), the tile blockDim.x elements at a time in order.
// Within such a chunk an element's place among its digit's elements is its rank among its warp's (a match
// of the warp's digits) after the counts of the warps before it.
__device__ void radix_scatter_tile(const RadixSort& s, int p, int tile) {
    __shared__ int next[RADIX];                           // where the tile's next element of each digit goes
    __shared__ int warp_start[SORT_THREADS / 32][RADIX];  // a chunk's elements of each digit by warp: counts, starts
    const RadixIO io = radix_io(s, p);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5, shift = p * RADIX_BITS;
    if (threadIdx.x < RADIX) {  // the digits' totals, and the tile's starts among each digit's elements
        next[threadIdx.x] = s.counts[(long long)s.tiles * RADIX + threadIdx.x];
        warp_start[0][threadIdx.x] = s.counts[(long long)tile * RADIX + threadIdx.x];
    }
    __syncthreads();
    if (warp == 0) {  // exclusive scan of the digits' totals: lane l holds digits 8l to 8l + 7
        constexpr int per_lane = RADIX / 32;
        int own[per_lane], sum = 0;
#pragma unroll
        for (int k = 0; k < per_lane; ++k) {
            own[k] = sum;
            sum += next[lane * per_lane + k];
        }
        int below = sum;  // inclusive scan of the lanes' sums
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int up = __shfl_up_sync(0xffffffffu, below, o);
            if (lane >= o) below += up;
        }
        below -= sum;
#pragma unroll
        for (int k = 0; k < per_lane; ++k) {
            const int d = lane * per_lane + k;
            next[d] = below + own[k] + warp_start[0][d];
        }
    }
    __syncthreads();
    const long long begin = (long long)tile * s.tile, end = min(begin + s.tile, (long long)s.n);
    for (long long chunk = begin; chunk < end; chunk += blockDim.x) {
        for (int t = threadIdx.x; t < warps * RADIX; t += blockDim.x) warp_start[t / RADIX][t % RADIX] = 0;
        __syncthreads();
        const long long i = chunk + threadIdx.x;
        const bool valid = i < end;
        const int key = valid ? io.keys[i] : 0, digit = valid ? radix_digit(key, shift) : -1;
        const unsigned int peers = __match_any_sync(0xffffffffu, digit);
        const int rank = __popc(peers & ((1u << lane) - 1));
        if (valid && rank == 0) warp_start[warp][digit] = __popc(peers);
        __syncthreads();
        if (threadIdx.x < RADIX) {
            int at = next[threadIdx.x];
            for (int w = 0; w < warps; ++w) {
                const int c = warp_start[w][threadIdx.x];
                warp_start[w][threadIdx.x] = at;
                at += c;
            }
            next[threadIdx.x] = at;
        }
        __syncthreads();
        if (valid) {
            const int at = warp_start[warp][digit] + rank;
            if (io.keys_out) io.keys_out[at] = key;
            io.values_out[at] = io.values ? io.values[i] : (int)i;
        }
        __syncthreads();
    }
}

// Every pass, a barrier after each of its three steps (`sync`: the caller's grid barrier).
template <class Sync>
__device__ void radix_sort_passes(const RadixSort& s, Sync& sync) {
    for (int p = 0; p < s.passes; ++p) {
        for (int t = blockIdx.x; t < s.tiles; t += gridDim.x) radix_count_tile(s, p, t);
        sync();
        radix_prefix(s);
        sync();
        for (int t = blockIdx.x; t < s.tiles; t += gridDim.x) radix_scatter_tile(s, p, t);
        sync();
    }
}
