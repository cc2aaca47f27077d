// The repacked Q8_0 / Q4_0 weight layout of the CUDA backend (cuda_util.h), checked on the host
// (no device needed): quant_pos() must place every value where the lanes of the tensor-core
// GEMV read it, i.e. the A fragment of mma.m16n8k16 (PTX ISA, "matrix fragments for
// mma.m16n8k16 with floating point type": lane 4g + t holds rows g and g + 8 at columns 2t,
// 2t + 1, 2t + 8, 2t + 9 of each 16-column k-step), and no two values may share a place.
#include <gtest/gtest.h>

#include <set>
#include <tuple>

#include "backend/cuda/cuda_util.h"

namespace shoal::test {
namespace {

using cuda::quant_pos;

struct Shape {
  int64_t rows, cols;
};
constexpr Shape kShapes[] = {{1, 32}, {17, 96}, {40, 256}, {16, 64}, {33, 160}};

TEST(CudaLayoutTest, EveryValueHasItsOwnPlaceInsideTheAllocation) {
  for (bool q4 : {false, true})
    for (const Shape& s : kShapes) {
      SCOPED_TRACE(testing::Message() << (q4 ? "Q4_0 " : "Q8_0 ") << s.rows << "x" << s.cols);
      const uint64_t quant_bytes = cuda::scale_offset(q4, s.rows, s.cols);
      const int64_t scales = cuda::padded_rows(s.rows) * cuda::quant_row_scales(q4, s.cols);
      EXPECT_EQ(cuda::repacked_bytes(q4, s.rows, s.cols), quant_bytes + uint64_t(scales) * 2);
      std::set<std::pair<int64_t, int>> places;
      std::set<int64_t> scale_of_block;
      for (int64_t r = 0; r < s.rows; ++r)
        for (int64_t k = 0; k < s.cols; ++k) {
          const cuda::QuantPos p = quant_pos(q4, s.cols, r, k);
          ASSERT_GE(p.byte, 0);
          ASSERT_LT(uint64_t(p.byte), quant_bytes);
          ASSERT_TRUE(places.insert({p.byte, p.shift}).second) << "value " << r << "," << k << " shares a place";
          ASSERT_GE(p.scale, 0);
          ASSERT_LT(p.scale, scales);
          // One scale per (row, 32-value block), shared by the block, not by another block.
          const cuda::QuantPos first = quant_pos(q4, s.cols, r, k / 32 * 32);
          ASSERT_EQ(p.scale, first.scale);
          if (k % 32 == 0) {
            ASSERT_TRUE(scale_of_block.insert(p.scale).second);
          }
        }
    }
}

// Where lane l = 4g + t of tile T, chunk c finds value (row g + 8 up, column 2t + i + 8h of
// k-step j of the chunk), from the fragment layout, independently of quant_pos().
std::tuple<int64_t, int> fragment_place(bool q4, int64_t chunks, int64_t T, int64_t c, int g, int t, int j, int up,
                                        int i, int h) {
  const int64_t lane_at = (T * chunks + c) * 512 + (4 * g + t) * 16;
  if (q4) return {lane_at + 4 * j + 2 * i + h, 4 * up};  // word j, nibble at 16i + 8h + 4up
  return {lane_at + 4 * (2 * j + h) + 2 * up + i, 0};   // word 2j + h, byte 2up + i
}

TEST(CudaLayoutTest, LanesFindTheirMmaFragments) {
  for (bool q4 : {false, true}) {
    const int64_t rows = 40, cols = 192, chunks = cuda::quant_chunks(q4, cols);
    const int steps = q4 ? 4 : 2;  // k-steps per chunk
    for (int64_t T = 0; T < cuda::padded_rows(rows) / 16; ++T)
      for (int64_t c = 0; c < chunks; ++c)
        for (int l = 0; l < 32; ++l)
          for (int j = 0; j < steps; ++j)
            for (int up = 0; up < 2; ++up)
              for (int i = 0; i < 2; ++i)
                for (int h = 0; h < 2; ++h) {
                  const int g = l / 4, t = l % 4;
                  const int64_t r = T * 16 + g + 8 * up, k = c * 16 * steps + 16 * j + 2 * t + i + 8 * h;
                  if (r >= rows || k >= cols) continue;
                  const cuda::QuantPos p = quant_pos(q4, cols, r, k);
                  const auto [byte, shift] = fragment_place(q4, chunks, T, c, g, t, j, up, i, h);
                  ASSERT_EQ(p.byte, byte) << (q4 ? "Q4_0" : "Q8_0") << " row " << r << " col " << k;
                  ASSERT_EQ(p.shift, shift);
                  // The lane reads the scales of its two rows (and, Q4_0, both blocks) at once.
                  const int64_t scale = q4 ? ((T * chunks + c) * 8 + g) * 4 + 2 * (j / 2) + up
                                           : ((T * chunks + c) * 8 + g) * 2 + up;
                  ASSERT_EQ(p.scale, scale);
                }
  }
}

}  // namespace
}  // namespace shoal::test
