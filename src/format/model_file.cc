#include "format/model_file.h"

#include <algorithm>
#include <filesystem>

#include "format/gguf.h"
#include "format/hf_checkpoint.h"

namespace shoal {

uint64_t ModelFile::bytes_read() const {
  uint64_t n = 0;
  for (const auto& s : sources) n += s->bytes_read();
  return n;
}

Result<uint64_t> model_identity(const ModelFile& m) {
  constexpr uint64_t kFnvPrime = 0x100000001b3ull;
  uint64_t h = m.index.identity_hash();
  auto mix = [&](const uint8_t* p, size_t n) {
    for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * kFnvPrime;
  };
  constexpr uint64_t kSample = 32;
  uint8_t buf[kSample];
  for (const TensorInfo& t : m.index.tensors()) {
    if (t.source >= m.sources.size()) return make_error(Code::kInternal, "tensor '{}' names no source", t.name);
    const uint64_t n = std::min(kSample, t.nbytes);
    const uint64_t last = t.nbytes - n;
    for (uint64_t at : {uint64_t(0), last / 2, last}) {
      SHOAL_RETURN_IF_ERROR(m.sources[t.source]->read(t.offset + at, buf, n));
      mix(buf, size_t(n));
    }
  }
  return h;
}

namespace {

Result<ModelFile> open_gguf(std::unique_ptr<MmapSource> src, const std::string& path) {
  // Parsing reads the mapping directly: header bytes are not counted as weight reads.
  SHOAL_ASSIGN_OR_RETURN(GgufFile g, parse_gguf(src->file().data(), src->size(), path));
  ModelFile m;
  m.format = ModelFormat::kGguf;
  m.path = path;
  m.file_size = src->size();
  m.metadata = std::move(g.metadata);
  for (TensorInfo& t : g.tensors) {
    // parse_gguf already rejected duplicate names.
    m.index.add(std::move(t));
  }
  m.sources.push_back(std::move(src));
  return m;
}

bool has_suffix(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

Result<ModelFile> open_model_file(const std::string& path) {
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(st)) {
    return make_error(Code::kNotFound, "model '{}' does not exist", path);
  }
  if (std::filesystem::is_directory(st)) return open_hf_checkpoint(path);
  const std::filesystem::path p(path);
  const std::filesystem::path dir = p.has_parent_path() ? p.parent_path() : std::filesystem::path(".");
  // A sharded checkpoint is its folder: its index names the folder's shards.
  if (p.filename() == "model.safetensors.index.json") return open_hf_checkpoint(dir.string());
  SHOAL_ASSIGN_OR_RETURN(auto src, MmapSource::open(path));
  const uint8_t* d = src->file().data();
  if (src->size() >= 4 && d[0] == 'G' && d[1] == 'G' && d[2] == 'U' && d[3] == 'F') {
    return open_gguf(std::move(src), path);
  }
  if (has_suffix(path, ".safetensors")) return open_safetensors_model(std::move(src), path);
  if (has_suffix(path, ".gguf")) return open_gguf(std::move(src), path);  // reports the bad magic
  return make_error(Code::kUnsupported,
                    "'{}' is neither a GGUF file, a .safetensors file nor a checkpoint folder", path);
}

}  // namespace shoal
