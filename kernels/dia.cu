// DIA: column-major slots (slots.cu) whose columns are not stored: slot k of every row i lies on one
// diagonal, column i + offsets[k] (ascending: a row's entries are added in column order). The
// diagonals are the offsets most frequent among sampled rows (solvers/formats/dia.py). The product
// reads 8 bytes a slot where ELL reads 12, and its gathers are coalesced. A slot off the matrix's
// edge (i + offsets[k] outside the columns) is padding of value 0 and reads the nearest column
// instead. With DIA_EXCEPTIONS, the few entries off the diagonals (periodic walls, a rank's halo
// columns) follow as CSR rows: row i's at rest_ptr[i] to rest_ptr[i + 1], their values after the
// slots' in val, added in their order after the row's slots (their row pointers loaded before the
// slots, so that they have arrived by then). Host side: solvers/formats/dia.py; NumPy meaning:
// DIA.product.
//
// struct Matrix { const real_t* val; int n; int columns; int offsets[64]; const int* rest_ptr;
// const int* rest_col; } (generated; the first SLOT_WIDTH offsets are the diagonals).

#if DIA_EXCEPTIONS
// Row i's exceptions: where they are (loaded with the slots), then their products added to its sum.
template <typename V>
struct Exceptions {
    struct Span { int first, last; };
    const Matrix& A;
    V v;
    __device__ __forceinline__ Span operator()(int i) const {
        return {matrix_load(&A.rest_ptr[i]), matrix_load(&A.rest_ptr[i + 1])};
    }
    __device__ __forceinline__ real_t operator()(Span row, real_t sum) const {
        const real_t* rest_val = A.val + (size_t)SLOT_WIDTH * A.n;
        for (int e = row.first; e < row.last; ++e) sum += matrix_load(&rest_val[e]) * v(matrix_load(&A.rest_col[e]));
        return sum;
    }
};
#endif

template <typename V, typename F>
__device__ __forceinline__ void for_each_row_product(const Matrix& A, const MatrixStage&, V v, F finish) {
    const auto column = [&](int k, size_t, int i) { return min(max(i + A.offsets[k], 0), A.columns - 1); };
#if DIA_EXCEPTIONS
    for_each_slot_row_product(A, column, v, finish, Exceptions<V>{A, v});
#else
    for_each_slot_row_product(A, column, v, finish, NothingApart{});
#endif
}
