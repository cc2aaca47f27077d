// GGUF files (spec: ggml docs/gguf.md): reading from raw bytes, and writing.
//
// Layout (little-endian, versions 2 and 3):
//   u32 magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
//   n_kv x (string key | u32 value_type | value)        string = u64 length + bytes
//   n_tensors x (string name | u32 n_dims | u64 ne[n_dims] | u32 ggml_type | u64 offset)
//   padding to `general.alignment` (default 32) | data section (offsets relative to its start)
// An array value is u32 element type | u64 count | count values (arrays may nest).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <unordered_set>
#include <vector>

#include "core/status.h"
#include "format/metadata.h"
#include "format/tensor_index.h"

namespace shoal {

inline constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as a little-endian u32
inline constexpr uint32_t kGgufDefaultAlignment = 32;
inline constexpr uint32_t kGgufMaxAlignment = 1u << 20;  // larger values are rejected as corrupt
inline constexpr uint32_t kGgufMaxDims = 4;              // GGML_MAX_DIMS
inline constexpr uint64_t kGgufMaxTensorName = 64;       // spec: names are at most 64 bytes
inline constexpr uint64_t kGgufMaxKey = 65535;           // spec: keys are at most 2^16-1 bytes
inline constexpr int kGgufMaxArrayDepth = 8;             // arrays of arrays nest at most this deep

/// A parsed GGUF: header facts, metadata in file order and the tensor index in file order.
struct GgufFile {
  uint32_t version = 3;
  Metadata metadata;
  std::vector<TensorInfo> tensors;  // offsets absolute from the start of the bytes; source 0
  uint32_t alignment = kGgufDefaultAlignment;
  uint64_t data_offset = 0;  // start of the data section (aligned; may equal the size)
};

/// Parses and validates a whole GGUF held in memory. `name` (usually the path) only appears in
/// messages: "gguf 'name': ...". Checks every count, length, type, shape, offset and size against
/// the bytes before using or allocating for it; afterwards each tensor's byte range lies inside
/// [0, size), ranges do not overlap, and nbytes matches dtype x shape.
/// Errors: kCorrupt (malformed or truncated bytes), kUnsupported (version other than 2 or 3,
/// big-endian file, tensor type id not known to Shoal's dtype table).
Result<GgufFile> parse_gguf(const uint8_t* data, uint64_t size, const std::string& name);

/// Builds a GGUF (version 3, little-endian). Metadata keeps insertion order; tensors are laid out
/// in the order added, each at an offset that is a multiple of the alignment (the value of
/// `general.alignment` if set, else 32). Tensor bytes are either copied in or produced by a
/// callback at write time, so a multi-GB model never sits in memory.
class GgufWriter {
 public:
  /// Fills dst with the n bytes of the tensor starting at byte `offset` of that tensor.
  /// Called in order, with chunks of at most a few MiB.
  using Filler = std::function<Status(uint64_t offset, uint8_t* dst, uint64_t n)>;

  /// Adds or replaces a metadata key (replacing keeps its position).
  void set(std::string key, MetaValue value) { metadata_.set(std::move(key), std::move(value)); }
  /// Every key of `m`, in order.
  void set_all(const Metadata& m);
  /// Adds a tensor whose bytes are copied now. shape is outermost-first (PyTorch order).
  /// Errors: kInvalidArgument (empty, too long or duplicate name; 0 or more than 4 dims; a dim
  /// <= 0; innermost dim not a whole number of blocks; bytes.size() != dtype x shape).
  Status add_tensor(std::string name, DType dtype, std::vector<int64_t> shape,
                    std::span<const uint8_t> bytes);
  /// Adds a tensor whose bytes `fill` produces while writing. Same errors.
  Status add_tensor(std::string name, DType dtype, std::vector<int64_t> shape, Filler fill);

  /// Writes the file. Errors: kInvalidArgument (a metadata value whose variant does not match
  /// its type, a bad general.alignment), kIoError, or whatever a Filler returns.
  Status write(const std::string& path) const;
  /// The same bytes, in memory (for tests and small files).
  Result<std::vector<uint8_t>> write_to_bytes() const;

  /// Byte destination used by write() / write_to_bytes() (defined in gguf_writer.cc).
  class Sink;

 private:
  struct Pending {
    TensorInfo info;  // offset relative to the data section
    std::vector<uint8_t> bytes;
    Filler fill;
  };
  Status check_tensor(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                      uint64_t* nbytes) const;
  Status write_to(Sink& out) const;

  Metadata metadata_;
  std::vector<Pending> tensors_;
  std::unordered_set<std::string> names_;
};

}  // namespace shoal
