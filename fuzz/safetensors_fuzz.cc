// libFuzzer target: parse_safetensors on raw bytes. Any input must give a value or a Status,
// never a crash, hang, leak or out-of-bounds read. On success, tensor ranges lie in the input.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "format/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto r = shoal::parse_safetensors(data, size, "fuzz");
  if (r.ok()) {
    for (const shoal::TensorInfo& t : r->tensors) {
      if (t.offset > size || t.nbytes > size - t.offset) std::abort();
    }
  }
  return 0;
}
