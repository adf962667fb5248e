// Per-thread scratch, grown on demand and freed when the thread exits. Included INSIDE
// namespace octavo::OCTAVO_ISA_NS (after <stdlib.h>), so each ISA variant has its own copy.
#pragma once

struct TlsBuffer {
  char* p = nullptr;
  size_t cap = 0;
  ~TlsBuffer() { free(p); }
  // 64-byte aligned; nullptr when the allocation fails (the caller reports it)
  char* get(size_t n) {
    if (n > cap) {
      free(p);
      cap = n + (n >> 1);
      p = (char*)aligned_alloc(64, (cap + 63) & ~(size_t)63);
      if (p == nullptr) cap = 0;
    }
    return p;
  }
};
