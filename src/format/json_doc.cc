#include "format/json_doc.h"

#include <fmt/format.h>

namespace shoal {

namespace {

using nlohmann::json;

// nlohmann's SAX DOM builder (the one json::parse uses without a callback), with the depth counted
// and the top-level keys shown to the caller.
class BoundedDom {
 public:
  BoundedDom(json& out, const JsonLimits& limits) : dom_(out, /*allow_exceptions=*/false), limits_(limits) {}
  const std::string& error() const { return error_; }

  bool null() { return dom_.null(); }
  bool boolean(bool b) { return dom_.boolean(b); }
  bool number_integer(json::number_integer_t n) { return dom_.number_integer(n); }
  bool number_unsigned(json::number_unsigned_t n) { return dom_.number_unsigned(n); }
  bool number_float(json::number_float_t d, const json::string_t& s) { return dom_.number_float(d, s); }
  bool string(json::string_t& s) { return dom_.string(s); }
  bool binary(json::binary_t& b) { return dom_.binary(b); }
  bool start_object(size_t n) { return enter() && dom_.start_object(n); }
  bool start_array(size_t n) { return enter() && dom_.start_array(n); }
  bool end_object() {
    --depth_;
    return dom_.end_object();
  }
  bool end_array() {
    --depth_;
    return dom_.end_array();
  }
  bool key(json::string_t& k) {
    if (depth_ == 1 && limits_.on_top_key) {
      if (std::string why = limits_.on_top_key(k); !why.empty()) {
        error_ = std::move(why);
        return false;
      }
    }
    return dom_.key(k);
  }
  bool parse_error(size_t, const std::string&, const nlohmann::detail::exception& ex) {
    error_ = fmt::format("invalid JSON: {}", ex.what());
    return false;
  }

 private:
  bool enter() {
    if (++depth_ <= limits_.max_depth) return true;
    error_ = fmt::format("JSON nests deeper than {} levels", limits_.max_depth);
    return false;
  }

  nlohmann::detail::json_sax_dom_parser<json> dom_;
  const JsonLimits& limits_;
  int depth_ = 0;
  std::string error_;
};

}  // namespace

Result<nlohmann::json> parse_json_doc(std::string_view text, std::string_view source, const JsonLimits& limits) {
  json out;
  BoundedDom sax(out, limits);
  bool ok = false;
  try {
    ok = json::sax_parse(text.begin(), text.end(), &sax);
  } catch (const json::exception& e) {  // (none expected: the builder is told not to throw)
    return make_error(Code::kCorrupt, "{}: invalid JSON: {}", source, e.what());
  }
  if (!ok) return make_error(Code::kCorrupt, "{}: {}", source, sax.error().empty() ? "invalid JSON" : sax.error());
  return out;
}

}  // namespace shoal
