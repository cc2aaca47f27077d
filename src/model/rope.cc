#include "model/rope.h"

#include <cmath>

#include "core/half.h"

namespace shoal {

std::vector<float> rope_inv_freq(const RopeConfig& r, bool local, const float* freq_factors) {
  const int half = r.rot_dims / 2;
  const double theta = (local && r.theta_local > 0) ? r.theta_local : r.theta;
  std::vector<float> out(static_cast<size_t>(half));
  constexpr double kPi = 3.14159265358979323846;
  for (int i = 0; i < half; ++i) {
    // As HF: base ** (arange(0, dim, 2).float() / dim), in float32.
    const float exponent = float(2 * i) / float(r.rot_dims);
    double f = 1.0 / std::pow(theta, double(exponent));
    if (!local) {
      switch (r.scaling) {
        case RopeScaling::kLinear:
          f /= r.factor;
          break;
        case RopeScaling::kLlama3: {
          const double low_wavelen = r.original_context / r.low_freq_factor;
          const double high_wavelen = r.original_context / r.high_freq_factor;
          const double wavelen = 2 * kPi / f;
          if (wavelen > low_wavelen) {
            f /= r.factor;
          } else if (wavelen >= high_wavelen) {
            const double smooth =
                (r.original_context / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
            f = (1 - smooth) * f / r.factor + smooth * f;
          }
          break;
        }
        case RopeScaling::kNone:
        case RopeScaling::kYarn:
          break;
      }
      if (freq_factors) f /= freq_factors[i];
    }
    float v = float(f);
    if (r.freq_dtype == DType::kBF16) v = bf16_to_f32(f32_to_bf16(v));
    if (r.freq_dtype == DType::kF16) v = f16_to_f32(f32_to_f16(v));
    out[size_t(i)] = v;
  }
  return out;
}

}  // namespace shoal
