// SentencePiece model protobuf (sentencepiece_model.proto, ModelProto) -> Vocab. A minimal,
// bounds-checked wire-format reader for the fields a tokenizer needs:
//   ModelProto     1: repeated SentencePiece pieces, 2: TrainerSpec, 3: NormalizerSpec
//   SentencePiece  1: piece (string), 2: score (float), 3: type (enum, default NORMAL = 1)
//   TrainerSpec    3: model_type (1 UNIGRAM, 2 BPE), 40: unk_id, 41: bos_id, 42: eos_id, 43: pad_id
//   NormalizerSpec 3: add_dummy_prefix (default true)
#include <cstring>

#include "tokenizer/hf_common.h"
#include "tokenizer/loaders.h"

namespace shoal::tok {
namespace {

// Reads protobuf wire format from a byte range; every read is checked against the end.
class WireReader {
 public:
  WireReader(std::string_view bytes, size_t base) : s_(bytes), base_(base) {}
  bool done() const { return pos_ >= s_.size(); }
  size_t offset() const { return base_ + pos_; }

  bool varint(uint64_t* out) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ >= s_.size()) return false;
      const auto b = uint8_t(s_[pos_++]);
      v |= uint64_t(b & 0x7F) << shift;
      if (!(b & 0x80)) {
        *out = v;
        return true;
      }
    }
    return false;
  }
  bool bytes(std::string_view* out) {
    uint64_t n;
    if (!varint(&n) || n > s_.size() - pos_) return false;
    *out = s_.substr(pos_, n);
    pos_ += n;
    return true;
  }
  bool fixed32(uint32_t* out) {
    if (s_.size() - pos_ < 4) return false;
    std::memcpy(out, s_.data() + pos_, 4);  // little-endian on every supported host
    pos_ += 4;
    return true;
  }
  // Skips a field of `wire` type; false for groups and truncation.
  bool skip(uint32_t wire) {
    uint64_t v;
    uint32_t f;
    std::string_view b;
    switch (wire) {
      case 0: return varint(&v);
      case 1: if (s_.size() - pos_ < 8) return false; pos_ += 8; return true;
      case 2: return bytes(&b);
      case 5: return fixed32(&f);
      default: return false;
    }
  }
  size_t pos() const { return pos_; }

 private:
  std::string_view s_;
  size_t base_;
  size_t pos_ = 0;
};

Status corrupt(std::string_view source, size_t offset, std::string_view what) {
  return make_error(Code::kCorrupt, "{}: SentencePiece model: {} at byte {}", source, what, offset);
}

// Walks the fields of one message, calling fn(field, wire, reader) for each; fn consumes the
// value or returns false to have it skipped.
template <typename Fn>
Status for_each_field(std::string_view msg, size_t base, std::string_view source, Fn fn) {
  WireReader r(msg, base);
  while (!r.done()) {
    const size_t at = r.offset();
    uint64_t key;
    if (!r.varint(&key)) return corrupt(source, at, "truncated field key");
    const auto field = uint32_t(key >> 3), wire = uint32_t(key & 7);
    const size_t before = r.pos();
    SHOAL_ASSIGN_OR_RETURN(bool used, fn(field, wire, r));
    if (!used && (r.pos() != before || !r.skip(wire))) return corrupt(source, at, "malformed field");
  }
  return Status::Ok();
}

}  // namespace

Result<Vocab> vocab_from_sentencepiece(std::string_view data, const nlohmann::json& config,
                                       std::string_view source) {
  Vocab v;
  v.type = VocabType::kSpm;
  v.model = "llama";
  v.add_space_prefix = true, v.add_bos = true;
  int64_t ids[4] = {0, 1, 2, -1};  // unk, bos, eos, pad: TrainerSpec defaults
  int64_t model_type = 1;

  SHOAL_RETURN_IF_ERROR(for_each_field(data, 0, source, [&](uint32_t field, uint32_t wire, WireReader& r) -> Result<bool> {
    if (wire != 2 || field < 1 || field > 3) return false;
    const size_t at = r.offset();
    std::string_view msg;
    if (!r.bytes(&msg)) return corrupt(source, at, "truncated message");
    const size_t base = r.offset() - msg.size();
    if (field == 1) {
      TokenData t{"", 0.0f, kAttrNormal};
      SHOAL_RETURN_IF_ERROR(for_each_field(msg, base, source, [&](uint32_t f, uint32_t w, WireReader& pr) -> Result<bool> {
        std::string_view s;
        uint32_t bits;
        uint64_t x;
        if (f == 1 && w == 2) {
          if (!pr.bytes(&s)) return corrupt(source, pr.offset(), "truncated piece");
          t.text = std::string(s);
        } else if (f == 2 && w == 5) {
          if (!pr.fixed32(&bits)) return corrupt(source, pr.offset(), "truncated score");
          std::memcpy(&t.score, &bits, 4);
        } else if (f == 3 && w == 0) {
          if (!pr.varint(&x)) return corrupt(source, pr.offset(), "truncated type");
          t.attr = attr_from_gguf_type(int64_t(x));  // same numbering as llama_token_type
        } else {
          return false;
        }
        return true;
      }));
      v.tokens.push_back(std::move(t));
    } else if (field == 2) {
      SHOAL_RETURN_IF_ERROR(for_each_field(msg, base, source, [&](uint32_t f, uint32_t w, WireReader& tr) -> Result<bool> {
        uint64_t x;
        if (w != 0 || (f != 3 && (f < 40 || f > 43))) return false;
        if (!tr.varint(&x)) return corrupt(source, tr.offset(), "truncated trainer field");
        if (f == 3) model_type = int64_t(x);
        else ids[f - 40] = int64_t(int32_t(uint32_t(x)));  // int32 fields: -1 is sent sign-extended
        return true;
      }));
    } else {
      SHOAL_RETURN_IF_ERROR(for_each_field(msg, base, source, [&](uint32_t f, uint32_t w, WireReader& nr) -> Result<bool> {
        uint64_t x;
        if (f != 3 || w != 0) return false;
        if (!nr.varint(&x)) return corrupt(source, nr.offset(), "truncated normalizer field");
        v.add_space_prefix = x != 0;
        return true;
      }));
    }
    return true;
  }));

  // (No pieces first: an empty file also has the default model type, 1.)
  if (v.tokens.empty()) return make_error(Code::kCorrupt, "{}: SentencePiece model has no pieces", source);
  if (model_type != 2) {
    return make_error(Code::kUnsupported, "{}: SentencePiece model type {} is not supported (BPE = 2 only)",
                      source, model_type);
  }
  v.unk = int32_t(ids[0]), v.bos = int32_t(ids[1]), v.eos = int32_t(ids[2]), v.pad = int32_t(ids[3]);
  SHOAL_RETURN_IF_ERROR(add_config_tokens(v, config, source));
  SHOAL_RETURN_IF_ERROR(index_tokens(v, source));
  apply_config_specials(v, config, /*resolve_names=*/false);
  derive_specials(v);
  return v;
}

}  // namespace shoal::tok
