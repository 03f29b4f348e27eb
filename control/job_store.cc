#include "control/job_store.h"

#include <sqlite3.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace downpour {
namespace control {
namespace {

class SqliteJobStore : public JobStore {
 public:
  SqliteJobStore(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}
  ~SqliteJobStore() override { sqlite3_close(db_); }

  absl::Status SaveJob(const JobStatus& job) override {
    return Put("jobs", job.id(), job.SerializeAsString());
  }
  absl::Status SaveNode(const NodeInfo& node) override {
    return Put("nodes", node.id(), node.SerializeAsString());
  }
  absl::StatusOr<std::vector<JobStatus>> LoadJobs() override { return LoadAll<JobStatus>("jobs"); }
  absl::StatusOr<std::vector<NodeInfo>> LoadNodes() override { return LoadAll<NodeInfo>("nodes"); }
  absl::Status DeleteJob(const std::string& job_id) override { return Delete("jobs", job_id); }
  absl::Status DeleteNode(const std::string& node_id) override { return Delete("nodes", node_id); }

  absl::Status Exec(const std::string& sql) {
    char* error = nullptr;
    if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &error) != SQLITE_OK) {
      absl::Status status = Error(error ? error : "unknown error");
      sqlite3_free(error);
      return status;
    }
    return absl::OkStatus();
  }

 private:
  absl::Status Error(absl::string_view what) {
    return absl::InternalError(absl::StrCat("state database ", path_, ": ", what));
  }

  absl::Status Put(const char* table, const std::string& id, const std::string& blob) {
    absl::MutexLock lock(&mu_);
    const std::string sql =
        absl::StrCat("INSERT OR REPLACE INTO ", table, " (id, value) VALUES (?, ?)");
    sqlite3_stmt* stmt = nullptr;
    if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &stmt, nullptr) != SQLITE_OK) {
      return Error(sqlite3_errmsg(db_));
    }
    sqlite3_bind_text(stmt, 1, id.data(), id.size(), SQLITE_TRANSIENT);
    sqlite3_bind_blob(stmt, 2, blob.data(), blob.size(), SQLITE_TRANSIENT);
    const int rc = sqlite3_step(stmt);
    sqlite3_finalize(stmt);
    if (rc != SQLITE_DONE) return Error(sqlite3_errmsg(db_));
    return absl::OkStatus();
  }

  absl::Status Delete(const char* table, const std::string& id) {
    absl::MutexLock lock(&mu_);
    const std::string sql = absl::StrCat("DELETE FROM ", table, " WHERE id = ?");
    sqlite3_stmt* stmt = nullptr;
    if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &stmt, nullptr) != SQLITE_OK) {
      return Error(sqlite3_errmsg(db_));
    }
    sqlite3_bind_text(stmt, 1, id.data(), id.size(), SQLITE_TRANSIENT);
    const int rc = sqlite3_step(stmt);
    sqlite3_finalize(stmt);
    if (rc != SQLITE_DONE) return Error(sqlite3_errmsg(db_));
    return absl::OkStatus();
  }

  template <typename Message>
  absl::StatusOr<std::vector<Message>> LoadAll(const char* table) {
    absl::MutexLock lock(&mu_);
    const std::string sql = absl::StrCat("SELECT id, value FROM ", table, " ORDER BY rowid");
    sqlite3_stmt* stmt = nullptr;
    if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &stmt, nullptr) != SQLITE_OK) {
      return Error(sqlite3_errmsg(db_));
    }
    std::vector<Message> out;
    int rc;
    while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
      Message message;
      const void* blob = sqlite3_column_blob(stmt, 1);
      const int size = sqlite3_column_bytes(stmt, 1);
      if (!message.ParseFromArray(blob, size)) {
        const std::string id(reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0)));
        sqlite3_finalize(stmt);
        return absl::DataLossError(
            absl::StrCat("state database ", path_, ": corrupt ", table, " row \"", id, "\""));
      }
      out.push_back(std::move(message));
    }
    sqlite3_finalize(stmt);
    if (rc != SQLITE_DONE) return Error(sqlite3_errmsg(db_));
    return out;
  }

  absl::Mutex mu_;
  sqlite3* db_;
  const std::string path_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<JobStore>> OpenSqliteJobStore(const std::string& state_dir) {
  if (mkdir(state_dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create state dir ", state_dir, ": ", std::strerror(errno)));
  }
  const std::string path = state_dir + "/coordinator.db";
  sqlite3* db = nullptr;
  if (sqlite3_open(path.c_str(), &db) != SQLITE_OK) {
    std::string message = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open state database ", path, ": ", message));
  }
  auto store = std::make_unique<SqliteJobStore>(db, path);
  absl::Status status = store->Exec(
      "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;"
      "CREATE TABLE IF NOT EXISTS jobs (id TEXT PRIMARY KEY, value BLOB NOT NULL);"
      "CREATE TABLE IF NOT EXISTS nodes (id TEXT PRIMARY KEY, value BLOB NOT NULL);");
  if (!status.ok()) return status;
  return std::unique_ptr<JobStore>(std::move(store));
}

}  // namespace control
}  // namespace downpour
