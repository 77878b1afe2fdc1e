// A stable argsort of non-negative int keys (the NumPy meaning: numpy.argsort(keys, kind="stable")),
// least significant digit first: each pass orders the elements by RADIX_BITS bits of their keys and keeps
// the order of equal digits, so the passes over all of the keys' bits leave them sorted, ties in their
// given order. A pass is two kernels over tiles of `tile` elements, a block a tile, with nothing read back
// to the host: radix_count counts the digits of each tile; radix_scatter finds, from every tile's counts,
// where its tile's elements of each digit start (after all smaller digits, and after the same digit in the
// tiles before it) and writes them there in their order. Nothing depends on the scheduling.
// struct RadixPass (generated): n, tile, tiles, shift, keys, values (null: each element's index), counts
// (tiles x RADIX, tile-major), keys_out (null on the last pass: only the order is wanted), values_out.
#define RADIX_BITS 8
#define RADIX (1 << RADIX_BITS)

__device__ __forceinline__ int radix_digit(int key, int shift) { return (key >> shift) & (RADIX - 1); }

extern "C" __global__ void radix_count(const RadixPass a) {
    __shared__ int tile_counts[RADIX];
    for (int d = threadIdx.x; d < RADIX; d += blockDim.x) tile_counts[d] = 0;
    __syncthreads();
    const long long begin = (long long)blockIdx.x * a.tile, end = min(begin + a.tile, (long long)a.n);
    for (long long i = begin + threadIdx.x; i < end; i += blockDim.x)
        atomicAdd(&tile_counts[radix_digit(a.keys[i], a.shift)], 1);
    __syncthreads();
    for (int d = threadIdx.x; d < RADIX; d += blockDim.x) a.counts[(long long)blockIdx.x * RADIX + d] = tile_counts[d];
}

// A block of RADIX to 1024 threads (a multiple of 32) a tile, taking the tile blockDim.x elements at a
// time in order. Within such a chunk an element's place among its digit's elements is its rank among its
// warp's (a match of the warp's digits) after the counts of the warps before it.
extern "C" __global__ void radix_scatter(const RadixPass a) {
    __shared__ int next[RADIX];            // where the tile's next element of each digit goes
    __shared__ int warp_start[32][RADIX];  // a chunk's elements of each digit by warp: counts, then starts
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    if (threadIdx.x < RADIX) {  // this tile's starts: every tile's elements of smaller digits, then earlier tiles'
        const int d = threadIdx.x;
        int total = 0, before = 0;
        for (int b = 0; b < a.tiles; ++b) {
            const int c = a.counts[(long long)b * RADIX + d];
            total += c;
            before += b < (int)blockIdx.x ? c : 0;
        }
        next[d] = total;
        warp_start[0][d] = before;
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
    const long long begin = (long long)blockIdx.x * a.tile, end = min(begin + a.tile, (long long)a.n);
    for (long long chunk = begin; chunk < end; chunk += blockDim.x) {
        for (int t = threadIdx.x; t < warps * RADIX; t += blockDim.x) warp_start[t / RADIX][t % RADIX] = 0;
        __syncthreads();
        const long long i = chunk + threadIdx.x;
        const bool valid = i < end;
        const int key = valid ? a.keys[i] : 0, digit = valid ? radix_digit(key, a.shift) : -1;
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
            const int p = warp_start[warp][digit] + rank;
            if (a.keys_out) a.keys_out[p] = key;
            a.values_out[p] = a.values ? a.values[i] : (int)i;
        }
        __syncthreads();
    }
}
