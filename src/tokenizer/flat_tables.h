// Open-addressing hash tables for the vocabulary lookups: token text -> id and merge pair ->
// (rank, result). Flat arrays with linear probing keep loading a 150k-token vocabulary cheap
// (no per-entry allocation), which matters most under sanitizers.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace shoal::tok {

/// 64-bit FNV-1a of `s` (Fowler/Noll/Vo), the hash of token texts.
inline uint64_t hash_text(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

/// Token text -> id. Keeps its own copy of the texts in one arena, so lookups touch two flat
/// arrays; each slot carries a 32-bit hash tag, so text is compared only when the tags agree.
class TextIndex {
 public:
  /// Rebuilds for texts[0..n). Returns -1, or the id of the first text that repeats an earlier
  /// one (that id is then not inserted).
  int64_t build(const std::vector<std::string_view>& texts);
  /// Id of `t`, or -1.
  int32_t find(std::string_view t) const;

 private:
  struct Slot {
    int32_t id;    // -1: empty
    uint32_t tag;  // high half of the text's hash
  };
  std::vector<Slot> slots_;
  size_t mask_ = 0;
  std::string arena_;
  std::vector<uint32_t> offsets_;  // text i is arena_[offsets_[i], offsets_[i + 1])
};

/// A BPE merge: the pair's rank (lower merges first) and the id of the merged token.
struct MergeInfo {
  int32_t rank = 0;
  int32_t result = -1;
};

/// (left id, right id) -> MergeInfo; the first insertion of a pair wins.
class MergeTable {
 public:
  void reserve(size_t n);
  /// Inserts unless the pair is present; false if it was.
  bool insert(int32_t left, int32_t right, MergeInfo m);
  const MergeInfo* find(int32_t left, int32_t right) const;
  size_t size() const { return size_; }

 private:
  struct Slot {
    uint64_t key;  // pair key + 1; 0 when unused (so a zeroed array is empty)
    MergeInfo info;
  };
  static uint64_t key(int32_t l, int32_t r) { return ((uint64_t(uint32_t(l)) << 32) | uint32_t(r)) + 1; }
  static size_t mix(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return size_t(k);
  }
  void grow(size_t cap);

  std::unique_ptr<Slot[]> slots_;
  size_t cap_ = 0;
  size_t size_ = 0;
};

}  // namespace shoal::tok
