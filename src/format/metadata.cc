#include "format/metadata.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "core/log.h"

namespace shoal {

std::string_view meta_type_name(MetaType t) {
  switch (t) {
    case MetaType::kU8: return "u8";
    case MetaType::kI8: return "i8";
    case MetaType::kU16: return "u16";
    case MetaType::kI16: return "i16";
    case MetaType::kU32: return "u32";
    case MetaType::kI32: return "i32";
    case MetaType::kF32: return "f32";
    case MetaType::kBool: return "bool";
    case MetaType::kString: return "string";
    case MetaType::kArray: return "array";
    case MetaType::kU64: return "u64";
    case MetaType::kI64: return "i64";
    case MetaType::kF64: return "f64";
  }
  return "?";
}

std::optional<int64_t> MetaValue::as_int() const {
  if (const auto* u = std::get_if<uint64_t>(&v)) {
    if (*u > uint64_t(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return int64_t(*u);
  }
  if (const auto* i = std::get_if<int64_t>(&v)) return *i;
  if (const auto* b = std::get_if<bool>(&v)) return *b ? 1 : 0;
  return std::nullopt;
}

std::optional<double> MetaValue::as_float() const {
  if (const auto* u = std::get_if<uint64_t>(&v)) return double(*u);
  if (const auto* i = std::get_if<int64_t>(&v)) return double(*i);
  if (const auto* d = std::get_if<double>(&v)) return *d;
  return std::nullopt;
}

std::optional<bool> MetaValue::as_bool() const {
  if (const auto* b = std::get_if<bool>(&v)) return *b;
  return std::nullopt;
}

const std::string* MetaValue::as_string() const { return std::get_if<std::string>(&v); }

const std::vector<MetaValue>* MetaValue::as_array() const {
  return std::get_if<std::vector<MetaValue>>(&v);
}

std::string MetaValue::to_string(size_t max_items) const {
  if (const auto* u = std::get_if<uint64_t>(&v)) return fmt::format("{}", *u);
  if (const auto* i = std::get_if<int64_t>(&v)) return fmt::format("{}", *i);
  if (const auto* d = std::get_if<double>(&v)) {
    // f32 values print as the shortest float that reads back, not as the widened double.
    return type == MetaType::kF32 ? fmt::format("{}", float(*d)) : fmt::format("{}", *d);
  }
  if (const auto* b = std::get_if<bool>(&v)) return *b ? "true" : "false";
  if (const auto* s = std::get_if<std::string>(&v)) {
    // Quoted; control characters and bytes that are not UTF-8 escaped, so a value never breaks
    // a line of output or reaches a terminal as an escape sequence.
    std::string out = "\"";
    for (size_t i = 0; i < s->size();) {
      const size_t len = printable_char_len(*s, i);
      if (len == 0) {
        out += fmt::format("\\x{:02x}", uint8_t((*s)[i++]));
        continue;
      }
      if ((*s)[i] == '"' || (*s)[i] == '\\') out += '\\';
      out.append(*s, i, len);
      i += len;
    }
    return out + "\"";
  }
  const auto& items = std::get<std::vector<MetaValue>>(v);
  std::string out = fmt::format("{}[{}] [", meta_type_name(elem_type), items.size());
  for (size_t i = 0; i < items.size() && i < max_items; ++i) {
    if (i) out += ", ";
    out += items[i].to_string(max_items);
  }
  if (items.size() > max_items) out += ", ...";
  return out + "]";
}

const MetaValue* Metadata::find(std::string_view key) const {
  auto it = by_key_.find(std::string(key));
  return it == by_key_.end() ? nullptr : &entries_[it->second].second;
}

void Metadata::set(std::string key, MetaValue value) {
  auto it = by_key_.find(key);
  if (it != by_key_.end()) {
    entries_[it->second].second = std::move(value);
    return;
  }
  by_key_.emplace(key, entries_.size());
  entries_.emplace_back(std::move(key), std::move(value));
}

std::optional<int64_t> Metadata::get_int(std::string_view key) const {
  const MetaValue* m = find(key);
  return m ? m->as_int() : std::nullopt;
}

std::optional<double> Metadata::get_float(std::string_view key) const {
  const MetaValue* m = find(key);
  return m ? m->as_float() : std::nullopt;
}

std::optional<bool> Metadata::get_bool(std::string_view key) const {
  const MetaValue* m = find(key);
  return m ? m->as_bool() : std::nullopt;
}

std::optional<std::string> Metadata::get_string(std::string_view key) const {
  const MetaValue* m = find(key);
  if (!m || !m->as_string()) return std::nullopt;
  return *m->as_string();
}

std::optional<std::vector<std::string>> Metadata::get_string_array(std::string_view key) const {
  const MetaValue* m = find(key);
  const auto* a = m ? m->as_array() : nullptr;
  if (!a || m->elem_type != MetaType::kString) return std::nullopt;
  std::vector<std::string> out;
  out.reserve(a->size());
  for (const MetaValue& e : *a) {
    if (!e.as_string()) return std::nullopt;
    out.push_back(*e.as_string());
  }
  return out;
}

std::optional<std::vector<double>> Metadata::get_float_array(std::string_view key) const {
  const MetaValue* m = find(key);
  const auto* a = m ? m->as_array() : nullptr;
  if (!a) return std::nullopt;
  std::vector<double> out;
  out.reserve(a->size());
  for (const MetaValue& e : *a) {
    auto f = e.as_float();
    if (!f) return std::nullopt;
    out.push_back(*f);
  }
  return out;
}

std::optional<std::vector<int64_t>> Metadata::get_int_array(std::string_view key) const {
  const MetaValue* m = find(key);
  const auto* a = m ? m->as_array() : nullptr;
  if (!a) return std::nullopt;
  std::vector<int64_t> out;
  out.reserve(a->size());
  for (const MetaValue& e : *a) {
    auto i = e.as_int();
    if (!i) return std::nullopt;
    out.push_back(*i);
  }
  return out;
}

}  // namespace shoal
