/* The floor of a local tar read with a per-sample CRC32C, in C with no Python objects (issue 15).
 *
 *   cc -O2 -o /tmp/read_ceiling benchmarks/read_ceiling.c
 *   /tmp/read_ceiling MODE SHARD...     # e.g. <shards>/shard-*.tar: CPU seconds of one pass over them
 *
 * Each shard's members are found first (tar headers, untimed); then one timed pass reads every byte:
 *   cat      128 KiB reads into one buffer (what `cat` does)
 *   scatter  batches of whole members (~256 KiB, fastload's C reader's size): one preadv each, every member
 *            of 16 KiB or more into its own fresh malloc'd buffer (as a bytes object's), headers, small
 *            members and padding into scratch; the buffers freed after the batch
 *   scatter-crc  the same, then the CRC32C of every byte of the batch (AVX-512 VPCLMULQDQ folding)
 *   contig   each batch read into one fresh buffer (samples would share it)
 *   contig-crc   the same, then the CRC32C of every byte
 * The difference between `scatter-crc` and fastload's epoch (benchmarks/read_crc.py) is what Python's
 * objects and loops per sample cost; between `cat` and `scatter-crc`, what reading into separate buffers and
 * checking every byte cost. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <immintrin.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/uio.h>
#include <unistd.h>

#define BLOCK 512
#define BATCH (256 << 10)
#define DIRECT (16 << 10)
#define MAX_MEMBERS 64

typedef struct { long long offset, size; } Member; /* a member's data: offset in the shard, bytes */

static uint64_t k256[2], k64[2];
static int vpclmul; /* AVX-512 VPCLMULQDQ here: else the crc32 instruction alone (slower) */

static uint64_t xpow(int e) { /* x^e mod P, bit-reflected, for the folding constants */
    uint64_t r = 1;
    for (; e > 0; e--) { r <<= 1; if (r & 0x100000000ULL) r ^= 0x11EDC6F41ULL; }
    uint64_t out = 0;
    for (int j = 0; j < 32; j++) out |= (r >> j & 1) << (31 - j);
    return out;
}

#define VT __attribute__((target("avx512f,vpclmulqdq,sse4.2")))
static inline uint64_t ld(const unsigned char *p) { uint64_t w; memcpy(&w, p, 8); return w; }
VT static inline __m512i fold(__m512i x, __m512i k, __m512i d) {
    return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(x, k, 0), _mm512_clmulepi64_epi128(x, k, 0x11), d, 0x96);
}
VT static uint32_t crc32c(uint32_t crc, const unsigned char *p, size_t n) { /* as fastload/_native.c */
    uint64_t c = ~crc;
    if (vpclmul && n >= 512) {
        __m512i m256 = _mm512_broadcast_i32x4(_mm_set_epi64x((long long)k256[1], (long long)k256[0]));
        __m512i m64 = _mm512_broadcast_i32x4(_mm_set_epi64x((long long)k64[1], (long long)k64[0]));
        __m512i x0 = _mm512_xor_si512(_mm512_loadu_si512(p), _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, (int)~crc));
        __m512i x1 = _mm512_loadu_si512(p + 64), x2 = _mm512_loadu_si512(p + 128), x3 = _mm512_loadu_si512(p + 192);
        for (p += 256, n -= 256; n >= 256; p += 256, n -= 256) {
            x0 = fold(x0, m256, _mm512_loadu_si512(p));
            x1 = fold(x1, m256, _mm512_loadu_si512(p + 64));
            x2 = fold(x2, m256, _mm512_loadu_si512(p + 128));
            x3 = fold(x3, m256, _mm512_loadu_si512(p + 192));
        }
        x0 = fold(fold(fold(x0, m64, x1), m64, x2), m64, x3);
        for (; n >= 64; p += 64, n -= 64) x0 = fold(x0, m64, _mm512_loadu_si512(p));
        unsigned char last[64];
        _mm512_storeu_si512(last, x0);
        c = 0;
        for (int j = 0; j < 64; j += 8) c = _mm_crc32_u64(c, ld(last + j));
    }
    for (; n >= 8; n -= 8, p += 8) c = _mm_crc32_u64(c, ld(p));
    for (; n; n--) c = _mm_crc32_u8((uint32_t)c, *p++);
    return ~(uint32_t)c;
}

static double cpu(void) {
    struct rusage r;
    getrusage(RUSAGE_SELF, &r);
    return r.ru_utime.tv_sec + r.ru_stime.tv_sec + (r.ru_utime.tv_usec + r.ru_stime.tv_usec) / 1e6;
}

static Member *members_of(int fd, size_t *count) { /* the regular members' data, in file order */
    size_t cap = 1024, n = 0;
    Member *m = malloc(cap * sizeof *m);
    unsigned char h[BLOCK];
    for (long long pos = 0; pread(fd, h, BLOCK, pos) == BLOCK && h[0]; ) {
        long long size = strtoll((const char *)h + 124, NULL, 8);
        if (n == cap) m = realloc(m, (cap *= 2) * sizeof *m);
        m[n++] = (Member){pos + BLOCK, size};
        pos += BLOCK + (size + BLOCK - 1) / BLOCK * BLOCK;
    }
    *count = n;
    return m;
}

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: %s cat|scatter|scatter-crc|contig|contig-crc SHARD...\n", argv[0]); return 2; }
    const char *mode = argv[1];
    int crc = strstr(mode, "-crc") != NULL, contig = strncmp(mode, "contig", 6) == 0, cat = strcmp(mode, "cat") == 0;
    /* as in a Python process after its first big free: freed memory stays in the heap, 256 KiB come from it */
    mallopt(M_TRIM_THRESHOLD, 64 << 20);
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("sse4.2")) { fprintf(stderr, "needs SSE4.2 (x86-64)\n"); return 2; }
    vpclmul = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("vpclmulqdq");
    k256[0] = xpow(8 * 256 + 64 - 33); k256[1] = xpow(8 * 256 - 33);
    k64[0] = xpow(8 * 64 + 64 - 33); k64[1] = xpow(8 * 64 - 33);
    unsigned char *buf = malloc(128 << 10), *scratch = malloc(BATCH + MAX_MEMBERS * 2 * BLOCK);
    volatile uint32_t sink = 0;
    double spent = 0, bytes = 0;
    for (int f = 2; f < argc; f++) {
        int fd = open(argv[f], O_RDONLY);
        if (fd < 0) { perror(argv[f]); return 1; }
        size_t n;
        Member *m = members_of(fd, &n);
        double t = cpu();
        if (cat) {
            for (off_t o = 0;; ) { ssize_t r = pread(fd, buf, 128 << 10, o); if (r <= 0) break; o += r; bytes += r; }
        } else {
            for (size_t i = 0; i < n; ) { /* a batch: members i..j-1, from the header of i to the padding of j-1 */
                long long start = m[i].offset - BLOCK, end = start;
                size_t j = i;
                while (j < n && j - i < MAX_MEMBERS && (j == i || end - start < BATCH))
                    end = m[j].offset + (m[j].size + BLOCK - 1) / BLOCK * BLOCK, j++;
                size_t len = (size_t)(end - start);
                unsigned char *vals[MAX_MEMBERS] = {0}, *whole = NULL;
                struct iovec iov[2 * MAX_MEMBERS + 1];
                int niov = 0;
                long long from = start; /* file bytes not yet given a vector */
                size_t used = 0;        /* scratch used */
                if (contig) {
                    whole = malloc(len);
                    iov[niov++] = (struct iovec){whole, len};
                } else {
                    for (size_t k = i; k < j; k++) {
                        if (m[k].size < DIRECT) continue;
                        iov[niov++] = (struct iovec){scratch + used, (size_t)(m[k].offset - from)};
                        used += (size_t)(m[k].offset - from);
                        vals[k - i] = malloc((size_t)m[k].size + 32) + 32; /* data at +32, as in a bytes */
                        iov[niov++] = (struct iovec){vals[k - i], (size_t)m[k].size};
                        from = m[k].offset + m[k].size;
                    }
                    if (end > from) iov[niov++] = (struct iovec){scratch + used, (size_t)(end - from)};
                }
                ssize_t r = preadv(fd, iov, niov, start);
                if (r != (ssize_t)len) { fprintf(stderr, "%s: short read\n", argv[f]); return 1; }
                if (crc)
                    for (int v = 0; v < niov; v++) sink ^= crc32c(0, iov[v].iov_base, iov[v].iov_len);
                for (size_t k = 0; k < j - i; k++) if (vals[k]) free(vals[k] - 32);
                free(whole);
                bytes += (double)len;
                i = j;
            }
        }
        spent += cpu() - t;
        free(m);
        close(fd);
    }
    printf("%s %.3f s %.0f MB\n", mode, spent, bytes / 1e6);
    return sink == 1 && bytes < 0; /* (sink used) */
}
