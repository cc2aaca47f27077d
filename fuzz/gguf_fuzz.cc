// libFuzzer target: parse_gguf on raw bytes. Any input must give a value or a Status, never a
// crash, hang, leak or out-of-bounds read. On success, every tensor range must lie in the input.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "format/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto r = shoal::parse_gguf(data, size, "fuzz");
  if (r.ok()) {
    for (const shoal::TensorInfo& t : r->tensors) {
      if (t.offset > size || t.nbytes > size - t.offset) std::abort();
    }
    // Rendering touches every value (nested arrays included).
    for (const auto& [k, v] : r->metadata.entries()) (void)v.to_string(4);
  }
  return 0;
}
