// NodeRegistry: the cluster's membership as the coordinator knows it —
// which shards and workers registered (with which incarnation), when each
// was last heard, which are draining or cordoned, and which are dead.
//
// A node is alive while it heartbeats within node_timeout. After a
// coordinator restart, nodes loaded from the store count as alive for
// recovery_grace (or until they heartbeat), so a coordinator away for up to
// that long fails nothing; until a node is heard again it gets no new work.
//
// Durability: a change of a node's record (registration, death, revival,
// cordon) is written through the JobStore before it takes effect; a write
// that fails changes nothing. Liveness bookkeeping (last heartbeat, heard,
// draining) is memory only.
//
// Thread-safe: one mutex guards the nodes. It is taken after the
// coordinator's job lock and JobTable's, never the other way; nothing but
// the store and the log is called while it is held. Time comes from
// Options::now.
#ifndef DOWNPOUR_CONTROL_NODE_REGISTRY_H_
#define DOWNPOUR_CONTROL_NODE_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "control/job_store.h"
#include "proto/coordinator.pb.h"

namespace downpour {
namespace control {

class NodeRegistry {
 public:
  struct Options {
    // A node silent for this long is declared dead.
    absl::Duration node_timeout = absl::Seconds(5);
    // After a restart, nodes loaded from the store count as alive this long.
    absl::Duration recovery_grace = absl::Minutes(10);
    // Nodes dead for longer than this leave the store (zero: kept).
    absl::Duration dead_node_retention = absl::ZeroDuration();
    std::function<absl::Time()> now = [] { return absl::Now(); };
  };

  // What a heartbeat found.
  struct Beat {
    NodeInfo node;  // As recorded (before any revival below).
    // The heartbeat says draining for the first time; whether the node is
    // draining (by its heartbeats or its last report).
    bool began_draining = false;
    bool draining = false;
    // The node was recorded dead: its revival was written (ok) or not.
    bool revived = false;
    absl::Status revival;
  };

  // `store` must outlive this.
  NodeRegistry(Options options, JobStore* store);

  // Takes the nodes a restarted coordinator loaded from the store: alive
  // ones count as alive for recovery_grace from now, dead ones stay dead as
  // last heard.
  void Load(std::vector<NodeInfo> nodes);

  // Whether `node` may register: PermissionDenied when it is recorded alive
  // under another role (see Register).
  absl::Status MayRegister(const NodeInfo& node);
  // Whether `node` is known under another incarnation (it restarted).
  bool Restarted(const NodeInfo& node);
  // Records the node as registered and alive (an operator's cordon
  // outlives its restarts); logs its arrival. A node keeps the role it
  // first registered with while it is recorded alive: PermissionDenied for
  // another (a worker's identity cannot take a shard's place, dropping its
  // rank of a running job).
  absl::Status Register(const NodeInfo& node);
  // A heartbeat from `node_id` of `incarnation`; nullopt when the node is
  // unknown under that incarnation (it must register again).
  std::optional<Beat> Heartbeat(const std::string& node_id, int64_t incarnation, bool draining);
  // The node is leaving (SIGTERM): it gets no new work.
  void MarkDraining(const std::string& node_id);
  // An operator's cordon (or uncordon); NotFound for an unknown node.
  // Returns the node as ListNodes shows it.
  absl::StatusOr<NodeInfo> SetCordoned(const std::string& node_id, bool cordoned);

  // Every node as ListNodes shows it, by id.
  std::vector<NodeInfo> List();
  // The node's record; nullopt for an unknown node.
  std::optional<NodeInfo> Find(const std::string& node_id);
  // The address the node registered ("" when unknown).
  std::string Address(const std::string& node_id);
  // Whether the node is known and writes checkpoints (--checkpoint_root).
  bool KeepsCheckpoints(const std::string& node_id);
  // Nodes that may take new work: alive, heard since this coordinator
  // started, neither draining nor cordoned.
  std::vector<NodeInfo> Available();
  // Nodes alive now (busy, draining or cordoned ones too).
  std::vector<NodeInfo> Alive();

  // When the node was first heard since this coordinator started; nullopt
  // when it has not been (or is unknown).
  std::optional<absl::Time> HeardSince(const std::string& node_id);
  // A node loaded from the store and not heard since is judged from `since`
  // by the node timeout, not the recovery grace: the other nodes of its job
  // are back (since then), so it is missing, not the coordinator.
  void JudgeFrom(const std::string& node_id, absl::Time since);

  // Nodes recorded alive that have been silent past their deadline, each
  // with the sentence that says so.
  std::vector<std::pair<std::string, std::string>> Silent();
  // Records the node dead (kept, with when it was last heard).
  absl::Status MarkDead(const std::string& node_id);
  // Removes nodes dead for longer than dead_node_retention that `named`
  // does not hold; returns the ids whose removal could not be written, with
  // why.
  std::vector<std::pair<std::string, absl::Status>> RemoveDead(const std::set<std::string>& named);

 private:
  struct Entry {
    NodeInfo info;
    absl::Time last_heartbeat;
    // Registered or heartbeated since this coordinator started (false for a
    // node loaded from the store until it does).
    bool heard = true;
    // Told to stop (SIGTERM): gets no new work.
    bool draining = false;
    // When it was first heard since this coordinator started.
    absl::Time heard_at = absl::InfinitePast();
    // Not heard yet, but judged by the node timeout from here (JudgeFrom).
    std::optional<absl::Time> judge_from;
  };

  // When a silent node is declared dead.
  absl::Time Deadline(const Entry& node) const;
  bool Alive(const Entry& node) const;
  NodeInfo Describe(const Entry& node) const;
  absl::Status RoleKept(const NodeInfo& node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes `info` as the node's record, then keeps it.
  absl::Status Save(const NodeInfo& info) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  JobStore* const store_;
  // Nodes loaded from the store are not judged before this: the recovery
  // grace from the registry's creation.
  const absl::Time grace_until_;

  absl::Mutex mu_;
  std::map<std::string, Entry> nodes_ ABSL_GUARDED_BY(mu_);
};

}  // namespace control
}  // namespace downpour

#endif  // DOWNPOUR_CONTROL_NODE_REGISTRY_H_
