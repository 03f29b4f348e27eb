// The main of a fuzz target built without libFuzzer (gcc, the main build):
// runs LLVMFuzzerTestOneInput once over each file named on the command line
// and each file under each directory named, in sorted order, and fails when
// there is none. Arguments starting with '-' (libFuzzer's flags, such as
// -runs=0) are ignored, so the same test arguments work in both builds.
// A finding aborts the process, as under libFuzzer.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <system_error>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

// Every regular file at or under `path` (symbolic links followed: Bazel's
// runfiles are links).
void ListInputs(const std::filesystem::path& path, std::vector<std::string>* out) {
  std::error_code error;
  if (!std::filesystem::is_directory(path, error)) {
    out->push_back(path.string());
    return;
  }
  for (const auto& entry : std::filesystem::recursive_directory_iterator(
           path, std::filesystem::directory_options::follow_directory_symlink)) {
    if (entry.is_regular_file()) out->push_back(entry.path().string());
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> inputs;
  for (int i = 1; i < argc; ++i) {
    if (argv[i][0] != '-') ListInputs(argv[i], &inputs);
  }
  if (inputs.empty()) {
    std::fprintf(stderr, "usage: %s FILE_OR_DIRECTORY...: no input files found\n", argv[0]);
    return 1;
  }
  std::sort(inputs.begin(), inputs.end());
  for (const std::string& path : inputs) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "cannot read %s\n", path.c_str());
      return 1;
    }
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  }
  std::printf("replayed %zu inputs\n", inputs.size());
  return 0;
}
