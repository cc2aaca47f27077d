#include "format/tensor_index.h"

#include <fmt/format.h>

namespace shoal {

int64_t TensorInfo::n_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t TensorInfo::rows() const {
  int64_t n = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) n *= shape[i];
  return n;
}

int64_t TensorInfo::cols() const { return shape.empty() ? 1 : shape.back(); }

std::string TensorInfo::shape_string() const { return fmt::format("[{}]", fmt::join(shape, ", ")); }

bool TensorIndex::add(TensorInfo info) {
  if (by_name_.count(info.name)) return false;
  by_name_.emplace(info.name, tensors_.size());
  tensors_.push_back(std::move(info));
  return true;
}

const TensorInfo* TensorIndex::find(std::string_view name) const {
  auto it = by_name_.find(std::string(name));
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

uint64_t TensorIndex::total_bytes() const {
  uint64_t n = 0;
  for (const TensorInfo& t : tensors_) n += t.nbytes;
  return n;
}

namespace {

// 64-bit FNV-1a (Fowler/Noll/Vo, http://www.isthe.com/chongo/tech/comp/fnv/).
constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ull;
constexpr uint64_t kFnvPrime = 0x100000001b3ull;

void fnv_bytes(uint64_t& h, const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < n; ++i) {
    h ^= b[i];
    h *= kFnvPrime;
  }
}

void fnv_u64(uint64_t& h, uint64_t x) {
  uint8_t le[8];
  for (int i = 0; i < 8; ++i) le[i] = uint8_t(x >> (8 * i));
  fnv_bytes(h, le, 8);
}

}  // namespace

// Bytes hashed per tensor: name, a 0 byte, then dtype id, n_dims, each dim and nbytes as
// little-endian u64 -- fixed widths so that no two different indexes feed the same bytes.
uint64_t TensorIndex::identity_hash() const {
  uint64_t h = kFnvOffset;
  for (const TensorInfo& t : tensors_) {
    fnv_bytes(h, t.name.data(), t.name.size());
    const uint8_t zero = 0;
    fnv_bytes(h, &zero, 1);
    fnv_u64(h, uint64_t(t.dtype));
    fnv_u64(h, t.shape.size());
    for (int64_t d : t.shape) fnv_u64(h, uint64_t(d));
    fnv_u64(h, t.nbytes);
  }
  return h;
}

}  // namespace shoal
