/* What this CPU can do at best, for the benchmarks' floors (swarmkv_bench/hw_peak.py):
 * register-only loops of int8 multiply-adds and f32 FMAs, and a read loop over a buffer.
 *
 * Each function runs on the calling thread; the caller runs one per thread at once and times
 * them together (cffi releases the GIL around each call). The instruction set is the best
 * one the running CPU has (__builtin_cpu_supports), not what the build was compiled for, so
 * a floor is the hardware's: AVX-512 VNNI (vpdpbusd, 64 multiply-adds per instruction), else
 * AVX-VNNI (32), else AVX2 (vpmaddubsw + vpmaddwd + vpaddd, the sequence ggml's AVX2
 * kernels use, 32 per three instructions); FMAs with AVX-512F (16 lanes), else AVX2 FMA (8).
 * Sixteen independent accumulators cover the instructions' latency on two ports. Each
 * returns the count of operations (or bytes) done, 0 where no supported instruction set
 * exists (another architecture, or a CPU without AVX2). */
#include <stddef.h>
#include <stdint.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define SWARMKV_PEAK_X86 1
#endif

static volatile int32_t swarmkv_peak_sink;  /* keeps every loop's result alive */

#if defined(SWARMKV_PEAK_X86)
#define CHAINS 16
/* the accumulators must live in registers: the chains' loops are unrolled */
#define UNROLL _Pragma("GCC unroll 16")

__attribute__((target("avx512f,avx512bw,avx512vnni")))
static int64_t int8_avx512vnni(int64_t iters) {
    __m512i acc[CHAINS];
    const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-2);
    for (int c = 0; c < CHAINS; ++c) acc[c] = _mm512_set1_epi32(c);
    for (int64_t i = 0; i < iters; ++i) {
        UNROLL for (int c = 0; c < CHAINS; ++c) acc[c] = _mm512_dpbusd_epi32(acc[c], a, b);
    }
    __m512i s = acc[0];
    for (int c = 1; c < CHAINS; ++c) s = _mm512_add_epi32(s, acc[c]);
    swarmkv_peak_sink = _mm512_reduce_add_epi32(s);
    return iters * CHAINS * 64;
}

__attribute__((target("avx2,avxvnni")))
static int64_t int8_avxvnni(int64_t iters) {
    __m256i acc[CHAINS];
    const __m256i a = _mm256_set1_epi8(3), b = _mm256_set1_epi8(-2);
    for (int c = 0; c < CHAINS; ++c) acc[c] = _mm256_set1_epi32(c);
    for (int64_t i = 0; i < iters; ++i) {
        UNROLL for (int c = 0; c < CHAINS; ++c) acc[c] = _mm256_dpbusd_avx_epi32(acc[c], a, b);
    }
    __m256i s = acc[0];
    for (int c = 1; c < CHAINS; ++c) s = _mm256_add_epi32(s, acc[c]);
    swarmkv_peak_sink = _mm256_extract_epi32(s, 0) + _mm256_extract_epi32(s, 7);
    return iters * CHAINS * 32;
}

__attribute__((target("avx2")))
static int64_t int8_avx2(int64_t iters) {
    __m256i acc[CHAINS];
    const __m256i a = _mm256_set1_epi8(3), b = _mm256_set1_epi8(-2), ones = _mm256_set1_epi16(1);
    for (int c = 0; c < CHAINS; ++c) acc[c] = _mm256_set1_epi32(c);
    for (int64_t i = 0; i < iters; ++i) {
        UNROLL for (int c = 0; c < CHAINS; ++c) {
            const __m256i p16 = _mm256_maddubs_epi16(a, b);
            acc[c] = _mm256_add_epi32(acc[c], _mm256_madd_epi16(p16, ones));
        }
        __asm__ volatile("" : "+x"(acc[0]));  /* the products must be recomputed each pass */
    }
    __m256i s = acc[0];
    for (int c = 1; c < CHAINS; ++c) s = _mm256_add_epi32(s, acc[c]);
    swarmkv_peak_sink = _mm256_extract_epi32(s, 0) + _mm256_extract_epi32(s, 7);
    return iters * CHAINS * 32;
}

__attribute__((target("avx512f")))
static int64_t fma_avx512(int64_t iters) {
    __m512 acc[CHAINS];
    const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
    for (int c = 0; c < CHAINS; ++c) acc[c] = _mm512_set1_ps((float) c);
    for (int64_t i = 0; i < iters; ++i) {
        UNROLL for (int c = 0; c < CHAINS; ++c) acc[c] = _mm512_fmadd_ps(acc[c], a, b);
    }
    __m512 s = acc[0];
    for (int c = 1; c < CHAINS; ++c) s = _mm512_add_ps(s, acc[c]);
    swarmkv_peak_sink = (int32_t) _mm512_reduce_add_ps(s);
    return iters * CHAINS * 16;
}

__attribute__((target("avx2,fma")))
static int64_t fma_avx2(int64_t iters) {
    __m256 acc[CHAINS];
    const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
    for (int c = 0; c < CHAINS; ++c) acc[c] = _mm256_set1_ps((float) c);
    for (int64_t i = 0; i < iters; ++i) {
        UNROLL for (int c = 0; c < CHAINS; ++c) acc[c] = _mm256_fmadd_ps(acc[c], a, b);
    }
    __m256 s = acc[0];
    for (int c = 1; c < CHAINS; ++c) s = _mm256_add_ps(s, acc[c]);
    float out[8];
    _mm256_storeu_ps(out, s);
    swarmkv_peak_sink = (int32_t) (out[0] + out[7]);
    return iters * CHAINS * 8;
}

__attribute__((target("avx2")))
static int64_t read_avx2(const char * buf, size_t bytes, int passes) {
    __m256i acc[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                      _mm256_setzero_si256()};
    const size_t n = bytes / 128 * 128;
    for (int p = 0; p < passes; ++p) {
        for (size_t i = 0; i < n; i += 128) {
            for (int c = 0; c < 4; ++c) {
                acc[c] = _mm256_xor_si256(acc[c], _mm256_load_si256((const __m256i *) (buf + i + 32 * c)));
            }
        }
    }
    const __m256i s = _mm256_xor_si256(_mm256_xor_si256(acc[0], acc[1]), _mm256_xor_si256(acc[2], acc[3]));
    swarmkv_peak_sink = _mm256_extract_epi32(s, 0);
    return (int64_t) n * passes;
}
#endif

/* The best loop this CPU has: 3 AVX-512 VNNI, 2 AVX-VNNI, 1 AVX2, 0 none (int8);
 * 2 AVX-512F, 1 AVX2 with FMA, 0 none (f32 FMA). */
static int int8_level(void) {
#if defined(SWARMKV_PEAK_X86)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw")) return 3;
    if (__builtin_cpu_supports("avxvnni")) return 2;
    if (__builtin_cpu_supports("avx2")) return 1;
#endif
    return 0;
}

static int fma_level(void) {
#if defined(SWARMKV_PEAK_X86)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return 2;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 1;
#endif
    return 0;
}

const char * swarmkv_peak_int8_isa(void) {
    static const char * names[] = {"", "AVX2", "AVX_VNNI", "AVX512_VNNI"};
    return names[int8_level()];
}

const char * swarmkv_peak_fma_isa(void) {
    static const char * names[] = {"", "AVX2_FMA", "AVX512F"};
    return names[fma_level()];
}

/* int8 multiply-adds done in iters passes of the best loop this CPU has; 0 without one. */
int64_t swarmkv_peak_int8(int64_t iters) {
#if defined(SWARMKV_PEAK_X86)
    switch (int8_level()) {
        case 3: return int8_avx512vnni(iters);
        case 2: return int8_avxvnni(iters);
        case 1: return int8_avx2(iters);
        default: break;
    }
#endif
    (void) iters;
    return 0;
}

/* f32 FMAs done in iters passes; 0 without AVX2+FMA or AVX-512F. */
int64_t swarmkv_peak_fma(int64_t iters) {
#if defined(SWARMKV_PEAK_X86)
    switch (fma_level()) {
        case 2: return fma_avx512(iters);
        case 1: return fma_avx2(iters);
        default: break;
    }
#endif
    (void) iters;
    return 0;
}

/* Bytes read in `passes` passes over buf (32-byte aligned); 0 without AVX2. */
int64_t swarmkv_peak_read(const void * buf, size_t bytes, int passes) {
#if defined(SWARMKV_PEAK_X86)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2")) return read_avx2((const char *) buf, bytes, passes);
#endif
    (void) buf; (void) bytes; (void) passes;
    return 0;
}
