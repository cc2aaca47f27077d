#include "tokenizer/json_stream.h"

#include <charconv>
#include <cstdint>
#include <limits>

#include "format/json_doc.h"
#include "tokenizer/unicode.h"

namespace shoal::tok {
namespace {

using nlohmann::json;

// nlohmann SAX handler: builds a DOM like json::parse, except for the two captured containers.
class Handler {
 public:
  Handler(TokenizerJson& out, const std::vector<std::string>& vocab_path,
          const std::vector<std::string>& merges_path)
      : out_(out), vocab_path_(vocab_path), merges_path_(merges_path) {}

  const std::string& error() const { return error_; }

  bool null() { return value(json()); }
  bool boolean(bool b) { return value(json(b)); }
  bool number_integer(int64_t n) { return integer(n); }
  bool number_unsigned(uint64_t n) {
    return integer(n > uint64_t(std::numeric_limits<int64_t>::max()) ? -1 : int64_t(n));
  }
  bool number_float(double d, const std::string&) { return value(json(d)); }
  bool binary(json::binary_t&) { return fail("binary values are not JSON"); }

  bool string(std::string& s) {
    if (mode_ == kMerges) {
      if (depth_ == 2) {
        pair_.push_back(std::move(s));
        return true;
      }
      const size_t sp = s.find(' ', 1);
      if (sp == std::string::npos) return fail("merge " + std::to_string(out_.merges.size()) + " '" + s +
                                               "' is not two tokens separated by a space");
      out_.merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
      return true;
    }
    return value(json(std::move(s)));
  }

  bool start_object(size_t) {
    if (mode_ == kDom && at(vocab_path_)) {
      mode_ = kVocab;
      out_.has_vocab = true;
      return true;
    }
    if (mode_ != kDom) return fail(mode_ == kVocab ? "a vocab value is not an integer" : "malformed merge");
    return open(json::object(), false);
  }
  bool key(std::string& k) {
    key_ = std::move(k);
    return true;
  }
  bool end_object() {
    if (mode_ == kVocab) {
      mode_ = kDom;
      return true;
    }
    stack_.pop_back();
    return true;
  }
  bool start_array(size_t) {
    if (mode_ == kDom && at(merges_path_)) {
      mode_ = kMerges;
      depth_ = 1;
      out_.has_merges = true;
      return true;
    }
    if (mode_ == kMerges && depth_ == 1) {
      depth_ = 2;
      pair_.clear();
      return true;
    }
    if (mode_ != kDom) return fail(mode_ == kVocab ? "a vocab value is not an integer" : "malformed merge");
    return open(json::array(), true);
  }
  bool end_array() {
    if (mode_ == kMerges) {
      if (depth_ == 2) {
        if (pair_.size() != 2) return fail("merge " + std::to_string(out_.merges.size()) + " is not [\"a\", \"b\"]");
        out_.merges.emplace_back(std::move(pair_[0]), std::move(pair_[1]));
        depth_ = 1;
      } else {
        mode_ = kDom;
      }
      return true;
    }
    stack_.pop_back();
    return true;
  }
  bool parse_error(size_t pos, const std::string&, const nlohmann::detail::exception& ex) {
    error_ = "invalid JSON at byte " + std::to_string(pos) + ": " + ex.what();
    return false;
  }

 private:
  enum Mode { kDom, kVocab, kMerges };

  bool fail(std::string msg) {
    error_ = std::move(msg);
    return false;
  }
  bool integer(int64_t n) {
    if (mode_ == kVocab) {
      out_.vocab.emplace_back(std::move(key_), n);
      return true;
    }
    return value(json(n));
  }
  // Does the value about to start sit at `path`?
  bool at(const std::vector<std::string>& path) const {
    if (stack_.size() != path.size()) return false;
    for (size_t i = 1; i < stack_.size(); ++i) {
      if (stack_[i].is_array || stack_[i].key != path[i - 1]) return false;
    }
    return stack_.empty() || (!stack_.back().is_array && key_ == path.back());
  }
  json* put(json v) {
    if (stack_.empty()) {
      out_.doc = std::move(v);
      return &out_.doc;
    }
    Frame& top = stack_.back();
    if (top.is_array) {
      top.node->push_back(std::move(v));
      return &top.node->back();
    }
    json& slot = (*top.node)[key_];
    slot = std::move(v);
    return &slot;
  }
  bool value(json v) {
    if (mode_ != kDom) return fail(mode_ == kVocab ? "vocab entry '" + key_ + "' is not an integer id" : "malformed merge");
    put(std::move(v));
    return true;
  }
  bool open(json v, bool is_array) {
    if (stack_.size() >= size_t(kJsonMaxDepth)) return fail(fmt::format("JSON nests deeper than {} levels", kJsonMaxDepth));
    const std::string key = stack_.empty() || stack_.back().is_array ? std::string() : key_;
    json* node = put(std::move(v));
    stack_.push_back({node, is_array, key});
    return true;
  }

  struct Frame {
    json* node;
    bool is_array;
    std::string key;  // this container's key in its parent object
  };
  TokenizerJson& out_;
  const std::vector<std::string>& vocab_path_;
  const std::vector<std::string>& merges_path_;
  std::vector<Frame> stack_;
  std::string key_;
  Mode mode_ = kDom;
  int depth_ = 0;
  std::vector<std::string> pair_;
  std::string error_;
};

}  // namespace

Result<TokenizerJson> parse_tokenizer_json(std::string_view text, const std::vector<std::string>& vocab_path,
                                           const std::vector<std::string>& merges_path,
                                           std::string_view source) {
  TokenizerJson out;
  Handler h(out, vocab_path, merges_path);
  bool ok = false;
  try {
    ok = json::sax_parse(text.begin(), text.end(), &h);
  } catch (const json::exception& e) {
    return make_error(Code::kCorrupt, "{}: invalid JSON: {}", source, e.what());
  }
  if (!ok) return make_error(Code::kCorrupt, "{}: {}", source, h.error().empty() ? "invalid JSON" : h.error());
  return out;
}

namespace {

// Cursor over flat-object JSON; each reader returns false at the first byte that does not fit.
struct FlatReader {
  std::string_view s;
  size_t i = 0;

  void ws() {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) ++i;
  }
  bool eat(char c) {
    ws();
    if (i < s.size() && s[i] == c) return ++i, true;
    return false;
  }
  bool hex4(uint32_t* v) {
    if (s.size() - i < 4) return false;
    *v = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = s[i++];
      const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
      if (d < 0) return false;
      *v = *v * 16 + uint32_t(d);
    }
    return true;
  }
  bool string(std::string* out) {
    if (!eat('"')) return false;
    out->clear();
    while (i < s.size()) {
      const char c = s[i++];
      if (c == '"') return true;
      if (uint8_t(c) < 0x20) return false;
      if (c != '\\') {
        out->push_back(c);
        continue;
      }
      if (i >= s.size()) return false;
      const char e = s[i++];
      uint32_t cpt = 0;
      switch (e) {
        case '"': case '\\': case '/': out->push_back(e); continue;
        case 'b': out->push_back('\b'); continue;
        case 'f': out->push_back('\f'); continue;
        case 'n': out->push_back('\n'); continue;
        case 'r': out->push_back('\r'); continue;
        case 't': out->push_back('\t'); continue;
        case 'u':
          if (!hex4(&cpt)) return false;
          if (cpt >= 0xD800 && cpt <= 0xDBFF) {  // high surrogate: a low one must follow
            uint32_t lo = 0;
            if (s.substr(i, 2) != "\\u") return false;
            i += 2;
            if (!hex4(&lo) || lo < 0xDC00 || lo > 0xDFFF) return false;
            cpt = 0x10000 + ((cpt - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cpt >= 0xDC00 && cpt <= 0xDFFF) {
            return false;
          }
          append_utf8(*out, cpt);
          continue;
        default: return false;
      }
    }
    return false;
  }
  bool integer(int64_t* v) {
    ws();
    const char* b = s.data() + i;
    auto [end, ec] = std::from_chars(b, s.data() + s.size(), *v);
    if (ec != std::errc() || end == b) return false;
    i += size_t(end - b);
    return i >= s.size() || (s[i] != '.' && s[i] != 'e' && s[i] != 'E');
  }
};

}  // namespace

Result<std::vector<std::pair<std::string, int64_t>>> parse_flat_vocab(std::string_view text,
                                                                      std::string_view source) {
  FlatReader r{text};
  std::vector<std::pair<std::string, int64_t>> out;
  out.reserve(text.size() / 12);
  auto bad = [&](const char* what) {
    return make_error(Code::kCorrupt, "{}: {} at byte {}", source, what, r.i);
  };
  if (!r.eat('{')) return bad("expected '{' (a JSON object of token ids)");
  if (!r.eat('}')) {
    std::string key;
    do {
      int64_t id = 0;
      if (!r.string(&key)) return bad("expected a JSON string (token text)");
      if (!r.eat(':')) return bad("expected ':'");
      if (!r.integer(&id)) return bad("expected an integer token id");
      out.emplace_back(key, id);
    } while (r.eat(','));
    if (!r.eat('}')) return bad("expected ',' or '}'");
  }
  r.ws();
  if (r.i != text.size()) return bad("unexpected text after the object");
  return out;
}

}  // namespace shoal::tok
