#include "ps/request_dedup.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace downpour {

absl::StatusOr<RequestDedup::Verdict> RequestDedup::Reserve(const RequestKey& key) {
  if (key.worker_id.empty()) return absl::InvalidArgumentError("request_id.worker_id is empty");
  auto [it, fresh] = workers_.try_emplace(key.worker_id);
  Worker& worker = it->second;
  if (fresh || key.incarnation > worker.incarnation) {
    worker = Worker();
    worker.incarnation = key.incarnation;
  } else if (key.incarnation < worker.incarnation) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", key.worker_id, " incarnation ", key.incarnation,
                     " was superseded by incarnation ", worker.incarnation));
  }
  if (key.sequence <= worker.floor) return Verdict::kDuplicate;  // Long applied.
  auto [seq, inserted] = worker.recent.try_emplace(key.sequence, false);
  if (!inserted) return seq->second ? Verdict::kDuplicate : Verdict::kInFlight;
  // Prune the oldest applied sequences; in-flight ones stay.
  while (static_cast<int>(worker.recent.size()) > kWindow && worker.recent.begin()->second) {
    worker.floor = worker.recent.begin()->first;
    worker.recent.erase(worker.recent.begin());
  }
  return Verdict::kFresh;
}

void RequestDedup::Settle(const RequestKey& key, bool applied) {
  auto it = workers_.find(key.worker_id);
  if (it == workers_.end() || it->second.incarnation != key.incarnation) return;
  auto seq = it->second.recent.find(key.sequence);
  if (seq == it->second.recent.end()) return;
  if (applied) {
    seq->second = true;
  } else {
    it->second.recent.erase(seq);
  }
}

std::vector<RequestDedup::WorkerWindow> RequestDedup::Export() const {
  std::vector<WorkerWindow> windows;
  for (const auto& [id, worker] : workers_) {
    WorkerWindow window;
    window.worker_id = id;
    window.incarnation = worker.incarnation;
    window.floor = worker.floor;
    for (const auto& [sequence, applied] : worker.recent) {
      if (applied) window.applied.push_back(sequence);
    }
    windows.push_back(std::move(window));
  }
  std::sort(windows.begin(), windows.end(),
            [](const WorkerWindow& a, const WorkerWindow& b) { return a.worker_id < b.worker_id; });
  return windows;
}

void RequestDedup::Import(const std::vector<WorkerWindow>& windows) {
  workers_.clear();
  for (const WorkerWindow& window : windows) {
    Worker& worker = workers_[window.worker_id];
    worker.incarnation = window.incarnation;
    worker.floor = window.floor;
    for (int64_t sequence : window.applied) worker.recent[sequence] = true;
  }
}

int64_t RequestDedup::Remembered() const {
  int64_t n = 0;
  for (const auto& [id, worker] : workers_) n += static_cast<int64_t>(worker.recent.size());
  return n;
}

}  // namespace downpour
