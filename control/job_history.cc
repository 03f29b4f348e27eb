#include "control/job_history.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status.h"
#include "spec/limits.h"

namespace downpour {
namespace control {
namespace {

// Records a store that keeps failing leaves waiting: beyond this many the
// oldest go (the in-memory history still has them).
constexpr size_t kMaxUnwritten = 100000;
// Events kept in a job's record.
constexpr int kMaxEvents = 200;

template <typename T>
void KeepNewest(std::deque<T>* items, int keep) {
  while (static_cast<int>(items->size()) > std::max(1, keep)) items->pop_front();
}

template <typename T>
void DropOldest(std::vector<T>* items) {
  if (items->size() > kMaxUnwritten) items->erase(items->begin(), items->end() - kMaxUnwritten);
}

}  // namespace

JobHistory::JobHistory(Options options, JobStore* store)
    : options_(std::move(options)), store_(store) {}

absl::Status JobHistory::Load() {
  ASSIGN_OR_RETURN(JobHistoryRecords stored, store_->LoadHistory());
  absl::MutexLock lock(&mu_);
  for (JobLogLine& line : stored.lines) {
    JobLog& log = logs_[line.job_id()];
    log.next_sequence = std::max(log.next_sequence, line.sequence() + 1);
    log.lines.push_back(std::move(line));
    KeepNewest(&log.lines, options_.log_lines);
  }
  for (JobProgressRecord& record : stored.points) {
    std::deque<ProgressPoint>& points = progress_[record.job_id];
    points.push_back(std::move(record.point));
    KeepNewest(&points, options_.progress_points);
  }
  return absl::OkStatus();
}

void JobHistory::AddLine(JobLogLine line) {
  absl::MutexLock lock(&mu_);
  JobLog& log = logs_[line.job_id()];
  line.set_sequence(log.next_sequence++);
  unwritten_.lines.push_back(line);
  DropOldest(&unwritten_.lines);
  log.lines.push_back(std::move(line));
  KeepNewest(&log.lines, options_.log_lines);
  ++version_;
  changed_.SignalAll();
}

void JobHistory::AddEvent(JobStatus* job, const std::string& message) {
  JobEvent* event = job->add_events();
  event->set_time_ms(absl::ToUnixMillis(options_.now()));
  // Events name nodes, files and errors: a job of thousands of workers
  // keeps its 200 within a few MiB.
  event->set_message(TruncateText(message, kMaxEventBytes));
  if (job->events_size() > kMaxEvents) {
    job->mutable_events()->DeleteSubrange(0, job->events_size() - kMaxEvents);
  }
  Log(absl::StrCat("job ", job->id(), ": ", message));
  JobLogLine line;
  line.set_job_id(job->id());
  line.set_source("coordinator");
  line.set_time_ms(event->time_ms());
  line.set_text(TruncateText(message, kMaxLogLineBytes));
  AddLine(std::move(line));
}

void JobHistory::RecordProgress(const JobStatus& job) {
  const int64_t now = absl::ToUnixMillis(options_.now());
  absl::MutexLock lock(&mu_);
  std::deque<ProgressPoint>& points = progress_[job.id()];
  if (!points.empty()) {
    const ProgressPoint& last = points.back();
    const int64_t big_move = std::max<int64_t>(1, job.spec().steps() / 10);
    if (last.step() == job.step() ||
        (now - last.time_ms() < 1000 && job.step() - last.step() < big_move)) {
      return;
    }
  }
  ProgressPoint point;
  point.set_time_ms(now);
  point.set_step(job.step());
  point.set_loss(job.loss());
  point.set_examples_per_sec(job.examples_per_sec());
  unwritten_.points.push_back({job.id(), point});
  DropOldest(&unwritten_.points);
  points.push_back(std::move(point));
  KeepNewest(&points, options_.progress_points);
}

JobLogsResponse JobHistory::LinesAfter(const std::string& job_id, int64_t after_sequence) {
  absl::MutexLock lock(&mu_);
  JobLogsResponse response;
  auto it = logs_.find(job_id);
  if (it == logs_.end()) return response;
  const std::deque<JobLogLine>& lines = it->second.lines;
  response.set_truncated(!lines.empty() && lines.front().sequence() > after_sequence + 1);
  for (const JobLogLine& line : lines) {
    if (line.sequence() > after_sequence) *response.add_lines() = line;
  }
  return response;
}

std::vector<ProgressPoint> JobHistory::Progress(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  auto it = progress_.find(job_id);
  if (it == progress_.end()) return {};
  return std::vector<ProgressPoint>(it->second.begin(), it->second.end());
}

int64_t JobHistory::version() {
  absl::MutexLock lock(&mu_);
  return version_;
}

void JobHistory::WaitForChange(int64_t seen, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  const absl::Time deadline = absl::Now() + timeout;
  while (version_ <= seen && !changed_.WaitWithDeadline(&mu_, deadline)) {
  }
}

void JobHistory::Wake() {
  absl::MutexLock lock(&mu_);
  ++version_;
  changed_.SignalAll();
}

void JobHistory::Remove(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  logs_.erase(job_id);
  progress_.erase(job_id);
  auto& lines = unwritten_.lines;
  lines.erase(std::remove_if(lines.begin(), lines.end(),
                             [&](const JobLogLine& line) { return line.job_id() == job_id; }),
              lines.end());
  auto& points = unwritten_.points;
  points.erase(std::remove_if(points.begin(), points.end(),
                              [&](const JobProgressRecord& p) { return p.job_id == job_id; }),
               points.end());
  ++version_;
  changed_.SignalAll();
}

absl::Status JobHistory::Flush() {
  absl::MutexLock flushing(&flush_mu_);
  JobHistoryRecords batch;
  {
    absl::MutexLock lock(&mu_);
    std::swap(batch, unwritten_);
  }
  if (batch.lines.empty() && batch.points.empty()) return absl::OkStatus();
  absl::Status written = store_->AppendHistory(batch, options_.log_lines, options_.progress_points);
  if (!written.ok()) {
    // Tried again next time, before what came meanwhile (less what belongs
    // to jobs removed since).
    absl::MutexLock lock(&mu_);
    auto& lines = batch.lines;
    lines.erase(std::remove_if(lines.begin(), lines.end(),
                               [&](const JobLogLine& line) { return !logs_.count(line.job_id()); }),
                lines.end());
    auto& points = batch.points;
    points.erase(
        std::remove_if(points.begin(), points.end(),
                       [&](const JobProgressRecord& p) { return !progress_.count(p.job_id); }),
        points.end());
    batch.lines.insert(batch.lines.end(), unwritten_.lines.begin(), unwritten_.lines.end());
    batch.points.insert(batch.points.end(), unwritten_.points.begin(), unwritten_.points.end());
    DropOldest(&batch.lines);
    DropOldest(&batch.points);
    unwritten_ = std::move(batch);
  }
  return written;
}

}  // namespace control
}  // namespace downpour
