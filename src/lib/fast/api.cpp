// The public fast path (fast/fast.h): argument checks, dtype dispatch, the
// parallel drive over heads, and conversion of the engine's compact per-head
// results to the reference path's tensors.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>

#include "asap/error.h"
#include "asap/layer_call.h"
#include "fast/engine.h"
#include "fast/fast.h"
#include "fast/slices.h"
#include "model/layer_checks.h"

namespace asap {
namespace fast {

using detail::Active;
using detail::Choice;
using detail::Engine;
using detail::HeadOut;

bool handles(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& key_mask) {
  auto cpu = [](const at::Tensor& t) { return !t.defined() || (t.device().is_cpu() && !t.is_sparse()); };
  if (!q.defined() || !cpu(q) || !cpu(k) || !cpu(v) || !cpu(key_mask)) return false;
  if (q.scalar_type() != at::kFloat && q.scalar_type() != at::kDouble) return false;
  return q.dim() != 4 || (q.size(0) * q.size(1) >= 1 && q.size(2) >= 1);
}

bool all_finite(const at::Tensor& t) {
  if (t.device().is_cpu() && t.is_contiguous() && !t.is_sparse()) {
    const auto& k = detail::kernels_for({});
    if (t.scalar_type() == at::kFloat) return k.f32.all_finite(t.data_ptr<float>(), t.numel());
    if (t.scalar_type() == at::kDouble) return k.f64.all_finite(t.data_ptr<double>(), t.numel());
  }
  return t.isfinite().all().item<bool>();
}

namespace {

template <class T>
constexpr T kNegInf = -std::numeric_limits<T>::infinity();

// The kernels' inputs (handles()), refused in one sentence otherwise.
void require_handled(const char* fn, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const at::Tensor& mask) {
  if (handles(q, k, v, mask)) return;
  auto where = [](const at::Tensor& t) {
    return t.defined() ? asap::str(t.device(), " ", t.scalar_type(), " ", t.sizes()) : std::string("undefined");
  };
  throw Error(asap::str("asap::fast::", fn,
                        " takes CPU float32/float64 tensors with at least one head and one token (asap::run_teacher "
                        "and asap::run_layer take the others), found q ",
                        where(q), ", k ", where(k), ", v ", where(v), ", key_mask ", where(mask)));
}

// t as a contiguous tensor of type st: t itself when it is one already
// (Tensor::to goes through the dispatcher even when it has nothing to do).
at::Tensor typed_contiguous(const at::Tensor& t, at::ScalarType st) {
  return t.scalar_type() == st ? t.contiguous() : t.to(st).contiguous();
}

// The key mask as a contiguous bool [B, n] (undefined = none), with the
// reference path's checks and messages.
at::Tensor checked_mask(const at::Tensor& key_mask, int64_t B, int64_t n) {
  if (!key_mask.defined()) return at::Tensor();
  ASAP_CHECK(key_mask.dim() == 2 && key_mask.size(0) == B && key_mask.size(1) == n,
             "key-padding mask: expected shape [", B, ", ", n, "], found ", key_mask.sizes());
  auto m = key_mask.device().is_cpu() ? typed_contiguous(key_mask, at::kBool)
                                      : key_mask.to(at::kCPU, at::kBool).contiguous();
  // Row by row here: any(-1).all().item() was three dispatched operators and
  // two tensors on every masked call.
  const bool* p = m.data_ptr<bool>();
  for (int64_t b = 0; b < B; ++b)
    ASAP_CHECK(std::any_of(p + b * n, p + (b + 1) * n, [](bool x) { return x; }),
               "key-padding mask: every sequence needs at least one token");
  return m;
}

// Runs per_head(engine, bh) for every (batch, head), heads over threads or
// passes over threads as `choice` says.
// Short sequences: each thread keeps its engine (and the engine its
// buffers) from call to call while the shape and the plan stay the same.
// An engine's twenty-odd buffers were allocated and freed on every call, a
// visible share of a call at n = 17. Long sequences get a fresh engine, so
// that large score tiles are not kept alive between calls.
constexpr int64_t kCachedEngineMaxN = 256;

template <class T>
Engine<T>& thread_engine(const detail::KernelTable<T>& kt, int64_t n, int64_t d, int64_t dv, const Choice& ch) {
  struct Slot {
    const void* kt = nullptr;
    int64_t n = -1, d = -1, dv = -1, chunk = -1;
    bool head_parallel = false, store = false;
    int threads = -1, transposed_rows = -2;
    std::unique_ptr<Engine<T>> eng;
  };
  thread_local Slot s;
  // Every field of the Choice is part of the key: an engine keeps its Choice.
  if (!s.eng || s.kt != &kt || s.n != n || s.d != d || s.dv != dv || s.chunk != ch.chunk_rows ||
      s.head_parallel != ch.head_parallel || s.store != ch.store || s.threads != ch.threads ||
      s.transposed_rows != ch.transposed_rows) {
    s.eng = std::make_unique<Engine<T>>(kt, n, d, dv, ch);
    s.kt = &kt, s.n = n, s.d = d, s.dv = dv, s.chunk = ch.chunk_rows;
    s.head_parallel = ch.head_parallel, s.store = ch.store, s.threads = ch.threads;
    s.transposed_rows = ch.transposed_rows;
  }
  return *s.eng;
}

// One head of a [B, H] batch as drive() hands it over: flat index bh = b * H + h.
struct Head {
  int64_t bh, b, h;
};

// Runs before no heads (drive() without a per-range step).
struct NoRange {
  void operator()(int64_t, int64_t) const {}
};

// per_range(b, e) runs before the heads b..e-1 on the thread that runs them
// (a range's work done once, e.g. alpha for all its rows). Both steps are
// template parameters: as std::function objects their captures were a heap
// allocation each per call.
template <class T, class PerHead, class PerRange = NoRange>
void drive(const detail::KernelTable<T>& kt, const Choice& ch, int64_t B, int64_t H, int64_t n, int64_t d, int64_t dv,
           const PerHead& per_head, const PerRange& per_range = {}) {
  const bool cache = n <= kCachedEngineMaxN;
  const int64_t BH = B * H;
  // The heads b..e-1 with their sequence and head indices counted along
  // (one division per range: two per head were about 1% of a 3-pass call at
  // n = 17 on Zen 2, docs/performance.md, "Integer divisions per head").
  const auto heads = [&](Engine<T>& eng, int64_t b, int64_t e) {
    Head hd{b, b / H, b % H};
    for (; hd.bh < e; ++hd.bh) {
      per_head(eng, hd);
      if (++hd.h == H) hd.h = 0, ++hd.b;
    }
  };
  if (ch.head_parallel) {
    const auto run = [&](int64_t b, int64_t e) {
      const detail::FlushDenormals ftz;
      std::unique_ptr<Engine<T>> own;
      if (!cache) own = std::make_unique<Engine<T>>(kt, n, d, dv, ch);
      Engine<T>& eng = cache ? thread_engine(kt, n, d, dv, ch) : *own;
      per_range(b, e);
      heads(eng, b, e);
    };
    // One head on the calling thread: LibTorch's parallel_for starts the
    // whole team even for one item (about 3 us at n = 17 on the 2-core VM of
    // docs/performance.md, "Fewer heads than threads").
    if (BH == 1)
      run(0, 1);
    else
      at::parallel_for(0, BH, 1, run);
  } else {
    const detail::FlushDenormals ftz;
    Engine<T> eng(kt, n, d, dv, ch);
    per_range(0, BH);
    heads(eng, 0, BH);
  }
}

// alpha_i = (scale/2) ||q_i||^2 over R, rounded like the reference (sum, then
// times s/2), the sum in float64 vectors (a scalar chain per row was a third
// of a head's fixed cost at n = 17).
template <class T>
void query_alpha(const detail::KernelTable<T>& kt, const T* q, const Active& a, int64_t d, double scale, T* out) {
  kt.row_sqnorm(static_cast<int64_t>(a.rows.size()), a.rows.data(), q, d, static_cast<T>(0.5 * scale), out);
}

// Per-thread scratch vectors that keep their capacity between heads and
// calls: per-head std::vector allocations were a few percent of a call at
// n = 17. `slot` tells apart the buffers one head needs at once. 64-byte
// aligned: the duals are read by full vectors in every pass, and a
// std::vector's 16-byte alignment split those loads across cache lines
// (the row pass ran 7% slower on one slot than on another at n = 17).
// `first` is the first head of the range the calling thread runs (set by a
// per_range of drive(), read by its per-head calls on the same thread). A
// per-head call takes the whole area once: each thread_local access in this
// shared library is a call to __tls_get_addr.
template <class T>
struct ThreadScratch {
  detail::Buf<T> bufs[6];
  int64_t first = 0;
  T* get(int slot, int64_t count) { return bufs[slot].get(count); }
};

template <class T>
ThreadScratch<T>& thread_scratch() {
  thread_local ThreadScratch<T> s;
  return s;
}

template <class T>
T* scratch(int slot, int64_t count) {
  return thread_scratch<T>().get(slot, count);
}

// An output tensor the heads fill: uninitialised when they write every
// element, else zeros (rows of dropped padded queries, masked attention
// columns). Zeroing serially before the heads start was 2% of a padded
// text batch's call when nothing needed it.
at::Tensor new_output(at::IntArrayRef sizes, const at::TensorOptions& opts, bool every_element) {
  return every_element ? at::empty(sizes, opts) : at::zeros(sizes, opts);
}

// The layer output O of a call, which the next call on the same thread hands
// out again once nothing else holds it: at::empty (through the dispatcher,
// a TensorImpl, an aligned allocation) and the release of the caller's
// tensor were about a quarter of a 2.8 us call of one head at n = 17
// (docs/performance.md, "Per-call work at batch 1"). Reused only when the kept
// tensor is referenced by this slot alone (its TensorImpl and its storage,
// no weak references: no view, no alias), was never handed to Python (a
// released tensor's Python object lives on with it, PyTorch's PyObject
// preservation, so a Python weakref or attribute would see the next call),
// and is what a new output would be (shape, dtype, device, contiguous, no
// autograd, the same inference mode, no names or conjugate/negative bits).
// Outputs above kKeptOutputMaxBytes are not kept alive between calls.
constexpr int64_t kKeptOutputMaxBytes = int64_t(1) << 20;

bool reusable(const at::Tensor& t, at::IntArrayRef sizes, const at::TensorOptions& opts) {
  return t.defined() && t.use_count() == 1 && t.weak_use_count() == 1 && t.storage().use_count() == 1 &&
         t.unsafeGetTensorImpl()->_unchecked_untagged_pyobj() == nullptr && t.sizes() == sizes &&
         t.dtype() == opts.dtype() && t.device() == opts.device() && t.is_contiguous() && t.storage_offset() == 0 &&
         !t.requires_grad() && t.is_inference() == c10::InferenceMode::is_enabled() && !t.has_names() && !t.is_conj() &&
         !t.is_neg();
}

at::Tensor layer_output(at::IntArrayRef sizes, const at::TensorOptions& opts, bool every_element) {
  thread_local at::Tensor kept;
  if (reusable(kept, sizes, opts)) {
    if (!every_element) std::memset(kept.data_ptr(), 0, kept.nbytes());
    return kept;
  }
  at::Tensor t = new_output(sizes, opts, every_element);
  kept = t.nbytes() <= static_cast<size_t>(kKeptOutputMaxBytes) ? t : at::Tensor();
  return t;
}

// Heads h0..h1-1 all finite in q and k [., n, d] and v [., n, dv] (or null).
template <class T>
bool heads_finite(const detail::KernelTable<T>& kt, const T* q, const T* k, const T* v, int64_t h0, int64_t h1,
                  int64_t n, int64_t d, int64_t dv) {
  const int64_t c = h1 - h0;
  return kt.all_finite(q + h0 * n * d, c * n * d) && kt.all_finite(k + h0 * n * d, c * n * d) &&
         (!v || kt.all_finite(v + h0 * n * dv, c * n * dv));
}

// fast.h, nonfinite_heads: the check that drive() runs per range of heads,
// on the thread that runs them (one sweep over the range's inputs; per head
// only when it finds something: per-head calls on 17 x 16 blocks cost what
// the serial sweep did). Without flags (nullptr) it checks nothing.
template <class T>
struct NonfiniteCheck {
  uint8_t* bad = nullptr;
  const detail::KernelTable<T>* kt = nullptr;
  const T *q = nullptr, *k = nullptr, *v = nullptr;
  int64_t n = 0, d = 0, dv = 0;
  void operator()(int64_t b, int64_t e) const {
    if (!bad || heads_finite(*kt, q, k, v, b, e, n, d, dv)) return;
    for (int64_t h = b; h < e; ++h) bad[h] = !heads_finite(*kt, q, k, v, h, h + 1, n, d, dv);
  }
};

// Sizes the flags for BH heads (all clear) and returns their check.
template <class T>
NonfiniteCheck<T> flag_nonfinite(std::vector<uint8_t>* flags, int64_t BH, const detail::KernelTable<T>& kt, const T* q,
                                 const T* k, const T* v, int64_t n, int64_t d, int64_t dv) {
  if (!flags) return {};
  flags->assign(static_cast<size_t>(BH), 0);
  return NonfiniteCheck<T>{flags->data(), &kt, q, k, v, n, d, dv};
}

template <class T>
TeacherResult teacher_impl(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                           double scale, int T_budget, const Convention& c, bool want_attention, const Tuning& tuning,
                           bool want_duals, std::vector<uint8_t>* nonfinite) {
  const int64_t B = q.size(0), H = q.size(1), n = q.size(2), d = q.size(3);
  const int64_t dv = v.defined() ? v.size(3) : 0;
  const auto& kt = detail::table_of<T>(detail::kernels_for(tuning));
  detail::ActiveSets own_sets;
  const detail::ActiveSets& act =
      detail::call_sets(mask.defined() ? mask.data_ptr<bool>() : nullptr, B, n, c.drop_padded_queries, &own_sets);
  const bool full = !mask.defined();
  const Choice ch = detail::choose(B * H, n, sizeof(T), kt.nt_nr, tuning);
  auto opts = q.options();
  TeacherResult res;
  at::Tensor f, g, O, A, fstar, phibar;
  if (want_duals) f = at::empty({B, H, n}, opts), g = at::empty({B, H, n}, opts);
  // Every row of O is written unless padded queries are dropped.
  const bool every_row = full || !c.drop_padded_queries;
  if (v.defined()) O = layer_output({B, H, n, dv}, opts, every_row);
  if (want_attention) A = new_output({B, H, n, n}, opts, full);
  const bool has_star = want_duals && T_budget >= 2;
  if (has_star) fstar = at::empty({B, H, n}, opts), phibar = at::empty({B, H, n}, opts);
  const T* qp = q.data_ptr<T>();
  const T* kp = k.data_ptr<T>();
  const T* vp = v.defined() ? v.data_ptr<T>() : nullptr;
  T* fp = want_duals ? f.data_ptr<T>() : nullptr;
  T* gp = want_duals ? g.data_ptr<T>() : nullptr;
  T* Op = O.defined() ? O.data_ptr<T>() : nullptr;
  T* Ap = A.defined() ? A.data_ptr<T>() : nullptr;
  T* fsp = has_star ? fstar.data_ptr<T>() : nullptr;
  T* pbp = has_star ? phibar.data_ptr<T>() : nullptr;
  const T eps = static_cast<T>(c.eps);
  const T log_mult = c.multiply_by_n ? static_cast<T>(std::log(static_cast<double>(n))) : T(0);
  drive<T>(
      kt, ch, B, H, n, d, dv,
      [&](Engine<T>& eng, const Head& hd) {
        const int64_t bh = hd.bh;
        const Active& a = act[hd.b];
        eng.load(qp + bh * n * d, kp + bh * n * d, vp ? vp + bh * n * dv : nullptr, a, scale / c.eps);
        const int64_t nR = eng.rows(), nJ = eng.keys();
        ThreadScratch<T>& ts = thread_scratch<T>();
        T* fh = ts.get(0, nR);
        T* gh = ts.get(1, nJ);
        T* fs = has_star ? ts.get(2, nR) : nullptr;
        HeadOut<T> out{Op ? Op + bh * n * dv : nullptr, Ap ? Ap + bh * n * n : nullptr};
        eng.teacher(T_budget, log_mult, fh, gh, fs, out);
        if (!want_duals) return;
        T* fo = fp + bh * n;
        T* go = gp + bh * n;
        for (int64_t i = 0; i < n; ++i) fo[i] = kNegInf<T>, go[i] = kNegInf<T>;
        for (int64_t r = 0; r < nR; ++r) fo[a.rows[r]] = eps * fh[r];
        for (int64_t j = 0; j < nJ; ++j) go[a.keys[j]] = eps * gh[j];
        if (has_star) {
          T* alpha = ts.get(3, nR);
          query_alpha(kt, qp + bh * n * d, a, d, scale, alpha);
          T* so = fsp + bh * n;
          T* po = pbp + bh * n;
          for (int64_t i = 0; i < n; ++i) so[i] = kNegInf<T>, po[i] = kNegInf<T>;
          double sum = 0;
          for (int64_t r = 0; r < nR; ++r) {
            const T fr = eps * fs[r];
            so[a.rows[r]] = fr;
            fs[r] = fr + alpha[r];
            sum += static_cast<double>(fs[r]);
          }
          const double mean = sum / static_cast<double>(nR);
          for (int64_t r = 0; r < nR; ++r) po[a.rows[r]] = static_cast<T>(static_cast<double>(fs[r]) - mean);
        }
      },
      flag_nonfinite(nonfinite, B * H, kt, qp, kp, vp, n, d, dv));
  res.f = f;
  res.g = g;
  res.O = O;
  res.A = A;
  res.f_star = fstar;
  res.phi_bar_star = phibar;
  return res;
}

void check_qk(const at::Tensor& q, const at::Tensor& k) {
  ASAP_CHECK(q.dim() == 4 && k.dim() == 4 && q.sizes() == k.sizes(),
             "teacher: q and k must both be [B, H, n, d] with equal shapes, found ", q.sizes(), " and ", k.sizes());
}

// The engine's view of a feature family; bank kept alive by the caller.
template <class T>
detail::FeatureSpec<T> feature_spec(const FeatureFamily& fam, const detail::ScaledBank<T>& bank) {
  detail::FeatureSpec<T> fs;
  fs.theta_s = bank.rows.empty() ? nullptr : bank.rows.data();
  fs.theta_t = bank.cols.empty() ? nullptr : bank.cols.data();
  fs.L = fam.slices;
  fs.alpha = fam.alpha;
  fs.softmax = fam.softmax_dual;
  fs.sinkhorn3 = fam.sinkhorn_dual3;
  fs.stats = fam.score_stats;
  fs.cstats = fam.centered_stats;
  return fs;
}

// One fused call of a compiled ASAP map (Engine::asap_map per head): no
// [B, H, n, n] tensor, no feature tensor and no phi_hat unless asked for,
// per-thread scratch only.
template <class T>
LayerOutput layer_impl(const CompiledLayer& L, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const at::Tensor& mask, int closures, const RunOptions& opt, const Tuning& tuning,
                       std::vector<uint8_t>* nonfinite) {
  const LayerSpec& s = L.spec;
  const int64_t B = q.size(0), H = q.size(1), n = q.size(2), d = q.size(3), dv = v.size(3);
  const auto& kt = detail::table_of<T>(detail::kernels_for(tuning));
  const Convention c = convention_of(s);
  detail::ActiveSets own_sets;
  const detail::ActiveSets& act =
      detail::call_sets(mask.defined() ? mask.data_ptr<bool>() : nullptr, B, n, c.drop_padded_queries, &own_sets);
  const bool full = !mask.defined();
  const Choice ch = detail::choose(B * H, n, sizeof(T), kt.nt_nr, tuning);
  const FeatureFamily& fam = L.family;
  const int64_t P = fam.num_columns();
  ASAP_CHECK(L.coef.dim() == 2 && L.coef.size(1) == P && (L.coef.size(0) == 1 || L.coef.size(0) == H),
             "coefficients: expected [1, ", P, "] or [", H, ", ", P, "], found ", L.coef.sizes());
  const detail::ScaledBank<T> bank(L.theta, fam.slices, s.score_scale);
  const detail::FeatureSpec<T> fs = feature_spec(fam, bank);
  at::Tensor coef = L.coef;
  if (!(coef.device().is_cpu() && coef.scalar_type() == at::kDouble && coef.is_contiguous()))
    coef = coef.to(at::kCPU, at::kDouble).contiguous();
  const double* cp = coef.data_ptr<double>();
  const bool per_head = coef.size(0) == H && H > 1;
  auto opts = q.options();
  const bool every_row = full || !c.drop_padded_queries;  // as in teacher_impl
  at::Tensor O = layer_output({B, H, n, dv}, opts, every_row);
  at::Tensor A, phi, Psi;
  if (opt.return_attention) A = new_output({B, H, n, n}, opts, full);
  if (opt.return_phi) phi = new_output({B, H, n}, opts, full);
  if (opt.return_features) Psi = new_output({B, H, n, P}, opts, full);
  const T* qp = q.data_ptr<T>();
  const T* kp = k.data_ptr<T>();
  const T* vp = v.data_ptr<T>();
  T* Op = O.data_ptr<T>();
  T* Ap = A.defined() ? A.data_ptr<T>() : nullptr;
  T* php = phi.defined() ? phi.data_ptr<T>() : nullptr;
  T* psp = Psi.defined() ? Psi.data_ptr<T>() : nullptr;
  const double eps = c.eps;
  const T log_mult = c.multiply_by_n ? static_cast<T>(std::log(static_cast<double>(n))) : T(0);
  const double scale = s.score_scale;
  // When every head's rows are all n rows (no mask, or a mask that keeps the
  // padded queries, as the Sinkformer text model does), they are contiguous
  // across heads: alpha for a thread's heads in one sweep (at n = 17 the
  // per-head calls, each with its index loads and a remainder row, cost 3% of
  // a call; on the padded text batch 3% of a 6-pass map's instructions).
  // Each thread writes its range's alpha to its own scratch (slot 5), from
  // the range's first head (ThreadScratch::first). With one buffer of the caller's,
  // the other thread's stores went to the caller's memory: two heads on 2
  // threads took 3.95 us (3.92 on one), now 3.75 (docs/performance.md).
  const auto range_check = flag_nonfinite(nonfinite, B * H, kt, qp, kp, vp, n, d, dv);
  const auto per_range = [&](int64_t b, int64_t e) {
    range_check(b, e);
    if (every_row) {
      ThreadScratch<T>& ts = thread_scratch<T>();
      ts.first = b;
      kt.row_sqnorm((e - b) * n, nullptr, qp + b * n * d, d, static_cast<T>(0.5 * scale), ts.get(5, (e - b) * n));
    }
  };
  drive<T>(
      kt, ch, B, H, n, d, dv,
      [&](Engine<T>& eng, const Head& hd) {
        const int64_t bh = hd.bh;
        const Active& a = act[hd.b];
        const T* qh = qp + bh * n * d;
        eng.load(qh, kp + bh * n * d, vp + bh * n * dv, a, scale / eps);
        const int64_t nR = eng.rows(), nJ = eng.keys();
        ThreadScratch<T>& ts = thread_scratch<T>();
        T* alpha = every_row ? ts.bufs[5].data() + (bh - ts.first) * n : ts.get(0, nR);
        T* fh = ts.get(1, nR);
        T* gh = ts.get(2, nJ);
        T* ph = php ? ts.get(3, nR) : nullptr;
        T* ps = psp ? ts.get(4, P * nR) : nullptr;
        if (!every_row) query_alpha(kt, qh, a, d, scale, alpha);
        const double* beta = cp + (per_head ? hd.h * P : 0);
        HeadOut<T> out{Op + bh * n * dv, Ap ? Ap + bh * n * n : nullptr};
        eng.asap_map(fs, beta, eps, alpha, closures, log_mult, fh, gh, out, ph, ps);
        if (ph) {
          T* po = php + bh * n;
          for (int64_t r = 0; r < nR; ++r) po[a.rows[r]] = ph[r];
        }
        if (ps) {
          T* o = psp + bh * n * P;
          for (int64_t r = 0; r < nR; ++r)
            for (int64_t p = 0; p < P; ++p) o[a.rows[r] * P + p] = ps[p * nR + r];
        }
      },
      per_range);
  LayerOutput r;
  r.out = O;
  r.attention = A;
  r.phi_hat = phi;
  r.features = Psi;
  return r;
}

template <class T>
at::Tensor features_impl(const at::Tensor& q, const at::Tensor& k, const at::Tensor& mask, bool drop,
                         const at::Tensor& theta, const FeatureFamily& fam, double scale, double eps,
                         const Tuning& tuning) {
  const int64_t B = q.size(0), H = q.size(1), n = q.size(2), d = q.size(3);
  const auto& kt = detail::table_of<T>(detail::kernels_for(tuning));
  detail::ActiveSets own_sets;
  const detail::ActiveSets& act =
      detail::call_sets(mask.defined() ? mask.data_ptr<bool>() : nullptr, B, n, drop, &own_sets);
  const Choice ch = detail::choose(B * H, n, sizeof(T), kt.nt_nr, tuning);
  const int64_t P = fam.num_columns();
  const detail::ScaledBank<T> bank(theta, fam.slices, scale);
  const detail::FeatureSpec<T> fs = feature_spec(fam, bank);
  // Without a mask every row carries mass and is written below; zeroing a
  // large Psi would start a parallel region of its own (about 60 us at n = 50).
  at::Tensor Psi = new_output({B, H, n, P}, q.options(), !mask.defined());
  const T* qp = q.data_ptr<T>();
  const T* kp = k.data_ptr<T>();
  T* out = Psi.data_ptr<T>();
  drive<T>(kt, ch, B, H, n, d, 0, [&](Engine<T>& eng, const Head& hd) {
    const int64_t bh = hd.bh;
    const Active& a = act[hd.b];
    const T* qh = qp + bh * n * d;
    eng.load(qh, kp + bh * n * d, nullptr, a, scale / eps, fs.needs_scores());
    const int64_t nR = eng.rows();
    T* alpha = scratch<T>(0, nR);
    T* psi = scratch<T>(1, P * nR);
    query_alpha(kt, qh, a, d, scale, alpha);
    eng.features(fs, eps, alpha, psi);
    T* o = out + bh * n * P;
    for (int64_t r = 0; r < nR; ++r)
      for (int64_t p = 0; p < P; ++p) o[a.rows[r] * P + p] = psi[p * nR + r];
  });
  return Psi;
}

template <class T>
at::Tensor closure_errors_impl(const at::Tensor& q, const at::Tensor& k, const at::Tensor& mask, double scale,
                               int T_budget, const Convention& c, const at::Tensor& phi, const std::vector<int>& kc,
                               int k_max, const Tuning& tuning) {
  const int64_t B = q.size(0), H = q.size(1), n = q.size(2), d = q.size(3), C = phi.size(0);
  const auto& kt = detail::table_of<T>(detail::kernels_for(tuning));
  detail::ActiveSets own_sets;
  const detail::ActiveSets& act =
      detail::call_sets(mask.defined() ? mask.data_ptr<bool>() : nullptr, B, n, c.drop_padded_queries, &own_sets);
  const Choice ch = detail::choose(B * H, n, sizeof(T), kt.nt_nr, tuning);
  at::Tensor out = at::zeros({C, k_max, B, H}, at::kDouble);
  const T* qp = q.data_ptr<T>();
  const T* kp = k.data_ptr<T>();
  const T* pp = phi.data_ptr<T>();
  double* op = out.data_ptr<double>();
  const double eps = c.eps;
  drive<T>(kt, ch, B, H, n, d, 0, [&](Engine<T>& eng, const Head& hd) {
    const int64_t bh = hd.bh;
    const Active& a = act[hd.b];
    const T* qh = qp + bh * n * d;
    eng.load(qh, kp + bh * n * d, nullptr, a, scale / eps);
    const int64_t nR = eng.rows(), nJ = eng.keys();
    T* alpha = scratch<T>(0, nR);
    T* fs = scratch<T>(1, nR);
    T* gs = scratch<T>(2, nJ);
    T* f = scratch<T>(3, nR);
    T* g = scratch<T>(4, nJ);
    std::fill(gs, gs + nJ, T(0));
    query_alpha(kt, qh, a, d, scale, alpha);
    // The teacher's duals after T passes from g' = 0 (no final fused pass: the tile stays intact).
    for (int t = 1; t <= T_budget; ++t) {
      if (t % 2 == 1)
        eng.row_pass(gs, fs, false, T(0), HeadOut<T>{});
      else
        eng.col_pass(fs, gs, false, T(0), HeadOut<T>{});
    }
    eng.cache_plan(fs, gs);
    for (int64_t cand = 0; cand < C; ++cand) {
      const T* ph = pp + (cand * B * H + bh) * n;
      for (int64_t r = 0; r < nR; ++r) f[r] = static_cast<T>(static_cast<double>(ph[a.rows[r]] - alpha[r]) / eps);
      for (int t = 1; t <= kc[cand]; ++t) {
        if (t % 2 == 1)
          eng.col_pass(f, g, false, T(0), HeadOut<T>{});
        else
          eng.row_pass(g, f, false, T(0), HeadOut<T>{});
        double num, den;
        eng.plan_distance(f, g, nullptr, nullptr, &num, &den);
        op[(cand * k_max + (t - 1)) * B * H + bh] = std::sqrt(num / den);
      }
    }
  });
  return out;
}

}  // namespace

at::Tensor closure_errors(const at::Tensor& q, const at::Tensor& k, const at::Tensor& key_mask, double scale, int T,
                          const Convention& c, const at::Tensor& phi_hat, const std::vector<int>& kc,
                          const Tuning& tuning) {
  ASAP_CHECK(k.defined(), "closure_errors: k is undefined");
  require_handled("closure_errors", q, k, at::Tensor(), key_mask);
  check_qk(q, k);
  ASAP_CHECK(T >= 1, "Sinkhorn budget T must be at least 1, found ", T);
  ASAP_CHECK(phi_hat.dim() == 4 && static_cast<int64_t>(kc.size()) == phi_hat.size(0),
             "closure_errors: one closure count per candidate expected (", phi_hat.dim() == 4 ? phi_hat.size(0) : -1,
             "), found ", kc.size());
  int k_max = 1;
  for (int x : kc) {
    ASAP_CHECK(x >= 1, "number of closures must be at least 1, found ", x);
    k_max = std::max(k_max, x);
  }
  ASAP_CHECK(c.eps > 0, "entropy eps must be positive, found ", c.eps);
  const int64_t B = q.size(0), H = q.size(1), n = q.size(2);
  ASAP_CHECK(phi_hat.dim() == 4 && phi_hat.size(1) == B && phi_hat.size(2) == H && phi_hat.size(3) == n,
             "closure_errors: phi_hat must be [C, ", B, ", ", H, ", ", n, "], found ", phi_hat.sizes());
  auto mask = checked_mask(key_mask, B, n);
  auto qc = q.contiguous();
  auto kk = typed_contiguous(k, q.scalar_type());
  auto pc = phi_hat.to(at::kCPU, q.scalar_type()).contiguous();
  if (pc.size(0) == 0)
    return at::zeros({0, k_max, B, H}, at::kDouble);  // no candidates (empty batches are refused above)
  if (q.scalar_type() == at::kFloat)
    return closure_errors_impl<float>(qc, kk, mask, scale, T, c, pc, kc, k_max, tuning);
  return closure_errors_impl<double>(qc, kk, mask, scale, T, c, pc, kc, k_max, tuning);
}

TeacherResult teacher(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& key_mask,
                      double scale, int T, const Convention& c, bool want_attention, const Tuning& tuning,
                      bool want_duals, std::vector<uint8_t>* nonfinite_heads) {
  ASAP_CHECK(k.defined(), "teacher: k is undefined");
  require_handled("teacher", q, k, v, key_mask);
  ASAP_CHECK(T >= 1, "Sinkhorn budget T must be at least 1, found ", T);
  check_qk(q, k);
  ASAP_CHECK(c.eps > 0, "entropy eps must be positive, found ", c.eps);
  const int64_t B = q.size(0), H = q.size(1), n = q.size(2);
  if (v.defined())
    ASAP_CHECK(v.dim() == 4 && v.size(0) == B && v.size(1) == H && v.size(2) == n, "teacher: v must be [", B, ", ", H,
               ", ", n, ", dv], found ", v.sizes());
  auto mask = checked_mask(key_mask, B, n);
  auto qc = q.contiguous();
  auto kc = typed_contiguous(k, q.scalar_type());
  auto vc = v.defined() ? typed_contiguous(v, q.scalar_type()) : at::Tensor();
  if (q.scalar_type() == at::kFloat)
    return teacher_impl<float>(qc, kc, vc, mask, scale, T, c, want_attention, tuning, want_duals, nonfinite_heads);
  return teacher_impl<double>(qc, kc, vc, mask, scale, T, c, want_attention, tuning, want_duals, nonfinite_heads);
}

LayerOutput asap_layer(const CompiledLayer& L, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const at::Tensor& key_mask, const RunOptions& opt, const Tuning& tuning,
                       std::vector<uint8_t>* nonfinite_heads) {
  const LayerSpec& s = L.spec;
  ASAP_CHECK(L.kind == OperatorKind::kAsap, "layer '", s.name, "' runs ", L.describe(),
             ": asap::fast::asap_layer runs compiled ASAP maps only (asap::run_layer runs every kind)");
  ASAP_CHECK(k.defined() && v.defined(), "layer '", s.name, "': k and v must be defined");
  require_handled("asap_layer", q, k, v, key_mask);
  asap::detail::check_layer_inputs(L, q, k, v);
  ASAP_CHECK(opt.closures >= 0, "number of closures must be at least 1 (0 = the layer's default), found ",
             opt.closures);
  const int k_closures = opt.closures > 0 ? opt.closures : L.default_closures;
  ASAP_CHECK(k_closures >= 1, "number of closures must be at least 1, found ", k_closures);
  ASAP_CHECK(s.eps > 0, "entropy eps must be positive, found ", s.eps);
  ASAP_CHECK(L.family.num_columns() >= 1, "feature family has no columns");
  if (L.family.slices > 0) {
    ASAP_CHECK(L.theta.dim() == 2 && L.theta.size(0) == q.size(-1), "slice bank: expected [", q.size(-1),
               ", L], found ", L.theta.sizes());
    ASAP_CHECK(L.family.slices <= L.theta.size(1), "slice count ", L.family.slices, " outside the bank's 1..",
               L.theta.size(1));
  }
  const int64_t B = q.size(0), n = q.size(2);
  auto mask = checked_mask(key_mask, B, n);
  auto qc = q.contiguous();
  auto kc = typed_contiguous(k, q.scalar_type());
  auto vc = typed_contiguous(v, q.scalar_type());
  if (q.scalar_type() == at::kFloat)
    return layer_impl<float>(L, qc, kc, vc, mask, k_closures, opt, tuning, nonfinite_heads);
  return layer_impl<double>(L, qc, kc, vc, mask, k_closures, opt, tuning, nonfinite_heads);
}

at::Tensor build_features(const at::Tensor& q, const at::Tensor& k, const at::Tensor& key_mask,
                          bool drop_padded_queries, const at::Tensor& theta, const FeatureFamily& family, double scale,
                          double eps, const Tuning& tuning) {
  ASAP_CHECK(family.num_columns() >= 1, "feature family has no columns");
  ASAP_CHECK(k.defined(), "features: k is undefined");
  require_handled("build_features", q, k, at::Tensor(), key_mask);
  check_qk(q, k);
  if (family.slices > 0) {
    ASAP_CHECK(theta.dim() == 2 && theta.size(0) == q.size(-1), "slice bank: expected [", q.size(-1), ", L], found ",
               theta.sizes());
    ASAP_CHECK(family.slices >= 1 && family.slices <= theta.size(1), "slice count ", family.slices,
               " outside the bank's 1..", theta.size(1));
  }
  auto mask = checked_mask(key_mask, q.size(0), q.size(2));
  auto qc = q.contiguous();
  auto kc = typed_contiguous(k, q.scalar_type());
  if (q.scalar_type() == at::kFloat)
    return features_impl<float>(qc, kc, mask, drop_padded_queries, theta, family, scale, eps, tuning);
  return features_impl<double>(qc, kc, mask, drop_padded_queries, theta, family, scale, eps, tuning);
}

}  // namespace fast
}  // namespace asap
