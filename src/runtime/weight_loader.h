// Streams weights from a model file into backend buffers (DESIGN.md "Weights"): every destination
// is allocated first, then tensors are read one at a time from their WeightSource (zero-copy from
// an mmap, or through one reusable staging buffer), converted if needed, uploaded, and their
// pages dropped. Peak host memory beyond the backend's own buffers is about the largest tensor.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "format/model_file.h"

namespace shoal {

/// How a tensor is stored on the backend.
enum class WeightRole {
  kMatrix,  // kept in its dtype if native (F32/F16/BF16/Q8_0/Q4_0), other quants -> Q8_0
  kVector,  // norms, biases, frequency tables: always F32
};

/// Called with (bytes done, bytes total) after each tensor while loading; returns false to stop the
/// load there (the loader then fails with kUnavailable, "the load was stopped").
using LoadProgress = std::function<bool(uint64_t done, uint64_t total)>;

class WeightLoader {
 public:
  WeightLoader(ModelFile& file, Backend& backend) : file_(file), backend_(backend) {}

  /// Plans one tensor: chooses the backend dtype, checks the shape and allocates `dst` (dst is
  /// filled by run()). `add_one` adds 1.0 to every value (Gemma's (1 + w) norms from HF files).
  /// Errors: kUnsupported (dtype Shoal cannot compute or convert, named), kOutOfMemory.
  Status add(const TensorInfo& info, WeightRole role, Tensor& dst, bool add_one = false);
  /// Plans several matrices (role kMatrix, shape [rows, cols] each) like add(), allocated in one
  /// block when their backend dtypes agree (Backend::alloc_weights: a layer's q / k / v, or its
  /// gate / up, which the CUDA backend's prefill then computes in one GEMM); otherwise (dtypes that differ, a 1-D
  /// shape) one add() each, after which an error leaves the earlier dsts allocated and planned:
  /// the caller frees the dsts whose data is set (Slice does). Errors: as add(); kInternal when
  /// the spans' sizes differ.
  Status add_matrices(std::span<const TensorInfo* const> infos, std::span<Tensor* const> dsts);

  /// Streams every planned tensor into place. Logs one line per converted dtype with the memory
  /// cost. Errors: kIoError / kCorrupt from the source, backend upload errors, kUnavailable when
  /// `progress` stopped it.
  Status run(const LoadProgress& progress = {});

  /// Bytes the planned tensors take on the backend.
  uint64_t backend_bytes() const { return backend_bytes_; }
  /// Bytes the planned tensors take in the file.
  uint64_t file_bytes() const { return file_bytes_; }

  /// The backend dtype a tensor of `file_dtype` gets in `role`; kUnsupported if none.
  static Result<DType> backend_dtype(DType file_dtype, WeightRole role, const std::string& name);

 private:
  /// The backend dtype of a tensor to add, after the checks add() documents.
  static Result<DType> plan(const TensorInfo& info, WeightRole role);
  /// Records an allocated tensor t for run(): dst = t.
  void planned(const TensorInfo& info, Tensor& dst, const Tensor& t, bool add_one);

  struct Item {
    const TensorInfo* info;
    Tensor* dst;
    bool add_one;
  };
  ModelFile& file_;
  Backend& backend_;
  std::vector<Item> items_;
  uint64_t backend_bytes_ = 0;
  uint64_t file_bytes_ = 0;
};

/// A progress bar on stderr for long loads ("loading  43% [#####.....] 1.2/2.8 GiB"); prints
/// only when stderr is a terminal, else logs at 25% steps. Never stops the load.
LoadProgress stderr_progress(std::string label);

}  // namespace shoal
