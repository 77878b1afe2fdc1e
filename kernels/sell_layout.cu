// The SELL layout of a CSR pattern: where every entry goes, and the padding (solvers/formats/sell.py
// lays the same out with NumPy; that path is this kernel's reference and the tests compare the two).
//
// struct SellLayout (generated): n, lanes, sliced (entries of the slices), indptr, indices, slot (a
// short row's position among the sorted rows, or -1 - i for the i-th long row), slice_ptr,
// long_start (offset of each long row after the slices), col (zeroed), pos (out: place of entry e).
//
// One thread a row. Entry k of the short row at position j of slice s = j / R (R = 32 / lanes rows a
// slice) sits at slice_ptr[s] + (j % R) lanes + k + (32 - lanes)(k / lanes); the row's lanes up to
// the slice's width are padding, whose column is the row itself (it gathers nothing new). Entry k of
// the i-th long row sits at sliced + long_start[i] + k.
extern "C" __global__ void sell_place(const SellLayout a) {
    const int rows_per_slice = 32 / a.lanes;
    for (int r = blockIdx.x * blockDim.x + threadIdx.x; r < a.n; r += gridDim.x * blockDim.x) {
        const int first = a.indptr[r], length = a.indptr[r + 1] - first, j = a.slot[r];
        if (j < 0) {
            const int base = a.sliced + a.long_start[-1 - j];
            for (int k = 0; k < length; ++k) {
                a.col[base + k] = a.indices[first + k];
                a.pos[first + k] = base + k;
            }
            continue;
        }
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
// the columns c of row r (rank[c] = n for a column to leave out: a long row's), n for an empty row.
// struct SellKey (generated): n, indptr, indices, rank, key. One thread a row.
extern "C" __global__ void sell_neighbour_key(const SellKey a) {
    for (int r = blockIdx.x * blockDim.x + threadIdx.x; r < a.n; r += gridDim.x * blockDim.x) {
        int least = a.n;
        for (int e = a.indptr[r]; e < a.indptr[r + 1]; ++e) least = min(least, a.rank[a.indices[e]]);
        a.key[r] = least;
    }
}
