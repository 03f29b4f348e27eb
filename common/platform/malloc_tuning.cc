#include "common/platform/malloc_tuning.h"

#include <malloc.h>

namespace downpour {

void KeepTensorBuffersMapped() {
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
}

}  // namespace downpour
