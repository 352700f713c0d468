// asap_bench -- latency and peak memory of asapc's operators against their
// baselines, measured in one run with the same threads (issue 9).
//
//   asap_bench [--quick] [--json out.json] [--threads N] [--n 512,1024]
//              [--bh 1x4,4x4] [--T 6,10,20] [--d 64] [--reps 5] [--no-mem]
//              [--ref-max-n 2048] [--pytorch] [--pytorch-max-n 2048]
//              [--wait-policy passive|active] [--keep-blas]
//              [--features 16,64] [--sort auto|scalar|network|both]
//              [--lengths 5,11,5,8]
//
// --lengths: a key-padding mask, the real lengths of the batch's sequences
// (cycled over B, each clamped to n; tokens past a length are padding). Every
// asapc operator gets it (queries kept, as the Sinkformer text model does);
// the ATen softmax and esp baselines ignore it. Without it no mask is passed.
// Each result carries output_sum, the float64 sum of the operator's output
// in its warm-up call (inputs are seeded, so runs with and without --lengths
// can be compared: the asapc operators' sums change, the baselines' do not).
//
// Threads: every runtime gets the same count (--threads, default all
// cores): the program re-executes itself once with OMP_NUM_THREADS and
// OPENBLAS_NUM_THREADS set, and OMP_WAIT_POLICY=PASSIVE unless told
// otherwise (spinning OpenMP workers steal cores on a shared machine; see
// docs/decisions.md). LibTorch's own default here is 1 thread.
//
// Per configuration (n, B x H) every operator is warmed up once, then timed
// `reps` times in round-robin order (op1, op2, ..., op1, op2, ...) so that
// drift in machine load hits all of them alike; the report gives medians of
// wall time, and of the process CPU time (all threads, getrusage), which
// time-slicing by other processes does not inflate.
// Operators: "teacher_fast" / "sinkhorn" / "asap*" call the fused kernels
// (asap::fast); "layer_teacher" and "layer_s3" time the same teacher and
// 4-pass-family map through asap::run_layer, the entry that compile's
// latency phase, verify and the runtime use (input checks, NaN in NaN out).
// Peak extra memory is measured per operator in a fresh child process
// (this program re-executed with --mem-child): inputs are allocated, the
// operator is run once on a tiny input to start thread pools, the kernel's
// peak-RSS counter is reset (/proc/self/clear_refs), the operator runs once
// at full size, and the result is VmHWM - VmRSS(before): every byte the
// operator touched beyond its inputs, outputs included.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "asap/error.h"
#include "asap/features.h"
#include "asap/runtime.h"
#include "asap/teacher.h"
#include "fast/fast.h"
#include "fast/sort_network.h"

namespace {

using json = nlohmann::json;

struct Settings {
  std::vector<int64_t> ns{64, 128, 256, 512, 1024, 2048, 4096};
  std::vector<std::pair<int64_t, int64_t>> bh{{1, 4}, {4, 4}};
  std::vector<int> Ts{6, 10, 20};
  std::vector<int> ks{1, 2, 3, 4, 5};
  int64_t d = 64;
  int reps = 5;
  int threads = 0;
  bool mem = true;
  int64_t ref_max_n = 2048;
  bool pytorch = false;
  int64_t pytorch_max_n = 2048;
  std::string json_path;
  std::string only;  // comma-separated op names to run (default all)
  int64_t slices = 64;
  uint64_t seed = 1;
  // Features-only operators (fast::build_features with L slices, no
  // closures) for these slice counts, reported against one closure pass.
  std::vector<int64_t> feature_slices;
  std::vector<int64_t> lengths;  // --lengths: real sequence lengths (key mask), cycled over B
  std::string sort = "both";     // sort path of the features ops: auto, scalar, network, or both (auto and scalar)
};

struct Inputs {
  at::Tensor q, k, v;
  at::Tensor mask;  // [B, n] bool key mask (--lengths), or undefined
  int64_t B, H, n, d;
  double scale;
};

Inputs make_inputs(int64_t B, int64_t H, int64_t n, int64_t d, uint64_t seed,
                   const std::vector<int64_t>& lengths = {}) {
  at::manual_seed(seed);
  Inputs in;
  in.B = B, in.H = H, in.n = n, in.d = d;
  in.q = at::randn({B, H, n, d}, at::kFloat);
  in.k = at::randn({B, H, n, d}, at::kFloat);
  in.v = at::randn({B, H, n, d}, at::kFloat);
  in.scale = 1.0 / std::sqrt(static_cast<double>(d));
  if (!lengths.empty()) {
    in.mask = at::zeros({B, n}, at::kBool);
    for (int64_t b = 0; b < B; ++b)
      in.mask[b].narrow(0, 0, std::min(n, lengths[static_cast<size_t>(b) % lengths.size()])).fill_(true);
  }
  return in;
}

asap::CompiledLayer make_layer(int64_t H, int64_t d, int64_t slices, bool softmax, uint64_t seed,
                               bool sinkhorn3 = false, bool stats = false, bool cstats = false) {
  asap::CompiledLayer L;
  L.spec.name = "bench";
  L.spec.layout = asap::ProjLayout::kNone;
  L.spec.heads = H;
  L.spec.head_dim = d;
  L.spec.value_dim = d;
  L.spec.score_scale = 1.0 / std::sqrt(static_cast<double>(d));
  L.spec.eps = 1.0;
  L.spec.T = 6;
  // Slice-free families (slices = 0) keep a one-slice bank that no column uses.
  L.theta = asap::make_slice_bank(d, std::max<int64_t>(slices, 1), seed);
  L.family.slices = slices;
  L.family.alpha = true;
  L.family.softmax_dual = softmax;
  L.family.sinkhorn_dual3 = sinkhorn3;
  L.family.score_stats = stats || cstats;
  L.family.centered_stats = cstats;
  L.per_head = true;
  // Coefficients like a fitted map's: weight 1 on the family's last dual
  // column (f3, else f1, else alpha; never a score_stats column), small
  // random weights elsewhere. Purely
  // random weights give duals far from any plan, whose tiny entries turn
  // subnormal in the output GEMM: that times the data, not the kernel.
  at::manual_seed(seed + 7);
  L.coef =
      at::randn({H, L.family.num_columns()}, at::kDouble) * (0.05 / static_cast<double>(std::max<int64_t>(slices, 1)));
  L.coef.select(1, L.family.num_columns() - 1 - L.family.stats_columns()).add_(1.0);
  L.default_closures = 3;
  return L;
}

struct Op {
  std::string name;  // family: softmax, esp, teacher_fast, teacher_ref, sinkhorn, asap, asap_st, asap_cst, asap_sm,
                     // asap_s3, asap_s3c, asap_ref
  int param = 0;     // T or k (0 = none)
  std::function<void(const Inputs&)> run;
  std::string label() const { return param ? name + "_" + std::to_string(param) : name; }
};

// Reads one element so the result is observably used. During an operator's
// warm-up call (g_keep) the output itself is kept, for its checksum in the
// report (output_sum): what shows that the inputs, --lengths' mask
// included, reached the operator. Timed calls keep nothing.
volatile float g_sink = 0;
bool g_keep = false;
at::Tensor g_kept;
void sink(const at::Tensor& t) {
  if (t.defined() && t.numel()) g_sink = t.data_ptr<float>()[0];
  if (g_keep) g_kept = t;
}

// The FLOP/exponential bound of an operator on this machine (issue 14, item
// 3): its multiply-add flops at the measured FMA peak plus its
// exponentials at the measured exp peak (fast::measure_peak, all threads).
// Per head: the score and plan*V GEMMs, 2 n^2 (d + dv) flops (dv = d in
// this benchmark); one exp per
// score entry per closure (the last closure's exponentials are the plan's);
// the ASAP families add the slice projections (4 n d L flops) and their
// feature passes (softmax dual: one closure; f^3: three). Sorting, maxima,
// sums and memory traffic are not in it, so it is a bound no operator
// reaches. 0 for operators it does not model.
double bound_s(const Op& op, int64_t n, int64_t BH, int64_t d, int64_t slices, const asap::fast::MachinePeak& pk) {
  if (pk.flops_per_s <= 0 || pk.exps_per_s <= 0) return 0;
  const double n2 = static_cast<double>(n) * static_cast<double>(n);
  double flops = 2.0 * n2 * (2.0 * static_cast<double>(d)), exps = 0;
  if (op.name == "teacher_fast" || op.name == "sinkhorn") {
    exps = op.param * n2;
  } else if (op.name == "asap" || op.name == "asap_st" || op.name == "asap_cst" || op.name == "asap_sm" ||
             op.name == "asap_s3" || op.name == "asap_s3c") {
    const int feature_passes = op.name == "asap_s3" || op.name == "asap_s3c" ? 3 : op.name == "asap_sm" ? 1 : 0;
    flops += 4.0 * static_cast<double>(n) * static_cast<double>(d) * static_cast<double>(slices);
    exps = (op.param + feature_passes) * n2;
  } else {
    return 0;
  }
  return static_cast<double>(BH) * (flops / pk.flops_per_s + exps / pk.exps_per_s);
}

std::string fmt(double x) {
  char b[32];
  std::snprintf(b, sizeof b, x >= 100 ? "%.0f" : x >= 1 ? "%.2f" : "%.4f", x);
  return b;
}

// The core OpenBLAS selected at load time ("" when LibTorch uses another BLAS).
std::string blas_core() {
  using F = char* (*)();
  auto f = reinterpret_cast<F>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  return f ? std::string(f()) : std::string();
}

// Re-executes once with the thread counts of every runtime pinned to
// `threads` (OpenMP for ATen, OpenBLAS's own pool), so that all operators
// run with the same threads. OpenBLAS 0.3.21 (Debian 12) also does not know
// recent Intel server CPUs and falls back to its "Prescott" (SSE3) kernels,
// which makes every LibTorch matmul ~8x slower than it should be; the
// baselines would then be unfairly slow, so the core type is forced to what
// the CPU has (unless --keep-blas).
void pin_runtime(char** argv, int threads, bool keep_blas, const std::string& wait_policy) {
  if (std::getenv("ASAP_BENCH_REEXEC")) return;
  setenv("ASAP_BENCH_REEXEC", "1", 1);
  const std::string t = std::to_string(threads);
  setenv("OMP_NUM_THREADS", t.c_str(), 1);
  setenv("OPENBLAS_NUM_THREADS", t.c_str(), 1);
  if (!wait_policy.empty())
    setenv("OMP_WAIT_POLICY", wait_policy.c_str(), 1);
  else if (!std::getenv("OMP_WAIT_POLICY"))
    setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
  if (!keep_blas && !std::getenv("OPENBLAS_CORETYPE") && blas_core() == "Prescott") {
    __builtin_cpu_init();
    const char* core = __builtin_cpu_supports("avx512f") ? "SkylakeX"
                       : __builtin_cpu_supports("avx2")  ? "Haswell"
                                                         : nullptr;
    if (core) setenv("OPENBLAS_CORETYPE", core, 1);
  }
  execv("/proc/self/exe", argv);  // returns only on failure: carry on as is
}

std::vector<Op> make_ops(const Settings& s, int64_t n, int64_t H) {
  auto layer = std::make_shared<asap::CompiledLayer>(make_layer(H, s.d, s.slices, false, s.seed));
  auto layer_sm = std::make_shared<asap::CompiledLayer>(make_layer(H, s.d, s.slices, true, s.seed));
  // alpha and the row score statistics (score_stats): no feature pass.
  auto layer_st = std::make_shared<asap::CompiledLayer>(make_layer(H, s.d, s.slices, false, s.seed, false, true));
  // ... and the column-centered statistics too (centered_stats, +cstats): no feature pass either.
  auto layer_cst =
      std::make_shared<asap::CompiledLayer>(make_layer(H, s.d, s.slices, false, s.seed, false, true, true));
  // The family compile picks on the bundled teachers (default k = 1).
  auto layer_s3 = std::make_shared<asap::CompiledLayer>(make_layer(H, s.d, s.slices, true, s.seed, true));
  // ... with the column-centered statistics (the one compile picks on the bundled ViT's layer 0).
  auto layer_s3c = std::make_shared<asap::CompiledLayer>(make_layer(H, s.d, s.slices, true, s.seed, true, true, true));
  auto eye = at::eye(s.d, at::kDouble);
  asap::Convention c;
  std::vector<Op> ops;
  ops.push_back({"softmax", 0, [](const Inputs& in) {
                   auto S = at::matmul(in.q, in.k.transpose(-1, -2)).mul_(in.scale);
                   auto A = at::softmax(S, -1);
                   sink(at::matmul(A, in.v));
                 }});
  ops.push_back(
      {"esp", 0, [eye](const Inputs& in) { sink(asap::fast::esp_attention(in.q, in.k, in.v, eye, in.scale, 1.0)); }});
  for (int T : s.Ts) {
    ops.push_back({"teacher_fast", T, [T, c](const Inputs& in) {
                     sink(asap::fast::teacher(in.q, in.k, in.v, in.mask, in.scale, T, c, false, {}, false).O);
                   }});
    auto tl = std::make_shared<asap::CompiledLayer>(*layer_s3);
    tl->kind = asap::OperatorKind::kTeacher;
    tl->spec.T = T;
    tl->coef = at::zeros({1, 0}, at::kDouble);
    ops.push_back({"layer_teacher", T,
                   [tl](const Inputs& in) { sink(asap::run_layer(*tl, in.q, in.k, in.v, in.mask, {}).out); }});
    if (n <= s.ref_max_n)
      ops.push_back({"teacher_ref", T, [T, c](const Inputs& in) {
                       sink(asap::run_teacher_reference(in.q, in.k, in.v, in.mask, in.scale, T, c, false).O);
                     }});
  }
  for (int k : s.ks) {
    asap::RunOptions ro;
    ro.closures = k;
    ops.push_back({"sinkhorn", k, [k, c](const Inputs& in) {
                     sink(asap::fast::sinkhorn_normalizer(in.q, in.k, in.v, in.mask, in.scale, k, c).O);
                   }});
    ops.push_back({"asap", k, [ro, layer](const Inputs& in) {
                     sink(asap::fast::asap_layer(*layer, in.q, in.k, in.v, in.mask, ro).out);
                   }});
    ops.push_back({"asap_st", k, [ro, layer_st](const Inputs& in) {
                     sink(asap::fast::asap_layer(*layer_st, in.q, in.k, in.v, in.mask, ro).out);
                   }});
    ops.push_back({"asap_cst", k, [ro, layer_cst](const Inputs& in) {
                     sink(asap::fast::asap_layer(*layer_cst, in.q, in.k, in.v, in.mask, ro).out);
                   }});
    ops.push_back({"asap_sm", k, [ro, layer_sm](const Inputs& in) {
                     sink(asap::fast::asap_layer(*layer_sm, in.q, in.k, in.v, in.mask, ro).out);
                   }});
    ops.push_back({"asap_s3", k, [ro, layer_s3](const Inputs& in) {
                     sink(asap::fast::asap_layer(*layer_s3, in.q, in.k, in.v, in.mask, ro).out);
                   }});
    ops.push_back({"asap_s3c", k, [ro, layer_s3c](const Inputs& in) {
                     sink(asap::fast::asap_layer(*layer_s3c, in.q, in.k, in.v, in.mask, ro).out);
                   }});
    ops.push_back({"layer_s3", k, [ro, layer_s3](const Inputs& in) {
                     sink(asap::run_layer(*layer_s3, in.q, in.k, in.v, in.mask, ro).out);
                   }});
    // Sinkhorn T' = k through run_layer, as compile and verify time it
    // (when k is below the largest --T: a stored T' is less than the teacher's T).
    const int T_max = s.Ts.empty() ? 0 : *std::max_element(s.Ts.begin(), s.Ts.end());
    if (k < T_max) {
      auto sl = std::make_shared<asap::CompiledLayer>(*layer_s3);
      sl->kind = asap::OperatorKind::kSinkhorn;
      sl->spec.T = T_max;
      sl->sinkhorn_steps = k;
      sl->coef = at::zeros({1, 0}, at::kDouble);
      ops.push_back({"layer_sinkhorn", k,
                     [sl](const Inputs& in) { sink(asap::run_layer(*sl, in.q, in.k, in.v, in.mask, {}).out); }});
    }
  }
  // Features only: the sliced potentials of fast::build_features for L
  // slices (one GEMM per head for the projections, the sorts, the 1-D
  // potentials, the centering), no closures. "features" runs the default sort
  // path (the lane-parallel networks for short sequences), "features_scalar"
  // forces the scalar sorts of sort.h (the path before issue 14).
  for (int64_t L : s.feature_slices) {
    auto bank = std::make_shared<at::Tensor>(asap::make_slice_bank(s.d, L, s.seed));
    auto add = [&](const std::string& name, asap::fast::detail::SortPath path) {
      ops.push_back({name, static_cast<int>(L), [bank, L, path](const Inputs& in) {
                       asap::FeatureFamily fam;
                       fam.slices = L;
                       const auto old = asap::fast::detail::sort_path();
                       asap::fast::detail::set_sort_path(path);
                       sink(asap::fast::build_features(in.q, in.k, in.mask, false, *bank, fam, in.scale, 1.0));
                       asap::fast::detail::set_sort_path(old);
                     }});
    };
    if (s.sort == "both" || s.sort == "auto") add("features", asap::fast::detail::SortPath::kAuto);
    if (s.sort == "network") add("features", asap::fast::detail::SortPath::kNetwork);
    if (s.sort == "both" || s.sort == "scalar") add("features_scalar", asap::fast::detail::SortPath::kScalar);
  }
  if (n <= s.ref_max_n)
    ops.push_back({"asap_ref", 3, [layer](const Inputs& in) {
                     asap::RunOptions o;
                     o.closures = 3;
                     sink(asap::run_layer_reference(*layer, in.q, in.k, in.v, in.mask, o).out);
                   }});
  if (!s.only.empty()) {
    std::vector<Op> keep;
    std::stringstream ss(s.only);
    std::string item;
    std::vector<std::string> names;
    while (std::getline(ss, item, ',')) names.push_back(item);
    for (auto& op : ops)
      if (std::find(names.begin(), names.end(), op.name) != names.end() ||
          std::find(names.begin(), names.end(), op.label()) != names.end())
        keep.push_back(op);
    if (keep.empty()) {
      // Nothing to time (max_element over no operators crashed here).
      std::string have;
      for (const auto& op : ops) have += (have.empty() ? "" : ", ") + op.label();
      throw asap::Error("--only: expected operators of this run at n = " + std::to_string(n) + " (" + have +
                        "; --T and --k set which exist), found '" + s.only + "'");
    }
    ops = keep;
  }
  return ops;
}

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

double cpu_s() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size();
  return m % 2 ? v[m / 2] : 0.5 * (v[m / 2 - 1] + v[m / 2]);
}

int64_t status_kb(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  const std::string k = std::string(key) + ":";
  while (std::getline(f, line))
    if (line.rfind(k, 0) == 0) return std::atoll(line.c_str() + k.size());
  return -1;
}

// --mem-child: prints the peak extra bytes of one operator.
int mem_child(const Settings& s, const std::string& label, int64_t n, int64_t B, int64_t H) {
  auto ops = make_ops(s, n, H);
  const Op* op = nullptr;
  for (const auto& o : ops)
    if (o.label() == label) op = &o;
  if (!op) {
    std::cerr << "unknown operator " << label << "\n";
    return 2;
  }
  {  // start thread pools, BLAS and allocator caches on a tiny input
    auto tiny = make_inputs(1, H, 16, s.d, s.seed + 1, s.lengths);
    op->run(tiny);
  }
  auto in = make_inputs(B, H, n, s.d, s.seed, s.lengths);
  const int64_t rss = status_kb("VmRSS");
  {
    std::ofstream clear("/proc/self/clear_refs");
    clear << "5";
  }
  const int64_t before = status_kb("VmHWM");
  op->run(in);
  const int64_t hwm = status_kb("VmHWM");
  std::cout << (hwm - std::max(rss, before)) * 1024 << "\n";
  return 0;
}

std::string self_exe() {
  char buf[4096];
  const ssize_t len = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (len <= 0) return "asap_bench";
  buf[len] = 0;
  return buf;
}

int64_t measure_memory(const Settings& s, const Op& op, int64_t n, int64_t B, int64_t H) {
  std::ostringstream cmd;
  cmd << "'" << self_exe() << "' --mem-child " << op.label() << " --n " << n << " --bh " << B << "x" << H << " --d "
      << s.d << " --threads " << s.threads << " --slices " << s.slices << " --ref-max-n " << s.ref_max_n << " --sort "
      << s.sort;
  if (!s.feature_slices.empty()) {
    cmd << " --features ";
    for (size_t i = 0; i < s.feature_slices.size(); ++i) cmd << (i ? "," : "") << s.feature_slices[i];
  }
  FILE* p = popen(cmd.str().c_str(), "r");
  if (!p) return -1;
  char line[256] = {0};
  int64_t bytes = -1;
  if (std::fgets(line, sizeof line, p)) bytes = std::atoll(line);
  if (pclose(p) != 0) return -1;
  return bytes;
}

std::string shell_out(const std::string& cmd) {
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return "";
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  pclose(p);
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

template <class T>
std::vector<T> parse_list(const std::string& flag, const std::string& s) {
  std::vector<T> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size())
      throw std::invalid_argument(flag + ": expected a comma-separated list of integers, found '" + s + "'");
    out.push_back(static_cast<T>(v));
  }
  if (out.empty()) throw std::invalid_argument(flag + ": expected a comma-separated list of integers, found nothing");
  return out;
}

std::vector<std::pair<int64_t, int64_t>> parse_bh(const std::string& s) {
  std::vector<std::pair<int64_t, int64_t>> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const auto x = item.find('x');
    if (x == std::string::npos) throw asap::Error("--bh: expected BxH items like 1x4, found '" + item + "'");
    out.push_back({std::stoll(item.substr(0, x)), std::stoll(item.substr(x + 1))});
  }
  return out;
}

void usage() {
  std::cout << "usage: asap_bench [--quick] [--json FILE] [--threads N] [--n LIST] [--bh BxH,...] [--T LIST]\n"
               "                  [--k LIST] [--d D] [--slices L] [--reps R] [--no-mem] [--mem]\n"
               "                  [--ref-max-n N] [--pytorch] [--pytorch-max-n N] [--only OPS] [--keep-blas]\n"
               "                  [--wait-policy passive|active] [--features L,...] [--sort auto|scalar|network|both]\n"
               "                  [--lengths L,...]\n";
}

}  // namespace

int main(int argc, char** argv) try {
  bool keep_blas = false;
  int threads = static_cast<int>(std::thread::hardware_concurrency());
  std::string wait_policy;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--keep-blas") keep_blas = true;
    if (std::string(argv[i]) == "--threads" && i + 1 < argc) threads = std::atoi(argv[i + 1]);
    if (std::string(argv[i]) == "--wait-policy" && i + 1 < argc) {
      wait_policy = argv[i + 1];
      for (auto& ch : wait_policy) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    }
  }
  pin_runtime(argv, std::max(1, threads), keep_blas, wait_policy);
  Settings s;
  std::string child_label;
  bool quick = false, mem_set = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw asap::Error("missing value after " + a);
      return argv[++i];
    };
    if (a == "--quick") {
      quick = true;
    } else if (a == "--json") {
      s.json_path = next();
    } else if (a == "--threads") {
      s.threads = std::stoi(next());
    } else if (a == "--n") {
      s.ns = parse_list<int64_t>("--n", next());
    } else if (a == "--bh") {
      s.bh = parse_bh(next());
    } else if (a == "--T") {
      s.Ts = parse_list<int>("--T", next());
    } else if (a == "--k") {
      s.ks = parse_list<int>("--k", next());
    } else if (a == "--d") {
      s.d = std::stoll(next());
    } else if (a == "--slices") {
      s.slices = std::stoll(next());
      if (s.slices < 0)
        throw std::invalid_argument("--slices: expected 0 (slice-free families) or more, found " +
                                    std::to_string(s.slices));
    } else if (a == "--lengths") {
      s.lengths = parse_list<int64_t>("--lengths", next());
      for (int64_t l : s.lengths)
        if (l < 1) throw std::invalid_argument("--lengths: expected lengths of 1 or more, found " + std::to_string(l));
    } else if (a == "--reps") {
      s.reps = std::stoi(next());
    } else if (a == "--no-mem") {
      s.mem = false, mem_set = true;
    } else if (a == "--mem") {
      s.mem = true, mem_set = true;
    } else if (a == "--ref-max-n") {
      s.ref_max_n = std::stoll(next());
    } else if (a == "--pytorch") {
      s.pytorch = true;
    } else if (a == "--pytorch-max-n") {
      s.pytorch_max_n = std::stoll(next());
    } else if (a == "--only") {
      s.only = next();
    } else if (a == "--features") {
      s.feature_slices = parse_list<int64_t>("--features", next());
    } else if (a == "--sort") {
      s.sort = next();
      if (s.sort != "auto" && s.sort != "scalar" && s.sort != "network" && s.sort != "both")
        throw asap::Error("--sort: expected auto, scalar, network or both, found '" + s.sort + "'");
    } else if (a == "--keep-blas") {
    } else if (a == "--wait-policy") {
      next();
    } else if (a == "--mem-child") {
      child_label = next();
    } else if (a == "-h" || a == "--help") {
      usage();
      return 0;
    } else {
      usage();
      throw asap::Error("unknown argument '" + a + "'");
    }
  }
  if (quick) {
    s.ns = {128, 256};
    s.bh = {{1, 4}};
    s.Ts = {6};
    s.ks = {1, 3};
    s.reps = 3;
    if (!mem_set) s.mem = false;
    s.pytorch_max_n = 256;
  }
  if (s.threads <= 0) s.threads = std::max(1, threads);
  at::set_num_threads(s.threads);
  if (!child_label.empty()) return mem_child(s, child_label, s.ns.at(0), s.bh.at(0).first, s.bh.at(0).second);

  json out;
  const std::time_t t = std::time(nullptr);
  char date[64];
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&t));
  out["machine"] = {
      {"cpu", shell_out("lscpu | sed -n 's/^Model name:[ ]*//p' | head -1")},
      {"cores", shell_out("nproc")},
      {"threads", s.threads},
      {"date", date},
      {"load_before", shell_out("cut -d' ' -f1-3 /proc/loadavg")},
      {"isa", asap::fast::isa_for()},
      {"parallel_build", asap::fast::parallel_build()},
      {"openblas_core", blas_core()},
      {"openblas_coretype_env", std::getenv("OPENBLAS_CORETYPE") ? std::getenv("OPENBLAS_CORETYPE") : ""},
      {"openblas_threads", std::getenv("OPENBLAS_NUM_THREADS") ? std::getenv("OPENBLAS_NUM_THREADS") : ""},
      {"aten_threads", at::get_num_threads()},
      {"omp_wait_policy", std::getenv("OMP_WAIT_POLICY") ? std::getenv("OMP_WAIT_POLICY") : ""},
      {"torch_parallel", at::get_parallel_info().substr(0, 200)}};
  // The machine's peak, for the bound of every fused operator (bound_s).
  // Measured before and after the operators; the bounds use the larger of
  // the two (a peak measured while something else ran is too low and would
  // flatter every operator).
  auto peak_json = [](const asap::fast::MachinePeak& p) {
    return json{{"flops_per_s", p.flops_per_s}, {"exps_per_s", p.exps_per_s}, {"threads", p.threads}, {"isa", p.isa}};
  };
  auto print_peak = [](const char* when, const asap::fast::MachinePeak& p) {
    std::fprintf(stderr, "peak %s on %d threads (%s): %.1f GFLOP/s multiply-add, %.2f G exp/s\n", when, p.threads,
                 p.isa.c_str(), p.flops_per_s * 1e-9, p.exps_per_s * 1e-9);
  };
  asap::fast::MachinePeak peak = asap::fast::measure_peak(false, 7);
  out["machine"]["peak_before"] = peak_json(peak);
  print_peak("before", peak);
  out["settings"] = {{"n", s.ns},
                     {"d", s.d},
                     {"T", s.Ts},
                     {"k", s.ks},
                     {"reps", s.reps},
                     {"slices", s.slices},
                     {"lengths", s.lengths},
                     {"ref_max_n", s.ref_max_n},
                     {"memory", s.mem},
                     {"quick", quick},
                     {"dtype", "float32"}};
  json bh = json::array();
  for (auto& p : s.bh) bh.push_back({p.first, p.second});
  out["settings"]["bh"] = bh;
  json results = json::array();

  if (s.pytorch) {
    // The PyTorch Sinkformer loop, same sizes and threads, run first.
    const char* py_env = std::getenv("PYTHON");
    const std::string py = py_env && *py_env ? py_env : "/usr/bin/python3";
    std::string script = std::string(ASAP_SOURCE_DIR) + "/tools/bench/bench_pytorch.py";
    const std::string tmp = (s.json_path.empty() ? std::string("asap_bench") : s.json_path) + ".pytorch.json";
    std::ostringstream ns, bhs, Ts;
    for (auto n : s.ns)
      if (n <= s.pytorch_max_n) ns << (ns.tellp() ? "," : "") << n;
    for (auto& p : s.bh) bhs << (bhs.tellp() ? "," : "") << p.first << "x" << p.second;
    for (auto T : s.Ts) Ts << (Ts.tellp() ? "," : "") << T;
    if (!ns.str().empty()) {
      std::ostringstream cmd;
      cmd << py << " '" << script << "' --n " << ns.str() << " --bh " << bhs.str() << " --T " << Ts.str() << " --d "
          << s.d << " --threads " << s.threads << " --reps " << std::min(s.reps, 3) << " --json '" << tmp << "'";
      std::cerr << "running " << cmd.str() << "\n";
      if (std::system(cmd.str().c_str()) == 0) {
        std::ifstream f(tmp);
        json pj = json::parse(f);
        for (auto& r : pj["results"]) results.push_back(r);
        out["pytorch"] = pj["info"];
      } else {
        std::cerr << "warning: the PyTorch baseline failed; continuing without it\n";
      }
    }
  }

  for (int64_t n : s.ns) {
    for (auto [B, H] : s.bh) {
      auto in = make_inputs(B, H, n, s.d, s.seed, s.lengths);
      auto ops = make_ops(s, n, H);
      std::vector<std::vector<double>> times(ops.size()), cpu(ops.size());
      std::vector<int> want(ops.size(), s.reps);
      std::vector<double> output_sum(ops.size(), std::nan(""));
      // Warm-up (and each output's float64 sum); slow operators get fewer repeats.
      for (size_t i = 0; i < ops.size(); ++i) {
        g_keep = true;
        const double t0 = now_s();
        ops[i].run(in);
        const double dt = now_s() - t0;
        g_keep = false;
        if (g_kept.defined()) output_sum[i] = g_kept.sum(at::kDouble).item<double>();
        g_kept = at::Tensor();
        if (dt > 20.0)
          want[i] = 1;
        else if (dt > 3.0)
          want[i] = std::min(s.reps, 3);
        else if (dt < 1e-3)  // short calls: enough repeats for a steady median (about 20 ms each, at most 101)
          want[i] = std::max(s.reps, std::min(101, static_cast<int>(0.02 / std::max(dt, 1e-6))));
      }
      const int rounds = *std::max_element(want.begin(), want.end());
      for (int r = 0; r < rounds; ++r) {
        for (size_t i = 0; i < ops.size(); ++i) {
          if (static_cast<int>(times[i].size()) >= want[i]) continue;
          const double c0 = cpu_s(), t0 = now_s();
          ops[i].run(in);
          times[i].push_back(now_s() - t0);
          cpu[i].push_back(cpu_s() - c0);
        }
      }
      for (size_t i = 0; i < ops.size(); ++i) {
        json r = {{"op", ops[i].name},
                  {"param", ops[i].param},
                  {"n", n},
                  {"B", B},
                  {"H", H},
                  {"d", s.d},
                  {"median_s", median(times[i])},
                  {"min_s", *std::min_element(times[i].begin(), times[i].end())},
                  {"cpu_median_s", median(cpu[i])},
                  {"times_s", times[i]}};
        if (std::isfinite(output_sum[i])) r["output_sum"] = output_sum[i];
        if (s.mem) r["peak_extra_bytes"] = measure_memory(s, ops[i], n, B, H);
        const double bound = bound_s(ops[i], n, B * H, s.d, s.slices, peak);  // final values at the end
        std::fprintf(
            stderr, "n=%5lld BxH=%lldx%lld %-16s median %10.4f ms%s%s\n", static_cast<long long>(n),
            static_cast<long long>(B), static_cast<long long>(H), ops[i].label().c_str(), 1e3 * median(times[i]),
            bound > 0 ? ("  " + fmt(median(times[i]) / bound) + "x bound " + fmt(1e3 * bound) + " ms").c_str() : "",
            s.mem ? (" peak " + std::to_string(r["peak_extra_bytes"].get<int64_t>() >> 20) + " MiB").c_str() : "");
        results.push_back(r);
      }
      // Features-only time over one closure pass of the same shape. The
      // proxy for "one pass" is the fused Sinkhorn normalizer with T' = 1 (one
      // row closure fused with the QK^T and plan * V GEMMs): the cheapest
      // complete operator the fast path runs on these inputs.
      double pass = 0;
      for (size_t i = 0; i < ops.size(); ++i)
        if (ops[i].name == "sinkhorn" && ops[i].param == 1) pass = median(times[i]);
      for (size_t i = 0; i < ops.size(); ++i) {
        if (ops[i].name.rfind("features", 0) != 0 || pass <= 0) continue;
        const double ratio = median(times[i]) / pass;
        std::fprintf(stderr, "n=%5lld BxH=%lldx%lld d=%lld %s L=%d / one pass (sinkhorn_1, %.4f ms) = %.3f\n",
                     static_cast<long long>(n), static_cast<long long>(B), static_cast<long long>(H),
                     static_cast<long long>(s.d), ops[i].name.c_str(), ops[i].param, 1e3 * pass, ratio);
        out["feature_ratios"].push_back({{"op", ops[i].name},
                                         {"L", ops[i].param},
                                         {"n", n},
                                         {"B", B},
                                         {"H", H},
                                         {"d", s.d},
                                         {"pass_op", "sinkhorn_1"},
                                         {"pass_median_s", pass},
                                         {"features_median_s", median(times[i])},
                                         {"ratio", ratio}});
      }
    }
  }
  {
    const asap::fast::MachinePeak after = asap::fast::measure_peak(false, 7);
    print_peak("after", after);
    out["machine"]["peak_after"] = peak_json(after);
    peak.flops_per_s = std::max(peak.flops_per_s, after.flops_per_s);
    peak.exps_per_s = std::max(peak.exps_per_s, after.exps_per_s);
    out["machine"]["peak"] = peak_json(peak);
    for (auto& r : results) {
      if (!r.contains("median_s") || !r.contains("param")) continue;
      Op op{r["op"].get<std::string>(), r["param"].get<int>(), nullptr};
      const double b =
          bound_s(op, r["n"].get<int64_t>(), r["B"].get<int64_t>() * r["H"].get<int64_t>(), s.d, s.slices, peak);
      if (b > 0) r["bound_s"] = b, r["bound_ratio"] = r["median_s"].get<double>() / b;
    }
  }
  out["results"] = results;
  out["machine"]["load_after"] = shell_out("cut -d' ' -f1-3 /proc/loadavg");
  if (!s.json_path.empty()) {
    std::ofstream f(s.json_path);
    f << out.dump(1) << "\n";
    if (!f) throw asap::Error("cannot write '" + s.json_path + "'");
  } else {
    std::cout << out.dump(1) << "\n";
  }
  return 0;
} catch (const std::exception& e) {
  std::cerr << "asap_bench: " << e.what() << "\n";
  return 1;
}
