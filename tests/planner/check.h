/* The planner tests' CHECK: counts failures (`failures`) and carries on. */
#ifndef TOKPIPE_TESTS_PLANNER_CHECK_H
#define TOKPIPE_TESTS_PLANNER_CHECK_H

#include <stdio.h>

static int failures;
#define CHECK(cond, ...)                                                                                            \
  do {                                                                                                              \
    if (!(cond)) {                                                                                                  \
      printf("FAIL: " __VA_ARGS__);                                                                                 \
      printf("\n");                                                                                                 \
      failures++;                                                                                                   \
    }                                                                                                               \
  } while (0)

#endif
