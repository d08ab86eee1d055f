// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as used by TFRecord files, iSCSI and
// ext4; computed by Intel's ISA-L (crc32_iscsi: the SSE4.2 crc32 instruction with PCLMULQDQ
// folding, chosen for the CPU at run time). Pure function of the bytes; thread safe.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tessel {

// CRC-32C of `size` bytes; pass a previous result as `crc` to continue over more bytes.
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);

}  // namespace tessel
