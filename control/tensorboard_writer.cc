#include "control/tensorboard_writer.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/file.h"
#include "common/log.h"
#include "common/status.h"
#include "proto/tensorboard_event.pb.h"

namespace downpour {
namespace control {
namespace {

std::string ThisHost() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

void PutFixed32(uint32_t v, std::string* out) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// One TFRecord: length, masked CRC of the length, payload, masked CRC of it.
std::string Frame(const std::string& payload) {
  std::string record;
  record.reserve(payload.size() + 16);
  const uint64_t length = payload.size();
  for (int i = 0; i < 8; ++i) record.push_back(static_cast<char>((length >> (8 * i)) & 0xff));
  PutFixed32(MaskCrc(Crc32c(record.data(), 8)), &record);
  record += payload;
  PutFixed32(MaskCrc(Crc32c(payload.data(), payload.size())), &record);
  return record;
}

double WallTime(absl::Time t) { return absl::ToDoubleSeconds(t - absl::UnixEpoch()); }

}  // namespace

TensorBoardWriter::TensorBoardWriter(Options options)
    : options_(std::move(options)),
      hostname_(options_.hostname.empty() ? ThisHost() : options_.hostname) {}

TensorBoardWriter::~TensorBoardWriter() {
  for (auto& [id, file] : jobs_) {
    if (file.fd >= 0) close(file.fd);
  }
}

std::string TensorBoardWriter::JobDir(const std::string& job_id) const {
  return absl::StrCat(options_.root, "/", job_id);
}

absl::Status TensorBoardWriter::Open(const std::string& job_id, JobFile* file) {
  // Job ids are validated names, but a path must not climb out of the root.
  if (job_id.empty() || job_id == "." || job_id == ".." || job_id.find('/') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("job id \"", job_id, "\" is not a file name"));
  }
  const std::string dir = JobDir(job_id);
  RETURN_IF_ERROR(MakeDirs(dir));
  const absl::Time now = options_.now();
  const std::string base =
      absl::StrCat(dir, "/events.out.tfevents.", absl::ToUnixSeconds(now), ".", hostname_);
  // A file of the same second (a job run again at once) is never appended to.
  for (int n = 0;; ++n) {
    std::string path = n == 0 ? base : absl::StrCat(base, ".", n);
    int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
    if (fd >= 0) {
      file->fd = fd;
      file->path = std::move(path);
      break;
    }
    const int err = errno;
    if (err != EEXIST || n >= 100) return ErrnoStatus(err, absl::StrCat("cannot create ", path));
  }
  tensorboard::Event event;
  event.set_wall_time(WallTime(now));
  event.set_file_version("brain.Event:2");
  return WriteEvent(*file, event.SerializeAsString());
}

absl::Status TensorBoardWriter::WriteEvent(const JobFile& file, const std::string& event) {
  const std::string record = Frame(event);
  size_t done = 0;
  while (done < record.size()) {
    const ssize_t n = write(file.fd, record.data() + done, record.size() - done);
    if (n < 0) {
      const int err = errno;
      if (err == EINTR) continue;
      return ErrnoStatus(err, absl::StrCat("cannot write ", file.path));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

void TensorBoardWriter::AddScalar(const std::string& job_id, absl::string_view tag, int64_t step,
                                  double value) {
  absl::MutexLock lock(&mu_);
  JobFile& file = jobs_[job_id];
  if (file.failed) return;
  auto last = file.last_step.find(tag);
  if (last != file.last_step.end() && step <= last->second) return;
  absl::Status status;
  if (file.fd < 0) status = Open(job_id, &file);
  if (status.ok()) {
    tensorboard::Event event;
    event.set_wall_time(WallTime(options_.now()));
    event.set_step(step);
    tensorboard::Summary::Value* scalar = event.mutable_summary()->add_value();
    scalar->set_tag(std::string(tag));
    scalar->set_simple_value(static_cast<float>(value));
    status = WriteEvent(file, event.SerializeAsString());
  }
  if (!status.ok()) {
    file.failed = true;
    Log(absl::StrCat("job ", job_id,
                     ": TensorBoard scalars are not written from now on: ", status.message()));
    return;
  }
  file.last_step[std::string(tag)] = step;
}

void TensorBoardWriter::CloseJob(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  if (it->second.fd >= 0) close(it->second.fd);
  jobs_.erase(it);
}

}  // namespace control
}  // namespace downpour
