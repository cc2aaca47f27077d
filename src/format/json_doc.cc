#include "format/json_doc.h"

#include <fmt/format.h>

namespace shoal {

namespace {
struct TooDeep {};
}  // namespace

Result<nlohmann::json> parse_json_doc(std::string_view text, std::string_view source) {
  const nlohmann::json::parser_callback_t bound = [](int depth, nlohmann::json::parse_event_t ev, nlohmann::json&) {
    // (depth counts from 0 at the top-level container's start.)
    if ((ev == nlohmann::json::parse_event_t::object_start || ev == nlohmann::json::parse_event_t::array_start) &&
        depth >= kJsonMaxDepth)
      throw TooDeep{};
    return true;
  };
  try {
    return nlohmann::json::parse(text.begin(), text.end(), bound);
  } catch (const TooDeep&) {
    return make_error(Code::kCorrupt, "{}: JSON nests deeper than {} levels", source, kJsonMaxDepth);
  } catch (const nlohmann::json::exception& e) {
    return make_error(Code::kCorrupt, "{}: invalid JSON: {}", source, e.what());
  }
}

}  // namespace shoal
