// DIA: column-major slots (slots.cu) whose columns are not stored: slot k of every row i lies on one
// diagonal, column i + offsets[k] (the offsets of a widest row, ascending, so a row's entries keep
// their order). The set-up checked that every entry lies on one of them (dia_place in layout.cu). The
// product reads 8 bytes a slot where ELL reads 12, and its gathers are coalesced. A slot off the
// matrix's edge (i + offsets[k] outside the columns) is padding of value 0 and reads the nearest
// column instead. Host side: solvers/formats/dia.py; NumPy meaning: DIA.product.
//
// struct Matrix { const real_t* val; int n; int columns; int offsets[64]; } (generated; the first
// SLOT_WIDTH offsets are the diagonals).

template <typename V, typename F>
__device__ __forceinline__ void for_each_row_product(const Matrix& A, const MatrixStage&, V v, F finish) {
    for_each_slot_row_product(
        A, [&](int k, size_t, int i) { return min(max(i + A.offsets[k], 0), A.columns - 1); }, v, finish);
}
