// SELL-C-sigma with long rows split into pieces (Kreutzer et al. 2014 for the sliced part).
// Host side: solvers/formats/sell.py; NumPy meaning: SELL.product.
//
// Rows up to the long-row threshold are sorted by length, longest first (all together, or within
// windows of rows ordered by neighbours), and stored in slices of one warp: 32 / SELL_LANES rows,
// SELL_LANES lanes a row. Entry k of the row in a slice's position j sits at slice_ptr[s] +
// 32 (k / SELL_LANES) + j SELL_LANES + k % SELL_LANES, so every load of a step is coalesced, and
// sorting keeps the padding (value 0, column of the lane's own row, or 0 for lanes without a row) to
// a few percent. Longer rows are cut into pieces of at most PIECE_LENGTH consecutive entries, a warp a
// piece: a row much longer than the others (a graph's hub) is spread over many warps instead of
// holding one back. The pieces of a row add their sums in a fixed order, so nothing depends on which
// warp finishes first.
//
// struct Matrix (generated): n; slices, slice_ptr, slice_rows (row of each lane, -1 for none), col,
// val; pieces, piece_ptr (offsets into col/val), piece_row (index into long_rows), long_rows,
// row_pieces (first piece of each long row, and one past the last), piece_sums, tickets (per long row,
// zero between products).

// Sum of v over the warp, the same in every lane (a fixed butterfly order: deterministic).
__device__ __forceinline__ real_t warp_allsum(real_t v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// One piece of a long row (the whole warp): finish with its sum, and, from the piece that completes
// the row, with the row's total.
template <typename V, typename F>
__device__ __forceinline__ void sell_piece(const Matrix& A, int pc, int lane, V v, F finish) {
    const int li = A.piece_row[pc];
    const int row = A.long_rows[li];
    const int first = A.row_pieces[li], count = A.row_pieces[li + 1] - first;
    real_t sum = 0;
    const int end = A.piece_ptr[pc + 1];
    // unrolled so that a lane's gathers along the piece (up to PIECE_LENGTH / 32) are in flight together
#pragma unroll 4
    for (int k = A.piece_ptr[pc] + lane; k < end; k += 32) sum += matrix_load(&A.val[k]) * v(matrix_load(&A.col[k]));
    sum = warp_allsum(sum);
    if (count == 1) {
        if (lane == 0) finish(row, sum, WHOLE_ROW);
        return;
    }
    bool closing = false;
    if (lane == 0) {
        finish(row, sum, pc == first ? FIRST_PIECE : LATER_PIECE);
        A.piece_sums[pc] = sum;
        __threadfence();
        closing = atomicAdd(&A.tickets[li], 1u) == (unsigned int)count - 1;
        if (closing) __threadfence();
    }
    closing = __shfl_sync(0xffffffffu, closing, 0);
    if (!closing) return;
    __syncwarp();  // orders the other lanes' reads after lane 0 saw every piece's sum published
    real_t total = 0;
    // the pieces' sums in flight together (a hub row has over a thousand); added in order all the same
#pragma unroll 8
    for (int k = first + lane; k < first + count; k += 32) total += __ldcg(&A.piece_sums[k]);
    total = warp_allsum(total);
    if (lane == 0) {
        A.tickets[li] = 0;
        finish(row, total, PIECES_TOTAL);
    }
}

// finish(i, (A v)_i, WHOLE_ROW) for every row of the slices, finish(i, piece sum, FIRST_PIECE or
// LATER_PIECE) for every piece of a long row and finish(i, (A v)_i, PIECES_TOTAL) once its pieces are
// all done (see pcg.cu's RowPart). Work items (pieces, then slices from the next multiple of 32) go to
// warps in a fixed order, so every partial sum lands in the same thread whatever the scheduling.
//
// A window's slices are sorted longest first, and a round of the grid-stride loop hands aligned groups
// of 32 slices to 32 consecutive warps: with small windows the same warp would get the longest slice
// of its group every round. So in odd rounds each group goes in reverse (when the warps are a multiple
// of 32, so that a group lies within one round): a warp's slices over two rounds are about average.
//
// A slice's loads wait for its row and bounds, so those of the warp's next slice are loaded while it
// multiplies this one (H200, PCG on a power-law graph of 1M rows: 96.3 -> 92.7 us an iteration).
template <typename V, typename F>
__device__ __forceinline__ void for_each_row_product(const Matrix& A, V v, F finish) {
    const int lane = threadIdx.x & 31;
    const int warps = (gridDim.x * blockDim.x) >> 5;
    const int lead = (A.pieces + 31) & ~31;
    const int items = lead + A.slices;
    const bool mirror = warps % 32 == 0;
    int item = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    for (; item < lead; item += warps)  // a warp's pieces come before its slices
        if (item < A.pieces) sell_piece(A, item, lane, v, finish);
    auto slice_of = [&](int it) {
        int s = it - lead;
        if (mirror && ((it / warps) & 1) && (s | 31) < A.slices) s ^= 31;
        return s;
    };
    int row = -1, begin = 0, end = 0;
    if (item < items) {
        const int s = slice_of(item);
        row = A.slice_rows[32 * s + lane];
        begin = A.slice_ptr[s];
        end = A.slice_ptr[s + 1];
    }
    for (; item < items; item += warps) {
        const int r = row, first = begin, last = end;
        if (item + warps < items) {
            const int s = slice_of(item + warps);
            row = A.slice_rows[32 * s + lane];
            begin = A.slice_ptr[s];
            end = A.slice_ptr[s + 1];
        }
        real_t sum = 0;
#pragma unroll 4
        for (int k = first + lane; k < last; k += 32) sum += matrix_load(&A.val[k]) * v(matrix_load(&A.col[k]));
#pragma unroll
        for (int o = SELL_LANES / 2; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        if (r >= 0 && lane % SELL_LANES == 0) finish(r, sum, WHOLE_ROW);
    }
}
