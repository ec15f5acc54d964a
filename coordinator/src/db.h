// coordinator/src/db.h: a thin RAII wrapper over the SQLite C API, just what state.cpp needs:
// open a file in WAL mode, run statements with bound parameters, and transactions.
//
//   Db db;
//   if (absl::Status st = db.open(path); !st.ok()) return st;
//   Stmt s = db.prepare("SELECT id FROM jobs WHERE state = ?");
//   s.bind(1, "queued");
//   while (s.step()) use(s.text(0));
#pragma once

#include <absl/status/status.h>

#include <cstdint>
#include <stdexcept>
#include <string>

struct sqlite3;
struct sqlite3_stmt;

namespace kiln::coord {

// A prepared statement. Errors while stepping are bugs in our SQL or a broken disk; both throw
// DbError, which the caller turns into INTERNAL at the RPC boundary.
class Stmt {
 public:
  Stmt(sqlite3* db, const std::string& sql);
  ~Stmt();
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;

  Stmt& bind(int i, int64_t v);
  Stmt& bind(int i, const std::string& v);
  Stmt& bind_blob(int i, const std::string& bytes);
  Stmt& bind_real(int i, double v);
  Stmt& bind_null(int i);
  // true while a row is available; false when done.
  bool step();
  void run() {
    while (step()) {
    }
  }
  int64_t integer(int col) const;
  double real(int col) const;
  bool is_null(int col) const;
  std::string text(int col) const;
  std::string blob(int col) const;

 private:
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
};

struct DbError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Db {
 public:
  Db() = default;
  ~Db();
  Db(const Db&) = delete;
  Db& operator=(const Db&) = delete;

  // Opens (creating) the file, in WAL mode with a busy timeout.
  absl::Status open(const std::string& path);
  void exec(const std::string& sql);  // statements without parameters or results
  Stmt prepare(const std::string& sql) { return Stmt(db_, sql); }

 private:
  sqlite3* db_ = nullptr;
};

// BEGIN IMMEDIATE ... COMMIT; rolls back when destroyed uncommitted (an exception on the way).
class Transaction {
 public:
  explicit Transaction(Db& db) : db_(db) { db_.exec("BEGIN IMMEDIATE"); }
  ~Transaction();
  void commit() {
    db_.exec("COMMIT");
    done_ = true;
  }

 private:
  Db& db_;
  bool done_ = false;
};

}  // namespace kiln::coord
