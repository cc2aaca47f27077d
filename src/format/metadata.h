// Key/value metadata of a model file: GGUF's typed values (spec: ggml docs/gguf.md, "Standardized
// key-value pairs"), kept in file order so a GGUF can be written back unchanged.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

namespace shoal {

/// GGUF metadata value types (gguf_metadata_value_type).
enum class MetaType : uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
  kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
};
std::string_view meta_type_name(MetaType t);

/// One metadata value: a scalar, a string, or an array of values of one type (arrays nest).
struct MetaValue {
  MetaType type = MetaType::kU8;
  MetaType elem_type = MetaType::kU8;  // arrays only
  // Unsigned ints as uint64_t, signed as int64_t, floats as double, then bool, string, array.
  std::variant<uint64_t, int64_t, double, bool, std::string, std::vector<MetaValue>> v;

  static MetaValue u8(uint8_t x) { return {MetaType::kU8, MetaType::kU8, uint64_t(x)}; }
  static MetaValue i8(int8_t x) { return {MetaType::kI8, MetaType::kU8, int64_t(x)}; }
  static MetaValue u16(uint16_t x) { return {MetaType::kU16, MetaType::kU8, uint64_t(x)}; }
  static MetaValue i16(int16_t x) { return {MetaType::kI16, MetaType::kU8, int64_t(x)}; }
  static MetaValue u32(uint32_t x) { return {MetaType::kU32, MetaType::kU8, uint64_t(x)}; }
  static MetaValue i32(int32_t x) { return {MetaType::kI32, MetaType::kU8, int64_t(x)}; }
  static MetaValue u64(uint64_t x) { return {MetaType::kU64, MetaType::kU8, x}; }
  static MetaValue i64(int64_t x) { return {MetaType::kI64, MetaType::kU8, x}; }
  static MetaValue f32(float x) { return {MetaType::kF32, MetaType::kU8, double(x)}; }
  static MetaValue f64(double x) { return {MetaType::kF64, MetaType::kU8, x}; }
  static MetaValue boolean(bool x) { return {MetaType::kBool, MetaType::kU8, x}; }
  static MetaValue str(std::string s) { return {MetaType::kString, MetaType::kU8, std::move(s)}; }
  static MetaValue array(MetaType elem, std::vector<MetaValue> items) {
    return {MetaType::kArray, elem, std::move(items)};
  }

  /// Integer value of any integer or bool type; nullopt otherwise (or if it overflows int64).
  std::optional<int64_t> as_int() const;
  /// Numeric value of any integer or float type.
  std::optional<double> as_float() const;
  std::optional<bool> as_bool() const;
  const std::string* as_string() const;
  const std::vector<MetaValue>* as_array() const;
  /// Human-readable rendering, arrays abbreviated after `max_items`.
  std::string to_string(size_t max_items = 8) const;
  /// Same type(s) and same value (recursively for arrays).
  bool operator==(const MetaValue&) const = default;
};

/// Ordered key -> value map.
class Metadata {
 public:
  const MetaValue* find(std::string_view key) const;
  /// Adds or replaces a key (replacing keeps its position).
  void set(std::string key, MetaValue value);
  const std::vector<std::pair<std::string, MetaValue>>& entries() const { return entries_; }
  size_t size() const { return entries_.size(); }

  std::optional<int64_t> get_int(std::string_view key) const;
  std::optional<double> get_float(std::string_view key) const;
  std::optional<bool> get_bool(std::string_view key) const;
  std::optional<std::string> get_string(std::string_view key) const;
  /// Arrays: nullopt if the key is missing or not an array of the right kind of element.
  std::optional<std::vector<std::string>> get_string_array(std::string_view key) const;
  std::optional<std::vector<double>> get_float_array(std::string_view key) const;
  std::optional<std::vector<int64_t>> get_int_array(std::string_view key) const;

 private:
  std::vector<std::pair<std::string, MetaValue>> entries_;
  std::unordered_map<std::string, size_t> by_key_;  // key -> index in entries_
};

}  // namespace shoal
