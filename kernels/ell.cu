// ELL: column-major slots (slots.cu) with the column of every slot stored; padding has value 0 and
// points at its own row. For rows of nearly equal length (stencils, meshes). Host side:
// solvers/formats/ell.py; NumPy meaning: ELL.product.
//
// struct Matrix { const int* col; const real_t* val; int n; } (generated, see solvers/formats).

template <typename V, typename F>
__device__ __forceinline__ void for_each_row_product(const Matrix& A, const MatrixStage&, V v, F finish) {
    for_each_slot_row_product(A, [&](int, size_t slot, int) { return matrix_load(&A.col[slot]); }, v, finish,
                              NothingApart{});
}
