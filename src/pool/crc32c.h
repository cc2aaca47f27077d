// CRC-32C (Castagnoli): polynomial 0x1EDC6F41 (reflected 0x82F63B78), initial value and final xor
// 0xFFFFFFFF, as in iSCSI (RFC 3720 section B.4) and google/leveldb's log format. It checksums
// every record on the pool's wire (docs/protocol.md).
#pragma once

#include <cstddef>
#include <cstdint>

namespace shoal::pool {

/// Continues a CRC-32C: `crc` is the value returned for the bytes before `data` (0 to start).
/// Uses the SSE4.2 crc32 instruction when the CPU has it, else portable slicing-by-8 tables.
uint32_t crc32c_extend(uint32_t crc, const void* data, size_t n);

/// CRC-32C of n bytes; crc32c("123456789", 9) == 0xE3069283.
inline uint32_t crc32c(const void* data, size_t n) { return crc32c_extend(0, data, n); }

/// The table-driven path alone (tests compare it with the instruction path).
uint32_t crc32c_extend_portable(uint32_t crc, const void* data, size_t n);

}  // namespace shoal::pool
