// safetensors: the fixture files parse with the facts fixtures/README.md states; one test per
// malformed case, each asserting the error code and a key phrase.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "core/mmap_file.h"
#include "format/safetensors.h"
#include "test_util.h"

namespace shoal {
namespace {

Result<SafetensorsFile> parse_file(const std::string& path) {
  auto f = MappedFile::open(path);
  if (!f.ok()) return f.status();
  return parse_safetensors(f->data(), f->size(), path);
}

TEST(FormatSafetensors, ReferenceFixtureFacts) {
  // README.md: input_ids int32 [T], logits f32 [T, V], generated_ids int32 [G],
  // decode_logits f32 [G, V]; T = 20, G = 16; hf/llama has vocab_size 512.
  auto r = parse_file(test::fixture("hf/llama/reference.safetensors"));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->tensors.size(), 4u);
  std::map<std::string, const TensorInfo*> by;
  for (const TensorInfo& t : r->tensors) by[t.name] = &t;
  ASSERT_TRUE(by.count("input_ids") && by.count("logits") && by.count("generated_ids") &&
              by.count("decode_logits"));
  EXPECT_EQ(by["input_ids"]->dtype, DType::kI32);
  EXPECT_EQ(by["input_ids"]->shape, (std::vector<int64_t>{20}));
  EXPECT_EQ(by["logits"]->dtype, DType::kF32);
  EXPECT_EQ(by["logits"]->shape, (std::vector<int64_t>{20, 512}));
  EXPECT_EQ(by["generated_ids"]->shape, (std::vector<int64_t>{16}));
  EXPECT_EQ(by["decode_logits"]->shape, (std::vector<int64_t>{16, 512}));
  EXPECT_EQ(by["decode_logits"]->nbytes, 16u * 512 * 4);
}

TEST(FormatSafetensors, EveryFixtureSafetensorsParses) {
  int n = 0;
  for (const char* dir : {"hf", "quant"}) {
    for (const auto& e : std::filesystem::recursive_directory_iterator(test::fixture(dir))) {
      if (e.path().extension() != ".safetensors") continue;
      SCOPED_TRACE(e.path().string());
      auto r = parse_file(e.path().string());
      ASSERT_TRUE(r.ok()) << r.status().to_string();
      EXPECT_FALSE(r->tensors.empty());
      for (size_t i = 1; i < r->tensors.size(); ++i) {
        EXPECT_GE(r->tensors[i].offset, r->tensors[i - 1].offset + r->tensors[i - 1].nbytes);
      }
      ++n;
    }
  }
  EXPECT_EQ(n, 10 * 2 + 10);
}

TEST(FormatSafetensors, WriterRoundTrip) {
  std::vector<SafetensorsTensor> ts = {
      {"w", DType::kBF16, {2, 3}, std::vector<uint8_t>(12, 7)},
      {"ids", DType::kI64, {2}, std::vector<uint8_t>(16, 9)},
      {"scalar", DType::kF32, {}, std::vector<uint8_t>{0, 0, 128, 63}},
      {"empty", DType::kF16, {0, 4}, {}},
  };
  auto bytes = write_safetensors(ts, {{"format", "pt"}});
  ASSERT_TRUE(bytes.ok()) << bytes.status().to_string();
  auto r = parse_safetensors(bytes->data(), bytes->size(), "mem");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->metadata.at("format"), "pt");
  EXPECT_EQ(r->data_offset % 8, 0u);
  ASSERT_EQ(r->tensors.size(), 4u);
  for (const SafetensorsTensor& want : ts) {
    auto it = std::find_if(r->tensors.begin(), r->tensors.end(),
                           [&](const TensorInfo& t) { return t.name == want.name; });
    ASSERT_NE(it, r->tensors.end()) << want.name;
    EXPECT_EQ(it->dtype, want.dtype);
    EXPECT_EQ(it->shape, want.shape);
    ASSERT_EQ(it->nbytes, want.bytes.size());
    if (it->nbytes) {
      EXPECT_EQ(std::memcmp(bytes->data() + it->offset, want.bytes.data(), it->nbytes), 0);
    }
  }
}

// --- malformed files -------------------------------------------------------------------------

std::vector<uint8_t> with_header(const std::string& json, size_t data_bytes, uint64_t claimed = 0) {
  std::vector<uint8_t> b(8);
  const uint64_t n = claimed ? claimed : json.size();
  std::memcpy(b.data(), &n, 8);
  b.insert(b.end(), json.begin(), json.end());
  b.resize(b.size() + data_bytes, 0);
  return b;
}

void expect_safetensors_error(const std::vector<uint8_t>& b, Code code, const std::string& phrase) {
  auto r = parse_safetensors(b.data(), b.size(), "bad.safetensors");
  ASSERT_FALSE(r.ok()) << "expected an error containing: " << phrase;
  EXPECT_EQ(r.status().code(), code) << r.status().to_string();
  EXPECT_NE(r.status().message().find(phrase), std::string::npos) << r.status().to_string();
  EXPECT_NE(r.status().message().find("safetensors 'bad.safetensors'"), std::string::npos);
}

void expect_json_error(const std::string& json, size_t data, Code code, const std::string& phrase) {
  expect_safetensors_error(with_header(json, data), code, phrase);
}

TEST(FormatSafetensorsMalformed, TooShort) {
  expect_safetensors_error({1, 2, 3}, Code::kCorrupt, "too short for the header length");
}

TEST(FormatSafetensorsMalformed, HeaderLengthPastEnd) {
  expect_safetensors_error(with_header("{}", 0, 1000), Code::kCorrupt, "header length 1000 runs past the end");
}

TEST(FormatSafetensorsMalformed, HeaderLengthOverLimit) {
  expect_safetensors_error(with_header("{}", 0, uint64_t(1) << 40), Code::kCorrupt, "exceeds the limit 100000000");
}

TEST(FormatSafetensorsMalformed, InvalidJson) {
  expect_json_error("{\"a\": {\"dtype\": ", 0, Code::kCorrupt, "header: invalid JSON");
  expect_json_error("{\"a\": 1}\xff", 0, Code::kCorrupt, "header: invalid JSON");
}

TEST(FormatSafetensorsMalformed, NotAnObject) {
  expect_json_error("[1, 2]", 0, Code::kCorrupt, "header is not a JSON object");
  expect_json_error("{\"t\": 5}", 0, Code::kCorrupt, "tensor 't' is not an object");
}

TEST(FormatSafetensorsMalformed, WrongTypes) {
  expect_json_error(R"({"t": {"dtype": 1, "shape": [1], "data_offsets": [0, 4]}})", 4,
                    Code::kCorrupt, "dtype is missing or not a string");
  expect_json_error(R"({"t": {"dtype": "F32", "shape": "1", "data_offsets": [0, 4]}})", 4,
                    Code::kCorrupt, "shape is missing or not an array");
  expect_json_error(R"({"t": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4,
                    Code::kCorrupt, "not an unsigned integer");
  expect_json_error(R"({"t": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})", 4,
                    Code::kCorrupt, "not an unsigned integer");
  expect_json_error(R"({"t": {"dtype": "F32", "shape": [1], "data_offsets": [0]}})", 4,
                    Code::kCorrupt, "data_offsets is not [begin, end]");
  expect_json_error(R"({"t": {"dtype": "F32", "shape": [1], "data_offsets": [0, -4]}})", 4,
                    Code::kCorrupt, "data_offsets is not [begin, end]");
  expect_json_error(R"({"t": {"dtype": "F32", "shape": [1]}})", 4, Code::kCorrupt,
                    "data_offsets is not [begin, end]");
  expect_json_error(R"({"__metadata__": {"format": 1}})", 0, Code::kCorrupt,
                    "__metadata__ 'format' is not a string");
  expect_json_error(R"({"__metadata__": []})", 0, Code::kCorrupt, "__metadata__ is not an object");
}

TEST(FormatSafetensorsMalformed, OffsetsOutOfRange) {
  expect_json_error(R"({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", 4,
                    Code::kCorrupt, "end past the data section (4 bytes)");
  expect_json_error(R"({"t": {"dtype": "F32", "shape": [1], "data_offsets": [18446744073709551612, 18446744073709551615]}})",
                    4, Code::kCorrupt, "end past the data section");
}

TEST(FormatSafetensorsMalformed, OffsetsReversed) {
  expect_json_error(R"({"t": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}})", 4,
                    Code::kCorrupt, "data_offsets [4, 0] are reversed");
}

TEST(FormatSafetensorsMalformed, SizeDoesNotMatchShape) {
  expect_json_error(R"({"t": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 8]}})", 8,
                    Code::kCorrupt, "hold 8 bytes, but BF16 x [3] needs 6");
}

TEST(FormatSafetensorsMalformed, ElementCountOverflow) {
  expect_json_error(
      R"({"t": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 4]}})", 4,
      Code::kCorrupt, "element count or byte size overflows");
  expect_json_error(
      R"({"t": {"dtype": "F64", "shape": [4611686018427387904], "data_offsets": [0, 4]}})", 4,
      Code::kCorrupt, "element count or byte size overflows");
}

TEST(FormatSafetensorsMalformed, TooManyDims) {
  expect_json_error(R"({"t": {"dtype": "F32", "shape": [1,1,1,1,1,1,1,1,1], "data_offsets": [0, 4]}})",
                    4, Code::kCorrupt, "has 9 dims (limit 8)");
}

TEST(FormatSafetensorsMalformed, Overlapping) {
  expect_json_error(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                       "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
                    8, Code::kCorrupt, "tensor 'b' data_offsets overlap tensor 'a'");
}

TEST(FormatSafetensors, EmptyTensorBetweenOthers) {
  // An empty range overlaps nothing: {a [0,8), e [8,8), b [8,16)} is a valid file (the format's
  // reference checks only that each tensor starts where the one before it ends).
  const std::string json = R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                               "e": {"dtype": "F32", "shape": [0], "data_offsets": [8, 8]},
                               "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})";
  const std::vector<uint8_t> b = with_header(json, 16);
  auto r = parse_safetensors(b.data(), b.size(), "mem");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->tensors.size(), 3u);
  // Still an overlap when the tensors with bytes overlap, an empty one between them or not.
  expect_json_error(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                       "e": {"dtype": "F32", "shape": [0], "data_offsets": [4, 4]},
                       "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
                    8, Code::kCorrupt, "tensor 'b' data_offsets overlap tensor 'a'");
}

TEST(FormatSafetensorsMalformed, DuplicateName) {
  expect_json_error(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                       "a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
                    8, Code::kCorrupt, "duplicate tensor name 'a'");
}

TEST(FormatSafetensorsMalformed, UnknownDtype) {
  expect_json_error(R"({"t": {"dtype": "F99", "shape": [1], "data_offsets": [0, 4]}})", 4,
                    Code::kUnsupported, "tensor 't' has unknown dtype 'F99'");
}

TEST(FormatSafetensorsMalformed, DtypeWithoutShoalType) {
  // U8 is valid safetensors but has no DType: the whole file is refused, after the checks.
  expect_json_error(R"({"m": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}})", 4,
                    Code::kUnsupported, "tensor 'm' has dtype U8, which Shoal does not load");
  expect_json_error(R"({"m": {"dtype": "BOOL", "shape": [4], "data_offsets": [0, 5]}})", 5,
                    Code::kCorrupt, "hold 5 bytes, but BOOL x [4] needs 4");
}

TEST(FormatSafetensorsMalformed, NestingBomb) {
  std::string deep = "{\"__metadata__\": ";
  for (int i = 0; i < 100000; ++i) deep += "[";
  expect_json_error(deep, 0, Code::kCorrupt, "nests deeper than 4");
}

TEST(FormatSafetensorsMalformed, EmptyName) {
  expect_json_error(R"({"": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", 4,
                    Code::kCorrupt, "empty name");
}

}  // namespace
}  // namespace shoal
