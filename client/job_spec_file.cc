#include "client/job_spec_file.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"

namespace downpour {
namespace {

// Records the parser's errors as "FILE:LINE:COL: message" (1-based).
class JobSpecErrorCollector : public google::protobuf::io::ErrorCollector {
 public:
  explicit JobSpecErrorCollector(std::string path) : path_(std::move(path)) {}

  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    if (first_error_.empty()) {
      first_error_ = absl::StrCat(path_, ":", line + 1, ":", column + 1, ": ", message);
    }
  }

  const std::string& first_error() const { return first_error_; }

 private:
  const std::string path_;
  std::string first_error_;
};

}  // namespace

absl::StatusOr<JobSpec> LoadJobSpec(const std::string& path) {
  struct stat info;
  if (stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("job spec path ", path, " is a directory, not a file"));
  }
  std::ifstream in(path);
  if (!in) {
    const int error = errno;
    if (error == ENOENT) {
      return absl::NotFoundError(absl::StrCat("job spec file ", path, " does not exist"));
    }
    return absl::FailedPreconditionError(
        absl::StrCat("cannot read job spec file ", path, ": ", std::strerror(error)));
  }
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    return absl::DataLossError(absl::StrCat("cannot read job spec file ", path));
  }
  JobSpec spec;
  JobSpecErrorCollector errors(path);
  google::protobuf::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text.str(), &spec)) {
    if (errors.first_error().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": not a valid job spec"));
    }
    return absl::InvalidArgumentError(errors.first_error());
  }
  return spec;
}

}  // namespace downpour
