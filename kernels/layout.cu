// Set-up kernels every matrix format shares, and ELL's layout (solvers/formats/base.py and ell.py compute the
// same with NumPy: that path is these kernels' reference, and the tests compare the two). Grid-stride loops
// that write each output once, or combine integers with atomics: nothing depends on the scheduling.

// What the formats' choice and set-up need to know of a CSR pattern of n rows, in one pass and one read back
// (base.pattern_stats): stats[0] = the entries (indptr[n]), stats[1] = the longest row, stats[2] = the rows
// longer than long_row entries and, with `columns`, stats[3] = the largest column index + 1. stats starts at
// zero. One atomic a warp for each.
// struct PatternStats (generated): n, long_row, columns, indptr, indices, stats.
extern "C" __global__ void pattern_stats(const PatternStats a) {
    const int stride = gridDim.x * blockDim.x, first = blockIdx.x * blockDim.x + threadIdx.x;
    const int nnz = a.indptr[a.n];
    int width = 0, longs = 0, columns = 0;
    for (int r = first; r < a.n; r += stride) {
        const int length = a.indptr[r + 1] - a.indptr[r];
        width = max(width, length);
        longs += length > a.long_row;
    }
    if (a.columns)
        for (int e = first; e < nnz; e += stride) columns = max(columns, a.indices[e] + 1);
    for (int o = 16; o > 0; o >>= 1) {
        width = max(width, __shfl_xor_sync(0xffffffffu, width, o));
        longs += __shfl_xor_sync(0xffffffffu, longs, o);
        columns = max(columns, __shfl_xor_sync(0xffffffffu, columns, o));
    }
    if ((threadIdx.x & 31) == 0) {
        if (first == 0) a.stats[0] = nnz;
        if (width) atomicMax(&a.stats[1], width);
        if (longs) atomicAdd(&a.stats[2], longs);
        if (columns) atomicMax(&a.stats[3], columns);
    }
}

// ELL's layout (ELL.__init__), one thread a row r: entry k of the row goes to slot k n + r (col gets its
// column, src the entry); the row's slots from its length up to `width` are padding, whose column is the
// row itself and whose src is -1.
// struct EllPlace (generated): n, width, indptr, indices, col, src.
extern "C" __global__ void ell_place(const EllPlace a) {
    for (int r = blockIdx.x * blockDim.x + threadIdx.x; r < a.n; r += gridDim.x * blockDim.x) {
        const int first = a.indptr[r], length = a.indptr[r + 1] - first;
        for (int k = 0; k < a.width; ++k) {
            const int slot = k * a.n + r;
            a.col[slot] = k < length ? a.indices[first + k] : r;
            a.src[slot] = k < length ? first + k : -1;
        }
    }
}
