// CSR, each row spread over ROW_LANES lanes (a power of two, 2 to 32, near the mean row length).
// Host side: solvers/formats/csr.py; NumPy meaning: its reference_product.
//
// struct Matrix { const int* rowptr; const int* col; const real_t* val; int n; } (generated).

// Sum val * v(col) over the entries of rows a and b; every lane of a row gets its sum. The first
// ROW_LANES entries of both rows are loaded before either row's remainder loop, so a typical short
// row costs one round of independent loads.
template <typename V>
__device__ __forceinline__ void csr_row_pair(const Matrix& A, int a, bool has_a, int b, bool has_b, V v,
                                             real_t& sa, real_t& sb) {
    const int lane = threadIdx.x % ROW_LANES;
    int ka = 0, ea = 0, kb = 0, eb = 0;
    if (has_a) { ka = matrix_load(&A.rowptr[a]) + lane; ea = matrix_load(&A.rowptr[a + 1]); }
    if (has_b) { kb = matrix_load(&A.rowptr[b]) + lane; eb = matrix_load(&A.rowptr[b + 1]); }
    sa = ka < ea ? matrix_load(&A.val[ka]) * v(matrix_load(&A.col[ka])) : real_t(0);
    sb = kb < eb ? matrix_load(&A.val[kb]) * v(matrix_load(&A.col[kb])) : real_t(0);
    // unrolled so that the loads of a long row (a dense block: tens a lane) are in
    // flight several at a time; the sums are added in the same order
#pragma unroll 4
    for (ka += ROW_LANES; ka < ea; ka += ROW_LANES)
        sa += matrix_load(&A.val[ka]) * v(matrix_load(&A.col[ka]));
#pragma unroll 4
    for (kb += ROW_LANES; kb < eb; kb += ROW_LANES)
        sb += matrix_load(&A.val[kb]) * v(matrix_load(&A.col[kb]));
    for (int o = ROW_LANES / 2; o > 0; o >>= 1) {
        sa += __shfl_xor_sync(0xffffffffu, sa, o, ROW_LANES);
        sb += __shfl_xor_sync(0xffffffffu, sb, o, ROW_LANES);
    }
}

// Nothing is staged on chip (matrix.cu).
struct MatrixStage {};
__device__ __forceinline__ MatrixStage stage_matrix(const Matrix&) { return {}; }

// finish(i, (A v)_i, WHOLE_ROW) for every row i, from the row's first lane. Two rows per pass keep
// two independent gather chains in flight; the loop bound is uniform across the block so every lane
// reaches the shuffles.
template <typename V, typename F>
__device__ __forceinline__ void for_each_row_product(const Matrix& A, const MatrixStage&, V v, F finish) {
    const int rows_per_block = blockDim.x / ROW_LANES;
    const int stride = gridDim.x * rows_per_block;
    for (int base = blockIdx.x * rows_per_block; base < A.n; base += 2 * stride) {
        const int a = base + threadIdx.x / ROW_LANES, b = a + stride;
        const bool has_a = a < A.n, has_b = b < A.n;
        real_t sa, sb;
        csr_row_pair(A, a, has_a, b, has_b, v, sa, sb);
        if (threadIdx.x % ROW_LANES == 0) {
            if (has_a) finish(a, sa, WHOLE_ROW);
            if (has_b) finish(b, sb, WHOLE_ROW);
        }
    }
}
