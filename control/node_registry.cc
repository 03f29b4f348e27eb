#include "control/node_registry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status.h"

namespace downpour {
namespace control {
namespace {

const char* RoleName(NodeRole role) { return role == SHARD ? "shard" : "worker"; }

absl::Status NoSuchNode(const std::string& node_id) {
  return absl::NotFoundError(absl::StrCat("no node \"", node_id, "\""));
}

}  // namespace

NodeRegistry::NodeRegistry(Options options, JobStore* store)
    : options_(std::move(options)),
      store_(store),
      grace_until_(options_.now() + options_.recovery_grace) {}

void NodeRegistry::Load(std::vector<NodeInfo> nodes) {
  const absl::Time now = options_.now();
  absl::MutexLock lock(&mu_);
  for (NodeInfo& node : nodes) {
    Entry& entry = nodes_[node.id()];
    entry.info = std::move(node);
    entry.last_heartbeat = now;
    entry.heard = false;
    // A node dead before the restart stays dead, as last heard then.
    if (!entry.info.alive() && entry.info.last_heartbeat_ms() > 0) {
      entry.last_heartbeat = absl::FromUnixMillis(entry.info.last_heartbeat_ms());
    }
  }
}

absl::Time NodeRegistry::Deadline(const Entry& node) const {
  const absl::Time deadline = node.last_heartbeat + options_.node_timeout;
  if (node.heard) return deadline;
  if (node.judge_from.has_value()) return *node.judge_from + options_.node_timeout;
  return std::max(deadline, grace_until_);
}

bool NodeRegistry::Alive(const Entry& node) const {
  return node.info.alive() && options_.now() <= Deadline(node);
}

NodeInfo NodeRegistry::Describe(const Entry& node) const {
  NodeInfo info = node.info;
  info.set_alive(Alive(node));
  info.set_draining(node.draining);
  info.set_last_heartbeat_ms(absl::ToUnixMillis(node.last_heartbeat));
  return info;
}

absl::Status NodeRegistry::Save(const NodeInfo& info) {
  RETURN_IF_ERROR(store_->SaveNode(info));
  nodes_[info.id()].info = info;
  return absl::OkStatus();
}

absl::Status NodeRegistry::RoleKept(const NodeInfo& node) {
  auto it = nodes_.find(node.id());
  if (it == nodes_.end() || it->second.info.role() == node.role() || !it->second.info.alive()) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "node ", node.id(), " is registered as a ", RoleName(it->second.info.role()),
      " and cannot register as a ", RoleName(node.role()),
      ": a node keeps its role while it is alive (give the new one another --node_id)"));
}

absl::Status NodeRegistry::MayRegister(const NodeInfo& node) {
  absl::MutexLock lock(&mu_);
  return RoleKept(node);
}

bool NodeRegistry::Restarted(const NodeInfo& node) {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node.id());
  return it != nodes_.end() && it->second.info.incarnation() != node.incarnation();
}

absl::Status NodeRegistry::Register(const NodeInfo& node) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(RoleKept(node));
  auto it = nodes_.find(node.id());
  const bool known = it != nodes_.end();
  NodeInfo info = node;
  info.set_alive(true);
  // An operator's cordon outlives the node's restarts.
  info.set_cordoned(known && it->second.info.cordoned());
  const bool arrived =
      !known || !it->second.info.alive() || it->second.info.incarnation() != node.incarnation();
  RETURN_IF_ERROR(Save(info));
  if (arrived) {
    Log(absl::StrCat(RoleName(node.role()), " node ", node.id(), " at ", node.address(),
                     known ? " registered again" : " joined",
                     info.cordoned() ? " (cordoned: no new work)" : ""));
  }
  Entry& entry = nodes_[node.id()];
  entry.last_heartbeat = options_.now();
  if (!entry.heard) entry.heard_at = entry.last_heartbeat;
  entry.heard = true;
  return absl::OkStatus();
}

std::optional<NodeRegistry::Beat> NodeRegistry::Heartbeat(const std::string& node_id,
                                                          int64_t incarnation, bool draining) {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node_id);
  if (it == nodes_.end() || it->second.info.incarnation() != incarnation) return std::nullopt;
  Entry& node = it->second;
  node.last_heartbeat = options_.now();
  if (!node.heard) node.heard_at = node.last_heartbeat;
  node.heard = true;
  Beat beat;
  beat.node = node.info;
  if (draining && !node.draining) {
    node.draining = true;
    beat.began_draining = true;
    Log(absl::StrCat("node ", node_id, " is draining"));
  }
  beat.draining = node.draining;
  if (!node.info.alive()) {
    // Back from the dead: alive again once that is recorded (the next
    // heartbeat tries again otherwise).
    NodeInfo info = node.info;
    info.set_alive(true);
    beat.revived = true;
    beat.revival = Save(info);
  }
  return beat;
}

void NodeRegistry::MarkDraining(const std::string& node_id) {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node_id);
  if (it != nodes_.end()) it->second.draining = true;
}

absl::StatusOr<NodeInfo> NodeRegistry::SetCordoned(const std::string& node_id, bool cordoned) {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node_id);
  if (it == nodes_.end()) return NoSuchNode(node_id);
  if (it->second.info.cordoned() != cordoned) {
    NodeInfo info = it->second.info;
    info.set_cordoned(cordoned);
    RETURN_IF_ERROR(Save(info));
    Log(absl::StrCat("node ", node_id,
                     cordoned ? " drained by operator: no new work, its jobs move off it"
                              : " uncordoned by operator: it takes work again"));
  }
  return Describe(it->second);
}

std::vector<NodeInfo> NodeRegistry::List() {
  absl::MutexLock lock(&mu_);
  std::vector<NodeInfo> out;
  for (const auto& [id, node] : nodes_) out.push_back(Describe(node));
  return out;
}

std::optional<NodeInfo> NodeRegistry::Find(const std::string& node_id) {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node_id);
  if (it == nodes_.end()) return std::nullopt;
  return it->second.info;
}

std::string NodeRegistry::Address(const std::string& node_id) {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node_id);
  return it == nodes_.end() ? "" : it->second.info.address();
}

bool NodeRegistry::KeepsCheckpoints(const std::string& node_id) {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node_id);
  return it != nodes_.end() && it->second.info.checkpoints();
}

std::vector<NodeInfo> NodeRegistry::Available() {
  absl::MutexLock lock(&mu_);
  std::vector<NodeInfo> out;
  for (const auto& [id, node] : nodes_) {
    // A node not heard from since a restart may be gone, a draining one is
    // leaving: no new work.
    if (Alive(node) && node.heard && !node.draining && !node.info.cordoned()) {
      out.push_back(node.info);
    }
  }
  return out;
}

std::vector<NodeInfo> NodeRegistry::Alive() {
  absl::MutexLock lock(&mu_);
  std::vector<NodeInfo> out;
  for (const auto& [id, node] : nodes_) {
    if (Alive(node)) out.push_back(node.info);
  }
  return out;
}

std::optional<absl::Time> NodeRegistry::HeardSince(const std::string& node_id) {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node_id);
  if (it == nodes_.end() || !it->second.heard) return std::nullopt;
  return it->second.heard_at;
}

void NodeRegistry::JudgeFrom(const std::string& node_id, absl::Time since) {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node_id);
  if (it == nodes_.end() || it->second.heard) return;
  Entry& node = it->second;
  if (!node.judge_from.has_value() || since < *node.judge_from) node.judge_from = since;
}

std::vector<std::pair<std::string, std::string>> NodeRegistry::Silent() {
  const absl::Time now = options_.now();
  absl::MutexLock lock(&mu_);
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [id, node] : nodes_) {
    if (!node.info.alive() || now <= Deadline(node)) continue;
    out.emplace_back(id, absl::StrCat(RoleName(node.info.role()), " node ", id, " at ",
                                      node.info.address(), " stopped heartbeating for ",
                                      absl::FormatDuration(now - node.last_heartbeat)));
  }
  return out;
}

absl::Status NodeRegistry::MarkDead(const std::string& node_id) {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node_id);
  if (it == nodes_.end()) return NoSuchNode(node_id);
  NodeInfo dead = it->second.info;
  dead.set_alive(false);
  // Kept, so a restarted coordinator still shows when it was last heard.
  dead.set_last_heartbeat_ms(absl::ToUnixMillis(it->second.last_heartbeat));
  return Save(dead);
}

std::vector<std::pair<std::string, absl::Status>> NodeRegistry::RemoveDead(
    const std::set<std::string>& named) {
  std::vector<std::pair<std::string, absl::Status>> failed;
  if (options_.dead_node_retention <= absl::ZeroDuration()) return failed;
  const absl::Time now = options_.now();
  absl::MutexLock lock(&mu_);
  for (auto it = nodes_.begin(); it != nodes_.end();) {
    const Entry& node = it->second;
    if (Alive(node) || now - node.last_heartbeat <= options_.dead_node_retention ||
        named.count(it->first)) {
      ++it;
      continue;
    }
    absl::Status removed = store_->DeleteNode(it->first);
    if (!removed.ok()) {
      failed.emplace_back(it->first, std::move(removed));
      ++it;
      continue;
    }
    Log(absl::StrCat(
        "node ", it->first, " removed: dead since ",
        absl::FormatTime("%Y-%m-%d %H:%M:%S", node.last_heartbeat, absl::LocalTimeZone()),
        ", longer than --dead_node_retention=",
        absl::FormatDuration(options_.dead_node_retention)));
    it = nodes_.erase(it);
  }
  return failed;
}

}  // namespace control
}  // namespace downpour
