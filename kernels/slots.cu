// Column-major slots, one thread a row: the loop that ELL (ell.cu) and DIA (dia.cu) share. Slot k of
// row i holds its value at k * n + i, so every value load of a step is coalesced; SLOT_WIDTH slots a
// row, fixed at compile time, so the unrolled loop keeps all of a row's loads in flight. Padding has
// value 0. The format says where each slot's column comes from: column(k, slot, i) for slot k of row i,
// stored at index `slot`.

// Nothing is staged on chip (matrix.cu).
struct MatrixStage {};
__device__ __forceinline__ MatrixStage stage_matrix(const Matrix&) { return {}; }

// finish(i, (A v)_i, WHOLE_ROW) for every row i; two rows a thread per pass keep two independent
// gather chains in flight.
template <typename C, typename V, typename F>
__device__ __forceinline__ void for_each_slot_row_product(const Matrix& A, C column, V v, F finish) {
    const int stride = gridDim.x * blockDim.x;
    for (int a = blockIdx.x * blockDim.x + threadIdx.x; a < A.n; a += 2 * stride) {
        const int b = a + stride;
        const bool has_b = b < A.n;
        real_t sa = 0, sb = 0;
#pragma unroll
        for (int k = 0; k < SLOT_WIDTH; ++k) {
            const size_t off = (size_t)k * A.n;
            sa += matrix_load(&A.val[off + a]) * v(column(k, off + a, a));
            if (has_b) sb += matrix_load(&A.val[off + b]) * v(column(k, off + b, b));
        }
        finish(a, sa, WHOLE_ROW);
        if (has_b) finish(b, sb, WHOLE_ROW);
    }
}
