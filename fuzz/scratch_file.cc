#include "fuzz/scratch_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace downpour {
namespace fuzz {

const std::string& ScratchDir() {
  static const std::string* dir = [] {
    const char* base = std::getenv("TEST_TMPDIR");
    if (base == nullptr || *base == '\0') base = std::getenv("TMPDIR");
    if (base == nullptr || *base == '\0') base = "/tmp";
    std::string path = std::string(base) + "/downpour-fuzz.XXXXXX";
    if (mkdtemp(path.data()) == nullptr) {
      std::fprintf(stderr, "cannot make a scratch directory under %s: %s\n", base,
                   std::strerror(errno));
      std::abort();
    }
    return new std::string(path);
  }();
  return *dir;
}

std::string WriteScratchFile(const std::string& name, const uint8_t* data, size_t size) {
  std::string path = ScratchDir() + "/" + name;
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  size_t done = 0;
  while (fd >= 0 && done < size) {
    const ssize_t wrote = write(fd, data + done, size - done);
    if (wrote < 0 && errno == EINTR) continue;
    if (wrote <= 0) break;
    done += static_cast<size_t>(wrote);
  }
  if (fd < 0 || done < size || close(fd) != 0) {
    std::fprintf(stderr, "cannot write scratch file %s: %s\n", path.c_str(), std::strerror(errno));
    std::abort();
  }
  return path;
}

}  // namespace fuzz
}  // namespace downpour
