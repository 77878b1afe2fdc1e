// The SELL layout of a CSR pattern on the device (solvers/formats/sell.py computes the same arrays with
// NumPy: that path is these kernels' reference, and the tests compare the two): the phases of sell_build,
// then the kernels that place the entries. Each phase and kernel writes each output once, or adds
// integers, or sorts stably (sort.cu): nothing depends on the scheduling.

// Per row (row_keys, the "rows" phase): key[r] = 64 - length for a short row (length <= long_row), long_row + 1
// for a long one, so that a stable sort puts the short rows longest first and the long ones after them;
// rank[r] = r, or n for a long row (the first ranks of the neighbours' order).
// struct SellRows (generated): n, long_row, indptr, key, rank.
__device__ void rows_phase(const SellRows& a) {
    for (int r = blockIdx.x * blockDim.x + threadIdx.x; r < a.n; r += gridDim.x * blockDim.x) {
        const int length = a.indptr[r + 1] - a.indptr[r];
        const bool is_long = length > a.long_row;
        a.key[r] = is_long ? a.long_row + 1 : a.long_row - length;
        a.rank[r] = is_long ? a.n : r;
    }
}

// The neighbour key of every row for SELL's row order by neighbours (neighbour_key): key[r] = the
// least rank[c] over the columns c of row r (rank[c] = n for a column to leave out: a long row's), n for
// an empty row, n + 1 for a row longer than long_row entries (long rows take no part and sort last).
// struct SellKey (generated): n, long_row, indptr, indices, rank, key. One thread a row.
__device__ void key_phase(const SellKey& a) {
    for (int r = blockIdx.x * blockDim.x + threadIdx.x; r < a.n; r += gridDim.x * blockDim.x) {
        int least = a.n;
        if (a.indptr[r + 1] - a.indptr[r] > a.long_row) least = a.n + 1;
        else
            for (int e = a.indptr[r]; e < a.indptr[r + 1]; ++e) least = min(least, a.rank[a.indices[e]]);
        a.key[r] = least;
    }
}

// Distinct 32-byte sectors that sampled windows of `window` rows read, in two row orders at once (SELL's
// automatic row order, SELL._sample_sectors; the NumPy meaning is base.py's window_sectors on each order).
// blockIdx.y 0: the rows as numbered (0 to n - 1), a long row's entries left out; 1: the first `rows`
// rows of `grouped`. Of the G windows of an order, `samples` (at most G) are spread as NumPy's
// linspace(0, G - 1, samples) spreads them, truncated to integers; block x counts the x-th.
// counts[(y samples + x) 2 + 0] gets the distinct sectors of its window's columns (column c in sector
// c itemsize / 32), counts[... + 1] its entries. The sectors are told apart in an open-addressing hash
// table of `table` slots (a power of two) in dynamic shared memory, which must hold every entry of a
// window (rows of at most long_row entries): the count does not depend on the order of the insertions.
// struct SellSample (generated): n, rows, window, samples, table, itemsize, long_row, indptr, indices,
// grouped, counts. The block's window: sample x of order y (sample_phase: blocks take them in turn).
__device__ void sample_window(const SellSample& a, int y, int x) {
    extern __shared__ int slots[];
    __shared__ unsigned int distinct, entries;
    const bool by_grouped = y == 1;
    const long long count = by_grouped ? a.rows : a.n;
    const long long groups = (count + a.window - 1) / a.window;
    const int samples = (int)min((long long)a.samples, groups);
    if (x >= samples) return;  // the whole block: its counts stay zero
    long long w;
    if (samples == 1) w = 0;
    else if (x == samples - 1) w = groups - 1;  // linspace's endpoint is exact
    else w = (long long)((double)x * ((double)(groups - 1) / (double)(samples - 1)));
    for (int t = threadIdx.x; t < a.table; t += blockDim.x) slots[t] = -1;
    if (threadIdx.x == 0) distinct = entries = 0;
    __syncthreads();
    const long long begin = w * a.window, end = min(begin + a.window, count);
    const unsigned int mask = (unsigned int)(a.table - 1);
    unsigned int found = 0, read = 0;
    for (long long p = begin + threadIdx.x; p < end; p += blockDim.x) {
        const int r = by_grouped ? a.grouped[p] : (int)p;
        if (a.indptr[r + 1] - a.indptr[r] > a.long_row) continue;  // a long row: only in the numbered order
        for (int e = a.indptr[r]; e < a.indptr[r + 1]; ++e) {
            const int sector = (int)((long long)a.indices[e] * a.itemsize / 32);
            unsigned int h = ((unsigned int)sector * 2654435761u) & mask;
            while (true) {
                const int seen = atomicCAS(&slots[h], -1, sector);
                if (seen == -1) { ++found; break; }
                if (seen == sector) break;
                h = (h + 1) & mask;
            }
            ++read;
        }
    }
    atomicAdd(&distinct, found);
    atomicAdd(&entries, read);
    __syncthreads();
    if (threadIdx.x == 0) {
        const int at = (y * a.samples + x) * 2;
        a.counts[at] = distinct;
        a.counts[at + 1] = entries;
    }
    __syncthreads();  // the table and the totals are free for the block's next window
}

__device__ void sample_phase(const SellSample& a) {
    for (int w = blockIdx.x; w < 2 * a.samples; w += gridDim.x) sample_window(a, w / a.samples, w % a.samples);
}

// The ranks of the neighbours' next pass (order_ranks): rank[order[p]] = p for a short row (p < rows), n
// for a long one. `order` is a permutation: each rank is written once.
// struct SellRanks (generated): n, rows, order, rank.
__device__ void ranks_phase(const SellRanks& a) {
    for (int p = blockIdx.x * blockDim.x + threadIdx.x; p < a.n; p += gridDim.x * blockDim.x)
        a.rank[a.order[p]] = p < a.rows ? p : a.n;
}

// `order` sorted within windows (window_sort): a block of `window` threads a window of `window`
// positions. The short rows' positions (p < rows) of the window are sorted by length, longest first, ties
// in their order: the row at position i goes to the window's start + the count of its positions j whose
// row is longer, or as long with j < i. Positions from `rows` on (the long rows) keep their place.
// Dynamic shared memory: `window` ints.
// struct SellWindow (generated): n, rows, window, indptr, order, sorted.
__device__ void window_block(const SellWindow& a, long long w) {
    extern __shared__ int window_lengths[];
    const long long begin = w * a.window;
    const long long p = begin + threadIdx.x;
    const int shorts = (int)max(0ll, min((long long)a.window, (long long)a.rows - begin));
    const int r = p < a.n ? a.order[p] : -1;
    if (threadIdx.x < shorts) window_lengths[threadIdx.x] = a.indptr[r + 1] - a.indptr[r];
    __syncthreads();
    if ((int)threadIdx.x >= shorts) {
        if (p < a.n) a.sorted[p] = r;
    } else {
        const int mine = window_lengths[threadIdx.x];
        int before = 0;
        for (int j = 0; j < shorts; ++j) {
            const int other = window_lengths[j];
            before += other > mine || (other == mine && j < (int)threadIdx.x);
        }
        a.sorted[begin + before] = r;
    }
    __syncthreads();  // the lengths are free for the block's next window
}

__device__ void window_phase(const SellWindow& a) {
    for (long long w = blockIdx.x; w * a.window < a.n; w += gridDim.x) window_block(a, w);
}

// The sizes of the layout (SELL._offsets), in phases around a scan. counts_phase: counts[s] = the
// slots of slice s (32 for each `lanes` entries of its first row, the longest: position s 32 / lanes of
// `order`), for s < slices; counts[slices + i] = the entries of long row i (position rows + i of
// `order`) and counts[slices + longs + i] its pieces of piece_length, for i < longs. offsets_phase, from
// scan (the inclusive sum of counts): slice_ptr (slices + 1 offsets), long_start and row_pieces (longs
// + 1 each), each segment's sum from 0; totals = the slots of the slices, the long rows' entries, their
// pieces.
// struct SellSizes (generated): rows, lanes, slices, longs, piece_length, indptr, order, counts, scan,
// slice_ptr, long_start, row_pieces, totals.
__device__ __forceinline__ int sell_row_length(const int* indptr, int r) { return indptr[r + 1] - indptr[r]; }

__device__ void counts_phase(const SellSizes& a) {
    const int rows_per_slice = 32 / a.lanes;
    for (int t = blockIdx.x * blockDim.x + threadIdx.x; t < a.slices + a.longs; t += gridDim.x * blockDim.x) {
        if (t < a.slices) {
            const int length = sell_row_length(a.indptr, a.order[t * rows_per_slice]);
            a.counts[t] = (long long)((length + a.lanes - 1) / a.lanes) * 32;
        } else {
            const int i = t - a.slices;
            const int length = sell_row_length(a.indptr, a.order[a.rows + i]);
            a.counts[a.slices + i] = length;
            a.counts[a.slices + a.longs + i] = (length + a.piece_length - 1) / a.piece_length;
        }
    }
}

__device__ void offsets_phase(const SellSizes& a) {
    // the sum of counts[0, k): 0 for k = 0
    auto before = [&](long long k) { return k > 0 ? a.scan[k - 1] : 0ll; };
    const long long sliced = before(a.slices), long_end = before(a.slices + a.longs);
    const int segment = a.slices + 1, longs = a.longs + 1;
    for (int t = blockIdx.x * blockDim.x + threadIdx.x; t < segment + 2 * longs + 1; t += gridDim.x * blockDim.x) {
        if (t < segment) a.slice_ptr[t] = (int)before(t);
        else if (t < segment + longs) a.long_start[t - segment] = (int)(before(a.slices + t - segment) - sliced);
        else if (t < segment + 2 * longs) {
            const int i = t - segment - longs;
            a.row_pieces[i] = (int)(before(a.slices + a.longs + i) - long_end);
        } else {
            a.totals[0] = sliced;
            a.totals[1] = long_end - sliced;
            a.totals[2] = before(a.slices + 2 * a.longs) - long_end;
        }
    }
}

// The pieces of the long rows (SELL._cut_pieces): long row i has row_pieces[i + 1] - row_pieces[i]
// pieces of piece_length entries (the last one shorter); piece q = row_pieces[i] + k starts at
// piece_ptr[q] = sliced + long_start[i] + k piece_length and belongs to piece_row[q] = i, and
// piece_ptr[pieces] is the end of the long rows. One thread a piece (a hub row has thousands), its long
// row found by bisection of row_pieces.
// struct SellPieces (generated): longs, pieces, sliced, piece_length, long_start, row_pieces, piece_ptr,
// piece_row.
extern "C" __global__ void sell_cut_pieces(const SellPieces a) {
    for (int q = blockIdx.x * blockDim.x + threadIdx.x; q <= a.pieces; q += gridDim.x * blockDim.x) {
        if (q == a.pieces) {
            a.piece_ptr[q] = a.sliced + a.long_start[a.longs];
            continue;
        }
        int lo = 0, hi = a.longs - 1;  // the last i with row_pieces[i] <= q
        while (lo < hi) {
            const int mid = (lo + hi + 1) / 2;
            if (a.row_pieces[mid] <= q) lo = mid;
            else hi = mid - 1;
        }
        a.piece_ptr[q] = a.sliced + a.long_start[lo] + (q - a.row_pieces[lo]) * a.piece_length;
        a.piece_row[q] = lo;
    }
}

// The inclusive scan of the sizes' counts (slices + 2 longs of them) into scan, in two phases with a grid
// barrier between: each block sums its chunk of ceil(items / gridDim.x) counts into block_sums
// (scan_sums_phase), then scans the chunk, blockDim.x counts at a time, from the sum of the blocks' before
// it (scan_phase). Integers: the sums do not depend on the order of the additions.
__device__ __forceinline__ long long sizes_items(const SellSizes& a) { return a.slices + 2ll * a.longs; }

// The sum of v over the block (every thread gets it); `warp_sums` holds 32 values in shared memory.
__device__ long long block_total(long long v, long long* warp_sums) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    if (lane == 0) warp_sums[warp] = v;
    __syncthreads();
    long long total = 0;
    for (int w = 0; w < warps; ++w) total += warp_sums[w];
    __syncthreads();
    return total;
}

__device__ void scan_sums_phase(const SellSizes& a, long long* block_sums) {
    __shared__ long long warp_sums[32];
    const long long items = sizes_items(a), chunk = (items + gridDim.x - 1) / gridDim.x;
    const long long begin = blockIdx.x * chunk, end = min(begin + chunk, items);
    long long sum = 0;
    for (long long i = begin + threadIdx.x; i < end; i += blockDim.x) sum += a.counts[i];
    sum = block_total(sum, warp_sums);
    if (threadIdx.x == 0) block_sums[blockIdx.x] = sum;
}

__device__ void scan_phase(const SellSizes& a, const long long* block_sums) {
    __shared__ long long warp_sums[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const long long items = sizes_items(a), chunk = (items + gridDim.x - 1) / gridDim.x;
    const long long begin = blockIdx.x * chunk, end = min(begin + chunk, items);
    long long carry = 0;  // the sum of every count before this round
    for (int b = threadIdx.x; b < (int)blockIdx.x; b += blockDim.x) carry += block_sums[b];
    carry = block_total(carry, warp_sums);
    for (long long round = begin; round < end; round += blockDim.x) {
        const long long i = round + threadIdx.x;
        long long v = i < end ? a.counts[i] : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {  // inclusive scan within the warp
            const long long up = __shfl_up_sync(0xffffffffu, v, o);
            if (lane >= o) v += up;
        }
        if (lane == 31) warp_sums[warp] = v;
        __syncthreads();
        for (int w = 0; w < warp; ++w) v += warp_sums[w];
        v += carry;
        if (i < end) a.scan[i] = v;
        __syncthreads();
        if (threadIdx.x == blockDim.x - 1) warp_sums[0] = v;  // the sum up to the round's end
        __syncthreads();
        carry = warp_sums[0];
        __syncthreads();
    }
}

// SELL._longest_first on the device: the long rows (order[rows, rows + longs)) sorted by length, longest
// first, ties in their order, as a sort of the rows by how much shorter than the longest row (width) they
// are (long_keys_phase: key[i] for order[rows + i]; the sort carries the rows), then copied back in place
// (long_rows_phase).
// struct SellLongs (generated): rows, longs, width, indptr, order, key, sorted.
__device__ void long_keys_phase(const SellLongs& a) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < a.longs; i += gridDim.x * blockDim.x)
        a.key[i] = a.width - sell_row_length(a.indptr, a.order[a.rows + i]);
}

__device__ void long_rows_phase(const SellLongs& a) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < a.longs; i += gridDim.x * blockDim.x)
        a.order[a.rows + i] = a.sorted[i];
}

// SELL's set-up up to its sizes as a list of phases (LayoutBuild in solvers/formats/sell.py):
// phases[0, count), each with its argument (which sort: 0 the neighbours', 1 the rows', 2 the long rows';
// the next pass's ranks (0) or the rows' places (1)), run in order by one cooperative launch of
// SORT_THREADS threads a block, a grid barrier after each, nothing read back in between. Dynamic shared
// memory: the sample's hash table, or a window's lengths. At least 4 blocks an SM (64 registers a thread,
// no spills), so that the phases that gather have threads in flight.
// struct SellBuild (generated): the phases' structs, block_sums (a block's sum of the scan), counter (the
// grid barriers), count, phases, args. The PHASE_ numbers are generated from SELL's.
__device__ __forceinline__ const RadixSort& build_sort(const SellBuild& a, int which) {
    return which == 0 ? a.neighbour_sort : which == 1 ? a.length_sort : a.long_sort;
}

extern "C" __global__ void __launch_bounds__(SORT_THREADS, 4) sell_build(const SellBuild a) {
    __shared__ unsigned long long sync_target;
    if (threadIdx.x == 0) sync_target = sync_base(a.counter);
    auto sync = [&]() { grid_sync(a.counter, sync_target); };
    for (int i = 0; i < a.count; ++i) {
        const int arg = a.args[i];
        switch (a.phases[i]) {
            case PHASE_ROWS: rows_phase(a.rows); break;
            case PHASE_KEY: key_phase(a.key); break;
            case PHASE_SORT: radix_sort_passes(build_sort(a, arg), sync); continue;  // barriers of its own
            case PHASE_SAMPLE: sample_phase(a.sample); break;
            case PHASE_RANKS: ranks_phase(arg ? a.places : a.ranks); break;
            case PHASE_WINDOW: window_phase(a.window); break;
            case PHASE_LONG_KEYS: long_keys_phase(a.longs); break;
            case PHASE_LONG_ROWS: long_rows_phase(a.longs); break;
            case PHASE_COUNTS: counts_phase(a.sizes); break;
            case PHASE_SCAN_SUMS: scan_sums_phase(a.sizes, a.block_sums); break;
            case PHASE_SCAN: scan_phase(a.sizes, a.block_sums); break;
            case PHASE_OFFSETS: offsets_phase(a.sizes); break;
        }
        sync();
    }
}

// Where every entry goes (SELL._place_entries).
// struct SellLayout (generated): lanes, rows (the short rows: the first `rows` of `order`), positions
// (the slices' rows, 32 / lanes a slice), sliced (the slices' slots), indptr, indices, order, slice_ptr,
// long_start (offset of each long row after the slices), long_rows (order's rows from `rows` on), longs,
// places (null, or each row's number in the layout's numbering: its position in `order`; rows and columns
// are then written as numbered by it), max_steps (the most steps of 32 slots a slice has), col, src
// (out: the entry in each slot, -1 for padding), slice_rows (out: the row of every lane).
//
// sell_place, one warp a slice s at a time, its R = 32 / lanes rows those at positions j = s R + q, q < R,
// of `order` (none from `rows` on); entry k of the row at q sits at slot 32 (k / lanes) + q lanes +
// k % lanes of the slice, from slice_ptr[s] on. The warp reads the rows' entries one after the other (a
// load of the warp's 32 lanes spans two or three rows), places their columns in a copy of the slice in
// shared memory (`max_steps` steps of 32 slots a warp, after the rows' bounds) and writes the slice out
// in runs of 32, with each slot's entry (from the rows' bounds): reads and writes all coalesced, whatever
// the lanes a row. Slots past a row's end are padding, whose column is the row itself (it gathers nothing
// new; column 0 and row -1 for a position without a row) and whose entry is -1. Dynamic shared memory:
// (3 * 32 + 32 max_steps) ints a warp.
extern "C" __global__ void sell_place(const SellLayout a) {
    extern __shared__ int shared[];
    const int rows_per_slice = 32 / a.lanes, lane = threadIdx.x & 31, slices = a.positions / rows_per_slice;
    int* bounds = shared + (threadIdx.x >> 5) * (3 * 32 + 32 * a.max_steps);  // ends, starts, firsts
    int* slots = bounds + 3 * 32;
    const int warps = gridDim.x * blockDim.x / 32;
    for (int s = (blockIdx.x * blockDim.x + threadIdx.x) / 32; s < slices; s += warps) {
        // lane q < R: the row at position q of the slice, its first entry and length
        const int j = s * rows_per_slice + lane;
        const int r = lane < rows_per_slice && j < a.rows ? a.order[j] : -1;
        const int own = a.places && r >= 0 ? j : r;  // the row's number in the layout's numbering
        const int first = r >= 0 ? a.indptr[r] : 0, length = r >= 0 ? a.indptr[r + 1] - first : 0;
        int end = length;  // the rows' entries one after the other: where row q's end
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int before = __shfl_up_sync(0xffffffffu, end, o);
            if (lane >= o) end += before;
        }
        bounds[lane] = end;
        bounds[32 + lane] = end - length;
        bounds[64 + lane] = first;
        const int total = __shfl_sync(0xffffffffu, end, 31);
        const int lane_row = __shfl_sync(0xffffffffu, own, lane / a.lanes);  // the row of this lane's slots
        const int start = a.slice_ptr[s], slots_n = a.slice_ptr[s + 1] - start;
        for (int t = lane; t < slots_n; t += 32) slots[t] = max(lane_row, 0);
        a.slice_rows[32 * s + lane] = lane_row;
        __syncwarp();
        for (int i = lane; i < total; i += 32) {
            int q = 0;  // the row holding entry i: the first whose end is past i
            for (int step = 16; step > 0; step >>= 1)
                if (q + step < rows_per_slice && bounds[q + step - 1] <= i) q += step;
            const int k = i - bounds[32 + q], e = bounds[64 + q] + k;
            const int c = a.indices[e];
            const int slot = 32 * (k / a.lanes) + q * a.lanes + k % a.lanes;
            slots[slot] = a.places ? a.places[c] : c;
        }
        __syncwarp();
        for (int t = lane; t < slots_n; t += 32) {  // slot t holds entry k of the row at q
            const int q = lane / a.lanes, k = (t >> 5) * a.lanes + lane % a.lanes;
            a.col[start + t] = slots[t];
            a.src[start + t] = k < bounds[q] - bounds[32 + q] ? bounds[64 + q] + k : -1;
        }
        __syncwarp();
    }
}

// sell_place_long, one thread an entry of the long rows (a hub row of a million entries would hold a
// thread a row back for milliseconds): entry k of the i-th long row sits at sliced + long_start[i] + k;
// i is found by bisection of long_start.
extern "C" __global__ void sell_place_long(const SellLayout a) {
    const int total = a.long_start[a.longs];
    for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < total; e += gridDim.x * blockDim.x) {
        int lo = 0, hi = a.longs - 1;  // the last i with long_start[i] <= e
        while (lo < hi) {
            const int mid = (lo + hi + 1) / 2;
            if (a.long_start[mid] <= e) lo = mid;
            else hi = mid - 1;
        }
        const int source = a.indptr[a.long_rows[lo]] + e - a.long_start[lo];
        const int c = a.indices[source];
        a.col[a.sliced + e] = a.places ? a.places[c] : c;
        a.src[a.sliced + e] = source;
    }
}
