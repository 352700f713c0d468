// The per-head engine of the fast path (see engine.h and docs/performance.md).
#include "fast/engine.h"
#include "asap/error.h"
#include "fast/slices.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "util/env.h"
#include "util/potential.h"

namespace asap {
namespace fast {
namespace detail {

namespace {
// Rows per chunk in column passes over a stored tile (see col_pass).
constexpr int64_t kColChunkRows = 32;
// The most keys for which row passes run on the transposed tile by default.
constexpr int64_t kTransposedMaxKeys = 100;
}  // namespace

namespace {
constexpr int64_t kKeptSetsMaxTokens = int64_t(1) << 16;

// Fills a with the tokens of sequence b (mask nullptr: all n), reusing the
// vectors' storage.
void fill_active(Active& a, const bool* mask, int64_t b, int64_t n, bool drop_padded_queries) {
  a.keys.clear();
  a.rows.clear();
  a.key_in_rows.clear();
  a.extra_rows.clear();
  a.keys.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    if (!mask || mask[b * n + i]) a.keys.push_back(i);
  a.all_keys = static_cast<int64_t>(a.keys.size()) == n;
  if (drop_padded_queries) {
    a.rows = a.keys;
  } else {
    a.rows.resize(n);
    for (int64_t i = 0; i < n; ++i) a.rows[i] = i;
  }
  auto run = [](const std::vector<int64_t>& v) {
    return !v.empty() && v.back() - v.front() + 1 == static_cast<int64_t>(v.size()) ? v.front() : int64_t{-1};
  };
  a.row_run = run(a.rows);
  a.key_run = run(a.keys);
  // Positions of the keys within R, and of R's rows that are not keys.
  a.key_in_rows.resize(a.keys.size());
  a.extra_rows.reserve(a.rows.size() - a.keys.size());
  size_t kk = 0;
  for (size_t r = 0; r < a.rows.size(); ++r) {
    if (kk < a.keys.size() && a.keys[kk] == a.rows[r])
      a.key_in_rows[kk++] = static_cast<int64_t>(r);
    else
      a.extra_rows.push_back(static_cast<int64_t>(r));
  }
}
}  // namespace

const ActiveSets& call_sets(const bool* mask, int64_t B, int64_t n, bool drop_padded_queries, ActiveSets* own) {
  // The calling thread's sets, rebuilt in place: their vectors keep their
  // storage from call to call (four allocations per sequence and call were
  // about 5% of a call of one head at n = 17, and of a masked text batch).
  // Without a mask they depend on n alone (every token is a row and a key)
  // and are rebuilt only when n changes. Masked batches of more than
  // kKeptSetsMaxTokens tokens are built into *own, so that a thread does not
  // keep their storage (32 bytes a token) after the call.
  // One set for unmasked calls (`all` only) and one for masked calls
  // (`per_sequence` only), so that alternating calls keep both.
  thread_local ActiveSets unmasked, masked;
  thread_local int64_t unmasked_n = -1;
  if (!mask) {
    if (unmasked_n != n) {
      fill_active(unmasked.all, nullptr, 0, n, drop_padded_queries);
      unmasked_n = n;
    }
    return unmasked;
  }
  ActiveSets& sets = B * n > kKeptSetsMaxTokens ? *own : masked;
  sets.per_sequence.resize(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) fill_active(sets.per_sequence[b], mask, b, n, drop_padded_queries);
  return sets;
}

Choice choose(int64_t heads, int64_t n, int64_t elem_bytes, int64_t panel, const Tuning& tuning) {
  Choice c;
  const int threads = at::in_parallel_region() ? 1 : std::max(1, at::get_num_threads());
  int64_t budget = tuning.workspace_bytes;
  if (budget <= 0) {
    // The environment is read once: getenv walks it on every call, a visible
    // share of a call of one head at n = 17.
    static const int64_t env_budget = [] {
      const auto mb = env_number("ASAP_FAST_WORKSPACE_MB", 0, false, "a number of MiB, 0 or more");
      return mb ? static_cast<int64_t>(std::min(*mb, 1e12) * 1048576.0) : (int64_t(256) << 20);
    }();
    budget = env_budget;
  }
  const int64_t tile_bytes = n * round_up(n, panel) * elem_bytes;
  // Short sequences run heads over threads even when there are fewer heads
  // than threads (the other threads idle): splitting one head's passes pays a
  // fork/join per pass, and below n = 256 that cost more than the split
  // saved. One head on 2 threads took 2-5x the time of one thread at
  // n = 17-128 and 1.2x at n = 256, d = 16 (asap_bench --bh 1x1 --threads 1
  // and 2, docs/performance.md, "Fewer heads than threads").
  bool hp = threads == 1 || n * n < kWithinHeadMinScores ||
            (heads >= threads && (heads % threads == 0 || heads >= 4 * threads));
  if (tuning.strategy == Strategy::kHeadParallel) hp = true;
  if (tuning.strategy == Strategy::kWithinHead) hp = false;
  bool store;
  if (tuning.store_scores >= 0) {
    store = tuning.store_scores == 1;
  } else {
    store = (hp ? threads : 1) * tile_bytes <= budget;
    // Rather one stored tile with parallel passes than recomputing per head.
    if (!store && hp && threads > 1 && tile_bytes <= budget && tuning.strategy == Strategy::kAuto) {
      hp = false;
      store = true;
    }
  }
  c.head_parallel = hp;
  c.store = store;
  c.transposed_rows = tuning.transposed_rows;
  c.threads = hp ? 1 : threads;
  if (tuning.chunk_rows > 0) {
    c.chunk_rows = tuning.chunk_rows;
  } else if (store) {
    c.chunk_rows = 64;
  } else {
    // Recomputed tiles of about 256 KiB.
    c.chunk_rows =
        std::min<int64_t>(256, std::max<int64_t>(8, (int64_t(256) << 10) / (round_up(n, panel) * elem_bytes)));
  }
  return c;
}

template <class T>
Engine<T>::Engine(const KernelTable<T>& kt, int64_t n, int64_t d, int64_t dv, const Choice& ch)
    : kt_(kt), n_(n), d_(d), dv_(dv), dvp_(round_up(std::max<int64_t>(dv, 1), kt.width)), ch_(ch) {
  // The uniform marginals' log 1/n, once per engine: a libm log per head in
  // load() was about 50 instructions of every operator's head at n = 17.
  log_a_ = static_cast<T>(-std::log(static_cast<double>(n_)));
  log_b_ = log_a_;
  ASAP_ASSERT(kt.width > 0 && (kt.width & (kt.width - 1)) == 0);  // vector_columns
  ASAP_ASSERT(kt.nt_nr % kt.width == 0);                          // whole vectors within a panel-padded row (col_pass)
  scratch_.resize(std::max(1, ch.threads));
}

template <class T>
template <class F>
void Engine<T>::pfor(int64_t count, const F& fn) {
  // One scratch area per thread of the team. A team larger than the engine
  // was built for (at::set_num_threads raised by the caller since) runs
  // serially here rather than share an area; load() grows the areas for the
  // next head.
  if (ch_.threads <= 1 || count <= 1 || at::get_num_threads() > static_cast<int>(scratch_.size())) {
    for (int64_t i = 0; i < count; ++i) fn(i, 0);
    return;
  }
  at::parallel_for(0, count, 1, [&](int64_t b, int64_t e) {
    const FlushDenormals ftz;  // the team's other threads (drive() holds one on the caller's)
    const int tid = at::get_thread_num();
    ASAP_ASSERT(tid >= 0 && tid < static_cast<int>(scratch_.size()));
    for (int64_t i = b; i < e; ++i) fn(i, tid);
  });
}

template <class T>
void Engine<T>::set_geometry() {
  Geometry& g = geo_;
  g.nR = nR_, g.nJ = nJ_;
  const int64_t NR = kt_.nt_nr, W = kt_.width, CR = ch_.chunk_rows;
  const int64_t nb_want = ch_.threads > 1 ? ch_.threads : 1;
  g.ldS = round_up(nJ_, NR);
  g.nRw = round_up(nR_, W);
  g.nJw = round_up(nJ_, W);
  g.row_chunks = (nR_ + CR - 1) / CR;
  g.col_bw = std::max<int64_t>(round_up((nJ_ + nb_want - 1) / nb_want, NR), 1);
  g.col_nb = (nJ_ + g.col_bw - 1) / g.col_bw;
  g.rowt_bw = std::max<int64_t>(round_up((nR_ + nb_want - 1) / nb_want, W), 1);
  g.rowt_nb = (nR_ + g.rowt_bw - 1) / g.rowt_bw;
  // The final column pass's scales go into whichever costs less: E's
  // columns in place (a load, a multiply and a store per vector of E) or V's
  // rows as the output GEMM loads them (one multiply per vector of V, but
  // again for every micro tile of rows); see col_pass.
  g.scale_e = 3 * nR_ * ((nJ_ + W - 1) / W) < gemm_row_tiles(nR_) * nJ_ * (dvp_ / W);
}

template <class T>
void Engine<T>::load(const T* q, const T* k, const T* v, const Active& act, double s_eps, bool need_scores) {
  if (!at::in_parallel_region() && at::get_num_threads() > static_cast<int>(scratch_.size()))
    scratch_.resize(static_cast<size_t>(at::get_num_threads()));
  act_ = &act;
  nR_ = static_cast<int64_t>(act.rows.size());
  nJ_ = static_cast<int64_t>(act.keys.size());
  if (nR_ != geo_.nR || nJ_ != geo_.nJ) set_geometry();
  ldS_ = geo_.ldS;
  // The rows and keys that take part, contiguous (the inputs themselves when all do).
  auto gather = [&](const T* src, int64_t run, const std::vector<int64_t>& idx, Buf<T>& buf) -> const T* {
    if (run >= 0) return src + run * d_;  // consecutive tokens (all of them, or a padded sequence's)
    T* dst = buf.get(static_cast<int64_t>(idx.size()) * d_);
    for (size_t r = 0; r < idx.size(); ++r) std::memcpy(dst + r * d_, src + idx[r] * d_, d_ * sizeof(T));
    return dst;
  };
  qa_ = gather(q, act.row_run, act.rows, qa_buf_);
  ka_ = gather(k, act.key_run, act.keys, ka_buf_);
  // Packed keys for the score tiles; skipped when no pass will run (features
  // without score columns, where packing cost about 8% of the call at n = 50).
  T* kp = need_scores ? kp_.get(ldS_ * d_) : nullptr;
  if (need_scores) kt_.pack_b(nJ_, d_, ka_, d_, static_cast<T>(s_eps), kp);
  has_v_ = v != nullptr;
  vrows_ = nullptr;
  if (has_v_ && act.key_run >= 0 && dvp_ == dv_) {
    vrows_ = v + act.key_run * dv_;  // the value rows as they are: consecutive keys, no padding to add
  } else if (has_v_) {
    T* vp = vp_.get(nJ_ * dvp_);
    vrows_ = vp;
    for (int64_t j = 0; j < nJ_; ++j) {
      const T* src = v + act.keys[j] * dv_;
      T* dst = vp + j * dvp_;
      std::memcpy(dst, src, dv_ * sizeof(T));
      for (int64_t c = dv_; c < dvp_; ++c) dst[c] = T(0);
    }
  }
  // Per-head vectors.
  // Whole vectors for lse_start (lse and z are the per-column state of row
  // passes on the transposed tile, cmax and csum of column passes). Column
  // blocks start on whole vectors (their width is rounded to the vector or
  // the panel), so a block's rounded count ends within these sizes.
  lse_.get(geo_.nRw);
  z_.get(geo_.nRw);
  rs_.get(nR_);
  radd_.get(nR_);
  cmax_.get(geo_.nJw);
  csum_.get(geo_.nJw);
  cs_.get(geo_.nJw);  // whole vectors: the final column pass scales E's last one whole
  // Row passes on the transposed tile when they pay (asap_bench, docs/performance.md,
  // "Row passes on the transposed tile"): from kTransposedMinRows rows (fast.h)
  // to 100 keys (at 128 they gain nothing, at 256 they lose).
  use_st_ =
      ch_.store && need_scores &&
      (ch_.transposed_rows == 1 || (ch_.transposed_rows < 0 && nR_ >= kTransposedMinRows && nJ_ <= kTransposedMaxKeys));
  st_ready_ = false;
  if (ch_.store) {
    T* S = S_.get(nR_ * ldS_);
    if (need_scores) {
      const int64_t CR = ch_.chunk_rows;
      pfor(geo_.row_chunks, [&](int64_t c, int) {
        const int64_t r0 = c * CR, r1 = std::min(nR_, r0 + CR);
        kt_.gemm_nt(r1 - r0, nJ_, d_, qa_ + r0 * d_, d_, kp, S + r0 * ldS_, ldS_);
      });
    }
  }
}

template <class T>
T* Engine<T>::tile(int64_t r0, int64_t r1, int64_t c0, int64_t c1, int tid, int64_t* ld) {
  if (ch_.store) {
    *ld = ldS_;
    return S_.data() + r0 * ldS_ + c0;
  }
  const int64_t NR = kt_.nt_nr, w = round_up(c1 - c0, NR);
  T* buf = scratch_[tid].tile.get(std::max<int64_t>(ch_.chunk_rows, r1 - r0) * ldS_);
  kt_.gemm_nt(r1 - r0, c1 - c0, d_, qa_ + r0 * d_, d_, kp_.data() + (c0 / NR) * d_ * NR, buf, w);
  *ld = w;
  return buf;
}

template <class T>
void Engine<T>::emit(int64_t r0, int64_t r1, const T* E, int64_t lde, const T* rscale, const T* cscale, const T* Bv,
                     const T* bscale, int tid, const HeadOut<T>& out, bool transposed) {
  const int64_t rows = r1 - r0;
  const Active& a = *act_;
  const auto gemm = transposed ? kt_.gemm_tn : kt_.gemm_nn;
  if (out.O && has_v_) {
    if (a.row_run >= 0 && dvp_ == dv_) {
      // Straight into the output rows, when they are consecutive (a copy
      // through scratch was 2% of a 4-pass call at n = 17).
      gemm(rows, nJ_, dvp_, E, lde, Bv, dvp_, out.O + (a.row_run + r0) * dv_, dv_, rscale, bscale);
    } else {
      T* ot = scratch_[tid].otmp.get(rows * dvp_);
      gemm(rows, nJ_, dvp_, E, lde, Bv, dvp_, ot, dvp_, rscale, bscale);
      for (int64_t r = 0; r < rows; ++r) std::memcpy(out.O + a.rows[r0 + r] * dv_, ot + r * dvp_, dv_ * sizeof(T));
    }
  }
  if (out.A) {
    // E's entry (r, j): E[r * lde + j], or E[j * lde + r] when transposed.
    const int64_t rstep = transposed ? 1 : lde, jstep = transposed ? lde : 1;
    for (int64_t r = 0; r < rows; ++r) {
      const T sc = rscale ? rscale[r] : T(1);
      T* arow = out.A + a.rows[r0 + r] * n_;
      const T* e = E + r * rstep;
      for (int64_t j = 0; j < nJ_; ++j) {
        const T x = sc * e[j * jstep] * (cscale ? cscale[j] : T(1));
        arow[a.all_keys ? j : a.keys[j]] = x;
      }
    }
  }
}

template <class T>
template <class Chunk, class Line>
void Engine<T>::lse_down_columns(int64_t nrows, int64_t ncols, int64_t bw, int64_t nb, int64_t chunk_rows,
                                 const T* radd, T log_m, T* mx, T* sm, T* out, const Chunk& chunk, const Line& line) {
  pfor(nb, [&](int64_t b, int tid) {
    const int64_t c0 = b * bw, c1 = std::min(ncols, c0 + bw);
    kt_.lse_start(mx + c0, sm + c0, c1 - c0);
    // A tail of one or two columns from the other layout (col_line), else
    // the column kernels take it (vector_columns).
    const int64_t nl = line_columns(c0, c1, line), cm = c1 - nl;
    const int64_t nv = nl > 0 ? cm - c0 : vector_columns(c1 - c0);
    for (int64_t r0 = 0; r0 < nrows; r0 += chunk_rows) {
      const int64_t r1 = std::min(nrows, r0 + chunk_rows);
      int64_t ld;
      const T* t = chunk(r0, r1, c0, c1, tid, &ld);
      kt_.col_lse_chunk(r1 - r0, nv, t, ld, radd + r0, mx + c0, sm + c0);
      if (nv < cm - c0) kt_.col_lse_tail(r1 - r0, cm - c0 - nv, t + nv, ld, radd + r0, mx + c0 + nv, sm + c0 + nv);
    }
    for (int64_t c = cm; c < c1; ++c) kt_.col_line(nrows, line(c), radd, mx + c, sm + c, nullptr, 0);
    kt_.lse_finish(mx + c0, sm + c0, log_m, out + c0, c1 - c0);
  });
}

template <class T>
template <class Block, class Line>
void Engine<T>::exp_down_columns(T* M, int64_t ldm, int64_t nrows, int64_t ncols, int64_t bw, int64_t nb, const T* radd,
                                 T log_m, T* mx, T* sm, T* out, const Block& block, const Line& line) {
  const int64_t CR = kColChunkRows;
  pfor(nb, [&](int64_t b, int) {
    const int64_t c0 = b * bw, c1 = std::min(ncols, c0 + bw);
    kt_.lse_start(mx + c0, sm + c0, c1 - c0);
    const int64_t nl = line_columns(c0, c1, line), cm = c1 - nl;
    const int64_t nv = nl > 0 ? cm - c0 : vector_columns(c1 - c0), rem = cm - c0 - nv;
    for (int64_t r0 = 0; r0 < nrows; r0 += CR) {
      const int64_t r1 = std::min(nrows, r0 + CR);
      kt_.col_max(r1 - r0, nv, M + r0 * ldm + c0, ldm, radd + r0, mx + c0);
      if (rem > 0) kt_.col_max_tail(r1 - r0, rem, M + r0 * ldm + c0 + nv, ldm, radd + r0, mx + c0 + nv);
    }
    for (int64_t r0 = 0; r0 < nrows; r0 += CR) {
      const int64_t r1 = std::min(nrows, r0 + CR);
      T* m = M + r0 * ldm + c0;
      kt_.col_exp(r1 - r0, nv, m, ldm, radd + r0, mx + c0, sm + c0, m, ldm);
      if (rem > 0) kt_.col_exp_tail(r1 - r0, rem, m + nv, ldm, radd + r0, mx + c0 + nv, sm + c0 + nv, m + nv, ldm);
    }
    for (int64_t c = cm; c < c1; ++c) kt_.col_line(nrows, line(c), radd, mx + c, sm + c, M + c, ldm);
    kt_.lse_finish(mx + c0, sm + c0, log_m, out + c0, c1 - c0);
    block(c0, c1);
  });
}

template <class T>
void Engine<T>::build_transposed() {
  // The same values as S' (a copy), so both layouts give one score tile.
  ldST_ = geo_.nRw;
  T* ST = ST_.get(nJ_ * ldST_);
  kt_.transpose(nR_, nJ_, S_.data(), ldS_, ST, ldST_);
  st_ready_ = true;
}

template <class T>
void Engine<T>::row_pass(const T* g, T* f, bool final, T log_mult, const HeadOut<T>& out) {
  const int64_t CR = ch_.chunk_rows, nch = geo_.row_chunks;
  T* lse = lse_.data();
  T* z = z_.data();
  // Row passes on the transposed tile run as column passes over S'^T: f' =
  // log a - LSE_j(S'_ij + g'_j). The final one as the final column pass runs
  // on S': exact maxima, then E^T = exp(S'^T + g' - max_i) in place with the
  // sums, and O from E^T (gemm_tn). Horizontal reductions per row, as in
  // row_lse below, made a final row pass cost about two column passes at
  // n = 17 (docs/performance.md, "The final row pass on the transposed tile").
  if (use_st_) {
    if (!st_ready_) build_transposed();
    const int64_t bw = geo_.rowt_bw, nb = geo_.rowt_nb;
    T* ST = ST_.data();
    // Column i of S'^T is row i of S' (contiguous): the tail's line.
    const auto line = [this](int64_t i) { return static_cast<const T*>(S_.data() + i * ldS_); };
    if (!final) {
      lse_down_columns(
          nJ_, nR_, bw, nb, kColChunkRows, g, log_a_, lse, z, f,
          [&](int64_t r0, int64_t, int64_t c0, int64_t, int, int64_t* ld) {
            *ld = ldST_;
            return static_cast<const T*>(ST + r0 * ldST_ + c0);
          },
          line);
      return;
    }
    const double row_mass = std::exp(static_cast<double>(log_mult) + static_cast<double>(log_a_));
    T* rs = rs_.data();
    exp_down_columns(
        ST, ldST_, nJ_, nR_, bw, nb, g, log_a_, lse, z, f,
        [&](int64_t c0, int64_t c1) {
          for (int64_t r = c0; r < c1; ++r) rs[r] = static_cast<T>(row_mass / static_cast<double>(z[r]));
        },
        line);
    st_ready_ = false;  // ST now holds E^T
    pfor(nch, [&](int64_t c, int tid) {
      const int64_t r0 = c * CR, r1 = std::min(nR_, r0 + CR);
      emit(r0, r1, ST + r0, ldST_, rs + r0, nullptr, vrows_, nullptr, tid, out, /*transposed=*/true);
    });
    return;
  }
  T* rs = rs_.data();
  // Only the final pass scales by the mass (an exp per pass was 1% of a
  // feature pass at n = 17, where log_mult = 0 misses exp's fast path).
  const double row_mass = final ? std::exp(static_cast<double>(log_mult) + static_cast<double>(log_a_)) : 0.0;
  pfor(nch, [&](int64_t c, int tid) {
    const int64_t r0 = c * CR, r1 = std::min(nR_, r0 + CR);
    int64_t ld;
    T* t = tile(r0, r1, 0, nJ_, tid, &ld);
    if (!final) {
      kt_.row_lse(r1 - r0, nJ_, t, ld, g, lse + r0, nullptr, 0, nullptr);
    } else {
      // E = exp(S' + g' - max_i) in place; plan * mult = E * mult * a / z_i.
      kt_.row_lse(r1 - r0, nJ_, t, ld, g, lse + r0, t, ld, z + r0);
      for (int64_t r = r0; r < r1; ++r) rs[r] = static_cast<T>(row_mass / static_cast<double>(z[r]));
      emit(r0, r1, t, ld, rs + r0, nullptr, vrows_, nullptr, tid, out);
    }
    for (int64_t r = r0; r < r1; ++r) f[r] = log_a_ - lse[r];
  });
}

template <class T>
void Engine<T>::col_pass(const T* f, T* g, bool final, T log_mult, const HeadOut<T>& out) {
  // Column blocks: one per thread (panel aligned), or the whole width.
  const int64_t bw = geo_.col_bw, nb = geo_.col_nb;
  T* cmax = cmax_.data();
  T* csum = csum_.data();
  T* cs = cs_.data();
  const double col_mass = final ? std::exp(static_cast<double>(log_mult) + static_cast<double>(log_b_)) : 0.0;
  // Column passes walk the tile in chunks of rows across the block's full
  // width: sweeping one narrow column strip down all rows touches a new page
  // per row and thrashes the TLB at large n (4x slower at n = 4096).
  const int64_t CRc = ch_.store ? kColChunkRows : ch_.chunk_rows;
  // Column j of S' is row j of the transposed tile while that holds S'^T:
  // the tail's line. A row pass follows every non-final column pass and
  // builds that tile if no pass has yet (a map's closures start with a
  // column pass), so such a pass builds it itself, at no extra cost.
  if (!final && use_st_ && !st_ready_) build_transposed();
  const bool st = ch_.store && st_ready_;
  const auto st_line = [this, st](int64_t j) { return st ? static_cast<const T*>(ST_.data() + j * ldST_) : nullptr; };
  if (final && ch_.store) {
    // Exact column maxima, then E = exp(S' + f' - max_j) in place with the
    // column sums; plan * mult = E * mult * b / sum_j. The column scales go
    // into whichever costs less: E's columns in place (a load, a multiply and
    // a store per vector of E) or V's rows as the output GEMM loads them (one
    // multiply per vector of V, but again for every micro tile of rows). At
    // n = 17, d = 16 the GEMM's scales beat both E's and a scaled copy of V
    // (docs/performance.md, "AVX-512 again"); at d = 64 E's columns win from
    // n = 17 (docs/performance.md, "AVX2: `alpha` at d = 64, and the final
    // column pass scales the smaller side") and by more as n grows (counting
    // V's rows once, as before, kept n = 50-64 in the GEMM: "The final column
    // pass's scales by their cost").
    T* S = S_.data();
    const bool scale_e = has_v_ && geo_.scale_e;
    exp_down_columns(
        S, ldS_, nR_, nJ_, bw, nb, f, log_b_, cmax, csum, g,
        [&](int64_t c0, int64_t c1) {
          for (int64_t j = c0; j < c1; ++j) cs[j] = static_cast<T>(col_mass / static_cast<double>(csum[j]));
          if (!scale_e) return;
          // A partial last vector is scaled whole, with zeros past the last key:
          // blocks start on panels, so only the last block has one, and its
          // columns past nJ are the tile's padding, which nothing reads (with
          // the scalar tail, scale_cols had 339 samples against 282 now, in two
          // profiles at n = 17, d = 64; docs/performance.md).
          const int64_t W = kt_.width, cw = (c1 - c0 + W - 1) & ~(W - 1);
          for (int64_t j = c1; j < c0 + cw; ++j) cs[j] = T(0);
          kt_.scale_cols(nR_, cw, S + c0, ldS_, cs + c0);
        },
        st_line);
    const int64_t CR = ch_.chunk_rows;
    pfor(geo_.row_chunks, [&](int64_t c, int tid) {
      const int64_t r0 = c * CR, r1 = std::min(nR_, r0 + CR);
      emit(r0, r1, S + r0 * ldS_, ldS_, nullptr, scale_e ? nullptr : cs, vrows_, scale_e ? nullptr : cs, tid, out);
    });
    return;
  }
  lse_down_columns(
      nR_, nJ_, bw, nb, CRc, f, log_b_, cmax, csum, g,
      [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1, int tid, int64_t* ld) {
        return static_cast<const T*>(tile(r0, r1, c0, c1, tid, ld));
      },
      st_line);
  if (!final) return;
  // Recomputed tiles: a plan pass with both duals.
  T* radd = radd_.data();
  for (int64_t r = 0; r < nR_; ++r) radd[r] = f[r] + log_mult;
  const int64_t CR = ch_.chunk_rows;
  pfor(geo_.row_chunks, [&](int64_t c, int tid) {
    const int64_t r0 = c * CR, r1 = std::min(nR_, r0 + CR);
    int64_t ld;
    T* t = tile(r0, r1, 0, nJ_, tid, &ld);
    kt_.plan(r1 - r0, nJ_, t, ld, radd + r0, g, t, ld);
    emit(r0, r1, t, ld, nullptr, nullptr, vrows_, nullptr, tid, out);
  });
}

template <class T>
void Engine<T>::teacher(int T_budget, T log_mult, T* f, T* g, T* fstar, const HeadOut<T>& out) {
  for (int64_t j = 0; j < nJ_; ++j) g[j] = T(0);
  const int fstar_t = T_budget % 2 == 0 ? T_budget - 1 : T_budget - 2;
  for (int t = 1; t <= T_budget; ++t) {
    const bool final = t == T_budget;
    if (t % 2 == 1)
      row_pass(g, f, final, log_mult, out);
    else
      col_pass(f, g, final, log_mult, out);
    if (t == fstar_t && fstar) std::memcpy(fstar, f, nR_ * sizeof(T));
  }
}

template <class T>
void Engine<T>::closures(int k, T log_mult, T* f, T* g, const HeadOut<T>& out) {
  for (int t = 1; t <= k; ++t) {
    const bool final = t == k;
    if (t % 2 == 1)
      col_pass(f, g, final, log_mult, out);
    else
      row_pass(g, f, final, log_mult, out);
  }
}

template <class T>
void Engine<T>::cache_plan(const T* fq, const T* gq) {
  const int64_t CR = ch_.chunk_rows, nch = geo_.row_chunks;
  T* Q = Qc_.get(nR_ * ldS_);
  pfor(nch, [&](int64_t c, int tid) {
    const int64_t r0 = c * CR, r1 = std::min(nR_, r0 + CR);
    int64_t ld;
    const T* t = tile(r0, r1, 0, nJ_, tid, &ld);
    kt_.plan(r1 - r0, nJ_, t, ld, fq + r0, gq, Q + r0 * ldS_, ldS_);
  });
}

template <class T>
void Engine<T>::plan_distance(const T* f, const T* g, const T* fq, const T* gq, double* num, double* den) {
  const int64_t CR = ch_.chunk_rows, nch = geo_.row_chunks;
  std::vector<double> nums(nch, 0.0), dens(nch, 0.0);  // per chunk, summed in order: deterministic
  pfor(nch, [&](int64_t c, int tid) {
    const int64_t r0 = c * CR, r1 = std::min(nR_, r0 + CR), rows = r1 - r0;
    int64_t ld;
    const T* t = tile(r0, r1, 0, nJ_, tid, &ld);
    Scratch& sc = scratch_[tid];
    T* P = sc.pbuf.get(rows * ldS_);
    kt_.plan(rows, nJ_, t, ld, f + r0, g, P, ldS_);
    const T* Q;
    if (fq) {
      T* q = sc.qbuf.get(rows * ldS_);
      kt_.plan(rows, nJ_, t, ld, fq + r0, gq, q, ldS_);
      Q = q;
    } else {
      Q = Qc_.data() + r0 * ldS_;
    }
    double sn = 0, sd = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const T* p = P + r * ldS_;
      const T* q = Q + r * ldS_;
      T rn = 0, rd = 0;
      for (int64_t j = 0; j < nJ_; ++j) {
        const T d = p[j] - q[j];
        rn += d * d;
        rd += q[j] * q[j];
      }
      sn += static_cast<double>(rn);
      sd += static_cast<double>(rd);
    }
    nums[c] = sn;
    dens[c] = sd;
  });
  *num = 0;
  *den = 0;
  for (int64_t c = 0; c < nch; ++c) *num += nums[c], *den += dens[c];
}

// Centers column `col` over R and either stores it as psi column p
// (rounded like the reference) or adds beta_p * col into the scratch's
// accumulator and beta_p * mean into its shift: the centering commutes with
// the sum, so no column is stored or re-read.
namespace {
template <class T, class S>
inline void take_column(int64_t nR, const T* col, const double* beta, int64_t p, S& sc, T* psi) {
  double sum = 0;
  for (int64_t i = 0; i < nR; ++i) sum += static_cast<double>(col[i]);
  const double mean = sum / static_cast<double>(nR);
  if (beta) {
    const double b = beta[p];
    double* acc = sc.acc.data();
    for (int64_t i = 0; i < nR; ++i) acc[i] += b * static_cast<double>(col[i]);
    sc.shift += b * mean;
  } else {
    T* out = psi + p * nR;
    for (int64_t i = 0; i < nR; ++i) out[i] = static_cast<T>(static_cast<double>(col[i]) - mean);
  }
}
}  // namespace

template <class T>
void Engine<T>::slice_columns(const FeatureSpec<T>& fs, const double* beta, T* psi) {
  const Active& a = *act_;
  const int64_t NR = kt_.nt_nr;
  if (beta) {
    for (auto& sc : scratch_) {
      sc.acc.assign(nR_, 0.0);
      sc.shift = 0;
    }
  }
  if (fs.L <= 0) return;
  const SortPath sp = sort_path();
  if (sp == SortPath::kAuto && (fs.L != use_net_L_ || nJ_ != use_net_m_)) {
    use_net_ = use_network(kt_.isa, sizeof(T) == 8, fs.L, nJ_);
    use_net_L_ = fs.L;
    use_net_m_ = nJ_;
  }
  if (sp == SortPath::kNetwork || (sp == SortPath::kAuto && use_net_)) {
    // One slice per SIMD lane, sorting networks (sort_network.h), where they
    // win (use_network: short sequences everywhere, long ones too with
    // float32 on AVX2/AVX-512); the scalar sorts of sort.h otherwise.
    slice_features_network(fs, beta, psi);
    return;
  }
  const int64_t L = fs.L, ldx = round_up(nR_, NR), ldy = round_up(nJ_, NR);
  T* qp = qp_.get(ldx * d_);
  T* kp1 = kp1_.get(ldy * d_);
  T* X = X_.get(L * ldx);
  T* Y = Y_.get(L * ldy);
  project_slices(kt_, L, d_, fs.theta_s, nR_, qa_, nJ_, ka_, qp, kp1, X, ldx, Y, ldy);
  const int64_t m = nJ_;
  const bool extra = !a.extra_rows.empty();
  pfor(L, [&](int64_t l, int tid) {
    Scratch& s = scratch_[tid];
    const T* x = X + l * ldx;
    const T* y = Y + l * ldy;
    const int64_t* kir = a.key_in_rows.data();
    s.xs.resize(m);
    s.ys.resize(m);
    s.col.resize(nR_);
    const T* xk = x;
    if (!a.all_keys) {  // the active keys' own projections, contiguous
      s.xg.resize(m);
      for (int64_t r = 0; r < m; ++r) s.xg[r] = x[kir[r]];
      xk = s.xg.data();
    }
    sorted_with_order(m, xk, s.sort, s.ox, s.xs.data());
    sorted_values<T>(m, y, s.sort, s.ys.data());
    // u_(1) = 0, u_(r+1) = u_(r) + ys_(r) (xs_(r+1) - xs_(r)); phi_(r) = xs_(r)^2 / 2 - u_(r).
    T* col = s.col.data();
    const double* xs = s.xs.data();
    const double* ys = s.ys.data();
    const int32_t* ox = s.ox.data();
    if (extra) s.u.resize(m);
    double u = 0;
    for (int64_t r = 0; r < m; ++r) {
      if (extra) s.u[r] = u;
      col[kir[ox[r]]] = static_cast<T>(0.5 * xs[r] * xs[r] - u);
      if (r + 1 < m) u += ys[r] * (xs[r + 1] - xs[r]);
    }
    for (int64_t e : a.extra_rows)
      col[e] = static_cast<T>(asap::detail::eval_potential(s.xs, s.ys, s.u, static_cast<double>(x[e])));
    take_column(nR_, col, beta, l, s, psi);
  });
}

template <class T>
double Engine<T>::gather_acc(double* out) {
  double shift = 0;
  for (int64_t i = 0; i < nR_; ++i) out[i] = 0;
  for (auto& sc : scratch_) {
    if (sc.acc.size() < static_cast<size_t>(nR_)) continue;  // never used by this head
    for (int64_t i = 0; i < nR_; ++i) out[i] += sc.acc[i];
    shift += sc.shift;
  }
  return shift;
}

template <class T>
void Engine<T>::column_means(T* c) {
  // Column sums of the tile (the stored one, or recomputed chunks of rows).
  const int64_t nv = geo_.nJw, CR = ch_.chunk_rows;
  for (int64_t j = 0; j < nv; ++j) c[j] = T(0);
  for (int64_t r0 = 0; r0 < nR_; r0 += CR) {
    const int64_t r1 = std::min(nR_, r0 + CR);
    int64_t ld;
    const T* t = tile(r0, r1, 0, nJ_, 0, &ld);
    kt_.col_sums(r1 - r0, nJ_, t, ld, c);
  }
  const T inv = static_cast<T>(1.0 / static_cast<double>(nR_));
  for (int64_t j = 0; j < nJ_; ++j) c[j] *= inv;
}

template <class T>
void Engine<T>::score_stats(T* mx, T* mean, T* sd, const T* w, T* y, const T* shift, T* mxc, T* vc, const T* wc) {
  const int64_t W = kt_.width;
  if (use_st_) {
    if (!st_ready_) build_transposed();
    const int64_t bw = geo_.rowt_bw, nb = geo_.rowt_nb;
    const T* ST = ST_.data();
    // A tail of one or two rows past the block's last whole vector of lanes
    // as lines of S' (line_stats), as the row passes take them (col_line).
    const auto line = [this](int64_t i) { return static_cast<const T*>(S_.data() + i * ldS_); };
    pfor(nb, [&](int64_t b, int) {
      const int64_t c0 = b * bw, c1 = std::min(nR_, c0 + bw);
      const int64_t cm = c1 - line_columns(c0, c1, line);
      kt_.col_stats(nJ_, cm - c0, ST + c0, ldST_, shift, mx + c0, mean + c0, sd + c0, shift ? mxc + c0 : nullptr,
                    shift ? vc + c0 : nullptr, w, wc, y ? y + c0 : nullptr);
      for (int64_t i = cm; i < c1; ++i)
        kt_.line_stats(nJ_, line(i), shift, mx + i, mean + i, sd + i, shift ? mxc + i : nullptr,
                       shift ? vc + i : nullptr, w, wc, y ? y + i : nullptr);
    });
    return;
  }
  // Chunks of rows transposed into scratch; the kernel's whole-vector
  // outputs go to scratch too (a chunk need not end on a vector), then the
  // chunk's rows are copied out. One chunk (short sequences) writes the
  // outputs in place: they hold round_up(nR, width) each.
  const int64_t CR = ch_.chunk_rows, nch = geo_.row_chunks;
  pfor(nch, [&](int64_t c, int tid) {
    const int64_t r0 = c * CR, r1 = std::min(nR_, r0 + CR), ldt = round_up(r1 - r0, W);
    const bool direct = nch == 1;
    int64_t ld;
    const T* t = tile(r0, r1, 0, nJ_, tid, &ld);
    T* tt = scratch_[tid].stats.get((nJ_ + (direct ? 0 : 6)) * ldt);
    T* o = tt + nJ_ * ldt;
    kt_.transpose(r1 - r0, nJ_, t, ld, tt, ldt);
    if (direct) {
      kt_.col_stats(nJ_, nR_, tt, ldt, shift, mx, mean, sd, mxc, vc, w, wc, y);
      return;
    }
    kt_.col_stats(nJ_, r1 - r0, tt, ldt, shift, o, o + ldt, o + 2 * ldt, o + 4 * ldt, o + 5 * ldt, w, wc,
                  y ? o + 3 * ldt : nullptr);
    for (int64_t r = r0; r < r1; ++r) {
      mx[r] = o[r - r0], mean[r] = o[ldt + r - r0], sd[r] = o[2 * ldt + r - r0];
      if (y) y[r] = o[3 * ldt + r - r0];
      if (shift) mxc[r] = o[4 * ldt + r - r0], vc[r] = o[5 * ldt + r - r0];
    }
  });
}

template <class T>
void Engine<T>::features(const FeatureSpec<T>& fs, double eps, const T* alpha, T* psi, const double* beta,
                         double* phi) {
  slice_columns(fs, beta, psi);
  int64_t p = fs.L;
  Scratch& s0 = scratch_[0];
  if (fs.alpha) {
    take_column(nR_, alpha, beta, p, s0, psi);
    ++p;
  }
  if (fs.softmax || fs.sinkhorn3) {
    // The teacher's first steps from g' = 0 (reference: build_features):
    // f1 = eps (log a - LSE_j S'_ij), f3 = row(col(f1)); each column + alpha.
    T* f1 = f1_.get(nR_);
    T* g = g0_.get(nJ_);
    for (int64_t j = 0; j < nJ_; ++j) g[j] = T(0);
    s0.col.resize(nR_);
    T* col = s0.col.data();
    row_pass(g, f1, false, T(0), HeadOut<T>{});
    const T e = static_cast<T>(eps);
    auto emit_column = [&](const T* f) {
      for (int64_t r = 0; r < nR_; ++r) col[r] = e * f[r] + alpha[r];
      take_column(nR_, col, beta, p, s0, psi);
      ++p;
    };
    if (fs.softmax) emit_column(f1);
    if (fs.sinkhorn3) {
      T* f3 = f3_.get(nR_);
      col_pass(f1, g, false, T(0), HeadOut<T>{});
      row_pass(g, f3, false, T(0), HeadOut<T>{});
      emit_column(f3);
    }
  }
  if (fs.stats) {
    // Row statistics of S = eps S' over J (reference: build_features).
    const int64_t nv = geo_.nRw;  // col_stats writes whole vectors
    T* st[5] = {smx_.get(nv), smean_.get(nv), ssd_.get(nv), nullptr, nullptr};
    T* shift = nullptr;
    if (fs.cstats) {
      shift = cmu_.get(geo_.nJw);
      column_means(shift);
      st[3] = smxc_.get(nv), st[4] = svc_.get(nv);
    }
    score_stats(st[0], st[1], st[2], nullptr, nullptr, shift, st[3], st[4], nullptr);
    s0.col.resize(nR_);
    T* col = s0.col.data();
    const T e = static_cast<T>(eps);
    // The variance is in S'^2 units: eps^2 to S's.
    const T scale[5] = {e, e, e, e, static_cast<T>(eps * eps)};
    for (int c = 0; c < (fs.cstats ? 5 : 3); ++c) {
      for (int64_t r = 0; r < nR_; ++r) col[r] = scale[c] * st[c][r];
      take_column(nR_, col, beta, p, s0, psi);
      ++p;
    }
  }
  if (beta) {
    const double shift = gather_acc(phi);
    for (int64_t i = 0; i < nR_; ++i) phi[i] -= shift;
  }
}

// The statistics' weights in the dual, beta_c times eps (the max, mean, sd
// and centered max) or eps^2 (the centered variance, in S'^2 units), from
// beta[p_st]; with the centered ones, the column means they are centered on
// (else nullptr).
template <class T>
const T* Engine<T>::stats_weights(const FeatureSpec<T>& fs, const double* beta, int64_t p_st, double eps, T* w, T* wc) {
  for (int c = 0; c < 3; ++c) w[c] = static_cast<T>(beta[p_st + c] * eps);
  wc[0] = wc[1] = T(0);
  if (!fs.cstats) return nullptr;
  T* shift = cmu_.get(geo_.nJw);
  column_means(shift);
  wc[0] = static_cast<T>(beta[p_st + 3] * eps), wc[1] = static_cast<T>(beta[p_st + 4] * eps * eps);
  return shift;
}

template <class T>
void Engine<T>::asap_map(const FeatureSpec<T>& fs, const double* beta, double eps, const T* alpha, int k, T log_mult,
                         T* f, T* g, const HeadOut<T>& out, T* phi, T* psi) {
  if (fs.L == 0 && !fs.softmax && !fs.sinkhorn3 && !fs.stats && !psi) {
    // alpha alone (beta[0] its one coefficient): the general path's tail
    // below, the same bits, without its bookkeeping (about 1% of a 3-pass
    // call at n = 17, d = 16, one thread; docs/performance.md).
    kt_.map_tail(nR_, alpha, nullptr, nullptr, nullptr, static_cast<T>(beta[0]), T(0), T(0), static_cast<T>(1.0 / eps),
                 reinterpret_cast<T*>(phi_acc_.get(nR_)), phi, f);
    closures(k, log_mult, f, g, out);
    return;
  }
  if (fs.L == 0 && fs.stats && !fs.softmax && !fs.sinkhorn3 && !psi && !phi && use_st_ && ch_.threads <= 1) {
    // alpha and the statistics of a head on one thread with the transposed
    // tile (short sequences): the general path's col_stats, line_stats and
    // map_tail in one kernel that writes f, no statistic stored (their
    // bookkeeping was about 375 instructions of a head at n = 17, d = 16;
    // docs/performance.md).
    T w[3], wc[2];
    const T* shift = stats_weights(fs, beta, fs.alpha ? 1 : 0, eps, w, wc);
    if (!st_ready_) build_transposed();
    const auto line = [this](int64_t i) { return static_cast<const T*>(S_.data() + i * ldS_); };
    kt_.stats_map(nJ_, nR_, ST_.data(), ldST_, line_columns(0, nR_, line), S_.data(), ldS_, shift, w, wc, alpha,
                  fs.alpha ? static_cast<T>(beta[0]) : T(0), static_cast<T>(1.0 / eps), f);
    closures(k, log_mult, f, g, out);
    return;
  }
  // Slices: accumulated (beta_l col_l and beta_l mean_l) or, when the columns
  // are asked for, centered into psi and then summed from there.
  double* acc = phi_acc_.get(nR_);
  double shift = 0;
  if (fs.L > 0) {
    slice_columns(fs, psi ? nullptr : beta, psi);
    if (psi) {
      for (int64_t i = 0; i < nR_; ++i) acc[i] = 0;
      for (int64_t l = 0; l < fs.L; ++l) {
        const double b = beta[l];
        const T* c = psi + l * nR_;
        for (int64_t i = 0; i < nR_; ++i) acc[i] += b * static_cast<double>(c[i]);
      }
    } else {
      shift = gather_acc(acc);
    }
  }
  // The other columns are alpha + eps * (a row dual): alpha, and for softmax
  // and sinkhorn3 the row duals after one and three steps from g' = 0. Their
  // weighted sum is ca * alpha + b1 * f1 + b3 * f3.
  int64_t p = fs.L;
  double ca = 0, b1 = 0, b3 = 0;
  const int64_t p_alpha = fs.alpha ? p++ : -1;
  const int64_t p_soft = fs.softmax ? p++ : -1;
  const int64_t p_s3 = fs.sinkhorn3 ? p++ : -1;
  const int64_t p_st = fs.stats ? p : -1;
  if (p_alpha >= 0) ca += beta[p_alpha];
  if (p_soft >= 0) ca += beta[p_soft], b1 = beta[p_soft] * eps;
  if (p_s3 >= 0) ca += beta[p_s3], b3 = beta[p_s3] * eps;
  const T* f1 = nullptr;
  const T* f3 = nullptr;
  if (fs.softmax || fs.sinkhorn3) {
    T* f1w = f1_.get(nR_);
    for (int64_t j = 0; j < nJ_; ++j) g[j] = T(0);
    row_pass(g, f1w, false, T(0), HeadOut<T>{});
    f1 = f1w;
    if (fs.sinkhorn3) {
      T* f3w = f3_.get(nR_);
      col_pass(f1w, g, false, T(0), HeadOut<T>{});
      row_pass(g, f3w, false, T(0), HeadOut<T>{});
      f3 = f3w;
    }
  }
  // The score_stats columns are eps times the statistics of S', so their
  // weighted sum is y = sum_c eps beta_c stat_c.
  // The centered_stats columns are eps (max) and eps^2 (variance) times those of S'.
  T* st[5] = {nullptr, nullptr, nullptr, nullptr, nullptr};
  T* y = nullptr;
  if (p_st >= 0) {
    T w[3], wc[2];
    const T* shift = stats_weights(fs, beta, p_st, eps, w, wc);
    const int64_t nv = geo_.nRw;  // col_stats writes whole vectors
    st[0] = smx_.get(nv), st[1] = smean_.get(nv), st[2] = ssd_.get(nv);
    y = sy_.get(nv);
    if (fs.cstats) st[3] = smxc_.get(nv), st[4] = svc_.get(nv);
    score_stats(st[0], st[1], st[2], w, y, shift, st[3], st[4], wc);
  }
  if (psi) {
    // The same columns as features(), rounded like the reference.
    Scratch& s0 = scratch_[0];
    s0.col.resize(nR_);
    T* col = s0.col.data();
    const T e = static_cast<T>(eps);
    if (p_alpha >= 0) take_column(nR_, alpha, nullptr, p_alpha, s0, psi);
    if (p_soft >= 0) {
      for (int64_t r = 0; r < nR_; ++r) col[r] = e * f1[r] + alpha[r];
      take_column(nR_, col, nullptr, p_soft, s0, psi);
    }
    if (p_s3 >= 0) {
      for (int64_t r = 0; r < nR_; ++r) col[r] = e * f3[r] + alpha[r];
      take_column(nR_, col, nullptr, p_s3, s0, psi);
    }
    const T scale[5] = {e, e, e, e, static_cast<T>(eps * eps)};
    for (int c = 0; c < (fs.cstats ? 5 : 3) && p_st >= 0; ++c) {
      for (int64_t r = 0; r < nR_; ++r) col[r] = scale[c] * st[c][r];
      take_column(nR_, col, nullptr, p_st + c, s0, psi);
    }
  }
  // phi_i = acc_i + x_i - shift - mean(x), x = ca alpha + b1 f1 + b3 f3 + y.
  const double inv_eps = 1.0 / eps;
  if (fs.L == 0) {
    // Slice-free maps (the common case at short lengths): one vectorised
    // kernel per instruction set, the mean in float64 (this file is built
    // for the baseline instruction set: its loops were 2% of a 2-pass call).
    kt_.map_tail(nR_, alpha, f1, f3, y, static_cast<T>(ca), static_cast<T>(b1), static_cast<T>(b3),
                 static_cast<T>(inv_eps), reinterpret_cast<T*>(acc), phi, f);
  } else {
    double sum = 0;
    for (int64_t r = 0; r < nR_; ++r) {
      const double x = ca * static_cast<double>(alpha[r]) + (f1 ? b1 * static_cast<double>(f1[r]) : 0.0) +
                       (f3 ? b3 * static_cast<double>(f3[r]) : 0.0) + (y ? static_cast<double>(y[r]) : 0.0);
      acc[r] += x;
      sum += x;
    }
    shift += sum / static_cast<double>(nR_);
    for (int64_t r = 0; r < nR_; ++r) {
      const T ph = static_cast<T>(acc[r] - shift);
      if (phi) phi[r] = ph;
      f[r] = static_cast<T>(static_cast<double>(ph - alpha[r]) * inv_eps);
    }
  }
  closures(k, log_mult, f, g, out);
}

namespace {
template <class T>
const SortNetTable<T>& sort_table_of(const SortNetKernels& k);
template <>
const SortNetTable<float>& sort_table_of<float>(const SortNetKernels& k) {
  return k.f32;
}
template <>
const SortNetTable<double>& sort_table_of<double>(const SortNetKernels& k) {
  return k.f64;
}
}  // namespace

// The slice columns by lane blocks of kSortLanes slices: projections
// transposed ([row][slice], one GEMM each for queries and keys, the same
// accumulation order as the scalar path's), then per block the networks on
// the queries' (value, position) words and on the keys' values, the
// potentials lane-parallel, and the centering (SortNetTable::slice_block).
template <class T>
void Engine<T>::slice_features_network(const FeatureSpec<T>& fs, const double* beta, T* psi) {
  const Active& a = *act_;
  const SortNetTable<T>& sk = sort_table_of<T>(sortnet_for(kt_.isa));
  const int64_t L = fs.L, LB = kSortLanes, Lp = round_up(L, LB), m = nJ_;
  const T* th = fs.theta_t;
  if (!th) {
    T* t = thT_.get(d_ * Lp);
    for (int64_t k = 0; k < d_; ++k)
      for (int64_t l = 0; l < Lp; ++l) t[k * Lp + l] = l < L ? fs.theta_s[l * d_ + k] : T(0);
    th = t;
  }
  T* XT = XT_.get(nR_ * Lp);
  T* YT = YT_.get(m * Lp);
  sk.project(nR_, d_, qa_, d_, th, Lp, XT);
  sk.project(m, d_, ka_, d_, th, Lp, YT);
  kir32_.resize(m);
  for (int64_t r = 0; r < m; ++r) kir32_[r] = static_cast<int32_t>(a.key_in_rows[r]);
  extra32_.resize(a.extra_rows.size());
  for (size_t e = 0; e < a.extra_rows.size(); ++e) extra32_[e] = static_cast<int32_t>(a.extra_rows[e]);
  if (m != net_m_) {
    net_ = sort_network(m, &net_count_);
    net_m_ = m;
  }
  const int64_t nc = net_count_;
  const int32_t* comps = net_;
  const int64_t work_doubles = static_cast<int64_t>(sortnet_work_bytes(m, nR_) / 8) + 1;
  pfor(Lp / LB, [&](int64_t blk, int tid) {
    Scratch& s = scratch_[tid];
    SliceBlock<T> b;
    b.m = m;
    b.nR = nR_;
    b.lanes = static_cast<int>(std::min(LB, L - blk * LB));
    b.XT = XT + blk * LB;
    b.YT = YT + blk * LB;
    b.ld = Lp;
    b.kir = kir32_.data();
    b.extra = extra32_.data();
    b.n_extra = static_cast<int64_t>(extra32_.size());
    b.comps = comps;
    b.n_comps = nc;
    b.work = s.net_work.get(work_doubles);
    if (beta) {
      b.beta = beta + blk * LB;
      b.acc = s.acc.data();
      b.shift = &s.shift;
    } else {
      b.psi = psi + blk * LB * nR_;
      b.ldpsi = nR_;
    }
    sk.slice_block(b);
  });
}

template class Engine<float>;
template class Engine<double>;

}  // namespace detail
}  // namespace fast
}  // namespace asap
