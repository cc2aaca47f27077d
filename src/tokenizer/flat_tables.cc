#include "tokenizer/flat_tables.h"

#include <cstring>

namespace shoal::tok {

int64_t TextIndex::build(const std::vector<std::string_view>& texts) {
  const size_t n = texts.size();
  size_t total = 0;
  for (auto t : texts) total += t.size();
  arena_.clear();
  arena_.reserve(total);
  offsets_.assign(n + 1, 0);
  for (size_t i = 0; i < n; ++i) {
    offsets_[i] = uint32_t(arena_.size());
    arena_.append(texts[i]);
  }
  offsets_[n] = uint32_t(arena_.size());

  size_t cap = 16;
  while (cap < n * 2) cap <<= 1;
  slots_.assign(cap, Slot{-1, 0});
  mask_ = cap - 1;
  int64_t dup = -1;
  for (size_t i = 0; i < n; ++i) {
    if (find(texts[i]) >= 0) {  // the arena holds every text; the slots only the inserted ones
      if (dup < 0) dup = int64_t(i);
      continue;
    }
    const uint64_t h = hash_text(texts[i]);
    size_t s = size_t(h) & mask_;
    while (slots_[s].id >= 0) s = (s + 1) & mask_;
    slots_[s] = Slot{int32_t(i), uint32_t(h >> 32)};
  }
  return dup;
}

int32_t TextIndex::find(std::string_view t) const {
  if (slots_.empty()) return -1;
  const uint64_t h = hash_text(t);
  const auto tag = uint32_t(h >> 32);
  for (size_t s = size_t(h) & mask_; slots_[s].id >= 0; s = (s + 1) & mask_) {
    if (slots_[s].tag != tag) continue;
    const auto id = size_t(slots_[s].id);
    const size_t len = offsets_[id + 1] - offsets_[id];
    if (len == t.size() && std::memcmp(arena_.data() + offsets_[id], t.data(), len) == 0) return int32_t(id);
  }
  return -1;
}

void MergeTable::reserve(size_t n) {
  size_t cap = 16;
  while (cap < n * 2) cap <<= 1;
  if (cap > cap_) grow(cap);
}

void MergeTable::grow(size_t cap) {
  std::unique_ptr<Slot[]> old = std::move(slots_);
  const size_t old_cap = cap_;
  slots_.reset(new Slot[cap]());  // value-initialised: all keys 0 (empty)
  cap_ = cap;
  size_ = 0;
  for (size_t i = 0; i < old_cap; ++i) {
    if (old[i].key) insert(int32_t((old[i].key - 1) >> 32), int32_t(uint32_t(old[i].key - 1)), old[i].info);
  }
}

bool MergeTable::insert(int32_t left, int32_t right, MergeInfo m) {
  if ((size_ + 1) * 2 > cap_) grow(cap_ ? cap_ * 2 : 16);
  const uint64_t k = key(left, right);
  size_t s = mix(k) & (cap_ - 1);
  while (slots_[s].key) {
    if (slots_[s].key == k) return false;
    s = (s + 1) & (cap_ - 1);
  }
  slots_[s] = Slot{k, m};
  ++size_;
  return true;
}

const MergeInfo* MergeTable::find(int32_t left, int32_t right) const {
  if (!cap_) return nullptr;
  const uint64_t k = key(left, right);
  for (size_t s = mix(k) & (cap_ - 1); slots_[s].key; s = (s + 1) & (cap_ - 1)) {
    if (slots_[s].key == k) return &slots_[s].info;
  }
  return nullptr;
}

}  // namespace shoal::tok
