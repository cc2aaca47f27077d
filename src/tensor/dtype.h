// Tensor element types. Ids equal ggml's `enum ggml_type` (GGUF spec), so a GGUF tensor's type
// field maps directly. Quantized types store blocks of `block_size` values in `type_size` bytes.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace shoal {

enum class DType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
  kTQ1_0 = 34,
  kTQ2_0 = 35,
  kMXFP4 = 39,
  kCount = 40,  // one past the largest id we know
};

/// Facts about one dtype. A type we know the name of but cannot read has block_size 0.
struct DTypeInfo {
  std::string_view name;  // "F32", "Q4_K", ... (ggml's names)
  int64_t block_size;     // values per block (1 for plain types)
  int64_t type_size;      // bytes per block
  bool quantized;
};

/// Info for a dtype id read from a file; nullopt for ids that are not ggml types.
std::optional<DTypeInfo> dtype_info(uint32_t id);
/// Info for a known dtype (CHECKs that it is known).
const DTypeInfo& dtype_info(DType t);
std::string_view dtype_name(DType t);
/// Parses "F32", "q8_0", "BF16"... (case-insensitive).
std::optional<DType> dtype_from_name(std::string_view name);

/// Bytes for `n` values of type t; nullopt if n is not a whole number of blocks or overflows.
std::optional<uint64_t> dtype_bytes(DType t, int64_t n);

/// Types Shoal computes with natively (F32, F16, BF16, Q8_0, Q4_0).
bool dtype_is_native(DType t);
/// Types converted to Q8_0 at load (Q4_1, Q5_0, Q5_1, Q2_K..Q6_K).
bool dtype_converts_to_q8_0(DType t);

}  // namespace shoal
