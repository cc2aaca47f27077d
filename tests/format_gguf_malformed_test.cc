// One test per malformed-GGUF case: each builds the bytes by hand (tests/format_bytes.h) and
// asserts the error code and a key phrase of the message.
#include <gtest/gtest.h>

#include "format/gguf.h"
#include "format_bytes.h"

namespace shoal {
namespace {

using test::Bytes;
using test::gguf_header;
using test::gguf_kv_u32;
using test::gguf_tensor;

constexpr uint32_t kF32 = 0, kQ4_0 = 2;

Status parse(const Bytes& x) {
  auto r = parse_gguf(x.b.data(), x.b.size(), "bad.gguf");
  return r.ok() ? Status::Ok() : r.status();
}

void expect_gguf_error(const Bytes& x, Code code, const std::string& phrase) {
  Status s = parse(x);
  ASSERT_FALSE(s.ok()) << "expected an error containing: " << phrase;
  EXPECT_EQ(s.code(), code) << s.to_string();
  EXPECT_NE(s.message().find(phrase), std::string::npos) << s.to_string();
  EXPECT_NE(s.message().find("gguf 'bad.gguf'"), std::string::npos) << s.to_string();
}

// A valid file: one key, two F32 tensors [4] and [2, 8] at offsets 0 and 32.
Bytes good() {
  Bytes x = gguf_header(2, 1);
  x.add(gguf_kv_u32("test.n", 7));
  x.add(gguf_tensor("a", {4}, kF32, 0));
  x.add(gguf_tensor("b", {8, 2}, kF32, 32));
  x.pad_to(32).zeros(32 + 64);
  return x;
}

Bytes truncated(size_t n) {
  Bytes x = good();
  x.b.resize(n);
  return x;
}

TEST(FormatGgufMalformed, GoodFileParses) {
  Bytes x = good();
  auto r = parse_gguf(x.b.data(), x.b.size(), "bad.gguf");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->tensors.size(), 2u);
  EXPECT_EQ(r->tensors[1].shape, (std::vector<int64_t>{2, 8}));
  EXPECT_EQ(r->tensors[1].offset, r->data_offset + 32);
  EXPECT_EQ(r->tensors[1].nbytes, 64u);
}

TEST(FormatGgufMalformed, EmptyFile) { expect_gguf_error(Bytes{}, Code::kCorrupt, "truncated: magic"); }

TEST(FormatGgufMalformed, TruncatedInHeader) {
  expect_gguf_error(truncated(12), Code::kCorrupt, "truncated: tensor count");
}

TEST(FormatGgufMalformed, TruncatedInMetadata) {
  Bytes x = gguf_header(0, 2);
  x.add(gguf_kv_u32("test.n", 7));
  const size_t value_at = x.b.size() + 8 + 6 + 4;  // key "test.s", type, then the string value
  x.str("test.s").u32(8).str(std::string(100, 's'));
  x.b.resize(value_at + 8 + 50);
  expect_gguf_error(x, Code::kCorrupt, "string value of length 100");
  expect_gguf_error(x, Code::kCorrupt, "runs past the end of the file (size");
                    expect_gguf_error(x, Code::kCorrupt, "(metadata key 'test.s')");
  x.b.resize(value_at + 3);
  expect_gguf_error(x, Code::kCorrupt, "truncated: value needs 8 bytes");
}

TEST(FormatGgufMalformed, TruncatedInTensorInfos) {
  Bytes x = gguf_header(2, 1);
  x.str("test.s").u32(8).str(std::string(100, 's'));
  x.add(gguf_tensor("a", {4}, kF32, 0));
  const size_t b_at = x.b.size();
  x.add(gguf_tensor("b", {8, 2}, kF32, 32));
  x.pad_to(32).zeros(96);
  x.b.resize(b_at + 9 + 4 + 16 + 4 + 2);  // inside tensor b's offset
  expect_gguf_error(x, Code::kCorrupt, "truncated: tensor 'b' dims, type and offset needs 28 bytes");
}

TEST(FormatGgufMalformed, TruncatedInData) {
  Bytes x = good();
  expect_gguf_error(truncated(x.b.size() - 1), Code::kCorrupt,
                    "tensor 'b' data [");
  expect_gguf_error(truncated(x.b.size() - 1), Code::kCorrupt, "ends past end of file");
}

TEST(FormatGgufMalformed, BadMagic) {
  Bytes x = good();
  x.b[0] = 'X';
  expect_gguf_error(x, Code::kCorrupt, "bad magic 'XGUF'");
}

TEST(FormatGgufMalformed, Version1IsUnsupported) {
  expect_gguf_error(gguf_header(0, 0, 1), Code::kUnsupported, "version 1 is not supported");
}

TEST(FormatGgufMalformed, UnknownVersion) {
  expect_gguf_error(gguf_header(0, 0, 4), Code::kUnsupported, "version 4 is not supported");
}

TEST(FormatGgufMalformed, BigEndianIsUnsupported) {
  expect_gguf_error(gguf_header(0, 0, 0x03000000), Code::kUnsupported, "big-endian");
}

TEST(FormatGgufMalformed, Version2Parses) {
  Bytes x = gguf_header(0, 1, 2);
  x.add(gguf_kv_u32("k", 1));
  EXPECT_TRUE(parse(x).ok());
}

TEST(FormatGgufMalformed, HugeMetadataCount) {
  expect_gguf_error(gguf_header(0, uint64_t(1) << 60), Code::kCorrupt, "metadata count 1152921504606846976 cannot fit");
}

TEST(FormatGgufMalformed, HugeTensorCount) {
  expect_gguf_error(gguf_header(~uint64_t(0), 0), Code::kCorrupt, "tensor count");
}

TEST(FormatGgufMalformed, KeyLengthPastEnd) {
  Bytes x = gguf_header(0, 1);
  x.u64(1000).zeros(10);
  expect_gguf_error(x, Code::kCorrupt, "metadata key #0 of length 1000");
}

TEST(FormatGgufMalformed, KeyTooLong) {
  Bytes x = gguf_header(0, 1);
  x.str(std::string(70000, 'k')).u32(4).u32(1);
  expect_gguf_error(x, Code::kCorrupt, "has length 70000 (limit 65535)");
}

TEST(FormatGgufMalformed, EmptyKey) {
  Bytes x = gguf_header(0, 1);
  x.add(gguf_kv_u32("", 1));
  expect_gguf_error(x, Code::kCorrupt, "metadata key #0 is empty");
}

TEST(FormatGgufMalformed, StringValuePastEnd) {
  Bytes x = gguf_header(0, 1);
  x.str("name").u32(8).u64(~uint64_t(0) - 3).zeros(4);
  expect_gguf_error(x, Code::kCorrupt, "runs past the end of the file");
}

TEST(FormatGgufMalformed, ArrayLengthOverflow) {
  // 2^62 u32 elements: count x 4 overflows u64; must be rejected before allocating.
  Bytes x = gguf_header(0, 1);
  x.str("arr").u32(9).u32(4).u64(uint64_t(1) << 62).zeros(16);
  expect_gguf_error(x, Code::kCorrupt, "array of 4611686018427387904 u32 elements");
}

TEST(FormatGgufMalformed, StringArrayLengthTooLarge) {
  Bytes x = gguf_header(0, 1);
  x.str("arr").u32(9).u32(8).u64(1000).str("a").str("b");
  expect_gguf_error(x, Code::kCorrupt, "cannot fit in the");
}

TEST(FormatGgufMalformed, NestedArrayBombDepth) {
  Bytes x = gguf_header(0, 1);
  x.str("deep").u32(9);
  for (int i = 0; i < 100; ++i) x.u32(9).u64(1);  // array of array of ... (100 levels)
  x.u32(4).u64(0);
  expect_gguf_error(x, Code::kCorrupt, "arrays nested deeper than 8");
}

TEST(FormatGgufMalformed, NestedArrayBombWidth) {
  // An array of 2 arrays, each claiming 2^40 u64 elements.
  Bytes x = gguf_header(0, 1);
  x.str("wide").u32(9).u32(9).u64(2).u32(10).u64(uint64_t(1) << 40).zeros(64);
  expect_gguf_error(x, Code::kCorrupt, "array of 1099511627776 u64 elements");
}

TEST(FormatGgufMalformed, NestedArraysParse) {
  Bytes x = gguf_header(0, 1);
  x.str("nest").u32(9).u32(9).u64(2);
  x.u32(4).u64(2).u32(1).u32(2);
  x.u32(8).u64(1).str("hi");
  auto r = parse_gguf(x.b.data(), x.b.size(), "ok.gguf");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const auto* outer = r->metadata.find("nest")->as_array();
  ASSERT_EQ(outer->size(), 2u);
  EXPECT_EQ((*outer)[0].elem_type, MetaType::kU32);
  EXPECT_EQ((*outer)[0].as_array()->at(1).as_int(), 2);
  EXPECT_EQ(*(*outer)[1].as_array()->at(0).as_string(), "hi");
}

TEST(FormatGgufMalformed, UnknownValueType) {
  Bytes x = gguf_header(0, 1);
  x.str("k").u32(13).u32(0);
  expect_gguf_error(x, Code::kCorrupt, "metadata key 'k' has unknown value type 13");
}

TEST(FormatGgufMalformed, UnknownArrayElementType) {
  Bytes x = gguf_header(0, 1);
  x.str("k").u32(9).u32(77).u64(0);
  expect_gguf_error(x, Code::kCorrupt, "unknown array element type 77");
}

TEST(FormatGgufMalformed, BoolOutOfRange) {
  Bytes x = gguf_header(0, 1);
  x.str("flag").u32(7).u8(2);
  expect_gguf_error(x, Code::kCorrupt, "bool value 2");
}

TEST(FormatGgufMalformed, DuplicateKey) {
  Bytes x = gguf_header(0, 2);
  x.add(gguf_kv_u32("dup", 1)).add(gguf_kv_u32("dup", 2));
  expect_gguf_error(x, Code::kCorrupt, "duplicate metadata key 'dup'");
}

Bytes one_tensor(const Bytes& info, uint64_t data_bytes, const Bytes& kv = Bytes{}, uint64_t n_kv = 0) {
  Bytes x = gguf_header(1, n_kv);
  x.add(kv).add(info).pad_to(32).zeros(data_bytes);
  return x;
}

TEST(FormatGgufMalformed, UnknownDtype) {
  expect_gguf_error(one_tensor(gguf_tensor("t", {4}, 4, 0), 32), Code::kUnsupported,
                    "tensor 't' has unknown tensor type id 4");
  expect_gguf_error(one_tensor(gguf_tensor("t", {4}, 1000, 0), 32), Code::kUnsupported,
                    "unknown tensor type id 1000");
}

TEST(FormatGgufMalformed, TooManyDims) {
  expect_gguf_error(one_tensor(gguf_tensor("t", {1, 1, 1, 1, 1}, kF32, 0), 32), Code::kCorrupt,
                    "tensor 't' has n_dims 5 (must be 1..4)");
}

TEST(FormatGgufMalformed, ZeroDims) {
  expect_gguf_error(one_tensor(gguf_tensor("t", {}, kF32, 0), 32), Code::kCorrupt, "n_dims 0");
}

TEST(FormatGgufMalformed, ZeroDim) {
  expect_gguf_error(one_tensor(gguf_tensor("t", {4, 0}, kF32, 0), 32), Code::kCorrupt,
                    "tensor 't' dimension ne[1] = 0");
}

TEST(FormatGgufMalformed, NegativeDim) {
  expect_gguf_error(one_tensor(gguf_tensor("t", {uint64_t(-4)}, kF32, 0), 32), Code::kCorrupt,
                    "dimension ne[0] = 18446744073709551612");
}

TEST(FormatGgufMalformed, DimsOfOneAreFine) {
  EXPECT_TRUE(parse(one_tensor(gguf_tensor("t", {4, 1, 1, 1}, kF32, 0), 32)).ok());
}

TEST(FormatGgufMalformed, ElementCountOverflow) {
  expect_gguf_error(one_tensor(gguf_tensor("t", {uint64_t(1) << 32, uint64_t(1) << 32}, kF32, 0), 32),
                    Code::kCorrupt, "element count overflows");
}

TEST(FormatGgufMalformed, ByteSizeOverflow) {
  // 2^62 elements fit in int64, but 2^62 x 4 bytes does not fit in u64.
  expect_gguf_error(one_tensor(gguf_tensor("t", {uint64_t(1) << 31, uint64_t(1) << 31}, kF32, 0), 32),
                    Code::kCorrupt, "byte size overflows");
}

TEST(FormatGgufMalformed, NotAWholeNumberOfBlocks) {
  expect_gguf_error(one_tensor(gguf_tensor("t", {48}, kQ4_0, 0), 64), Code::kCorrupt,
                    "ne[0] = 48 is not a multiple of the Q4_0 block size 32");
}

TEST(FormatGgufMalformed, OffsetPastEnd) {
  expect_gguf_error(one_tensor(gguf_tensor("t", {4}, kF32, 64), 32), Code::kCorrupt,
                    "tensor 't' data [");
  expect_gguf_error(one_tensor(gguf_tensor("t", {4}, kF32, ~uint64_t(0) - 31), 32), Code::kCorrupt,
                    "offset 18446744073709551584 overflows");
}

TEST(FormatGgufMalformed, MisalignedOffset) {
  expect_gguf_error(one_tensor(gguf_tensor("t", {4}, kF32, 4), 32), Code::kCorrupt,
                    "offset 4 is not a multiple of the alignment 32");
}

TEST(FormatGgufMalformed, BadAlignmentValue) {
  for (uint32_t a : {0u, 3u, 48u, 1u << 21}) {
    SCOPED_TRACE(a);
    expect_gguf_error(one_tensor(gguf_tensor("t", {4}, kF32, 0), 32, gguf_kv_u32("general.alignment", a), 1),
                      Code::kCorrupt, "general.alignment");
  }
  Bytes kv;
  kv.str("general.alignment").u32(10).u64(64);  // u64, not u32
  expect_gguf_error(one_tensor(gguf_tensor("t", {4}, kF32, 0), 32, kv, 1), Code::kCorrupt,
                    "general.alignment has type u64");
}

TEST(FormatGgufMalformed, CustomAlignmentIsUsed) {
  Bytes x = gguf_header(1, 1);
  x.add(gguf_kv_u32("general.alignment", 64)).add(gguf_tensor("t", {4}, kF32, 64));
  x.pad_to(64).zeros(128);
  auto r = parse_gguf(x.b.data(), x.b.size(), "ok.gguf");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->alignment, 64u);
  EXPECT_EQ(r->data_offset % 64, 0u);
  EXPECT_EQ(r->tensors[0].offset, r->data_offset + 64);
  expect_gguf_error(one_tensor(gguf_tensor("t", {4}, kF32, 32), 64, gguf_kv_u32("general.alignment", 64), 1),
                    Code::kCorrupt, "not a multiple of the alignment 64");
}

TEST(FormatGgufMalformed, DuplicateTensorName) {
  Bytes x = gguf_header(2, 0);
  x.add(gguf_tensor("t", {4}, kF32, 0)).add(gguf_tensor("t", {4}, kF32, 32));
  x.pad_to(32).zeros(64);
  expect_gguf_error(x, Code::kCorrupt, "duplicate tensor name 't'");
}

TEST(FormatGgufMalformed, OverlappingTensors) {
  Bytes x = gguf_header(2, 0);
  x.add(gguf_tensor("a", {16}, kF32, 0)).add(gguf_tensor("b", {4}, kF32, 32));
  x.pad_to(32).zeros(64);
  expect_gguf_error(x, Code::kCorrupt, "overlaps tensor 'a'");
}

TEST(FormatGgufMalformed, TensorNameTooLongOrEmpty) {
  expect_gguf_error(one_tensor(gguf_tensor(std::string(65, 'n'), {4}, kF32, 0), 32), Code::kCorrupt,
                    "has length 65 (limit 64)");
  expect_gguf_error(one_tensor(gguf_tensor("", {4}, kF32, 0), 32), Code::kCorrupt, "empty name");
}

TEST(FormatGgufMalformed, VocabOnlyFileWithoutPadding) {
  // No tensors: the file may end right after the metadata.
  Bytes x = gguf_header(0, 1);
  x.add(gguf_kv_u32("k", 1));
  auto r = parse_gguf(x.b.data(), x.b.size(), "ok.gguf");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_GE(r->data_offset, x.b.size());
}

}  // namespace
}  // namespace shoal
