#include "db.h"

#include <sqlite3.h>

namespace kiln::coord {

namespace {
[[noreturn]] void fail(sqlite3* db, const std::string& what) {
  throw DbError("sqlite: " + what + ": " + sqlite3_errmsg(db));
}
}  // namespace

Stmt::Stmt(sqlite3* db, const std::string& sql) : db_(db) {
  if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &stmt_, nullptr) != SQLITE_OK) fail(db_, sql);
}

Stmt::~Stmt() { sqlite3_finalize(stmt_); }

Stmt& Stmt::bind(int i, int64_t v) {
  if (sqlite3_bind_int64(stmt_, i, v) != SQLITE_OK) fail(db_, "bind");
  return *this;
}

Stmt& Stmt::bind_real(int i, double v) {
  if (sqlite3_bind_double(stmt_, i, v) != SQLITE_OK) fail(db_, "bind");
  return *this;
}

Stmt& Stmt::bind_null(int i) {
  if (sqlite3_bind_null(stmt_, i) != SQLITE_OK) fail(db_, "bind");
  return *this;
}

Stmt& Stmt::bind(int i, const std::string& v) {
  if (sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT) !=
      SQLITE_OK) {
    fail(db_, "bind");
  }
  return *this;
}

bool Stmt::step() {
  const int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  fail(db_, "step");
}

int64_t Stmt::integer(int col) const { return sqlite3_column_int64(stmt_, col); }
double Stmt::real(int col) const { return sqlite3_column_double(stmt_, col); }
bool Stmt::is_null(int col) const { return sqlite3_column_type(stmt_, col) == SQLITE_NULL; }

Stmt& Stmt::bind_blob(int i, const std::string& bytes) {
  if (sqlite3_bind_blob(stmt_, i, bytes.data(), static_cast<int>(bytes.size()),
                        SQLITE_TRANSIENT) != SQLITE_OK) {
    fail(db_, "bind");
  }
  return *this;
}

std::string Stmt::blob(int col) const {
  const auto* p = sqlite3_column_blob(stmt_, col);
  return p ? std::string(static_cast<const char*>(p), sqlite3_column_bytes(stmt_, col)) : "";
}

std::string Stmt::text(int col) const {
  const auto* p = sqlite3_column_text(stmt_, col);
  return p ? std::string(reinterpret_cast<const char*>(p), sqlite3_column_bytes(stmt_, col)) : "";
}

Db::~Db() { sqlite3_close(db_); }

absl::Status Db::open(const std::string& path) {
  if (sqlite3_open(path.c_str(), &db_) != SQLITE_OK) {
    return absl::UnavailableError("cannot open state file '" + path + "': " + sqlite3_errmsg(db_));
  }
  try {
    sqlite3_busy_timeout(db_, 5000);
    // WAL: a commit is one append, and a process killed at any point leaves the last committed
    // state. synchronous=NORMAL survives process crashes (SIGKILL); only a power loss may drop
    // the latest commits.
    exec("PRAGMA journal_mode=WAL");
    exec("PRAGMA synchronous=NORMAL");
  } catch (const DbError& e) {
    return absl::UnavailableError("state file '" + path + "': " + e.what());
  }
  return absl::OkStatus();
}

void Db::exec(const std::string& sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : "error";
    sqlite3_free(err);
    throw DbError("sqlite: " + sql + ": " + msg);
  }
}

Transaction::~Transaction() {
  if (done_) return;
  try {
    db_.exec("ROLLBACK");
  } catch (const DbError&) {
    // Nothing more to do: SQLite rolls back an open transaction itself when it fails.
  }
}

}  // namespace kiln::coord
