// Where tensor bytes come from: a local file (mmap) today, an HTTP range client later. Loading only
// ever asks for byte ranges, so every source plugs in the same way.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "core/mmap_file.h"
#include "core/status.h"

namespace shoal {

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  /// A path or URL, for messages.
  virtual std::string describe() const = 0;
  /// Total size in bytes.
  virtual uint64_t size() const = 0;
  /// Copies exactly n bytes starting at offset into dst. Errors: kOutOfRange when the range is
  /// not inside the source, kIoError when the read fails.
  virtual Status read(uint64_t offset, void* dst, uint64_t n) = 0;
  /// Zero-copy access when the bytes are already in memory (mmap); nullptr otherwise or when the
  /// range is out of bounds. Counts as a read.
  virtual const uint8_t* view(uint64_t offset, uint64_t n) { return nullptr; }
  /// Hint that [offset, offset+n) will not be needed again (drops mmap pages).
  virtual void release(uint64_t offset, uint64_t n) {}
  /// Bytes handed out by read()/view() so far (a worker's load is checked against this).
  uint64_t bytes_read() const { return bytes_read_.load(std::memory_order_relaxed); }

 protected:
  std::atomic<uint64_t> bytes_read_{0};
};

/// A local file, memory-mapped.
class MmapSource final : public WeightSource {
 public:
  static Result<std::unique_ptr<MmapSource>> open(const std::string& path);
  std::string describe() const override { return file_.path(); }
  uint64_t size() const override { return file_.size(); }
  Status read(uint64_t offset, void* dst, uint64_t n) override;
  const uint8_t* view(uint64_t offset, uint64_t n) override;
  void release(uint64_t offset, uint64_t n) override { file_.release(offset, n); }
  const MappedFile& file() const { return file_; }

 private:
  explicit MmapSource(MappedFile f) : file_(std::move(f)) {}
  MappedFile file_;
};

}  // namespace shoal
