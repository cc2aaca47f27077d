// Metadata, MetaValue and TensorIndex basics; the identity hash is checked against FNV-1a
// computed independently (Python, from the byte layout documented in tensor_index.cc).
#include <gtest/gtest.h>

#include "core/log.h"
#include "format/metadata.h"
#include "format/tensor_index.h"

namespace shoal {
namespace {

TEST(FormatMetadata, SetKeepsOrderAndReplacesInPlace) {
  Metadata m;
  m.set("b", MetaValue::u32(1));
  m.set("a", MetaValue::str("x"));
  m.set("b", MetaValue::i32(-5));
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m.entries()[0].first, "b");
  EXPECT_EQ(m.get_int("b"), -5);
  EXPECT_EQ(m.get_string("a"), "x");
  EXPECT_EQ(m.find("c"), nullptr);
  EXPECT_FALSE(m.get_int("a").has_value());
  EXPECT_FALSE(m.get_string("b").has_value());
}

TEST(FormatMetadata, TypedGetters) {
  Metadata m;
  m.set("u64", MetaValue::u64(~uint64_t(0)));
  m.set("f", MetaValue::f32(0.5f));
  m.set("flag", MetaValue::boolean(true));
  m.set("toks", MetaValue::array(MetaType::kString, {MetaValue::str("a"), MetaValue::str("b")}));
  m.set("ints", MetaValue::array(MetaType::kI32, {MetaValue::i32(3), MetaValue::i32(-4)}));
  EXPECT_FALSE(m.get_int("u64").has_value());  // does not fit int64
  EXPECT_EQ(m.get_float("f"), 0.5);
  EXPECT_EQ(m.get_bool("flag"), true);
  EXPECT_EQ(m.get_int("flag"), 1);
  EXPECT_EQ(m.get_string_array("toks"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(m.get_int_array("ints"), (std::vector<int64_t>{3, -4}));
  EXPECT_EQ(m.get_float_array("ints"), (std::vector<double>{3, -4}));
  EXPECT_FALSE(m.get_string_array("ints").has_value());
  EXPECT_FALSE(m.get_int_array("toks").has_value());
}

TEST(FormatMetadata, ToStringAbbreviatesAndEscapes) {
  std::vector<MetaValue> items;
  for (int i = 0; i < 10; ++i) items.push_back(MetaValue::i32(i));
  EXPECT_EQ(MetaValue::array(MetaType::kI32, items).to_string(3), "i32[10] [0, 1, 2, ...]");
  EXPECT_EQ(MetaValue::str("a\"b\n").to_string(), "\"a\\\"b\\x0a\"");
  // Bytes that are not UTF-8 and an escape sequence are written as \xHH; valid UTF-8 is kept.
  EXPECT_EQ(MetaValue::str(std::string("na\xff\xfe\x1b[31m\0\xc3\xa9", 12)).to_string(),
            "\"na\\xff\\xfe\\x1b[31m\\x00\xc3\xa9\"");
  EXPECT_EQ(MetaValue::f32(1e-5f).to_string(), "1e-05");
  EXPECT_EQ(MetaValue::boolean(false).to_string(), "false");
}

TEST(CoreText, EscapeUnprintableKeepsPrintableUtf8) {
  EXPECT_EQ(escape_unprintable("plain \xc3\xa9 \xf0\x9f\xa6\x99"), "plain \xc3\xa9 \xf0\x9f\xa6\x99");
  EXPECT_EQ(escape_unprintable(std::string("llama\0junk", 10)), "llama\\x00junk");
  EXPECT_EQ(escape_unprintable("a\nb\x1b[0m\x7f"), "a\\x0ab\\x1b[0m\\x7f");
  EXPECT_EQ(escape_unprintable("\xc2\x9b" "31m\xc2\xa0"), "\\xc2\\x9b" "31m\xc2\xa0");  // C1's CSI; NBSP kept
  EXPECT_EQ(escape_unprintable("\xc0\x80\xed\xa0\x80\xe2\x82"), "\\xc0\\x80\\xed\\xa0\\x80\\xe2\\x82");
}

TEST(FormatTensorIndex, IdentityHashIsFnv1aOfNamesDtypesShapesSizes) {
  TensorIndex idx;
  EXPECT_EQ(idx.identity_hash(), 0xcbf29ce484222325ull);  // FNV-1a offset basis
  ASSERT_TRUE(idx.add({"a", DType::kF32, {2}, 0, 128, 8}));
  ASSERT_TRUE(idx.add({"blk.0.w", DType::kBF16, {4, 3}, 1, 7, 24}));
  EXPECT_FALSE(idx.add({"a", DType::kF32, {2}, 0, 0, 8}));
  EXPECT_EQ(idx.identity_hash(), 0x478ba4061eb2fa46ull);
  // Offsets and sources do not change the identity; shapes do.
  TensorIndex moved;
  ASSERT_TRUE(moved.add({"a", DType::kF32, {2}, 3, 999, 8}));
  ASSERT_TRUE(moved.add({"blk.0.w", DType::kBF16, {4, 3}, 0, 0, 24}));
  EXPECT_EQ(moved.identity_hash(), idx.identity_hash());
  TensorIndex other;
  ASSERT_TRUE(other.add({"a", DType::kF32, {2}, 0, 128, 8}));
  ASSERT_TRUE(other.add({"blk.0.w", DType::kBF16, {3, 4}, 1, 7, 24}));
  EXPECT_NE(other.identity_hash(), idx.identity_hash());
  EXPECT_EQ(idx.total_bytes(), 32u);
  const TensorInfo* w = idx.find("blk.0.w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->n_elements(), 12);
  EXPECT_EQ(w->rows(), 4);
  EXPECT_EQ(w->cols(), 3);
  EXPECT_EQ(w->shape_string(), "[4, 3]");
}

}  // namespace
}  // namespace shoal
