#include "backend/tensor.h"

#include <fmt/format.h>

namespace shoal {

std::string Tensor::shape_string() const {
  std::string s = "[";
  for (int i = 0; i < nd; ++i) s += fmt::format("{}{}", i ? ", " : "", shape[size_t(i)]);
  return s + "]";
}

}  // namespace shoal
