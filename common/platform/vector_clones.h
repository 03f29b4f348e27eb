// DOWNPOUR_VECTOR_CLONES: compiles a function for AVX-512, AVX2 and the
// baseline x86-64 (SSE2) and picks one when the program loads
// (target_clones), so a loop written to vectorise runs 8 or 16 lanes wide
// where the CPU has them. Elsewhere (clang, other CPUs) it is empty.
//
// Not under ThreadSanitizer: it instruments the clones' resolver, which the
// dynamic loader runs before TSan's runtime is initialized (a crash at start).
#ifndef DOWNPOUR_COMMON_PLATFORM_VECTOR_CLONES_H_
#define DOWNPOUR_COMMON_PLATFORM_VECTOR_CLONES_H_

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define DOWNPOUR_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define DOWNPOUR_VECTOR_CLONES
#endif

#endif  // DOWNPOUR_COMMON_PLATFORM_VECTOR_CLONES_H_
