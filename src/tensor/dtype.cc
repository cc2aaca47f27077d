#include "tensor/dtype.h"

#include <array>
#include <cctype>
#include <limits>

#include "core/check.h"

namespace shoal {

namespace {

constexpr int kN = int(DType::kCount);

constexpr std::array<DTypeInfo, kN> make_table() {
  std::array<DTypeInfo, kN> t{};
  auto set = [&](DType d, std::string_view name, int64_t bs, int64_t ts, bool q) {
    t[size_t(d)] = DTypeInfo{name, bs, ts, q};
  };
  set(DType::kF32, "F32", 1, 4, false);
  set(DType::kF16, "F16", 1, 2, false);
  set(DType::kQ4_0, "Q4_0", 32, 18, true);
  set(DType::kQ4_1, "Q4_1", 32, 20, true);
  set(DType::kQ5_0, "Q5_0", 32, 22, true);
  set(DType::kQ5_1, "Q5_1", 32, 24, true);
  set(DType::kQ8_0, "Q8_0", 32, 34, true);
  set(DType::kQ8_1, "Q8_1", 32, 36, true);
  set(DType::kQ2_K, "Q2_K", 256, 84, true);
  set(DType::kQ3_K, "Q3_K", 256, 110, true);
  set(DType::kQ4_K, "Q4_K", 256, 144, true);
  set(DType::kQ5_K, "Q5_K", 256, 176, true);
  set(DType::kQ6_K, "Q6_K", 256, 210, true);
  set(DType::kQ8_K, "Q8_K", 256, 292, true);
  set(DType::kIQ2_XXS, "IQ2_XXS", 256, 66, true);
  set(DType::kIQ2_XS, "IQ2_XS", 256, 74, true);
  set(DType::kIQ3_XXS, "IQ3_XXS", 256, 98, true);
  set(DType::kIQ1_S, "IQ1_S", 256, 50, true);
  set(DType::kIQ4_NL, "IQ4_NL", 32, 18, true);
  set(DType::kIQ3_S, "IQ3_S", 256, 110, true);
  set(DType::kIQ2_S, "IQ2_S", 256, 82, true);
  set(DType::kIQ4_XS, "IQ4_XS", 256, 136, true);
  set(DType::kI8, "I8", 1, 1, false);
  set(DType::kI16, "I16", 1, 2, false);
  set(DType::kI32, "I32", 1, 4, false);
  set(DType::kI64, "I64", 1, 8, false);
  set(DType::kF64, "F64", 1, 8, false);
  set(DType::kIQ1_M, "IQ1_M", 256, 56, true);
  set(DType::kBF16, "BF16", 1, 2, false);
  set(DType::kTQ1_0, "TQ1_0", 256, 54, true);
  set(DType::kTQ2_0, "TQ2_0", 256, 66, true);
  set(DType::kMXFP4, "MXFP4", 32, 17, true);
  return t;
}

constexpr std::array<DTypeInfo, kN> kTable = make_table();

}  // namespace

std::optional<DTypeInfo> dtype_info(uint32_t id) {
  if (id >= uint32_t(kN) || kTable[id].block_size == 0) return std::nullopt;
  return kTable[id];
}

const DTypeInfo& dtype_info(DType t) {
  SHOAL_CHECK(uint32_t(t) < uint32_t(kN) && kTable[size_t(t)].block_size != 0,
              "unknown dtype id {}", uint32_t(t));
  return kTable[size_t(t)];
}

std::string_view dtype_name(DType t) {
  auto i = dtype_info(uint32_t(t));
  return i ? i->name : std::string_view("?");
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (int i = 0; i < kN; ++i) {
    const auto& e = kTable[size_t(i)];
    if (e.block_size == 0 || e.name.size() != name.size()) continue;
    bool eq = true;
    for (size_t k = 0; k < name.size(); ++k)
      if (std::toupper(static_cast<unsigned char>(name[k])) != e.name[k]) eq = false;
    if (eq) return DType(i);
  }
  return std::nullopt;
}

std::optional<uint64_t> dtype_bytes(DType t, int64_t n) {
  auto info = dtype_info(uint32_t(t));
  if (!info || n < 0 || n % info->block_size != 0) return std::nullopt;
  const uint64_t blocks = uint64_t(n / info->block_size);
  if (blocks > std::numeric_limits<uint64_t>::max() / uint64_t(info->type_size)) return std::nullopt;
  return blocks * uint64_t(info->type_size);
}

bool dtype_is_native(DType t) {
  return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16 || t == DType::kQ8_0 ||
         t == DType::kQ4_0;
}

bool dtype_converts_to_q8_0(DType t) {
  switch (t) {
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ5_1:
    case DType::kQ2_K:
    case DType::kQ3_K:
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
      return true;
    default:
      return false;
  }
}

}  // namespace shoal
