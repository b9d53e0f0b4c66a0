/* carry.token_mix of one token t at output position p (uint64, wrapping): the numpy of
   invariants/carry.py is the definition; every kernel's fingerprint must equal it bit
   for bit (tests/test_compiled*.py). A token is sign-extended to 64 bits first, as
   numpy's astype(uint64) does. */
#ifndef SPECAUDIT_KERNELS_MIX_H
#define SPECAUDIT_KERNELS_MIX_H
#include <stdint.h>

static inline uint64_t token_mix1(int64_t t, int64_t p)
{
    uint64_t x = ((uint64_t)t + 1u) * 0x9E3779B97F4A7C15ull;
    x ^= (uint64_t)p * 0xC2B2AE3D27D4EB4Full;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    return x;
}
#endif
