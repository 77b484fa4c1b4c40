/* runtime/cuda/check.h's failure path: a CUDA call that fails on every machine (device
 * ordinal 4096; without a GPU, no device at all) must give one line naming this file, the
 * line, the call and cudart's message, and exit code 1 (tests/cuda/CMakeLists.txt checks). */
#include "cuda/check.h"

int main(void) {
  TP_CUDA_CHECK(cudaSetDevice(4096));
  return 0; /* not reached */
}
