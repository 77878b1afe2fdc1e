// The SELL layout of a CSR pattern: where every entry goes, and the padding (solvers/formats/sell.py
// lays the same out with NumPy; that path is this kernel's reference and the tests compare the two).
//
// struct SellLayout (generated): n, lanes, sliced (entries of the slices), indptr, indices, slot (a
// short row's position among the sorted rows, or -1 - i for the i-th long row), slice_ptr,
// long_start (offset of each long row after the slices), long_rows (the rows of the longs long rows),
// longs, col (zeroed), pos (out: place of entry e).
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
        if (j < 0) continue;  // a long row: sell_place_long
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

// The neighbour key of every row for SELL's row order by neighbours (solvers/formats/sell.py,
// SELL._neighbour_order, whose NumPy path is this kernel's reference): key[r] = the least rank[c] over
// the columns c of row r (rank[c] = n for a column to leave out: a long row's), n for an empty row
// and for a row longer than long_row entries (long rows take no part in the order).
// struct SellKey (generated): n, long_row, indptr, indices, rank, key. One thread a row.
extern "C" __global__ void sell_neighbour_key(const SellKey a) {
    for (int r = blockIdx.x * blockDim.x + threadIdx.x; r < a.n; r += gridDim.x * blockDim.x) {
        int least = a.n;
        if (a.indptr[r + 1] - a.indptr[r] <= a.long_row)
            for (int e = a.indptr[r]; e < a.indptr[r + 1]; ++e) least = min(least, a.rank[a.indices[e]]);
        a.key[r] = least;
    }
}
