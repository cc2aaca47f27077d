// A read-only memory-mapped file.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"

namespace shoal {

/// Maps a whole file read-only. Movable, not copyable; unmaps on destruction.
class MappedFile {
 public:
  /// Errors: kNotFound (no such file), kIoError (open/stat/mmap failed).
  static Result<MappedFile> open(const std::string& path);

  MappedFile() = default;
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  /// Tells the kernel the bytes [offset, offset+n) are done with (MADV_DONTNEED); keeps RSS low
  /// while streaming a large file.
  void release(uint64_t offset, uint64_t n) const;

 private:
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  std::string path_;
};

/// Reads a whole (small) file into a string. Errors: kNotFound, kIoError, kInvalidArgument (a
/// directory).
Result<std::string> read_file(const std::string& path);

}  // namespace shoal
