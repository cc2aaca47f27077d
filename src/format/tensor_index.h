// The tensor index: every tensor of a model with its name, dtype, shape and byte range. GGUF gives
// it directly; safetensors has it in a JSON header. Loading and the pool work from this list only.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tensor/dtype.h"

namespace shoal {

struct TensorInfo {
  std::string name;            // as stored in the file (GGUF or HF name)
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // outermost first (PyTorch order); GGUF's ne[] reversed.
                               // A weight matrix is [out_features, in_features], rows contiguous.
  uint32_t source = 0;         // index of the WeightSource (file / shard) holding the bytes
  uint64_t offset = 0;         // absolute byte offset inside that source
  uint64_t nbytes = 0;         // exact byte length (checked against dtype and shape)

  int64_t n_elements() const;
  int64_t rows() const;  // product of all dims but the last (1 for a vector)
  int64_t cols() const;  // last dim
  /// "[512, 64]"
  std::string shape_string() const;
};

class TensorIndex {
 public:
  /// Adds a tensor; returns false if the name is already present.
  bool add(TensorInfo info);
  const TensorInfo* find(std::string_view name) const;
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  size_t size() const { return tensors_.size(); }
  uint64_t total_bytes() const;
  /// 64-bit FNV-1a over every (name, dtype, shape, nbytes) in order: the model's identity as the
  /// pool compares it (with the file size). Offsets are left out so a re-saved file still matches.
  uint64_t identity_hash() const;

 private:
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> by_name_;
};

}  // namespace shoal
