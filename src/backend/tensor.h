// A view of a tensor in some backend's memory (host RAM for the CPU, device memory for CUDA).
// Row-major, dims outermost first. Non-owning: the backend that allocated it owns the bytes.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "core/check.h"
#include "tensor/dtype.h"

namespace shoal {

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::kF32;
  int nd = 0;
  std::array<int64_t, 4> shape{0, 0, 0, 0};  // outermost first; only the first nd are used
  /// Backend-private layout data (e.g. CUDA's separate scale array of a repacked Q8_0 weight).
  void* aux = nullptr;

  static Tensor make(void* data, DType dtype, std::initializer_list<int64_t> dims) {
    Tensor t;
    t.data = data;
    t.dtype = dtype;
    for (int64_t d : dims) t.shape[size_t(t.nd++)] = d;
    return t;
  }

  int64_t n_elements() const {
    int64_t n = 1;
    for (int i = 0; i < nd; ++i) n *= shape[size_t(i)];
    return n;
  }
  int64_t cols() const { return nd == 0 ? 1 : shape[size_t(nd - 1)]; }
  int64_t rows() const { return nd == 0 ? 1 : n_elements() / cols(); }
  /// Bytes of one row (whole quant blocks).
  uint64_t row_bytes() const {
    const auto& i = dtype_info(dtype);
    return uint64_t(cols() / i.block_size * i.type_size);
  }
  uint64_t nbytes() const { return row_bytes() * uint64_t(rows()); }

  /// Rows [first, first+n) of a 2-D (or flattened) tensor, same dtype. Only for plain
  /// (non-repacked) layouts: activations, caches.
  Tensor rows_view(int64_t first, int64_t n) const {
    SHOAL_CHECK(first >= 0 && n >= 0 && first + n <= rows(), "rows_view({}, {}) of {} rows", first, n, rows());
    SHOAL_CHECK(aux == nullptr, "rows_view of a repacked tensor");
    Tensor t = Tensor::make(static_cast<uint8_t*>(data) + uint64_t(first) * row_bytes(), dtype, {n, cols()});
    return t;
  }
  /// Same bytes seen with another shape (element counts must agree).
  Tensor reshaped(std::initializer_list<int64_t> dims) const {
    Tensor t = Tensor::make(data, dtype, dims);
    t.aux = aux;
    SHOAL_CHECK(t.n_elements() == n_elements(), "reshape changes the element count");
    return t;
  }
  std::string shape_string() const;
};

}  // namespace shoal
