// A small compile set-up shared by the compile, runtime and verify tests:
// the fixture ViT checkpoint, a teacher spec for it, and a calibration file
// of random activations, all in a fresh temp directory.
#pragma once
#include <ATen/ATen.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "asap/calib.h"
#include "asap/checkpoint.h"
#include "asap/spec.h"
#include "test_util.h"

namespace asap_test {

inline std::string vit_checkpoint() { return data_path("fixtures/vit_checkpoint.pt"); }

inline asap::TeacherSpec vit_spec(int T = 6) {
  auto ck = asap::load_checkpoint(vit_checkpoint());
  asap::DetectOptions o;
  o.T = T;
  o.heads = 2;
  return asap::detect_layers(ck, o).spec;
}

// N random activation sequences per layer of the fixture ViT (n = 17, d_model = 32).
inline void write_vit_calib(const std::string& path, int64_t N, uint64_t seed, bool nan_at_5 = false) {
  at::manual_seed(seed);
  std::vector<asap::CalibLayerData> layers;
  for (const char* name : {"transformer.layers.0.0.fn", "transformer.layers.1.0.fn"}) {
    asap::CalibLayerData d;
    d.name = name;
    d.x = at::randn({N, 17, 32});
    if (nan_at_5) d.x[5][3][1] = std::numeric_limits<float>::quiet_NaN();
    layers.push_back(d);
  }
  asap::write_calib(path, layers);
}

// Runs a shell command; returns its exit code and captures stdout+stderr.
inline int run_cmd(const std::string& cmd, std::string* out = nullptr) {
  std::string full = cmd + " 2>&1";
  FILE* p = popen(full.c_str(), "r");
  std::string s;
  char buf[4096];
  while (p && fgets(buf, sizeof buf, p)) s += buf;
  int st = p ? pclose(p) : -1;
  if (out) *out = s;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

}  // namespace asap_test
