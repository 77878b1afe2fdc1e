// Cuthill-McKee ordering of a symmetric sparsity pattern, and the symmetric permutation of a CSR
// pattern. NumPy meaning: reorder_ref.py.
//
// cm_levels runs the breadth-first levels of one pass in one persistent kernel (a cooperative
// launch: grid_sync between the three phases of a level, no host round trip). The next level is
// the current level's unvisited neighbours; each goes to the earliest position of the current
// level among its neighbours (claim: atomicMin, so the smallest position wins whatever order the
// threads run in), each position's group is placed where the counts of the positions before it
// say (count: a prefix sum over the level), and the group is sorted by (degree, index) by ranks.
// That is Cuthill-McKee's order, and it does not depend on scheduling. A group of CM_LANES lanes
// walks a vertex's row, so that a level costs a few dependent memory reads, not one a neighbour.
//
// The loader defines CM_BLOCK (threads a block), CM_LANES (lanes a vertex, a power of two up to 32)
// and CM_SORT_ON_DEVICE (the largest group or row the kernels sort, at most 64).

#define CM_UNCLAIMED 0x7fffffff
#define CM_DONE 0
#define CM_LIMIT 1
#define CM_SORT 2
#define CM_GROUPS (CM_BLOCK / CM_LANES)                    // vertices a block takes at once
#define CM_EACH ((CM_SORT_ON_DEVICE + CM_LANES - 1) / CM_LANES)  // children a lane ranks
static_assert(CM_SORT_ON_DEVICE <= 64, "permute_rows ranks at most two entries a lane");

// (degree, index) packed so that comparing keys compares the pairs.
__device__ __forceinline__ unsigned long long cm_key(const int* degree, int v) {
    return ((unsigned long long)(unsigned int)degree[v] << 32) | (unsigned int)v;
}

// Sum of v over the CM_LANES lanes of each group, in each of them (every lane of the warp calls it).
__device__ __forceinline__ int group_sum(int v) {
    for (int o = CM_LANES / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Exclusive prefix sum of v over the block's B threads (every thread calls it); `total` gets the sum.
template <int B>
__device__ int block_exclusive_sum(int v, int& total) {
    __shared__ int warp_sums[B / 32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int x = v;
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    __syncthreads();  // warp_sums may still be read by a previous call
    if (lane == 31) warp_sums[warp] = x;
    __syncthreads();
    if (warp == 0) {
        int s = lane < B / 32 ? warp_sums[lane] : 0;
        for (int o = 1; o < 32; o <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, s, o);
            if (lane >= o) s += y;
        }
        if (lane < B / 32) warp_sums[lane] = s;
    }
    __syncthreads();
    total = warp_sums[B / 32 - 1];
    return x - v + (warp > 0 ? warp_sums[warp - 1] : 0);
}

// Sum of v over the block's B threads, in every thread.
template <int B>
__device__ int block_sum(int v) {
    int total;
    block_exclusive_sum<B>(v, total);
    return total;
}

// The k <= CM_SORT_ON_DEVICE children at out[0, k), sorted by (degree, index) by the group that
// placed them (lanes `mask`): each lane ranks the children lane, lane + CM_LANES, ... among all k
// (the keys are distinct), then, once every lane has read them, writes them at their ranks.
__device__ void sort_group(int* out, int k, const int* degree, int lane, unsigned int mask) {
    int child[CM_EACH], child_degree[CM_EACH], rank[CM_EACH];
    __syncwarp(mask);  // the group's writes of out[] seen by the whole group
#pragma unroll
    for (int c = 0; c < CM_EACH; ++c) {
        const int i = lane + c * CM_LANES;
        child[c] = i < k ? out[i] : 0;
        child_degree[c] = i < k ? degree[child[c]] : 0;
        rank[c] = 0;
    }
    for (int j = 0; j < k; ++j) {
        const int other = out[j], other_degree = degree[other];
#pragma unroll
        for (int c = 0; c < CM_EACH; ++c)
            rank[c] += other_degree < child_degree[c] || (other_degree == child_degree[c] && other < child[c]);
    }
    __syncwarp(mask);  // every lane has read out[] before any writes it
#pragma unroll
    for (int c = 0; c < CM_EACH; ++c)
        if (lane + c * CM_LANES < k) out[rank[c]] = child[c];
}

// degree[i]: the entries of row i off the diagonal (its neighbours).
extern "C" __global__ void cm_degree(int n, const int* __restrict__ indptr, const int* __restrict__ indices,
                                     int* __restrict__ degree) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        int d = 0;
        for (int e = indptr[i]; e < indptr[i + 1]; ++e) d += indices[e] != i;
        degree[i] = d;
    }
}

// One pass from [a.lo, a.hi) of a.order on (a fresh pass first puts a.root at a.order[a.lo]), until
// a level has no unvisited neighbour (DONE), the pass would have more than a.max_levels levels
// (LIMIT), or a level holds a group of more than CM_SORT_ON_DEVICE vertices (SORT: left in
// neighbour order for the host to sort, after which it resumes from that level). A vertex is
// unvisited when its stamp is below a.pass_id; the pass stamps what it places with a.pass_id.
// a.count and a.offset hold, for each position of the current level, its group's size and its
// offset within the block's share; a.block_total each block's share's sum.
extern "C" __global__ void __launch_bounds__(CM_BLOCK) cm_levels(CMPass a) {
    __shared__ unsigned long long sync_target;
    if (threadIdx.x == 0) sync_target = sync_base(a.counter);
    const int threads = gridDim.x * CM_BLOCK, t0 = blockIdx.x * CM_BLOCK + threadIdx.x;
    const int lane = threadIdx.x % CM_LANES, groups = threads / CM_LANES;
    const int warp_lane = threadIdx.x & 31;
    const unsigned int group_mask = (0xffffffffu >> (32 - CM_LANES)) << (warp_lane & ~(CM_LANES - 1));
    auto sync = [&]() { grid_sync(a.counter, sync_target); };
    int lo = a.lo, hi = a.hi, depth = a.depth, prev_lo = -1, prev_hi = -1, status = CM_DONE;
    if (t0 == 0) {
        a.result->best = ~0ull;
        if (a.root >= 0) {
            a.order[lo] = a.root;
            a.stamp[a.root] = a.pass_id;
        }
    }
    sync();
    for (;;) {
        // claim: each unvisited neighbour takes the least position of the level next to it
        for (int p = lo + t0 / CM_LANES; p < hi; p += groups) {
            const int v = a.order[p], end = a.indptr[v + 1];
            for (int e = a.indptr[v] + lane; e < end; e += CM_LANES) {
                const int w = a.indices[e];
                if (a.stamp[w] < a.pass_id) atomicMin(&a.parent[w], p);
            }
        }
        sync();
        // count: each block takes one contiguous share of the level, CM_GROUPS vertices at a time
        const int m = hi - lo, share = (m + gridDim.x - 1) / gridDim.x;
        const int first = min(hi, lo + (int)blockIdx.x * share), last = min(hi, first + share);
        int carry = 0;
        for (int t = first; t < last; t += CM_GROUPS) {
            const int p = t + threadIdx.x / CM_LANES;
            int c = 0;
            if (p < last) {
                const int v = a.order[p], end = a.indptr[v + 1];
                for (int e = a.indptr[v] + lane; e < end; e += CM_LANES) c += a.parent[a.indices[e]] == p;
            }
            c = group_sum(c);
            const bool leads = lane == 0 && p < last;
            int tile;
            const int before = block_exclusive_sum<CM_BLOCK>(leads ? c : 0, tile);
            if (leads) {
                a.count[p] = c;
                a.offset[p] = carry + before;
            }
            carry += tile;
        }
        if (threadIdx.x == 0) a.block_total[blockIdx.x] = carry;
        sync();
        // place: the block's share starts after the shares of the blocks before it
        int below = 0, size = 0;
        for (int j = threadIdx.x; j < (int)gridDim.x; j += CM_BLOCK) {
            const int s = __ldcg(&a.block_total[j]);
            size += s;
            if (j < (int)blockIdx.x) below += s;
        }
        below = block_sum<CM_BLOCK>(below);
        size = block_sum<CM_BLOCK>(size);
        for (int p = first + threadIdx.x / CM_LANES; p < last; p += CM_GROUPS) {  // a group stays together
            const int v = a.order[p], begin = a.indptr[v], end = a.indptr[v + 1];
            int* out = a.order + hi + below + a.offset[p];
            int k = 0;
            for (int e0 = begin; e0 < end; e0 += CM_LANES) {  // in neighbour order
                const int e = e0 + lane;
                int w = 0;
                bool child = false;
                if (e < end) {
                    w = a.indices[e];
                    child = a.parent[w] == p;
                }
                const unsigned int found = __ballot_sync(group_mask, child) & group_mask;
                if (child) {
                    out[k + __popc(found & ((1u << warp_lane) - 1u))] = w;
                    a.stamp[w] = a.pass_id;
                }
                k += __popc(found);
            }
            if (k <= CM_SORT_ON_DEVICE) {
                sort_group(out, k, a.degree, lane, group_mask);
            } else if (lane == 0) {
                a.big[depth + 1] = a.pass_id;
            }
        }
        sync();
        if (size == 0) break;
        prev_lo = lo;
        prev_hi = hi;
        lo = hi;
        hi += size;
        ++depth;
        if (depth + 1 > a.max_levels) {
            status = CM_LIMIT;
            break;
        }
        if (__ldcg(&a.big[depth]) == a.pass_id) {
            status = CM_SORT;
            break;
        }
    }
    if (status == CM_DONE) {  // the next pass finds every vertex unclaimed; the last level's least key
        for (int p = a.base + t0; p < hi; p += threads) {
            const int v = a.order[p];
            a.parent[v] = CM_UNCLAIMED;
            if (p >= lo) atomicMin(&a.result->best, cm_key(a.degree, v));
        }
    }
    if (t0 == 0) {
        a.result->status = status;
        a.result->levels = depth + 1;
        a.result->lo = lo;
        a.result->hi = hi;
        a.result->prev_lo = prev_lo;
        a.result->prev_hi = prev_hi;
    }
}

// Row i of P A P^T is row perm[i] of A with its columns renumbered (inverse) and sorted, a warp a
// row: a row of at most CM_SORT_ON_DEVICE entries ranked here (two a lane at most: the columns are
// distinct), a longer one copied in order for the host to sort. source[e] is the entry of A that
// entry e comes from (the values follow by a gather, whatever their type).
extern "C" __global__ void permute_rows(int n, const int* __restrict__ perm, const int* __restrict__ inverse,
                                        const int* __restrict__ indptr, const int* __restrict__ indices,
                                        const int* __restrict__ new_indptr, int* __restrict__ new_indices,
                                        int* __restrict__ source) {
    const int lane = threadIdx.x & 31, warps = gridDim.x * (blockDim.x / 32);
    for (int i = (blockIdx.x * blockDim.x + threadIdx.x) / 32; i < n; i += warps) {
        const int row = perm[i], s = indptr[row], length = indptr[row + 1] - s, d = new_indptr[i];
        if (length > CM_SORT_ON_DEVICE) {
            for (int k = lane; k < length; k += 32) {
                new_indices[d + k] = inverse[indices[s + k]];
                source[d + k] = s + k;
            }
            continue;
        }
        const int c0 = lane < length ? inverse[indices[s + lane]] : 0;
        const int c1 = lane + 32 < length ? inverse[indices[s + lane + 32]] : 0;
        int r0 = 0, r1 = 0;
        for (int j = 0; j < length; ++j) {
            const int cj = __shfl_sync(0xffffffffu, j < 32 ? c0 : c1, j & 31);
            r0 += cj < c0;
            r1 += cj < c1;
        }
        if (lane < length) {
            new_indices[d + r0] = c0;
            source[d + r0] = s + lane;
        }
        if (lane + 32 < length) {
            new_indices[d + r1] = c1;
            source[d + r1] = s + lane + 32;
        }
    }
}
