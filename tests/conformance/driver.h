// tests/conformance/driver.h: the conformance driver. It walks the op table and, for every op,
// every sample and every dtype a row claims, runs the op on eager CPU and on each execution path
// of the build (path.h), and fills the support matrix op x path x dtype.
//
//   conformance::Matrix m = conformance::run({.paths = {"Meta"}});
//   conformance::print_matrix(std::cout, m);      // the table, then the summary
//   for (const auto& [op, path, dtype, detail] : m.problems()) ...
//
// Note [Conformance]: the CPU column is eager CPU itself: a claimed dtype whose run raises
// NotImplemented or "dtype ... is not supported" is Missing. For the other paths a claim is
// Missing when the path's dispatch key has no kernel for the op, or, for a composite row, when
// an op its decomposition calls (traced on the CPU run of the same sample) has no kernel for
// that key or does not claim the dtype it was called with; or when running it raises as above.
// Otherwise the path runs (when available()) and is Ok or Failed; a claim it could not run
// (no device, no sample in that dtype: Note [Sample dtypes], eager CPU refusing every sample
// for another reason) is Untested. Every sample runs as written and again with its floating
// tensors non-contiguous. scripts/ops-matrix
// prints the matrix; tensor/ops/README.md "The support matrix" says how to read it.
//
// Note [Untested cells]: an untested cell is a gap, and problems() lists it (so
// OpsMatrix.ClaimsHold and the Conformance suites fail on it), unless its reason is one of these:
// the path cannot run on this machine (CUDA without a GPU: Matrix::unavailable), or every sample
// in that dtype has a data-dependent output shape the path cannot know ahead (nonzero on Meta and
// Remote: nothing to compare). An in-place variant whose self cannot hold its functional op's
// result (exp_ on integers, Note [Variant dtypes]) is not claimed, not untested.
#pragma once

#include <array>
#include <iosfwd>
#include <string>
#include <vector>

#include "conformance/path.h"

namespace kiln::conformance {

// The dtypes of the matrix's columns, in ScalarType order (bool ... float64).
const std::vector<ScalarType>& matrix_dtypes();
constexpr int kMatrixDtypes = 10;

struct Cell {
  Status status = Status::NotClaimed;
  int ran = 0;              // samples compared
  std::string detail;       // the first problem
  bool documented = false;  // Untested for a reason of Note [Untested cells]
};

struct Matrix {
  std::vector<std::string> paths;        // "CPU" first, then the paths run
  std::vector<std::string> unavailable;  // per path: why it could not run here ("" = it ran)
  struct Row {
    std::string op;
    std::vector<std::array<Cell, kMatrixDtypes>> cells;  // per path, per dtype
  };
  std::vector<Row> rows;

  struct Problem {
    std::string op, path;
    ScalarType dtype;
    Status status;
    std::string detail;
  };
  // Every Missing and Failed cell, and every Untested one that is a gap (Note [Untested cells]).
  std::vector<Problem> problems() const;
  int count(size_t path, Status s) const;
  int count_documented(size_t path) const;  // the Untested cells of Note [Untested cells]
};

struct Options {
  std::vector<std::string> paths;  // path names to run; empty: every registered path
  std::string op;                  // only this op (empty: every op)
  // Each sample in one dtype only: float32 when it has floating data, else its own (Note [Sample
  // dtypes]); the cells of a dtype left without samples are not claimed. The DTensor path runs
  // so (Note [DTensor conformance]).
  bool one_dtype_per_sample = false;
  bool non_contiguous = true;  // also run each sample with its floating tensors non-contiguous
};

Matrix run(const Options& opt = {});

// The table (one line per op: per path one character per dtype), the problems, the summary.
void print_matrix(std::ostream& os, const Matrix& m);
// Per path: how many cells are ok / failed / missing / untested (gaps, and those of Note
// [Untested cells] apart) / not claimed.
void print_summary(std::ostream& os, const Matrix& m);

}  // namespace kiln::conformance
