// ONLINEPS_AVX2_CLONES: on x86-64 with GCC, a function so marked is compiled twice, for
// the baseline (SSE2) and for AVX2, and the loader picks the copy the CPU runs (an ifunc,
// resolved once at start-up). For the few loops that stream a push's floats: measured at
// 10,000 x 64 floats, the finite check takes 4.3 ns a row with AVX2 against 8.3 with SSE2.
// Elsewhere (clang's analysis builds, other CPUs) it expands to nothing.
#ifndef ONLINEPS_PS_CPU_CLONES_H_
#define ONLINEPS_PS_CPU_CLONES_H_

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define ONLINEPS_AVX2_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define ONLINEPS_AVX2_CLONES
#endif

#endif  // ONLINEPS_PS_CPU_CLONES_H_
