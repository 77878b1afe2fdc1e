// ELL: one thread a row, entries column-major (entry k of row i at k * n + i; padding has value 0 and
// points at its own row), ELL_WIDTH entries a row, fixed at compile time. For rows of nearly equal
// length (stencils): every load is coalesced and the unrolled loop keeps all of a row's loads in
// flight. Host side: solvers/formats/ell.py; NumPy meaning: its reference_product.
//
// struct Matrix { const int* col; const real_t* val; int n; } (generated, see solvers/formats).

// Nothing is staged on chip (matrix.cu).
struct MatrixStage {};
__device__ __forceinline__ MatrixStage stage_matrix(const Matrix&) { return {}; }

// finish(i, (A v)_i, WHOLE_ROW) for every row i; two rows a thread per pass keep two independent
// gather chains in flight.
template <typename V, typename F>
__device__ __forceinline__ void for_each_row_product(const Matrix& A, const MatrixStage&, V v, F finish) {
    const int stride = gridDim.x * blockDim.x;
    for (int a = blockIdx.x * blockDim.x + threadIdx.x; a < A.n; a += 2 * stride) {
        const int b = a + stride;
        const bool has_b = b < A.n;
        real_t sa = 0, sb = 0;
#pragma unroll
        for (int k = 0; k < ELL_WIDTH; ++k) {
            const size_t off = (size_t)k * A.n;
            sa += matrix_load(&A.val[off + a]) * v(matrix_load(&A.col[off + a]));
            if (has_b) sb += matrix_load(&A.val[off + b]) * v(matrix_load(&A.col[off + b]));
        }
        finish(a, sa, WHOLE_ROW);
        if (has_b) finish(b, sb, WHOLE_ROW);
    }
}
