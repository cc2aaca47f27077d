#include "format/weight_source.h"

#include <cstring>

namespace shoal {

Result<std::unique_ptr<MmapSource>> MmapSource::open(const std::string& path) {
  SHOAL_ASSIGN_OR_RETURN(MappedFile f, MappedFile::open(path));
  return std::unique_ptr<MmapSource>(new MmapSource(std::move(f)));
}

Status MmapSource::read(uint64_t offset, void* dst, uint64_t n) {
  const uint64_t size = file_.size();
  if (offset > size || n > size - offset) {
    return make_error(Code::kOutOfRange, "read [{}, {}+{}) past the end of '{}' (size {})", offset,
                      offset, n, file_.path(), size);
  }
  if (n > 0) std::memcpy(dst, file_.data() + offset, n);
  bytes_read_.fetch_add(n, std::memory_order_relaxed);
  return Status::Ok();
}

const uint8_t* MmapSource::view(uint64_t offset, uint64_t n) {
  const uint64_t size = file_.size();
  if (offset > size || n > size - offset || file_.data() == nullptr) return nullptr;
  bytes_read_.fetch_add(n, std::memory_order_relaxed);
  return file_.data() + offset;
}

}  // namespace shoal
