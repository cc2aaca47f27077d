// safetensors files (spec: huggingface/safetensors README, "Format"):
//   u64 N (little-endian) | N bytes of UTF-8 JSON header | data section
// The header maps each tensor name to {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}
// (offsets relative to the data section) and may hold "__metadata__": {string: string}.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/status.h"
#include "format/tensor_index.h"

namespace shoal {

inline constexpr uint64_t kSafetensorsMaxHeader = 100'000'000;  // as the reference reader
inline constexpr size_t kSafetensorsMaxRank = 8;

/// A parsed safetensors file.
struct SafetensorsFile {
  std::vector<TensorInfo> tensors;  // sorted by offset; offsets absolute in the file; source 0
  std::map<std::string, std::string> metadata;  // "__metadata__"
  uint64_t data_offset = 0;                     // 8 + header length
};

/// Parses and validates a safetensors file held in memory; `name` only appears in messages
/// ("safetensors 'name': ..."). Checks: header length <= 100 MB and inside the file, the header is
/// a JSON object (no duplicate names, nesting <= 4), every entry has a string dtype, a shape of
/// at most 8 non-negative integers and data_offsets [begin, end] with begin <= end <= data size and
/// end - begin == element size x element count (overflow-safe), and no two tensors overlap.
/// Dtypes: F64, F32, F16, BF16, I64, I32, I16, I8 map to DType; BOOL, U8, U16, U32, U64,
/// F8_E4M3, F8_E5M2, F8_E8M0, C64 are validated but have no DType, so a file holding any of them
/// is rejected as a whole (after the structural checks).
/// Errors: kCorrupt (malformed), kUnsupported (a dtype Shoal cannot hold, or an unknown one).
Result<SafetensorsFile> parse_safetensors(const uint8_t* data, uint64_t size, const std::string& name);

/// The safetensors dtype name for a DType ("F32", "BF16"...); empty when there is none.
std::string_view safetensors_dtype_name(DType t);

/// Builds a safetensors file in memory (for tests and tools): tensors are laid out contiguously in
/// the order given. Errors: kInvalidArgument when a tensor's byte count does not match its shape
/// or its dtype has no safetensors name.
struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};
Result<std::vector<uint8_t>> write_safetensors(const std::vector<SafetensorsTensor>& tensors,
                                               const std::map<std::string, std::string>& metadata);

}  // namespace shoal
