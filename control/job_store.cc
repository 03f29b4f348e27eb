#include "control/job_store.h"

#include <sqlite3.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status.h"

namespace downpour {
namespace control {
namespace {

// One prepared statement, finalized when it goes out of scope.
class Statement {
 public:
  Statement(sqlite3* db, const std::string& sql) {
    if (sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt_, nullptr) != SQLITE_OK) stmt_ = nullptr;
  }
  ~Statement() { sqlite3_finalize(stmt_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  bool ok() const { return stmt_ != nullptr; }
  sqlite3_stmt* get() { return stmt_; }
  void Bind(int index, const std::string& text) {
    sqlite3_bind_text(stmt_, index, text.data(), text.size(), SQLITE_TRANSIENT);
  }
  void BindBlob(int index, const std::string& blob) {
    sqlite3_bind_blob(stmt_, index, blob.data(), blob.size(), SQLITE_TRANSIENT);
  }
  void Bind(int index, int64_t value) { sqlite3_bind_int64(stmt_, index, value); }
  // Runs a statement that returns no rows.
  bool Done() { return sqlite3_step(stmt_) == SQLITE_DONE; }

 private:
  sqlite3_stmt* stmt_ = nullptr;
};

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
  absl::Status DeleteJob(const std::string& job_id) override {
    absl::MutexLock lock(&mu_);
    return Transaction([&]() -> absl::Status {
      for (const char* table : {"jobs", "job_logs", "job_progress"}) {
        Statement stmt(db_, absl::StrCat("DELETE FROM ", table, " WHERE ",
                                         std::string(table) == "jobs" ? "id" : "job_id", " = ?"));
        if (!stmt.ok()) return Error();
        stmt.Bind(1, job_id);
        if (!stmt.Done()) return Error();
      }
      return absl::OkStatus();
    });
  }
  absl::Status DeleteNode(const std::string& node_id) override {
    absl::MutexLock lock(&mu_);
    Statement stmt(db_, "DELETE FROM nodes WHERE id = ?");
    if (!stmt.ok()) return Error();
    stmt.Bind(1, node_id);
    return stmt.Done() ? absl::OkStatus() : Error();
  }

  absl::Status AppendHistory(const JobHistoryRecords& added, int keep_lines,
                             int keep_points) override {
    absl::MutexLock lock(&mu_);
    return Transaction([&]() -> absl::Status {
      std::set<std::string> logged, sampled;
      for (const JobLogLine& line : added.lines) {
        Statement stmt(
            db_, "INSERT OR REPLACE INTO job_logs (job_id, sequence, value) VALUES (?, ?, ?)");
        if (!stmt.ok()) return Error();
        stmt.Bind(1, line.job_id());
        stmt.Bind(2, line.sequence());
        stmt.BindBlob(3, line.SerializeAsString());
        if (!stmt.Done()) return Error();
        logged.insert(line.job_id());
      }
      for (const JobProgressRecord& record : added.points) {
        Statement stmt(db_, "INSERT INTO job_progress (job_id, value) VALUES (?, ?)");
        if (!stmt.ok()) return Error();
        stmt.Bind(1, record.job_id);
        stmt.BindBlob(2, record.point.SerializeAsString());
        if (!stmt.Done()) return Error();
        sampled.insert(record.job_id);
      }
      for (const std::string& job_id : logged) {
        RETURN_IF_ERROR(Trim("job_logs", "sequence", job_id, keep_lines));
      }
      for (const std::string& job_id : sampled) {
        RETURN_IF_ERROR(Trim("job_progress", "rowid", job_id, keep_points));
      }
      return absl::OkStatus();
    });
  }

  absl::StatusOr<JobHistoryRecords> LoadHistory() override {
    absl::MutexLock lock(&mu_);
    JobHistoryRecords history;
    absl::Status read =
        ReadRows("SELECT job_id, value FROM job_logs ORDER BY job_id, sequence", "job_logs",
                 [&](const std::string& job_id, const void* blob, int size) {
                   JobLogLine line;
                   if (!line.ParseFromArray(blob, size)) return false;
                   line.set_job_id(job_id);
                   history.lines.push_back(std::move(line));
                   return true;
                 });
    if (!read.ok()) return read;
    read = ReadRows("SELECT job_id, value FROM job_progress ORDER BY job_id, rowid", "job_progress",
                    [&](const std::string& job_id, const void* blob, int size) {
                      JobProgressRecord record{job_id, {}};
                      if (!record.point.ParseFromArray(blob, size)) return false;
                      history.points.push_back(std::move(record));
                      return true;
                    });
    if (!read.ok()) return read;
    return history;
  }

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
  absl::Status Error() { return Error(sqlite3_errmsg(db_)); }

  // Runs `body` in one transaction: all of it is written, or none.
  template <typename Body>
  absl::Status Transaction(Body body) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
    absl::Status status = body();
    if (status.ok()) status = Exec("COMMIT");
    if (!status.ok()) Exec("ROLLBACK").IgnoreError();  // The first error is the one to tell.
    return status;
  }

  // Keeps the newest `keep` rows of `job_id` in `table`, newest by `order`.
  absl::Status Trim(const char* table, const char* order, const std::string& job_id, int keep)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Statement stmt(db_, absl::StrCat("DELETE FROM ", table, " WHERE job_id = ?1 AND ", order,
                                     " NOT IN (SELECT ", order, " FROM ", table,
                                     " WHERE job_id = ?1 ORDER BY ", order, " DESC LIMIT ?2)"));
    if (!stmt.ok()) return Error();
    stmt.Bind(1, job_id);
    stmt.Bind(2, static_cast<int64_t>(std::max(1, keep)));
    return stmt.Done() ? absl::OkStatus() : Error();
  }

  absl::Status Put(const char* table, const std::string& id, const std::string& blob) {
    absl::MutexLock lock(&mu_);
    Statement stmt(db_,
                   absl::StrCat("INSERT OR REPLACE INTO ", table, " (id, value) VALUES (?, ?)"));
    if (!stmt.ok()) return Error();
    stmt.Bind(1, id);
    stmt.BindBlob(2, blob);
    return stmt.Done() ? absl::OkStatus() : Error();
  }

  // Calls `row(id, blob, size)` for each row of `sql` (two columns: an id
  // and a serialized message); a row it cannot parse is DataLoss naming it.
  template <typename Row>
  absl::Status ReadRows(const std::string& sql, const char* table, Row row)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Statement stmt(db_, sql);
    if (!stmt.ok()) return Error();
    int rc;
    while ((rc = sqlite3_step(stmt.get())) == SQLITE_ROW) {
      const std::string id(reinterpret_cast<const char*>(sqlite3_column_text(stmt.get(), 0)));
      if (!row(id, sqlite3_column_blob(stmt.get(), 1), sqlite3_column_bytes(stmt.get(), 1))) {
        return absl::DataLossError(
            absl::StrCat("state database ", path_, ": corrupt ", table, " row \"", id, "\""));
      }
    }
    return rc == SQLITE_DONE ? absl::OkStatus() : Error();
  }

  template <typename Message>
  absl::StatusOr<std::vector<Message>> LoadAll(const char* table) {
    absl::MutexLock lock(&mu_);
    std::vector<Message> out;
    absl::Status read = ReadRows(absl::StrCat("SELECT id, value FROM ", table, " ORDER BY rowid"),
                                 table, [&](const std::string&, const void* blob, int size) {
                                   out.emplace_back();
                                   return out.back().ParseFromArray(blob, size);
                                 });
    if (!read.ok()) return read;
    return out;
  }

  absl::Mutex mu_;
  sqlite3* const db_;
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
      "CREATE TABLE IF NOT EXISTS nodes (id TEXT PRIMARY KEY, value BLOB NOT NULL);"
      "CREATE TABLE IF NOT EXISTS job_logs (job_id TEXT NOT NULL, sequence INTEGER NOT NULL,"
      "  value BLOB NOT NULL, PRIMARY KEY (job_id, sequence));"
      "CREATE TABLE IF NOT EXISTS job_progress (job_id TEXT NOT NULL, value BLOB NOT NULL);"
      "CREATE INDEX IF NOT EXISTS job_progress_by_job ON job_progress (job_id);");
  if (!status.ok()) return status;
  return std::unique_ptr<JobStore>(std::move(store));
}

}  // namespace control
}  // namespace downpour
