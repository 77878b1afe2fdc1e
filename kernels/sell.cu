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

// The order in which warps take the work items, in rounds of one item a warp: pieces from the last
// warp down (warp w takes pieces warps - 1 - w, 2 warps - 1 - w, ...), slices from the first warp up
// in even rounds and from the last down in odd ones (a snake). Slices are sorted longest first (all
// together, or within windows), and the long rows too, so the first warps take the longest slices
// and the last the longest pieces, and each odd round gives back what the even one before gave
// least: a warp's work is about average. Power-law graph of 1M rows, 132 x 32 warps, counted from
// its layout: the busiest warp 106 steps of 32 entries, 79 the mean, when pieces and then slices were
// dealt from the first warp up, each group of 32 slices reversed in odd rounds; 89 so (H200, PCG
// 95.0 -> 88.4 us an iteration, MEASUREMENTS.md). Consecutive warps take
// consecutive slices (rows of a window, which share gathered columns). solvers/formats/sell.py
// (stage_steps) follows the same order.
struct WorkItems {
    int warps, warp;
    __device__ WorkItems() : warps((gridDim.x * blockDim.x) >> 5), warp((blockIdx.x * blockDim.x + threadIdx.x) >> 5) {}
    __device__ int piece(int round) const { return round * warps + (warps - 1 - warp); }
    __device__ int slice(int round) const { return round * warps + ((round & 1) ? warps - 1 - warp : warp); }
};

// ---- The slices staged in shared memory (persistent kernels) ---------------------------------
// A persistent kernel's warps take the same slices in every product, and every grid reduction's
// acquire drops the SM's L1: read from global memory, each slice costs a round trip to L2 for its
// rows and bounds and one for its entries before its gathers can start. stage_matrix copies, once a
// launch, as many of the warp's slices (in the product's order) as fit in the warp's share of the
// block's dynamic shared memory (none without it): for each, a header step (the lanes' rows in col,
// the slice's steps in val, exact in any real_t) and its steps of 32 entries. The product reads the
// staged slices from there, the same entries in the same order: the same bits.
struct MatrixStage {
    const int* col = nullptr;  // the warp's region
    const real_t* val = nullptr;
    int slices = 0;            // the warp's first `slices` slices are staged
};

__device__ __forceinline__ unsigned int dynamic_shared_bytes() {
    unsigned int bytes;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(bytes));
    return bytes;
}

__device__ MatrixStage stage_matrix(const Matrix& A) {
    extern __shared__ __align__(16) unsigned char stage_memory[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, block_warps = blockDim.x >> 5;
    const int cap = dynamic_shared_bytes() / (block_warps * 32 * (sizeof(real_t) + sizeof(int)));  // steps a warp
    MatrixStage st;
    if (cap == 0) return st;
    real_t* val = (real_t*)stage_memory + (size_t)warp * cap * 32;
    int* col = (int*)((real_t*)stage_memory + (size_t)block_warps * cap * 32) + (size_t)warp * cap * 32;
    st.col = col;
    st.val = val;
    const WorkItems w;
    int used = 0;
    for (int round = 0, s; (s = w.slice(round)) < A.slices; ++round) {
        const int begin = A.slice_ptr[s], steps = (A.slice_ptr[s + 1] - begin) >> 5;
        if (used + 1 + steps > cap) break;
        col[32 * used + lane] = A.slice_rows[32 * s + lane];
        val[32 * used + lane] = (real_t)steps;
#pragma unroll 4
        for (int t = 0; t < steps; ++t) {
            col[32 * (used + 1 + t) + lane] = matrix_load(&A.col[begin + 32 * t + lane]);
            val[32 * (used + 1 + t) + lane] = matrix_load(&A.val[begin + 32 * t + lane]);
        }
        used += 1 + steps;
        ++st.slices;
    }
    __syncwarp();
    return st;
}

// finish(i, (A v)_i, WHOLE_ROW) for every row of the slices, finish(i, piece sum, FIRST_PIECE or
// LATER_PIECE) for every piece of a long row and finish(i, (A v)_i, PIECES_TOTAL) once its pieces are
// all done (see pcg.cu's RowPart). Work items go to warps in a fixed order (WorkItems), so every
// partial sum lands in the same thread whatever the scheduling; the warp's staged slices (`stage`)
// come first, from shared memory.
//
// A slice's loads wait for its row and bounds, so those of the warp's next slice are loaded while it
// multiplies this one (H200, PCG on a power-law graph of 1M rows: 96.3 -> 92.7 us an iteration).
template <typename V, typename F>
__device__ __forceinline__ void for_each_row_product(const Matrix& A, const MatrixStage& stage, V v, F finish) {
    const int lane = threadIdx.x & 31;
    const WorkItems w;
    for (int round = 0, pc; (pc = w.piece(round)) < A.pieces; ++round)  // a warp's pieces before its slices
        sell_piece(A, pc, lane, v, finish);
    const int* stage_col = stage.col;
    const real_t* stage_val = stage.val;
    int round = 0;
    for (; round < stage.slices; ++round) {
        const int r = stage_col[lane];
        const int steps = (int)stage_val[0];
        real_t sum = 0;
#pragma unroll 4
        for (int t = 1; t <= steps; ++t) sum += stage_val[32 * t + lane] * v(stage_col[32 * t + lane]);
        stage_col += 32 * (steps + 1);
        stage_val += 32 * (steps + 1);
#pragma unroll
        for (int o = SELL_LANES / 2; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        if (r >= 0 && lane % SELL_LANES == 0) finish(r, sum, WHOLE_ROW);
    }
    int s = w.slice(round), row = -1, begin = 0, end = 0;
    if (s < A.slices) {
        row = A.slice_rows[32 * s + lane];
        begin = A.slice_ptr[s];
        end = A.slice_ptr[s + 1];
    }
    while (s < A.slices) {
        const int r = row, first = begin, last = end;
        s = w.slice(++round);
        if (s < A.slices) {
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
