#include "tessel/core/crc32c.h"

#include <isa-l/crc.h>

#include <algorithm>
#include <climits>

namespace tessel {

uint32_t crc32c(const void* data, size_t size, uint32_t crc) {
  // ISA-L takes an int length and leaves the pre- and post-inversion to the caller.
  auto* p = static_cast<unsigned char*>(const_cast<void*>(data));  // read only; ISA-L's type
  crc = ~crc;
  while (size > 0) {
    const size_t n = std::min<size_t>(size, INT_MAX);
    crc = crc32_iscsi(p, static_cast<int>(n), crc);
    p += n;
    size -= n;
  }
  return ~crc;
}

}  // namespace tessel
