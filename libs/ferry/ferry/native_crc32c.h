/* CRC32C (Castagnoli) with the CPU's instruction, for Ferry's native twins
 * (store/_batch_input_cy.pyx, codec/_record_check_cy.pyx): the value the crc32c package
 * gives, crc32c(data, value). x86-64 with SSE 4.2 only (ferry_crc_hw() says whether this
 * CPU has it); elsewhere a twin refuses to import and the mypyc twin runs. */
#ifndef FERRY_NATIVE_CRC32C_H
#define FERRY_NATIVE_CRC32C_H
#include <stdint.h>
#include <string.h>
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
static int ferry_crc_hw(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("sse4.2");
}
__attribute__((target("sse4.2")))
static uint32_t ferry_crc32c(uint32_t value, const unsigned char *p, size_t n) {
    uint64_t crc = (uint32_t)~value;
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        crc = _mm_crc32_u64(crc, v);
        p += 8;
        n -= 8;
    }
    uint32_t c = (uint32_t)crc;
    while (n--) c = _mm_crc32_u8(c, *p++);
    return ~c;
}
#else
static int ferry_crc_hw(void) { return 0; }
static uint32_t ferry_crc32c(uint32_t value, const unsigned char *p, size_t n) {
    (void)p; (void)n; return value;
}
#endif
static int ferry_little_endian(void) { uint16_t one = 1; return *(unsigned char *)&one; }

#endif
