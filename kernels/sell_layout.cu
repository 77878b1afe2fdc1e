// The SELL layout of a CSR pattern on the device (solvers/formats/sell.py lays the same out with NumPy;
// that path is these kernels' reference and the tests compare the two).
//
// struct SellLayout (generated): n, lanes, short_rows (rows in slices: the first short_rows positions of
// the row order), sliced (entries of the slices), indptr, indices, slot (each row's position in the row
// order; positions from short_rows on are the long rows, in long_rows' order), slice_ptr, long_start
// (offset of each long row after the slices), long_rows (the rows of the longs long rows), longs, col
// (zeroed), pos (out: place of entry e).
//
// sell_place, one thread a short row: entry k of the row at position j of slice s = j / R (R = 32 /
// lanes rows a slice) sits at slice_ptr[s] + (j % R) lanes + k + (32 - lanes)(k / lanes); the row's
// lanes up to the slice's width are padding, whose column is the row itself (it gathers nothing new).
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
        a.col[a.sliced + e] = a.indices[source];
        a.pos[source] = a.sliced + e;
    }
}

extern "C" __global__ void sell_place(const SellLayout a) {
    const int rows_per_slice = 32 / a.lanes;
    for (int r = blockIdx.x * blockDim.x + threadIdx.x; r < a.n; r += gridDim.x * blockDim.x) {
        const int first = a.indptr[r], length = a.indptr[r + 1] - first, j = a.slot[r];
        if (j >= a.short_rows) continue;  // a long row: sell_place_long
        const int s = j / rows_per_slice;
        const int base = a.slice_ptr[s] + (j % rows_per_slice) * a.lanes;
        const int width = (a.slice_ptr[s + 1] - a.slice_ptr[s]) / 32 * a.lanes;
        const int spread = 32 - a.lanes;
        for (int k = 0; k < width; ++k) {
            const int p = base + k + spread * (k / a.lanes);
            if (k < length) {
                a.col[p] = a.indices[first + k];
                a.pos[first + k] = p;
            } else {
                a.col[p] = r;
            }
        }
    }
}

// The pieces of the long rows (SELL._cut_pieces): long row i has row_pieces[i + 1] - row_pieces[i]
// pieces of piece_length entries (the last one shorter); piece q = row_pieces[i] + k starts at
// piece_ptr[q] = sliced + long_start[i] + k piece_length and belongs to piece_row[q] = i, and
// piece_ptr[last + 1] is the end of the long rows. One thread a long row.
// struct SellPieces (generated): longs, sliced, piece_length, long_start, row_pieces, piece_ptr, piece_row.
extern "C" __global__ void sell_cut_pieces(const SellPieces a) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i <= a.longs; i += gridDim.x * blockDim.x) {
        if (i == a.longs) {
            a.piece_ptr[a.row_pieces[i]] = a.sliced + a.long_start[i];
            continue;
        }
        for (int q = a.row_pieces[i], k = 0; q < a.row_pieces[i + 1]; ++q, ++k) {
            a.piece_ptr[q] = a.sliced + a.long_start[i] + k * a.piece_length;
            a.piece_row[q] = i;
        }
    }
}

// The neighbour key of every row for SELL's row order by neighbours (solvers/formats/sell.py,
// SELL._neighbour_order, whose NumPy path is this kernel's reference): key[r] = the least rank[c] over
// the columns c of row r (rank[c] = n for a column to leave out: a long row's), n for an empty row,
// n + 1 for a row longer than long_row entries (long rows take no part and sort last).
// struct SellKey (generated): n, long_row, indptr, indices, rank, key. One thread a row.
extern "C" __global__ void sell_neighbour_key(const SellKey a) {
    for (int r = blockIdx.x * blockDim.x + threadIdx.x; r < a.n; r += gridDim.x * blockDim.x) {
        int least = a.n;
        if (a.indptr[r + 1] - a.indptr[r] > a.long_row) least = a.n + 1;
        else
            for (int e = a.indptr[r]; e < a.indptr[r + 1]; ++e) least = min(least, a.rank[a.indices[e]]);
        a.key[r] = least;
    }
}

// Distinct 32-byte sectors that sampled windows of rows read, in two row orders at once (SELL's
// automatic row order; the NumPy meaning is solvers/formats/base.py's window_sectors, called on each
// order). The rows are the first `rows` of `given` (blockIdx.y 0) or `grouped` (1), taken `window` at a
// time; block x counts window w_x of the `samples` windows spread evenly as NumPy's linspace(0, G - 1,
// samples) spreads them (G windows, truncated to integers). counts[(y samples + x) 2 + 0] gets the
// distinct sectors of the window's columns (column c in sector c itemsize / 32), counts[... + 1] its
// entries. The distinct sectors are counted in an open-addressing hash table in dynamic shared memory
// of `table` slots (a power of two), which must hold every entry of a window (rows of at most
// SELL.LONG_ROW entries): the count does not depend on the order of the insertions.
// struct SellSample (generated): rows, window, samples, table, itemsize, indptr, indices, given, grouped,
// counts.
extern "C" __global__ void sell_sample_sectors(const SellSample a) {
    extern __shared__ int slots[];
    __shared__ unsigned int distinct, entries;
    const int groups = (a.rows + a.window - 1) / a.window;
    const int x = blockIdx.x;
    long long w;
    if (a.samples == 1) w = 0;
    else if (x == a.samples - 1) w = groups - 1;  // linspace's endpoint is exact
    else w = (long long)((double)x * ((double)(groups - 1) / (double)(a.samples - 1)));
    for (int t = threadIdx.x; t < a.table; t += blockDim.x) slots[t] = -1;
    if (threadIdx.x == 0) distinct = entries = 0;
    __syncthreads();
    const int* order = blockIdx.y ? a.grouped : a.given;
    const long long begin = w * a.window, end = min(begin + a.window, (long long)a.rows);
    unsigned int found = 0, read = 0;
    for (long long p = begin + threadIdx.x; p < end; p += blockDim.x) {
        const int r = order[p];
        for (int e = a.indptr[r]; e < a.indptr[r + 1]; ++e) {
            const int sector = (int)((long long)a.indices[e] * a.itemsize / 32);
            unsigned int h = ((unsigned int)sector * 2654435761u) & (unsigned int)(a.table - 1);
            while (true) {
                const int seen = atomicCAS(&slots[h], -1, sector);
                if (seen == -1) { ++found; break; }
                if (seen == sector) break;
                h = (h + 1) & (unsigned int)(a.table - 1);
            }
            ++read;
        }
    }
    atomicAdd(&distinct, found);
    atomicAdd(&entries, read);
    __syncthreads();
    if (threadIdx.x == 0) {
        const int at = (blockIdx.y * a.samples + x) * 2;
        a.counts[at] = distinct;
        a.counts[at + 1] = entries;
    }
}
