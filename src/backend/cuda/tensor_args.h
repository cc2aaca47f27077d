// Tensor arguments of the CUDA ops as raw device pointers, with the dtype checked (a mismatch is a
// bug: SHOAL_CHECK, as in the reference). Only included by src/backend/cuda/*.cc.
#pragma once

#include "backend/backend.h"
#include "backend/cuda/kernels.h"
#include "core/check.h"

namespace shoal::cuda {

inline float* f32(Tensor& t) {
  SHOAL_CHECK(t.dtype == DType::kF32, "expected F32, got {}", dtype_name(t.dtype));
  return static_cast<float*>(t.data);
}
inline const float* f32(const Tensor& t) {
  SHOAL_CHECK(t.dtype == DType::kF32, "expected F32, got {}", dtype_name(t.dtype));
  return static_cast<const float*>(t.data);
}
inline const int32_t* i32(const Tensor& t) {
  SHOAL_CHECK(t.dtype == DType::kI32, "expected I32, got {}", dtype_name(t.dtype));
  return static_cast<const int32_t*>(t.data);
}

inline Act act_of(Activation a) { return static_cast<Act>(static_cast<int>(a)); }

/// The kernels' kind of a KV cache of type t (F32, F16 or Q8_0; another type is a bug).
inline CacheKind cache_kind(DType t) {
  switch (t) {
    case DType::kF32:
      return CacheKind::kF32;
    case DType::kF16:
      return CacheKind::kF16;
    case DType::kQ8_0:
      return CacheKind::kQ8_0;
    default:
      SHOAL_CHECK(false, "KV cache of type {} (expected F32, F16 or Q8_0)", dtype_name(t));
  }
  return CacheKind::kF32;
}

}  // namespace shoal::cuda
