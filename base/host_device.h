/* TP_HOST_DEVICE marks a function that runs on the host and, compiled by nvcc, on the GPU:
 * the inline helpers the CPU kernels share with runtime/cuda (one implementation each). */
#ifndef TOKPIPE_BASE_HOST_DEVICE_H
#define TOKPIPE_BASE_HOST_DEVICE_H

#ifdef __CUDACC__
#define TP_HOST_DEVICE __host__ __device__
#else
#define TP_HOST_DEVICE
#endif

#endif
