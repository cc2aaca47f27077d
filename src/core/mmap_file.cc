#include "core/mmap_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace shoal {

Result<MappedFile> MappedFile::open(const std::string& path) {
  // O_NONBLOCK: a FIFO opens at once (then fstat refuses it) instead of waiting for a writer;
  // it changes nothing for the regular file that is mapped.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    return Status(err == ENOENT ? Code::kNotFound : Code::kIoError,
                  fmt::format("cannot open '{}': {}", path, std::strerror(err)));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return make_error(Code::kIoError, "cannot stat '{}': {}", path, std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return make_error(Code::kInvalidArgument, "'{}' is not a regular file", path);
  }
  MappedFile f;
  f.path_ = path;
  f.size_ = uint64_t(st.st_size);
  if (f.size_ > 0) {
    void* p = ::mmap(nullptr, f.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return make_error(Code::kIoError, "cannot mmap '{}': {}", path, std::strerror(err));
    }
    f.data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  return f;
}

MappedFile::MappedFile(MappedFile&& o) noexcept
    : data_(o.data_), size_(o.size_), path_(std::move(o.path_)) {
  o.data_ = nullptr;
  o.size_ = 0;
}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
    data_ = o.data_;
    size_ = o.size_;
    path_ = std::move(o.path_);
    o.data_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

void MappedFile::release(uint64_t offset, uint64_t n) const {
  if (!data_ || offset >= size_) return;
  const uint64_t page = uint64_t(::sysconf(_SC_PAGESIZE));
  uint64_t begin = (offset + page - 1) / page * page;
  uint64_t end = std::min(size_, offset + n) / page * page;
  if (end > begin) ::madvise(const_cast<uint8_t*>(data_) + begin, end - begin, MADV_DONTNEED);
}

Result<std::string> read_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {  // (an ifstream opens it and reads nothing)
    return make_error(Code::kInvalidArgument, "'{}' is a directory, not a file", path);
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return Status(errno == ENOENT ? Code::kNotFound : Code::kIoError,
                  fmt::format("cannot open '{}': {}", path, std::strerror(errno)));
  }
  std::string text;
  char buf[1 << 16];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {  // (read sets badbit on a read error;
    text.append(buf, size_t(in.gcount()));                //  `ss << rdbuf()` hid it)
    if (!in) break;
  }
  if (in.bad()) return make_error(Code::kIoError, "cannot read '{}': {}", path, std::strerror(errno));
  return text;
}

}  // namespace shoal
