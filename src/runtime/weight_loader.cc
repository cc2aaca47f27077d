#include "runtime/weight_loader.h"

#include <unistd.h>

#include <cstring>
#include <map>

#include "core/log.h"
#include "tensor/quant.h"

namespace shoal {

Result<DType> WeightLoader::backend_dtype(DType t, WeightRole role, const std::string& name) {
  if (role == WeightRole::kVector) {
    if (t == DType::kF32 || t == DType::kF16 || t == DType::kBF16) return DType::kF32;
    return make_error(Code::kUnsupported, "tensor '{}': {} vectors are not supported (expected F32, F16 or BF16)",
                      name, dtype_name(t));
  }
  if (dtype_is_native(t)) return t;
  if (dtype_converts_to_q8_0(t)) return DType::kQ8_0;
  return make_error(Code::kUnsupported,
                    "tensor '{}' has type {}, which shoal cannot compute with (supported: F32, F16, BF16, Q8_0, "
                    "Q4_0; Q4_1, Q5_0, Q5_1, Q2_K..Q6_K are converted to Q8_0 at load)",
                    name, dtype_name(t));
}

Result<DType> WeightLoader::plan(const TensorInfo& info, WeightRole role) {
  SHOAL_ASSIGN_OR_RETURN(DType dt, backend_dtype(info.dtype, role, info.name));
  if (info.shape.empty() || info.shape.size() > 2)
    return make_error(Code::kUnsupported, "tensor '{}' has shape {}: expected a vector or a matrix", info.name,
                      info.shape_string());
  if (role == WeightRole::kVector && info.shape.size() != 1)
    return make_error(Code::kCorrupt, "tensor '{}' should be a vector but has shape {}", info.name, info.shape_string());
  const int64_t cols = info.shape.back();
  if (dt == DType::kQ8_0 && cols % 32 != 0)
    return make_error(Code::kUnsupported, "tensor '{}': rows of {} values cannot be converted to Q8_0", info.name, cols);
  return dt;
}

void WeightLoader::planned(const TensorInfo& info, Tensor& dst, const Tensor& t, bool add_one) {
  dst = t;
  items_.push_back({&info, &dst, add_one});
  backend_bytes_ += dst.nbytes();
  file_bytes_ += info.nbytes;
}

Status WeightLoader::add(const TensorInfo& info, WeightRole role, Tensor& dst, bool add_one) {
  SHOAL_ASSIGN_OR_RETURN(const DType dt, plan(info, role));
  const int64_t rows = info.shape.size() == 2 ? info.shape[0] : 1, cols = info.shape.back();
  Result<Tensor> t = info.shape.size() == 2 ? backend_.alloc_weight(dt, {rows, cols}) : backend_.alloc_weight(dt, {cols});
  if (!t.ok()) return t.status().with_context(fmt::format("allocating '{}'", info.name));
  planned(info, dst, *t, add_one);
  return Status::Ok();
}

Status WeightLoader::add_matrices(std::span<const TensorInfo* const> infos, std::span<Tensor* const> dsts) {
  if (infos.size() != dsts.size()) return make_error(Code::kInternal, "add_matrices: {} tensors, {} destinations",
                                                     infos.size(), dsts.size());
  std::vector<std::array<int64_t, 2>> shapes;
  DType dt = DType::kF32;
  for (size_t i = 0; i < infos.size(); ++i) {
    SHOAL_ASSIGN_OR_RETURN(const DType t, plan(*infos[i], WeightRole::kMatrix));
    if ((i > 0 && t != dt) || infos[i]->shape.size() != 2) {  // one allocation each
      for (size_t j = 0; j < infos.size(); ++j) SHOAL_RETURN_IF_ERROR(add(*infos[j], WeightRole::kMatrix, *dsts[j]));
      return Status::Ok();
    }
    dt = t;
    shapes.push_back({infos[i]->shape[0], infos[i]->shape[1]});
  }
  Result<std::vector<Tensor>> ts = backend_.alloc_weights(dt, shapes);
  if (!ts.ok()) return ts.status().with_context(fmt::format("allocating '{}' and the {} after it", infos[0]->name,
                                                            infos.size() - 1));
  for (size_t i = 0; i < infos.size(); ++i) planned(*infos[i], *dsts[i], (*ts)[i], false);
  return Status::Ok();
}

Status WeightLoader::run(const LoadProgress& progress) {
  std::vector<uint8_t> staging;       // file bytes when the source cannot be viewed in place
  std::vector<uint8_t> converted;     // bytes in the backend dtype, when they differ
  std::vector<float> values;          // dequantized values (vectors, conversions)
  struct ConvStat { int count = 0; uint64_t from = 0, to = 0; };
  std::map<DType, ConvStat> conversions;
  uint64_t done = 0;
  for (const Item& it : items_) {
    const TensorInfo& info = *it.info;
    Tensor& dst = *it.dst;
    WeightSource& src = *file_.sources[info.source];
    const uint8_t* bytes = src.view(info.offset, info.nbytes);
    if (!bytes) {
      staging.resize(info.nbytes);
      SHOAL_RETURN_IF_ERROR(src.read(info.offset, staging.data(), info.nbytes).with_context(info.name));
      bytes = staging.data();
    }
    const uint8_t* upload = bytes;
    const int64_t n = info.n_elements();
    if (dst.dtype != info.dtype || it.add_one) {
      converted.resize(dst.nbytes());
      if (dst.dtype == DType::kF32) {
        SHOAL_RETURN_IF_ERROR(dequantize(info.dtype, bytes, reinterpret_cast<float*>(converted.data()), n)
                                  .with_context(info.name));
        if (it.add_one)
          for (int64_t i = 0; i < n; ++i) reinterpret_cast<float*>(converted.data())[i] += 1.0f;
      } else if (dst.dtype == DType::kQ8_0) {
        SHOAL_RETURN_IF_ERROR(convert_to_q8_0(info.dtype, bytes, reinterpret_cast<BlockQ8_0*>(converted.data()), n)
                                  .with_context(info.name));
        auto& c = conversions[info.dtype];
        c.count++;
        c.from += info.nbytes;
        c.to += dst.nbytes();
      } else {
        return make_error(Code::kInternal, "no conversion from {} to {} for '{}'", dtype_name(info.dtype),
                          dtype_name(dst.dtype), info.name);
      }
      upload = converted.data();
    }
    SHOAL_RETURN_IF_ERROR(backend_.upload_weight(dst, upload, dst.nbytes()).with_context(info.name));
    src.release(info.offset, info.nbytes);
    done += info.nbytes;
    if (progress && !progress(done, file_bytes_)) {
      return make_error(Code::kUnavailable, "the load was stopped after {:.1f} of {:.1f} MiB", done / 1048576.0,
                        file_bytes_ / 1048576.0);
    }
  }
  for (const auto& [dt, c] : conversions) {
    spdlog::info("converted {} {} tensors to Q8_0 at load: {:.1f} MiB in the file -> {:.1f} MiB in memory (+{:.1f} MiB)",
                 c.count, dtype_name(dt), c.from / 1048576.0, c.to / 1048576.0,
                 (double(c.to) - double(c.from)) / 1048576.0);
  }
  return Status::Ok();
}

LoadProgress stderr_progress(std::string label) {
  const bool tty = ::isatty(2);
  auto last = std::make_shared<int>(-1);
  return [label = std::move(label), tty, last](uint64_t done, uint64_t total) {
    const int pct = total ? int(done * 100 / total) : 100;
    if (pct == *last) return true;
    if (tty) {
      constexpr int kWidth = 30;
      const int fill = pct * kWidth / 100;
      std::string bar(size_t(fill), '#');
      bar.append(size_t(kWidth - fill), '.');
      std::fprintf(stderr, "\r%s %3d%% [%s] %.2f/%.2f GiB%s", label.c_str(), pct, bar.c_str(), done / 1073741824.0,
                   total / 1073741824.0, pct == 100 ? "\n" : "");
      std::fflush(stderr);
    } else if (pct / 25 != *last / 25) {
      spdlog::info("{} {}% ({:.1f} of {:.1f} MiB)", label, pct, done / 1048576.0, total / 1048576.0);
    }
    *last = pct;
    return true;
  };
}

}  // namespace shoal
