#include "runtime/pipeline.h"

namespace shoal {

Status forward_in_steps(std::span<const int32_t> ids, int64_t pos0, int max_tokens, StepOutput& out,
                        const std::function<Status(std::span<const int32_t>, int64_t, StepOutput&)>& step) {
  if (ids.empty()) return make_error(Code::kInvalidArgument, "no tokens to run");
  const bool per_row = out.mode == HeadMode::kLogitsAll || out.mode == HeadMode::kArgmaxAll;
  std::vector<float> logits;
  std::vector<int32_t> row_ids;
  for (size_t done = 0; done < ids.size();) {
    const size_t n = std::min(ids.size() - done, size_t(max_tokens));
    const bool last = done + n == ids.size();
    StepOutput part;
    part.mode = (last || per_row) ? out.mode : HeadMode::kNone;
    part.top_k = out.top_k;
    SHOAL_RETURN_IF_ERROR(step(ids.subspan(done, n), pos0 + int64_t(done), part));
    if (per_row) {
      logits.insert(logits.end(), part.logits.begin(), part.logits.end());
      row_ids.insert(row_ids.end(), part.ids.begin(), part.ids.end());
    } else if (last) {
      logits = std::move(part.logits);
      row_ids = std::move(part.ids);
    }
    done += n;
  }
  out.logits = std::move(logits);
  out.ids = std::move(row_ids);
  return Status::Ok();
}

Result<int> Pipeline::decode(int32_t id, int64_t pos0, int max_steps, const DecodeSampling& how,
                             const std::function<bool(int32_t)>& on_token) {
  SHOAL_RETURN_IF_ERROR(check_decode_steps(pos0, max_steps, n_ctx()));
  SHOAL_RETURN_IF_ERROR(check_decode_sampling(how));
  DeviceSampling draw = how.draw;
  for (int k = 0; k < max_steps; ++k) {
    StepOutput out;
    out.mode = how.greedy ? HeadMode::kArgmaxLast : HeadMode::kTopKLast;
    out.top_k = how.greedy ? 0 : how.top_k;
    SHOAL_RETURN_IF_ERROR(forward(std::span<const int32_t>(&id, 1), pos0 + k, out));
    if (how.greedy) {
      id = out.ids.at(0);
    } else {
      if (out.ids.empty() || out.ids.size() != out.logits.size())
        return make_error(Code::kInternal, "top-k step returned {} ids and {} logits", out.ids.size(), out.logits.size());
      id = draw_token(out.ids.data(), out.logits.data(), int(out.ids.size()), draw);
    }
    if (!on_token(id)) return k + 1;
  }
  return max_steps;
}

Status LocalPipeline::forward(std::span<const int32_t> ids, int64_t pos0, StepOutput& out) {
  return forward_whole_slice(*slice_, ids, pos0, out);
}

Status forward_whole_slice(Slice& slice, std::span<const int32_t> ids, int64_t pos0, StepOutput& out) {
  return forward_in_steps(ids, pos0, slice.options().max_tokens, out,
                          [&](std::span<const int32_t> part, int64_t p0, StepOutput& o) {
                            StepInput in;
                            in.n = int(part.size());
                            in.pos0 = p0;
                            in.ids = part.data();
                            return slice.forward(in, o);
                          });
}

}  // namespace shoal
