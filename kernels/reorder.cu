// Cuthill-McKee ordering of a symmetric sparsity pattern, and the symmetric permutation of a CSR
// pattern. NumPy meaning: reorder_ref.py.
//
// cm_levels runs the breadth-first levels of one pass in one persistent kernel (a cooperative
// launch: grid_sync between the three phases of a level, no host round trip). The next level is
// the current level's unvisited neighbours; each goes to the earliest position of the current
// level among its neighbours (claim: atomicMin, so the smallest position wins whatever order the
// threads run in), each position's group is placed where the counts of the positions before it
// say (count: a prefix sum over the level), and a group is sorted by (degree, index) by the thread
// that placed it. That is Cuthill-McKee's order, and it does not depend on scheduling.
//
// CM_BLOCK (threads a block) and CM_SORT_IN_THREAD (the largest group one thread sorts) are
// defined by the loader.

#define CM_UNCLAIMED 0x7fffffff
#define CM_DONE 0
#define CM_LIMIT 1
#define CM_SORT 2

// (degree, index) packed so that comparing keys compares the pairs.
__device__ __forceinline__ unsigned long long cm_key(const int* degree, int v) {
    return ((unsigned long long)(unsigned int)degree[v] << 32) | (unsigned int)v;
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

// Insertion sort of a group of k vertices by (degree, index).
__device__ void sort_group(int* group, int k, const int* degree) {
    for (int i = 1; i < k; ++i) {
        const int x = group[i];
        const unsigned long long kx = cm_key(degree, x);
        int j = i - 1;
        while (j >= 0 && cm_key(degree, group[j]) > kx) {
            group[j + 1] = group[j];
            --j;
        }
        group[j + 1] = x;
    }
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
// (LIMIT), or a level holds a group of more than CM_SORT_IN_THREAD vertices (SORT: left in
// neighbour order for the host to sort, after which it resumes from that level). A vertex is
// unvisited when its stamp is below a.pass_id; the pass stamps what it places with a.pass_id.
// a.count and a.offset hold, for each position of the current level, its group's size and its
// offset within the block's share; a.block_total each block's share's sum.
extern "C" __global__ void __launch_bounds__(CM_BLOCK) cm_levels(CMPass a) {
    __shared__ unsigned long long sync_target;
    if (threadIdx.x == 0) sync_target = sync_base(a.counter);
    const int threads = gridDim.x * CM_BLOCK, t0 = blockIdx.x * CM_BLOCK + threadIdx.x;
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
        for (int p = lo + t0; p < hi; p += threads) {
            const int v = a.order[p];
            for (int e = a.indptr[v]; e < a.indptr[v + 1]; ++e) {
                const int w = a.indices[e];
                if (a.stamp[w] < a.pass_id) atomicMin(&a.parent[w], p);
            }
        }
        sync();
        // count: each block takes one contiguous share of the level, a tile of CM_BLOCK at a time
        const int m = hi - lo, share = (m + gridDim.x - 1) / gridDim.x;
        const int first = min(hi, lo + (int)blockIdx.x * share), last = min(hi, first + share);
        int carry = 0;
        for (int t = first; t < last; t += CM_BLOCK) {
            const int p = t + threadIdx.x;
            int c = 0;
            if (p < last) {
                const int v = a.order[p];
                for (int e = a.indptr[v]; e < a.indptr[v + 1]; ++e) c += a.parent[a.indices[e]] == p;
                a.count[p] = c;
            }
            int tile;
            const int before = block_exclusive_sum<CM_BLOCK>(c, tile);
            if (p < last) a.offset[p] = carry + before;
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
        for (int p = first + threadIdx.x; p < last; p += CM_BLOCK) {
            const int v = a.order[p];
            int* group = a.order + hi + below + a.offset[p];
            int k = 0;
            for (int e = a.indptr[v]; e < a.indptr[v + 1]; ++e) {
                const int w = a.indices[e];
                if (a.parent[w] == p) {
                    group[k++] = w;
                    a.stamp[w] = a.pass_id;
                }
            }
            if (k <= CM_SORT_IN_THREAD) {
                sort_group(group, k, a.degree);
            } else {
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

// Row i of P A P^T is row perm[i] of A with its columns renumbered (inverse) and sorted, rows of
// at most CM_SORT_IN_THREAD entries here, longer ones by the host; source[e] is the entry of A
// that entry e comes from (the values follow by a gather, whatever their type).
extern "C" __global__ void permute_rows(int n, const int* __restrict__ perm, const int* __restrict__ inverse,
                                        const int* __restrict__ indptr, const int* __restrict__ indices,
                                        const int* __restrict__ new_indptr, int* __restrict__ new_indices,
                                        int* __restrict__ source) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const int row = perm[i], s = indptr[row], length = indptr[row + 1] - s, d = new_indptr[i];
        for (int k = 0; k < length; ++k) {
            new_indices[d + k] = inverse[indices[s + k]];
            source[d + k] = s + k;
        }
        if (length > CM_SORT_IN_THREAD) continue;
        for (int k = 1; k < length; ++k) {
            const int column = new_indices[d + k], from = source[d + k];
            int j = k - 1;
            while (j >= 0 && new_indices[d + j] > column) {
                new_indices[d + j + 1] = new_indices[d + j];
                source[d + j + 1] = source[d + j];
                --j;
            }
            new_indices[d + j + 1] = column;
            source[d + j + 1] = from;
        }
    }
}
