#include "backend/cpu/cpu_features.h"

#include <cstdint>
#include <cstdlib>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "core/log.h"

namespace shoal {

namespace {

#if defined(__x86_64__) || defined(__i386__)
uint64_t read_xcr0() {
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}

// cpuid leaves 1 and 7 (Intel SDM vol. 2A, "CPUID"); XCR0 says which register state the OS saves.
CpuFeatures detect() {
  CpuFeatures f;
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = (c >> 27) & 1, avx = (c >> 28) & 1;
  if (!osxsave || !avx) return f;
  const uint64_t xcr0 = read_xcr0();
  const bool ymm_state = (xcr0 & 0x6) == 0x6;     // SSE + AVX state
  const bool zmm_state = (xcr0 & 0xe6) == 0xe6;   // + opmask, ZMM_Hi256, Hi16_ZMM
  if (!ymm_state) return f;
  f.fma = (c >> 12) & 1;
  f.f16c = (c >> 29) & 1;
  if (__get_cpuid_max(0, nullptr) < 7) return f;
  __cpuid_count(7, 0, a, b, c, d);
  f.avx2 = (b >> 5) & 1;
  if (zmm_state) {
    f.avx512f = (b >> 16) & 1;
    f.avx512dq = (b >> 17) & 1;
    f.avx512bw = (b >> 30) & 1;
    f.avx512vl = (b >> 31) & 1;
    f.avx512vnni = (c >> 11) & 1;
    __cpuid_count(7, 1, a, b, c, d);
    f.avx512bf16 = (a >> 5) & 1;
  }
  return f;
}
#else
CpuFeatures detect() { return {}; }
#endif

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures kFeatures = detect();
  return kFeatures;
}

CpuIsa cpu_isa_supported() {
  const CpuFeatures& f = cpu_features();
  const bool avx2 = f.avx2 && f.fma && f.f16c;
  if (avx2 && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.avx512vnni) return CpuIsa::kAvx512;
  if (avx2) return CpuIsa::kAvx2;
  return CpuIsa::kScalar;
}

std::string_view cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar: return "scalar";
    case CpuIsa::kAvx2: return "avx2";
    case CpuIsa::kAvx512: return "avx512";
  }
  return "?";
}

std::optional<CpuIsa> cpu_isa_from_name(std::string_view name) {
  for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512})
    if (name == cpu_isa_name(isa)) return isa;
  return std::nullopt;
}

CpuIsa cpu_isa() {
  static const CpuIsa kIsa = [] {
    const CpuIsa best = cpu_isa_supported();
    const char* env = std::getenv("SHOAL_CPU_ISA");
    if (env == nullptr || *env == 0) return best;
    const auto want = cpu_isa_from_name(env);
    if (!want) {
      spdlog::warn("SHOAL_CPU_ISA={} is not one of scalar, avx2, avx512; using {}", env, cpu_isa_name(best));
      return best;
    }
    if (int(*want) > int(best)) {
      spdlog::warn("SHOAL_CPU_ISA={} is above what this CPU supports; using {}", env, cpu_isa_name(best));
      return best;
    }
    return *want;
  }();
  return kIsa;
}

}  // namespace shoal
