// Run-time detection of the x86 SIMD extensions the fast CPU kernels use, and the choice of one
// instruction-set level for them. Kernels for a level live in *_avx2.cc / *_avx512.cc (compiled
// with that ISA's flags) next to a portable scalar fallback.
#pragma once

#include <optional>
#include <string_view>

namespace shoal {

/// What this CPU (and OS: AVX state enabled via XSAVE) supports.
struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512vnni = false, avx512bf16 = false;
};

/// Kernel levels, lowest first. kAvx2 needs AVX2+FMA+F16C; kAvx512 needs AVX-512 F, BW, DQ, VL
/// and VNNI (BF16 is not needed by any kernel).
enum class CpuIsa { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

/// Detected once (cpuid and xgetbv), then cached.
const CpuFeatures& cpu_features();
/// The highest level this machine supports.
CpuIsa cpu_isa_supported();
/// The level the fast kernels use: cpu_isa_supported(), lowered by the environment variable
/// SHOAL_CPU_ISA=scalar|avx2|avx512 (a level above what the CPU supports is ignored with a
/// warning, as is an unknown name). Read once, then cached.
CpuIsa cpu_isa();
/// "scalar", "avx2", "avx512".
std::string_view cpu_isa_name(CpuIsa isa);
/// Parses "scalar", "avx2", "avx512" (case-sensitive).
std::optional<CpuIsa> cpu_isa_from_name(std::string_view name);

}  // namespace shoal
