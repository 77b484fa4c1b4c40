/* What the communication tests share (tests/comm/test_comm.c, tests/cuda/test_cuda_nccl.cpp):
 * a failed expectation named with the rank, and what each rank contributes to a sum. */
#ifndef TOKPIPE_TESTS_COMM_EXPECT_H
#define TOKPIPE_TESTS_COMM_EXPECT_H

#include <stddef.h>
#include <stdio.h>

static int failures;

#define EXPECT(c, cond)                                                                                             \
  do {                                                                                                              \
    if (!(cond)) {                                                                                                  \
      fprintf(stderr, "rank %d: %s:%d: expected %s\n", (c)->rank, __FILE__, __LINE__, #cond);                       \
      failures++;                                                                                                   \
    }                                                                                                               \
  } while (0)

/* The value rank r contributes at index i: not exactly representable sums, so that a
 * different order of addition would show. */
static inline float value_f32(int r, size_t i) { return 1.0f / (float)(3 + r) + (float)i * 1e-3f * (float)(r + 1); }

#endif
