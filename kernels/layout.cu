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

// DIA's layout (DIA.__init__), in two passes over the rows. stats holds [0] the entries off the
// diagonals, [1] the largest column + 1, [2] the first row of `width` entries (starts at n), then from
// [3] that row's offsets (column - row): the diagonals. src starts at -1.
// struct DiaPlace (generated): n, width, indptr, indices, src, stats.
extern "C" __global__ void dia_widest(const DiaPlace a) {
    for (int r = blockIdx.x * blockDim.x + threadIdx.x; r < a.n; r += gridDim.x * blockDim.x)
        if (a.indptr[r + 1] - a.indptr[r] == a.width) atomicMin(&a.stats[2], r);
}

// One thread a row r walks its entries and the diagonals together (both ascending): entry e goes to
// slot k n + r where its offset is the k-th diagonal's; an entry on none of them (or out of order, or
// repeated) is counted in stats[0]. Each slot is written once: nothing depends on the scheduling.
extern "C" __global__ void dia_place(const DiaPlace a) {
    const int widest = a.stats[2];
    const int* diagonal = a.indices + a.indptr[widest];  // columns of the widest row: offsets + widest
    int misses = 0, columns = 0;
    for (int r = blockIdx.x * blockDim.x + threadIdx.x; r < a.n; r += gridDim.x * blockDim.x) {
        if (r == widest)
            for (int k = 0; k < a.width; ++k) a.stats[3 + k] = diagonal[k] - widest;
        const int first = a.indptr[r], last = a.indptr[r + 1];
        int k = 0;
        for (int e = first; e < last; ++e) {
            const int column = a.indices[e], offset = column - r;
            columns = max(columns, column + 1);
            while (k < a.width && diagonal[k] - widest < offset) ++k;
            if (k < a.width && diagonal[k] - widest == offset) a.src[(size_t)k++ * a.n + r] = e;
            else ++misses;
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        misses += __shfl_xor_sync(0xffffffffu, misses, o);
        columns = max(columns, __shfl_xor_sync(0xffffffffu, columns, o));
    }
    if ((threadIdx.x & 31) == 0) {
        if (misses) atomicAdd(&a.stats[0], misses);
        atomicMax(&a.stats[1], columns);
    }
}
