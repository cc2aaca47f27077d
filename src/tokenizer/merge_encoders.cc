#include "tokenizer/merge_encoders.h"

#include <queue>
#include <string>

#include "tokenizer/unicode.h"

namespace shoal::tok {
namespace {

// One piece of the text being merged: a byte range and a doubly linked list over live pieces.
struct Symbol {
  int32_t prev;
  int32_t next;
  uint32_t begin;
  uint32_t len;  // 0 once merged into its left neighbour
  int32_t id;    // token id of the piece, -1 if it is no token
};

std::vector<Symbol> split_chars(std::string_view text) {
  std::vector<Symbol> syms;
  syms.reserve(text.size());
  size_t off = 0;
  while (off < text.size()) {
    const size_t n = std::min(utf8_len(uint8_t(text[off])), text.size() - off);
    const int32_t idx = int32_t(syms.size());
    syms.push_back({idx - 1, off + n == text.size() ? -1 : idx + 1, uint32_t(off), uint32_t(n), -1});
    off += n;
  }
  return syms;
}

void emit_bytes(const Vocab& v, std::string_view bytes, std::vector<int32_t>& out) {
  for (char c : bytes) {
    int32_t id = v.byte_ids[uint8_t(c)];
    if (id >= 0) out.push_back(id);
  }
}

}  // namespace

void spm_encode(const Vocab& v, std::string_view text, std::vector<int32_t>& out) {
  std::vector<Symbol> syms = split_chars(text);
  struct Bigram {
    int32_t left, right;
    float score;
    uint32_t len;
    int32_t id;
  };
  auto worse = [](const Bigram& a, const Bigram& b) {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  };
  std::priority_queue<Bigram, std::vector<Bigram>, decltype(worse)> queue(worse);
  auto try_add = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const uint32_t len = syms[l].len + syms[r].len;
    const int32_t id = v.find(text.substr(syms[l].begin, len));
    if (id < 0) return;
    queue.push({l, r, v.tokens[id].score, len, id});
  };
  for (int32_t i = 1; i < int32_t(syms.size()); ++i) try_add(i - 1, i);

  while (!queue.empty()) {
    const Bigram b = queue.top();
    queue.pop();
    Symbol& l = syms[b.left];
    Symbol& r = syms[b.right];
    if (l.len == 0 || r.len == 0 || l.len + r.len != b.len) continue;  // stale
    l.len += r.len;
    l.id = b.id;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) syms[r.next].prev = b.left;
    try_add(l.prev, b.left);
    try_add(b.left, l.next);
  }

  for (int32_t i = syms.empty() ? -1 : 0; i != -1; i = syms[i].next) {
    const std::string_view piece = text.substr(syms[i].begin, syms[i].len);
    const int32_t id = syms[i].id >= 0 ? syms[i].id : v.find(piece);
    if (id >= 0) {
      out.push_back(id);
    } else {
      emit_bytes(v, piece, out);
    }
  }
}

void bpe_encode_word(const Vocab& v, std::string_view word, std::vector<int32_t>& out) {
  if (word.empty()) return;
  if (v.ignore_merges) {
    if (int32_t id = v.find(word); id >= 0) {
      out.push_back(id);
      return;
    }
  }
  std::vector<Symbol> syms = split_chars(word);
  for (auto& s : syms) s.id = v.find(word.substr(s.begin, s.len));

  struct Bigram {
    int32_t left, right;
    int32_t rank;
    uint32_t len;
    int32_t id;
  };
  auto worse = [](const Bigram& a, const Bigram& b) {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  };
  std::priority_queue<Bigram, std::vector<Bigram>, decltype(worse)> queue(worse);
  auto try_add = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0 || syms[l].id < 0 || syms[r].id < 0) return;
    if (v.rank_by_concat) {
      const int32_t id = v.find(word.substr(syms[l].begin, syms[l].len + syms[r].len));
      if (id >= 0) queue.push({l, r, id, syms[l].len + syms[r].len, id});
      return;
    }
    const MergeInfo* m = v.merges.find(syms[l].id, syms[r].id);
    if (!m) return;
    queue.push({l, r, m->rank, syms[l].len + syms[r].len, m->result});
  };
  for (int32_t i = 1; i < int32_t(syms.size()); ++i) try_add(i - 1, i);

  while (!queue.empty()) {
    const Bigram b = queue.top();
    queue.pop();
    Symbol& l = syms[b.left];
    Symbol& r = syms[b.right];
    if (l.len == 0 || r.len == 0 || l.len + r.len != b.len) continue;  // stale
    l.len += r.len;
    l.id = b.id;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) syms[r.next].prev = b.left;
    try_add(l.prev, b.left);
    try_add(b.left, l.next);
  }

  for (int32_t i = 0; i != -1; i = syms[i].next) {
    if (syms[i].id >= 0) {
      out.push_back(syms[i].id);
      continue;
    }
    const std::string_view piece = word.substr(syms[i].begin, syms[i].len);
    if (v.byte_encode) {
      for (char c : piece) {
        if (int32_t id = v.find(std::string_view(&c, 1)); id >= 0) out.push_back(id);
      }
    } else {
      emit_bytes(v, piece, out);
    }
  }
}

}  // namespace shoal::tok
