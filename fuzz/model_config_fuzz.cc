// libFuzzer target: a Hugging Face config.json from raw bytes, as a checkpoint folder's is read
// (parse_json_doc, then load_model_config over an empty tensor index). Any input must give a
// config or a Status, never a crash, hang or stack overflow; the DOM that parses must copy and
// compare as the loaders copy it (a document nested 100k deep once overflowed the stack there).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "format/json_doc.h"
#include "format/model_file.h"
#include "model/arch.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto j = shoal::parse_json_doc(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
  if (!j.ok() || !j->is_object()) return 0;
  shoal::ModelFile m;
  m.format = shoal::ModelFormat::kHuggingFace;
  m.path = "fuzz";
  m.hf_config = std::move(*j);
  const nlohmann::json copy = m.hf_config;
  if (copy != m.hf_config) std::abort();
  auto c = shoal::load_model_config(m);
  if (c.ok() && int(c->layers.size()) != c->n_layers) std::abort();
  return 0;
}
