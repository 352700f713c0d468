// Internal interface of the fused CPU kernels behind fast/fast.h.
//
// The kernels are compiled several times, once per instruction set
// (kernels_generic.cpp, kernels_avx2.cpp, kernels_avx512.cpp, each including
// kernels_impl.h with its own vector width and `#pragma GCC target`), and the
// fastest one the CPU supports is picked at run time. Those translation units
// include nothing but this header, so no inline function compiled for a wider
// instruction set can leak into code that runs on a narrower one.
//
// All scores are in scaled units S' = (scale/eps) * Q K^T and all duals in
// units of eps (f' = f/eps), so a closure is a plain log-sum-exp.
#pragma once
#include <cstdint>

namespace asap {
namespace fast {
namespace detail {

// Independent multiply-add chains of peak_fma: enough to cover the FMA
// latency on every instruction set (4 cycles x 2 ports here).
constexpr int kPeakChains = 12;

// From how many leftover columns the column kernels' tails run as one vector
// (KernelTable::col_*_tail; kernels_impl.h says why not fewer).
constexpr int64_t kColVectorTailMin = 3;

template <class T>
struct KernelTable {
  const char* isa;  // "generic", "avx2", "avx512"
  int nt_mr;        // gemm_nt: rows per micro tile; callers pad row counts to a multiple
  int nt_nr;        // gemm_nt: columns per packed panel; callers pad leading dims to a multiple
  int width;        // vector lanes (leading dims of buffers are multiples of it)
  int nn_mr;        // gemm_nn / gemm_tn: rows per micro tile

  // Packs B [N x K] (row-major, ldb) times alpha into panels of nt_nr columns:
  // out has roundup(N, nt_nr) * K elements; columns past N are zero up to
  // roundup(N, width), the rest of a short last panel is not written (nor read).
  void (*pack_b)(int64_t N, int64_t K, const T* B, int64_t ldb, T alpha, T* out);
  // C [M x roundup(N, width)] = A [M x K] (lda) * Bp^T, Bp from pack_b starting
  // at a panel boundary; any M. Columns of C past roundup(N, width) are not
  // written (ldc must still hold roundup(N, nt_nr)).
  void (*gemm_nt)(int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* Bp, T* C, int64_t ldc);
  // C [M x Nv] = diag(rscale) A [M x N] (lda) * diag(bscale) B [N x Nv] (ldb);
  // Nv and ldb multiples of width, C overwritten, rscale [M] (nullptr: no
  // scaling, else one rounded multiply per entry after the sum), bscale [N]
  // (nullptr: none, else B's row j times bscale[j], rounded, as it is
  // loaded: the same bits as scaling B's rows first). Any M.
  void (*gemm_nn)(int64_t M, int64_t N, int64_t Nv, const T* A, int64_t lda, const T* B, int64_t ldb, T* C, int64_t ldc,
                  const T* rscale, const T* bscale);
  // The same with A given transposed: A(i, j) = A[j * lda + i], i.e. A^T
  // [N x M] stored row-major (the exponentials of a row pass on the
  // transposed tile).
  void (*gemm_tn)(int64_t M, int64_t N, int64_t Nv, const T* A, int64_t lda, const T* B, int64_t ldb, T* C, int64_t ldc,
                  const T* rscale, const T* bscale);
  // M [rows x cols] (ld) = M diag(scale): column j times scale[j], in place;
  // nothing past column cols is read or written.
  void (*scale_cols)(int64_t rows, int64_t cols, T* M, int64_t ld, const T* scale);
  // Row log-sum-exp: lse[r] = LSE_j (S[r,j] + add[j]) over j < nc. When E is
  // given, also E[r,j] = exp(S[r,j] + add[j] - max_r) and z[r] = sum_j E[r,j]
  // (E may alias S).
  void (*row_lse)(int64_t rows, int64_t nc, const T* S, int64_t lds, const T* add, T* lse, T* E, int64_t lde, T* z);
  // B [cols x ldb] = A^T for A [rows x cols] (lda): W x W blocks in
  // registers (edge blocks of one or two rows by shuffles, of one or two
  // columns element by element). A's rows are read up to roundup(cols, width) (lda must hold
  // it; the padding is not used); ldb >= roundup(rows, width), and B's lanes
  // from rows to roundup(rows, width) are written as zeros.
  void (*transpose)(int64_t rows, int64_t cols, const T* A, int64_t lda, T* B, int64_t ldb);
  // Column kernels (col_lse_chunk, col_max, col_exp): S's rows are read up to
  // roundup(nc, width) (lds must hold it; the padding is not used), E's rows
  // (col_exp) are rewritten unchanged there.
  // Online column log-sum-exp over a chunk of rows: with per-column state
  // (cmax, csum) meaning LSE = cmax + log(csum), folds in S[r,j] + radd[r].
  void (*col_lse_chunk)(int64_t rows, int64_t nc, const T* S, int64_t lds, const T* radd, T* cmax, T* csum);
  // cmax[j] = max(cmax[j], max_r S[r,j] + radd[r]).
  void (*col_max)(int64_t rows, int64_t nc, const T* S, int64_t lds, const T* radd, T* cmax);
  // E[r,j] = exp(S[r,j] + radd[r] - cmax[j]); csum[j] += E[r,j] (E may alias S).
  void (*col_exp)(int64_t rows, int64_t nc, const T* S, int64_t lds, const T* radd, const T* cmax, T* csum, T* E,
                  int64_t lde);
  // The same three on the last rem < width columns as one vector (the engine
  // calls them for rem >= kColVectorTailMin, the kernels above on the columns
  // before; below that the kernels above take the columns one by one).
  void (*col_lse_tail)(int64_t rows, int64_t rem, const T* S, int64_t lds, const T* radd, T* cmax, T* csum);
  void (*col_max_tail)(int64_t rows, int64_t rem, const T* S, int64_t lds, const T* radd, T* cmax);
  void (*col_exp_tail)(int64_t rows, int64_t rem, const T* S, int64_t lds, const T* radd, const T* cmax, T* csum, T* E,
                       int64_t lde);
  // One column of a column kernel from the tile's other layout, where that
  // column is a contiguous line x [count] (a row of S'^T for a column of S',
  // a row of S' for a column of S'^T): *mx = max_i (x[i] + add[i]) and *sm =
  // sum_i exp(x[i] + add[i] - *mx) over i < count, the state the column
  // kernels leave for a column they take whole (a line of -inf only, which
  // compacted tiles do not have: -inf, 0 and zeros in e). With e, also e[i * lde] = exp(x[i] + add[i] - *mx): the
  // column of E. The engine takes a tail of one or two columns this way where
  // it has both layouts, instead of a scalar exponential per row.
  void (*col_line)(int64_t count, const T* x, const T* add, T* mx, T* sm, T* e, int64_t lde);
  // E[r,j] = exp(S[r,j] + radd[r] + cadd[j]) (E may alias S).
  void (*plan)(int64_t rows, int64_t nc, const T* S, int64_t lds, const T* radd, const T* cadd, T* E, int64_t lde);
  // y[i] = exp(x[i]) with the kernels' own exponential (for tests).
  void (*vexp)(int64_t n, const T* x, T* y);
  // out[i] += log(z[i]) for z[i] >= 1 (row and column sums), vectorised in float32.
  void (*add_log)(const T* z, T* out, int64_t count);
  // out[i] = log_m - mx[i] - log(sm[i]): the end of a log-sum-exp pass
  // (LSE = mx + log(sm)), vectorised in float32 like add_log.
  void (*lse_finish)(const T* mx, const T* sm, T log_m, T* out, int64_t count);
  // mx[i] = -inf, sm[i] = 0 for i < roundup(count, width) (both must hold
  // that many): the start of a log-sum-exp pass over the column kernels.
  void (*lse_start)(T* mx, T* sm, int64_t count);
  // out[r] = half_s * sum_c x_c^2 for the rows x = q + rows[r] * d (the cost
  // offsets alpha of asap-math.md): summed in float64 and rounded to T, or
  // for float32 with d a multiple of width up to 16 * width, in float32 by
  // blocks of width rows (a regrouping of the reference's float32 sum).
  // rows == nullptr: the rows 0..count-1 of q.
  void (*row_sqnorm)(int64_t count, const int64_t* rows, const T* q, int64_t d, T half_s, T* out);
  // The end of a slice-free map (Engine::asap_map): x = ca alpha + b1 f1 +
  // b3 f3 (f1, f3 may be null: no term), f = (x - alpha) * inv_eps (the
  // dual of the centered phi up to a constant that the closures cancel) and,
  // when phi is given, phi = x - mean(x), the mean summed in float64. x is
  // scratch of n elements.
  // y (may be null) is added to x as it is: the score_stats columns' weighted
  // sum (col_stats).
  void (*map_tail)(int64_t n, const T* alpha, const T* f1, const T* f3, const T* y, T ca, T b1, T b3, T inv_eps, T* x,
                   T* phi, T* f);
  // Statistics of each column c < nc of M [rows >= 1 x nc] (ld; rows read up
  // to roundup(nc, width)): mx[c] = max_r M[r,c], mean[c] and sd[c] (the
  // standard deviation about the mean, from sums shifted by M[0,c]). With
  // shift [rows], in the same sweep over x = M[r, c] - shift[r]: mxc[c] =
  // max_r x and var[c] = the variance of x about its mean (population). With
  // w [3] (and wc [2] with shift), also y[c] = w[0] mx[c] + w[1] mean[c] +
  // w[2] sd[c] (+ wc[0] mxc[c] + wc[1] var[c]). The outputs are written in
  // whole vectors: each must hold roundup(nc, width) (the lanes past nc come
  // from the padding and mean nothing).
  // On the transposed score tile these are the rows' score statistics (the
  // score_stats columns) and, with shift = the keys' column means, the
  // centered_stats columns.
  void (*col_stats)(int64_t rows, int64_t nc, const T* M, int64_t ld, const T* shift, T* mx, T* mean, T* sd, T* mxc,
                    T* var, const T* w, const T* wc, T* y);
  // col_stats of one column given as a contiguous line x [count >= 1]
  // (shift [count] as col_stats' shift), each output a single element.
  void (*line_stats)(int64_t count, const T* x, const T* shift, T* mx, T* mean, T* sd, T* mxc, T* var, const T* w,
                     const T* wc, T* y);
  // The slice-free statistics map's dual of one head on the transposed tile
  // M [rows x nc] (ld; the columns are the score rows, read in whole
  // vectors): f[c] = (ca alpha[c] + y_c - alpha[c]) * inv_eps, y_c as
  // col_stats' y for w (and wc with shift), the last `lines` columns taken
  // as the lines L + c * ldl [rows] (line_stats). Only f[0..nc) is written,
  // alpha[0..nc) read: the general path's col_stats, line_stats and
  // map_tail in one call, without their outputs.
  void (*stats_map)(int64_t rows, int64_t nc, const T* M, int64_t ld, int64_t lines, const T* L, int64_t ldl,
                    const T* shift, const T* w, const T* wc, const T* alpha, T ca, T inv_eps, T* f);
  // out[c] += sum_r M[r, c] for the columns of M [rows x nc] (ld), in whole
  // vectors: out and M's rows must hold roundup(nc, width).
  void (*col_sums)(int64_t rows, int64_t nc, const T* M, int64_t ld, T* out);
  // Whether every x[i], i < n, is finite (x * 0 is 0 for finite x, NaN
  // otherwise; independent vector accumulators).
  bool (*all_finite)(const T* x, int64_t n);
  // iters rounds of kPeakChains independent vector multiply-adds x = x * a + b
  // (2 * kPeakChains * width flops a round), for measure_peak(); returns a
  // sum of the chains so that the loop is kept.
  T (*peak_fma)(int64_t iters, T seed);
};

struct Kernels {
  KernelTable<float> f32;
  KernelTable<double> f64;
};

// One table per instruction set compiled in; nullptr when not compiled.
const Kernels* kernels_generic();
const Kernels* kernels_avx2();
const Kernels* kernels_avx512();

}  // namespace detail
}  // namespace fast
}  // namespace asap
