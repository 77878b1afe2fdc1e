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

// DIA's layout (DIA.__init__): the offsets (column - row) of `samples` rows spread over the matrix
// (dia_sample), from which the host takes the diagonals; then the entries placed on them. stats holds [0] the
// entries off the diagonals and [1] the largest column + 1; src starts at -1, rest_ptr at 0.
// struct DiaPlace (generated): n, width, samples, indptr, indices, diagonals, sample, src, stats, rest_ptr,
// rest_col, rest_src.

// Sampled row j is row n frac((j + 1) / golden ratio), a spread that no grid's stride repeats (rows evenly
// spaced by a power of two all lie on a power-of-two grid's walls); its first `width` offsets go to
// sample[j width ...], the rest of its share the least int (no offset is). DIA.sampled_rows is the same.
extern "C" __global__ void dia_sample(const DiaPlace a) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= a.samples) return;
    const double spread = fmod(__dmul_rn((double)(j + 1), 0.6180339887498949), 1.0);
    const int r = min((int)__dmul_rn(spread, (double)a.n), a.n - 1);
    const int first = a.indptr[r], length = a.indptr[r + 1] - first;
    for (int t = 0; t < a.width; ++t)
        a.sample[j * a.width + t] = t < length ? a.indices[first + t] - r : -2147483647 - 1;
}

// Row r's entries in their order: on_diagonal(e, k) for entry e whose offset is the k-th diagonal's (found
// by bisection: the entries need not be sorted), the first of the row's to take it; off_diagonal(e) for the
// others (off the diagonals, or a diagonal's repeat).
template <typename On, typename Off>
__device__ __forceinline__ void dia_walk(const DiaPlace& a, int r, On on_diagonal, Off off_diagonal) {
    unsigned long long taken = 0;  // a bit a diagonal (at most 64)
    for (int e = a.indptr[r]; e < a.indptr[r + 1]; ++e) {
        const int offset = a.indices[e] - r;
        int k = 0, end = a.width;  // k: the first diagonal not below offset
        while (k < end) {
            const int mid = (k + end) >> 1;
            if (a.diagonals[mid] < offset) k = mid + 1;
            else end = mid;
        }
        if (k < a.width && a.diagonals[k] == offset && !(taken >> k & 1ull)) {
            taken |= 1ull << k;
            on_diagonal(e, k);
        } else {
            off_diagonal(e);
        }
    }
}

// One thread a row r: each entry on a diagonal goes to slot k n + r; those off them are counted, in all
// (stats[0]) and for the row (rest_ptr[r + 1], for the exceptions' scan). Each slot is written once:
// nothing depends on the scheduling.
extern "C" __global__ void dia_place(const DiaPlace a) {
    int misses = 0, columns = 0;
    for (int r = blockIdx.x * blockDim.x + threadIdx.x; r < a.n; r += gridDim.x * blockDim.x) {
        int row_misses = 0;
        dia_walk(a, r, [&](int e, int k) { a.src[(size_t)k * a.n + r] = e; }, [&](int) { ++row_misses; });
        a.rest_ptr[r + 1] = row_misses;
        misses += row_misses;
        for (int e = a.indptr[r]; e < a.indptr[r + 1]; ++e) columns = max(columns, a.indices[e] + 1);
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

// The entries off the diagonals, row by row in their order (rest_ptr scanned: each row's first): their
// columns and CSR entries.
extern "C" __global__ void dia_rest(const DiaPlace a) {
    for (int r = blockIdx.x * blockDim.x + threadIdx.x; r < a.n; r += gridDim.x * blockDim.x) {
        int at = a.rest_ptr[r];
        if (at == a.rest_ptr[r + 1]) continue;
        dia_walk(a, r, [](int, int) {}, [&](int e) {
            a.rest_col[at] = a.indices[e];
            a.rest_src[at++] = e;
        });
    }
}
