// Column-major slots, one thread a row: the loop that ELL (ell.cu) and DIA (dia.cu) share. Slot k of
// row i holds its value at k * n + i, so every value load of a step is coalesced; SLOT_WIDTH slots a
// row, fixed at compile time, so the unrolled loop keeps all of a row's loads in flight. Padding has
// value 0. The format says where each slot's column comes from: column(k, slot, i) for slot k of row i,
// stored at index `slot`.

// Nothing is staged on chip (matrix.cu).
struct MatrixStage {};
__device__ __forceinline__ MatrixStage stage_matrix(const Matrix&) { return {}; }

// Where a format keeps no entries apart from its slots.
struct NothingApart {
    __device__ __forceinline__ int operator()(int) const { return 0; }
    __device__ __forceinline__ real_t operator()(int, real_t sum) const { return sum; }
};

// finish(i, (A v)_i, WHOLE_ROW) for every row i: its slots' products, then apart(where, sum) adds the
// entries the format keeps apart from the slots (DIA's exceptions), where = apart(i) being loaded
// before the slots so that it has arrived when they are summed. Two rows a thread per pass keep two
// independent gather chains in flight.
template <typename C, typename V, typename F, typename E>
__device__ __forceinline__ void for_each_slot_row_product(const Matrix& A, C column, V v, F finish, E apart) {
    const int stride = gridDim.x * blockDim.x;
    for (int a = blockIdx.x * blockDim.x + threadIdx.x; a < A.n; a += 2 * stride) {
        const int b = a + stride;
        const bool has_b = b < A.n;
        const auto where_a = apart(a), where_b = apart(has_b ? b : a);
        real_t sa = 0, sb = 0;
#pragma unroll
        for (int k = 0; k < SLOT_WIDTH; ++k) {
            const size_t off = (size_t)k * A.n;
            sa += matrix_load(&A.val[off + a]) * v(column(k, off + a, a));
            if (has_b) sb += matrix_load(&A.val[off + b]) * v(column(k, off + b, b));
        }
        finish(a, apart(where_a, sa), WHOLE_ROW);
        if (has_b) finish(b, apart(where_b, sb), WHOLE_ROW);
    }
}
