#pragma once
#include <ostream>
#include <string>
#include <vector>

#include "asap/verify.h"

namespace asapc {

// One verified artifact and the fit its compile used ("ls", "kl", "attention").
struct VerifiedArtifact {
  asap::VerifyResult result;
  std::string fit = "ls";
};

// A concise per-layer table of verify's result; artifacts after the first
// are compared side by side.
void print_verify_table(const std::vector<VerifiedArtifact>& all, std::ostream& os);

}  // namespace asapc
