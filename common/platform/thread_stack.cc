// Linking the CUDA libraries makes every thread's static TLS block about
// 100 KiB larger (cuBLASLt alone has 94 KiB of TLS). A library that asks for
// a small explicit thread stack then gets EINVAL from pthread_create,
// because glibc puts the TLS block on the thread's stack (civetweb's 100 KiB
// did, when it served /metrics; NCCL and gRPC's libgpr call
// pthread_attr_setstacksize too). This definition, in the program itself,
// interposes on pthread_attr_setstacksize for every library and raises
// explicit stack sizes to at least 1 MiB; default-sized threads are
// unaffected.
#include <dlfcn.h>
#include <pthread.h>

#include <cstddef>

extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr, size_t size) {
  using SetStackSize = int (*)(pthread_attr_t*, size_t);
  static const SetStackSize real =
      reinterpret_cast<SetStackSize>(dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  constexpr size_t kMinimum = size_t{1} << 20;
  return real(attr, size < kMinimum ? kMinimum : size);
}
