// kiln_ops_matrix: prints the support matrix op x path x dtype of the conformance driver
// (tests/conformance/driver.h) for every path of this build. scripts/ops-matrix builds and runs
// it; ctest runs it as OpsMatrix.ClaimsHold.
//   kiln_ops_matrix                       # the table, the problems, the summary
//   kiln_ops_matrix --summary             # the problems and the summary only
//   kiln_ops_matrix --path Meta --op mm   # some paths, one op
//   kiln_ops_matrix --problems            # machine-readable, one line per problem:
//                                         #   status<TAB>path<TAB>op<TAB>dtype<TAB>why
//   kiln_ops_matrix --cells               # the same for every claimed cell
// Exit status: 0 when every claim holds; 1 when a row claims a path and dtype with no kernel
// (missing), a path disagreed with eager CPU (failed), or a claim went untested for a reason
// other than those of Note [Untested cells] (driver.h); 2 on bad arguments.
#include <cstring>
#include <iostream>

#include "conformance/driver.h"

int main(int argc, char** argv) {
  using namespace kiln::conformance;
  Options opt;
  bool summary = false, problems = false, cells = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--summary") {
      summary = true;
    } else if (a == "--problems") {
      problems = true;
    } else if (a == "--cells") {
      cells = true;
    } else if (a == "--path" && i + 1 < argc) {
      opt.paths.push_back(argv[++i]);
    } else if (a == "--op" && i + 1 < argc) {
      opt.op = argv[++i];
    } else {
      std::cerr << "usage: kiln_ops_matrix [--summary | --problems | --cells] [--path NAME]... "
                   "[--op NAME]\n";
      return 2;
    }
  }
  try {
    Matrix m = run(opt);
    const std::vector<Matrix::Problem> ps = m.problems();
    if (cells) {
      for (const Matrix::Row& r : m.rows)
        for (size_t p = 0; p < m.paths.size(); ++p)
          for (int d = 0; d < kMatrixDtypes; ++d)
            if (r.cells[p][d].status != Status::NotClaimed)
              std::cout << status_name(r.cells[p][d].status) << "\t" << m.paths[p] << "\t" << r.op
                        << "\t" << kiln::scalar_type_name(matrix_dtypes()[d]) << "\t"
                        << r.cells[p][d].detail << "\n";
    } else if (problems) {
      for (const Matrix::Problem& p : ps)
        std::cout << status_name(p.status) << "\t" << p.path << "\t" << p.op << "\t"
                  << kiln::scalar_type_name(p.dtype) << "\t" << p.detail << "\n";
    } else if (summary) {
      for (const Matrix::Problem& p : ps)
        std::cout << status_name(p.status) << "  " << p.path << "  " << p.op << "  "
                  << kiln::scalar_type_name(p.dtype) << ": " << p.detail << "\n";
      print_summary(std::cout, m);
    } else {
      print_matrix(std::cout, m);
    }
    return ps.empty() ? 0 : 1;
  } catch (const kiln::Error& e) {
    std::cerr << "kiln_ops_matrix: " << e.what() << "\n";
    return 2;
  }
}
