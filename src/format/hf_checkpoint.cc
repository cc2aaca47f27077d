#include "format/hf_checkpoint.h"

#include <filesystem>
#include <set>
#include <unordered_map>

#include "format/json_doc.h"
#include "format/safetensors.h"

namespace shoal {

namespace fs = std::filesystem;

namespace {

Result<nlohmann::json> read_json_object(const std::string& path) {
  SHOAL_ASSIGN_OR_RETURN(std::string text, read_file(path));
  SHOAL_ASSIGN_OR_RETURN(nlohmann::json j, parse_json_doc(text, fmt::format("'{}'", path)));
  if (!j.is_object()) return make_error(Code::kCorrupt, "'{}' is not a JSON object", path);
  return j;
}

// Adds one shard's tensors to m as source `source`.
Status add_shard(ModelFile& m, std::unique_ptr<MmapSource> src, const std::string& path) {
  SHOAL_ASSIGN_OR_RETURN(SafetensorsFile st, parse_safetensors(src->file().data(), src->size(), path));
  const uint32_t source = uint32_t(m.sources.size());
  for (TensorInfo& t : st.tensors) {
    t.source = source;
    const std::string name = t.name;
    if (!m.index.add(std::move(t))) {
      return make_error(Code::kCorrupt, "checkpoint '{}': tensor '{}' is stored twice (again in '{}')",
                        m.path, name, path);
    }
  }
  m.file_size += src->size();
  m.sources.push_back(std::move(src));
  return Status::Ok();
}

bool plain_file_name(const std::string& s) {
  return !s.empty() && s != "." && s != ".." && s.find('/') == std::string::npos &&
         s.find('\\') == std::string::npos && s.find('\0') == std::string::npos;
}

Status open_sharded(ModelFile& m, const std::string& dir, const std::string& index_path) {
  SHOAL_ASSIGN_OR_RETURN(nlohmann::json idx, read_json_object(index_path));
  auto wm = idx.find("weight_map");
  if (wm == idx.end() || !wm->is_object() || wm->empty()) {
    return make_error(Code::kCorrupt, "'{}': weight_map is missing, empty or not an object", index_path);
  }
  std::unordered_map<std::string, std::string> shard_of;
  std::set<std::string> shards;
  for (auto& [tensor, file] : wm->items()) {
    if (!file.is_string() || !plain_file_name(file.get<std::string>())) {
      return make_error(Code::kCorrupt, "'{}': weight_map entry '{}' is not a plain file name",
                        index_path, tensor);
    }
    shard_of.emplace(tensor, file.get<std::string>());
    shards.insert(file.get<std::string>());
  }
  for (const std::string& shard : shards) {
    const std::string path = (fs::path(dir) / shard).string();
    SHOAL_ASSIGN_OR_RETURN(auto src, MmapSource::open(path));
    const size_t first = m.index.size();
    SHOAL_RETURN_IF_ERROR(add_shard(m, std::move(src), path));
    for (size_t i = first; i < m.index.size(); ++i) {
      const std::string& name = m.index.tensors()[i].name;
      auto it = shard_of.find(name);
      if (it == shard_of.end() || it->second != shard) {
        return make_error(Code::kCorrupt, "'{}': tensor '{}' is in shard '{}' but the weight_map says {}",
                          index_path, name, shard,
                          it == shard_of.end() ? std::string("nothing") : "'" + it->second + "'");
      }
    }
  }
  for (const auto& [tensor, shard] : shard_of) {
    if (!m.index.find(tensor)) {
      return make_error(Code::kCorrupt, "'{}': tensor '{}' is in the weight_map but not in shard '{}'",
                        index_path, tensor, shard);
    }
  }
  return Status::Ok();
}

}  // namespace

Result<ModelFile> open_hf_checkpoint(const std::string& dir) {
  ModelFile m;
  m.format = ModelFormat::kHuggingFace;
  m.path = dir;
  const std::string config = (fs::path(dir) / "config.json").string();
  if (!fs::exists(config)) return make_error(Code::kNotFound, "checkpoint '{}' has no config.json", dir);
  SHOAL_ASSIGN_OR_RETURN(m.hf_config, read_json_object(config));
  const std::string index = (fs::path(dir) / "model.safetensors.index.json").string();
  const std::string single = (fs::path(dir) / "model.safetensors").string();
  if (fs::exists(index)) {
    SHOAL_RETURN_IF_ERROR(open_sharded(m, dir, index));
  } else if (fs::exists(single)) {
    SHOAL_ASSIGN_OR_RETURN(auto src, MmapSource::open(single));
    SHOAL_RETURN_IF_ERROR(add_shard(m, std::move(src), single));
  } else {
    return make_error(Code::kNotFound,
                      "checkpoint '{}' has neither model.safetensors nor model.safetensors.index.json", dir);
  }
  return m;
}

Result<ModelFile> open_safetensors_model(std::unique_ptr<MmapSource> src, const std::string& path) {
  ModelFile m;
  m.format = ModelFormat::kHuggingFace;
  m.path = path;
  const fs::path config = fs::path(path).parent_path() / "config.json";
  if (fs::exists(config)) {
    SHOAL_ASSIGN_OR_RETURN(m.hf_config, read_json_object(config.string()));
  }
  SHOAL_RETURN_IF_ERROR(add_shard(m, std::move(src), path));
  return m;
}

}  // namespace shoal
