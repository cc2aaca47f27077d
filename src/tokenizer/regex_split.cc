#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex_split.h"

#include <pcre2.h>

#include <utility>

#include "core/log.h"

namespace shoal::tok {
namespace {

// Unicode White_Space, the set llama.cpp's unicode-data.cpp calls whitespace.
constexpr std::string_view kWhitespaceMembers =
    "\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  int n = pcre2_get_error_message(code, buf, sizeof(buf));
  return n < 0 ? std::string("unknown PCRE2 error") : std::string(reinterpret_cast<char*>(buf), size_t(n));
}

}  // namespace

std::string translate_pattern(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 64);
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[i + 1];
      ++i;
      if (e == 's') {
        out += in_class ? std::string(kWhitespaceMembers) : "[" + std::string(kWhitespaceMembers) + "]";
      } else if (e == 'S' && !in_class) {
        out += "[^" + std::string(kWhitespaceMembers) + "]";
      } else if (e == 'd') {
        out += in_class ? "0-9" : "[0-9]";
      } else if (e == 'w') {
        out += in_class ? "A-Za-z0-9_" : "[A-Za-z0-9_]";
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
    } else if (in_class && c == ']') {
      in_class = false;
    }
    out += c;
  }
  return out;
}

Result<std::unique_ptr<RegexSplitter>> RegexSplitter::compile(const std::vector<std::string>& patterns) {
  std::unique_ptr<RegexSplitter> s(new RegexSplitter());
  for (const auto& pat : patterns) {
    const std::string tr = translate_pattern(pat);
    int err = 0;
    PCRE2_SIZE err_off = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(tr.data()), tr.size(),
                                     PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &err, &err_off,
                                     nullptr);
    if (!code) {
      return make_error(Code::kInvalidArgument, "pre-tokenizer regex '{}': {} at offset {}", pat,
                        pcre2_message(err), size_t(err_off));
    }
    // JIT is an optimisation only: interpretation gives the same matches if it is unavailable.
    (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
    s->codes_.push_back(code);
  }
  return s;
}

RegexSplitter::~RegexSplitter() {
  for (void* c : codes_) pcre2_code_free(static_cast<pcre2_code*>(c));
}

std::vector<std::string_view> RegexSplitter::split(std::string_view text) const {
  std::vector<std::string_view> pieces;
  if (text.empty()) return pieces;
  pieces.push_back(text);
  if (codes_.empty()) return pieces;

  pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
  pcre2_match_context* mctx = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* jit_stack = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr);
  if (jit_stack) pcre2_jit_stack_assign(mctx, nullptr, jit_stack);

  std::vector<std::string_view> next;
  for (void* vcode : codes_) {
    auto* code = static_cast<pcre2_code*>(vcode);
    next.clear();
    next.reserve(pieces.size() * 2);
    for (std::string_view piece : pieces) {
      const auto* subj = reinterpret_cast<PCRE2_SPTR>(piece.data());
      size_t pos = 0;       // where the next search starts
      size_t emitted = 0;   // end of the last emitted piece
      while (pos < piece.size()) {
        int rc = pcre2_match(code, subj, piece.size(), pos, PCRE2_NO_UTF_CHECK, md, mctx);
        if (rc < 0) {
          if (rc != PCRE2_ERROR_NOMATCH) {
            spdlog::warn("pre-tokenizer regex failed ({}); rest of the piece kept whole", pcre2_message(rc));
          }
          break;
        }
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
        const size_t mb = ov[0], me = ov[1];
        if (me <= mb) {  // empty match: not a piece; step over one character
          size_t step = 1;
          while (mb + step < piece.size() && (uint8_t(piece[mb + step]) & 0xC0) == 0x80) ++step;
          pos = mb + step;
          continue;
        }
        if (mb > emitted) next.push_back(piece.substr(emitted, mb - emitted));
        next.push_back(piece.substr(mb, me - mb));
        emitted = pos = me;
      }
      if (emitted < piece.size()) next.push_back(piece.substr(emitted));
    }
    std::swap(pieces, next);
  }

  if (jit_stack) pcre2_jit_stack_free(jit_stack);
  pcre2_match_context_free(mctx);
  pcre2_match_data_free(md);
  return pieces;
}

}  // namespace shoal::tok
