// DOWNPOUR_HOST_DEVICE marks small inline helpers that CUDA device code calls
// too (nvcc sees __host__ __device__; every other compiler sees nothing).
#ifndef DOWNPOUR_COMMON_HOST_DEVICE_H_
#define DOWNPOUR_COMMON_HOST_DEVICE_H_

#ifdef __CUDACC__
#define DOWNPOUR_HOST_DEVICE __host__ __device__
#else
#define DOWNPOUR_HOST_DEVICE
#endif

#endif  // DOWNPOUR_COMMON_HOST_DEVICE_H_
