// The per-head engine of the fast path: one attention head at a time, score
// tile stored or recomputed, closures as single fused passes.
//
// Rows and columns are compacted to the tokens that carry mass: rows R are
// the query rows with a_i > 0 (all rows, or the active keys when padded
// queries are dropped), columns J the active keys. Padded key columns and
// dropped rows never enter a pass; the caller fills their outputs (-inf
// duals, zero rows and columns).
#pragma once
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "fast/common.h"
#include "fast/sort.h"
#include "fast/sort_network.h"

namespace asap {
namespace fast {
namespace detail {

// The tokens of one sequence that carry mass.
struct Active {
  std::vector<int64_t> rows;         // R, ascending token indices
  std::vector<int64_t> keys;         // J, ascending
  std::vector<int64_t> key_in_rows;  // position in R of each key (J is a subset of R)
  std::vector<int64_t> extra_rows;   // positions in R of rows that are not keys
  bool all_keys = true;
  // rows[0] / keys[0] when R / J are one run of consecutive tokens (a
  // right- or left-padded sequence), else -1: the engine then reads those
  // rows of q, k and v in place instead of gathering them row by row.
  int64_t row_run = -1, key_run = -1;
};

// The active tokens of every sequence of a batch: one Active per sequence
// under a key mask, one for all without (B sets of four vectors each were a
// visible share of a call at n = 17).
struct ActiveSets {
  std::vector<Active> per_sequence;  // masked
  Active all;                        // unmasked: every sequence
  const Active& operator[](int64_t b) const { return per_sequence.empty() ? all : per_sequence[b]; }
};

// The sets of one call for a [B, n] key mask (nullptr = no mask): the
// calling thread's, rebuilt in place (their storage kept from call to call)
// and valid until the thread's next call, or *own for large masked batches.
const ActiveSets& call_sets(const bool* mask, int64_t B, int64_t n, bool drop_padded_queries, ActiveSets* own);

// How a call is run.
struct Choice {
  bool head_parallel = true;  // heads over threads; else passes over threads
  bool store = true;          // keep the head's score tile
  int threads = 1;            // threads of the inner passes (1 when head_parallel)
  int64_t chunk_rows = 64;    // rows per tile in row passes and the PV product
  int transposed_rows = -1;   // Tuning::transposed_rows
};

Choice choose(int64_t heads, int64_t n, int64_t elem_bytes, int64_t panel, const Tuning& tuning);

// Sliced-potential and extra feature columns for the engine.
template <class T>
struct FeatureSpec {
  const T* theta_s = nullptr;  // [L, d]: sqrt(scale) * theta^T in T (rows = slices)
  // The same bank transposed, [d][round_up(L, kSortLanes)], zero past L, for
  // the lane-parallel path; nullptr = transposed per head from theta_s.
  const T* theta_t = nullptr;
  int64_t L = 0;
  bool alpha = false, softmax = false;
  bool sinkhorn3 = false;  // f3 = row(col(row(0))) + alpha, the teacher's dual after 3 steps
  bool stats = false;      // score_stats: max, mean, sd of each row of S = eps S' over J (three columns)
  bool cstats = false;     // centered_stats (with stats): max, variance of each row of S_ij - c_j (two columns)
  int64_t columns() const {
    return L + (alpha ? 1 : 0) + (softmax ? 1 : 0) + (sinkhorn3 ? 1 : 0) + (stats ? 3 : 0) + (cstats ? 2 : 0);
  }
  bool needs_scores() const { return softmax || sinkhorn3 || stats; }
};

template <class T>
struct HeadOut {
  T* O = nullptr;  // [n, dv] head output rows (token order); rows outside R untouched
  T* A = nullptr;  // [n, n] attention; entries outside R x J untouched
};

template <class T>
class Engine {
 public:
  Engine(const KernelTable<T>& kt, int64_t n, int64_t d, int64_t dv, const Choice& ch);

  // A new head: q, k rows [n, d], v rows [n, dv] (or nullptr); s_eps =
  // scale / eps. Gathers, packs and (when storing) computes the score tile.
  // need_scores = false: no pass may run on this head (features without
  // score columns); the keys are then not packed either.
  void load(const T* q, const T* k, const T* v, const Active& act, double s_eps, bool need_scores = true);

  int64_t rows() const { return nR_; }
  int64_t keys() const { return nJ_; }

  // f' = log a - LSE_j(S' + g') over R (final: fused with plan * V into out).
  void row_pass(const T* g, T* f, bool final, T log_mult, const HeadOut<T>& out);
  // g' = log b - LSE_i(S' + f') over J (final: fused with plan * V into out).
  void col_pass(const T* f, T* g, bool final, T log_mult, const HeadOut<T>& out);

  // The teacher's loop with budget T from g' = 0; f, g, fstar sized by rows()
  // / keys(); fstar (may be null) receives the closure-ready dual.
  void teacher(int budget, T log_mult, T* f, T* g, T* fstar, const HeadOut<T>& out);
  // k closures col, row, ... from f (overwritten); g receives the last column dual.
  void closures(int k, T log_mult, T* f, T* g, const HeadOut<T>& out);

  // sum_ij (P_ij - Q_ij)^2 into *num and sum_ij Q_ij^2 into *den over R x J,
  // P = exp(S' + f_i + g_j), Q = exp(S' + fq_i + gq_j); the tile is not changed.
  // fq = gq = nullptr: Q is the plan stored by cache_plan (one exponential
  // sweep instead of two).
  void plan_distance(const T* f, const T* g, const T* fq, const T* gq, double* num, double* den);
  void cache_plan(const T* fq, const T* gq);

  // Feature columns of the head, centered over R; alpha [nR] holds the
  // query cost offsets (T precision). Without beta: Psi [P, nR] into psi
  // (column p at psi + p * nR). With beta [P]: phi = Psi beta into phi [nR]
  // (float64), no column stored.
  void features(const FeatureSpec<T>& fs, double eps, const T* alpha, T* psi, const double* beta = nullptr,
                double* phi = nullptr);

  // A compiled ASAP map on this head, fused (docs/performance.md, "The fused
  // ASAP call"): the slice columns, then the softmax and sinkhorn3 columns
  // taken from the row/column passes the Sinkhorn loop would run anyway
  // (f1 = the first row pass from g' = 0; f3 after one column and one row
  // pass, on the stored tile), phi = Psi beta as one dot product per row in
  // float64 (the centering folded into one shift), f' = (phi - alpha) / eps,
  // then k closures with the last one fused into plan * V. beta [P] in the
  // family's column order; alpha [nR] the query cost offsets. phi (may be
  // null) receives phi_hat over R rounded to T; psi (may be null) the
  // centered columns [P, nR] as features() writes them, from the same passes.
  void asap_map(const FeatureSpec<T>& fs, const double* beta, double eps, const T* alpha, int k, T log_mult, T* f, T* g,
                const HeadOut<T>& out, T* phi, T* psi);

  T log_a() const { return log_a_; }

 private:
  struct Scratch {
    Buf<T> tile, otmp, pbuf, qbuf, stats;
    SortScratch<T> sort;
    std::vector<int32_t> ox;
    std::vector<T> xg, col;
    std::vector<double> xs, ys, u, acc;
    double shift = 0;
    Buf<double> net_work;  // lane-parallel path (sort_network.h)
  };
  template <class F>
  void pfor(int64_t count, const F& fn);
  // Of nc columns, how many the column kernels take (col_lse_chunk, col_max,
  // col_exp): all, or all but the last rem = nc mod width when rem >=
  // kColVectorTailMin, which the *_tail entries then take as one vector
  // (kernels.h). The width is a power of two: a 64-bit division per block
  // was measurable at n = 17.
  int64_t vector_columns(int64_t nc) const {
    const int64_t rem = nc & (kt_.width - 1);
    return rem >= kColVectorTailMin ? nc - rem : nc;
  }
  // The micro tiles of rows that emit's output GEMMs run over nrows rows
  // (chunks of chunk_rows, each in tiles of nn_mr rows): how many times
  // gemm_nn scales a row of V it is given scales for.
  int64_t gemm_row_tiles(int64_t nrows) const {
    const int64_t CR = ch_.chunk_rows, MR = kt_.nn_mr, full = nrows / CR, rem = nrows - full * CR;
    return full * ((CR + MR - 1) / MR) + (rem + MR - 1) / MR;
  }
  // The rows [r0, r1) x columns [c0, c1) of S' (c0 on a panel boundary):
  // pointer and leading dimension; writable (final passes work in place).
  T* tile(int64_t r0, int64_t r1, int64_t c0, int64_t c1, int tid, int64_t* ld);
  // O rows (and A entries) of chunk [r0, r1) from E = plan / (row and column scales).
  // transposed: E is given as E^T (entry (r, j) at E[j * lde + r]). bscale:
  // Bv's row j times bscale[j] as the output GEMM loads it (nullptr: none).
  void emit(int64_t r0, int64_t r1, const T* E, int64_t lde, const T* rscale, const T* cscale, const T* Bv,
            const T* bscale, int tid, const HeadOut<T>& out, bool transposed = false);

  const KernelTable<T>& kt_;
  int64_t n_, d_, dv_, dvp_;
  Choice ch_;
  const Active* act_ = nullptr;
  int64_t nR_ = 0, nJ_ = 0, ldS_ = 0;
  // What the passes derive from a head's shape (nR, nJ) by integer
  // division, kept while consecutive heads have the same shape (every head of
  // an unmasked batch): the divisors (panel, vector, chunk widths, threads)
  // are run-time values, so each was a 64-bit division of 14-46 cycles on
  // Zen 2, about 20 of them in a 3-pass head, 2-4% of a call at n = 17
  // (docs/performance.md, "Integer divisions per head"). Set by load().
  struct Geometry {
    int64_t nR = -1, nJ = -1;
    int64_t ldS = 0;                   // nJ rounded up to the panel (nt_nr)
    int64_t nRw = 0, nJw = 0;          // nR and nJ rounded up to the vector width
    int64_t row_chunks = 0;            // chunks of chunk_rows rows over R
    int64_t col_bw = 0, col_nb = 0;    // column blocks of a column pass (panel multiples, one per thread)
    int64_t rowt_bw = 0, rowt_nb = 0;  // blocks of R for passes on the transposed tile (vector multiples)
    bool scale_e = false;              // a final column pass scales E's columns rather than V's rows
  };
  Geometry geo_;
  void set_geometry();
  T log_a_ = 0, log_b_ = 0;
  bool has_v_ = false;
  const T* qa_ = nullptr;  // [nR, d]
  const T* ka_ = nullptr;  // [nJ, d]
  Buf<T> qa_buf_, ka_buf_, kp_, vp_, S_;
  const T* vrows_ = nullptr;  // [nJ, dvp] value rows of the keys: the input itself or vp_
  Buf<T> lse_, z_, cmax_, csum_, rs_, cs_, radd_;
  // The stored tile transposed, [nJ][ldST_], built at the head's first
  // non-final row pass when use_st_: those passes then run as column passes
  // on it, with rows in the lanes (no horizontal reductions per row, which
  // were most of a row pass at n = 17).
  Buf<T> ST_;
  int64_t ldST_ = 0;
  bool use_st_ = false, st_ready_ = false;
  void build_transposed();
  // out[c] = log_m - LSE_r(M[r, c] + radd[r]) over the columns of an [nrows x
  // ncols] matrix (a column pass on S', a row pass on S'^T), in blocks of bw
  // columns (nb blocks) over the threads and chunks of rows; chunk(r0, r1, c0, c1, tid, &ld)
  // gives that part of M. mx, sm: per-column scratch (running max and sum).
  // line(c) is column c of M as a contiguous line of nrows (the tile's other
  // layout), or nullptr: a tail of one or two columns past the last whole
  // vector then goes to col_line instead of a scalar loop down the rows.
  template <class Chunk, class Line>
  void lse_down_columns(int64_t nrows, int64_t ncols, int64_t bw, int64_t nb, int64_t chunk_rows, const T* radd,
                        T log_m, T* mx, T* sm, T* out, const Chunk& chunk, const Line& line);
  // The end of a final pass over the columns of M [nrows x ncols] (ldm; S'
  // for a column pass, S'^T for a row pass), in nb blocks of bw columns over the
  // threads: the exact column maxima mx of M + radd, then M = exp(M + radd -
  // mx) in place with the column sums sm, out = log_m - mx - log(sm), and
  // block(c0, c1) for each block's scales. line: as for lse_down_columns
  // (col_line then also writes the tail's columns of E).
  template <class Block, class Line>
  void exp_down_columns(T* M, int64_t ldm, int64_t nrows, int64_t ncols, int64_t bw, int64_t nb, const T* radd, T log_m,
                        T* mx, T* sm, T* out, const Block& block, const Line& line);
  // Of a block [c0, c1) of columns, how many trailing ones col_line takes:
  // the one or two past the last whole vector that the column kernels would
  // take one by one (vector_columns), when line gives them; else none.
  template <class Line>
  int64_t line_columns(int64_t c0, int64_t c1, const Line& line) const {
    const int64_t rem = (c1 - c0) & (kt_.width - 1);
    return rem > 0 && rem < kColVectorTailMin && line(c1 - 1) ? rem : 0;
  }
  Buf<T> qp_, kp1_, X_, Y_, Qc_;
  Buf<T> f1_, g0_, f3_;            // the teacher's first steps for the softmax / sinkhorn3 columns
  Buf<T> smx_, smean_, ssd_, sy_;  // the score_stats columns (S' units) and their weighted sum
  Buf<T> cmu_, smxc_, svc_;        // the keys' column means and the centered_stats columns (S' units)
  // c_j = mean over R of S'_ij into c [round_up(nJ, width)] (kernel col_sums).
  void column_means(T* c);
  // w [3] and wc [2] of the statistics from beta[p_st]; the column means when
  // centered (engine.cpp).
  const T* stats_weights(const FeatureSpec<T>& fs, const double* beta, int64_t p_st, double eps, T* w, T* wc);
  // The max, mean and standard deviation of each row of S' over J into mx,
  // mean, sd [nR, each holding round_up(nR, width)] (kernel col_stats on the
  // transposed tile, built here when the row passes will use it, else on
  // transposed chunks of rows); with w [3], also y = w0 mx + w1 mean + w2 sd.
  // With shift [nJ] (the column means), also mxc and vc, the max and the
  // variance of each row of S'_ij - shift_j (in the same col_stats sweep), and
  // with wc [2] y += wc0 mxc + wc1 vc.
  void score_stats(T* mx, T* mean, T* sd, const T* w, T* y, const T* shift = nullptr, T* mxc = nullptr, T* vc = nullptr,
                   const T* wc = nullptr);
  // Lane-parallel sliced features (sort_network.h): theta^T [d][Lp], the
  // transposed projections [nR][Lp] and [nJ][Lp], positions as int32.
  Buf<T> thT_, XT_, YT_;
  std::vector<int32_t> kir32_, extra32_;
  int64_t net_m_ = -1, net_count_ = 0;  // the comparators of the last m (sort_network locks)
  // use_network's answer for the last (L, m): a string compare and three
  // logarithms that cost about 2% of a 16-slice call at n = 17 when asked per head.
  int64_t use_net_L_ = -1, use_net_m_ = -1;
  bool use_net_ = false;
  const int32_t* net_ = nullptr;
  void slice_features_network(const FeatureSpec<T>& fs, const double* beta, T* psi);
  // The L slice columns: with beta, scratch acc += beta_l col_l and shift +=
  // beta_l mean_l (acc and shift reset first); else centered into psi.
  void slice_columns(const FeatureSpec<T>& fs, const double* beta, T* psi);
  // Sum over the scratch areas of acc (into out [nR]) and shift.
  double gather_acc(double* out);
  Buf<double> phi_acc_;
  std::vector<Scratch> scratch_;
};

}  // namespace detail
}  // namespace fast
}  // namespace asap
