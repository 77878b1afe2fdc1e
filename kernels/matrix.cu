// The interface every matrix format implements (ell.cu, csr.cu, sell.cu; host side in
// solvers/formats/), compiled after grid.cu and before the format and the solver kernels:
//
//   struct Matrix { ...; int n; ... };                       // generated from the format's fields
//   struct MatrixStage;                                      // what a block holds of A on chip
//   __device__ MatrixStage stage_matrix(const Matrix& A);     // fills it (persistent kernels)
//   template <typename V, typename F>
//   __device__ void for_each_row_product(const Matrix& A, const MatrixStage& stage, V v, F finish);
//
// for_each_row_product spreads the rows over the whole grid (each thread calls it) and computes
// (A v)_i = sum_k val_ik v(col_ik) for every row i, where v(j) gives the vector's entry j (a load, or
// a value formed on the fly from other vectors). It hands each result to finish(i, value, part):
//
//   WHOLE_ROW     value is all of (A v)_i; the row's only call.
//   FIRST_PIECE,  value is the sum over one piece of a long row that several warps share; each piece
//   LATER_PIECE   is always handled by the same thread, so sums over pieces are deterministic.
//                 FIRST_PIECE also carries the row's once-only work (updates of its own entries).
//   PIECES_TOTAL  value is all of (A v)_i, added up from its pieces in a fixed order, after all of them,
//                 by whichever piece finished last: store it, but add it to no sum (the pieces did).
//
// A caller's finish therefore does: what is linear in the value (inner products) when
// adds_to_sums(part); the row's own updates when owns_row(part); stores of the value when
// completes_row(part). A format without long rows only ever passes WHOLE_ROW.
//
// stage_matrix, called by every thread at the start of a persistent kernel, copies what of the
// thread's part of A fits in the block's dynamic shared memory, for the products of that launch to
// read from there (SELL; the other formats stage nothing). The results do not depend on what is
// staged. Kernels that run one product pass no stage (the overload below).

enum RowPart { WHOLE_ROW, FIRST_PIECE, LATER_PIECE, PIECES_TOTAL };

__device__ __forceinline__ bool adds_to_sums(int part) { return part != PIECES_TOTAL; }
__device__ __forceinline__ bool owns_row(int part) { return part == WHOLE_ROW || part == FIRST_PIECE; }
__device__ __forceinline__ bool completes_row(int part) { return part == WHOLE_ROW || part == PIECES_TOTAL; }

// Loads of the matrix itself, which no kernel writes: through the read-only path, and with
// STREAM_MATRIX marked evict-first, so that the matrix, read once per product, passes through L2
// without evicting the vectors the iteration reads again.
template <typename T>
__device__ __forceinline__ T matrix_load(const T* p) {
#ifdef STREAM_MATRIX
    return __ldcs(p);
#else
    return __ldg(p);
#endif
}

struct MatrixStage;

// for_each_row_product with nothing staged (S is only there to defer the lookup to the format's).
template <typename V, typename F, typename S = MatrixStage>
__device__ __forceinline__ void for_each_row_product(const Matrix& A, V v, F finish) {
    for_each_row_product(A, S{}, v, finish);
}
