// Linked into the fuzz targets that parse protobufs from arbitrary bytes:
// drops protobuf's log lines (e.g. "String field ... contains invalid UTF-8"
// for every such input), which are expected outcomes there, not findings,
// and would otherwise flood the fuzzer's log and slow it down. Protobuf's
// fatal errors still abort.
#include "google/protobuf/stubs/logging.h"

namespace {

const bool kQuiet = [] {
  google::protobuf::SetLogHandler(nullptr);
  return true;
}();

}  // namespace
