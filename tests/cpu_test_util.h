// Helpers shared by the CPU kernel tests.
#pragma once

#include <vector>

#include "backend/cpu/cpu_features.h"

namespace shoal::test {

/// Every kernel level this CPU runs (scalar, then AVX2 and AVX-512 where supported).
inline std::vector<CpuIsa> supported_isas() {
  std::vector<CpuIsa> v;
  for (CpuIsa i : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512})
    if (int(i) <= int(cpu_isa_supported())) v.push_back(i);
  return v;
}

}  // namespace shoal::test
