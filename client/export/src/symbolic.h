// client/export/src/symbolic.h: the integers of an exported program's message that may depend on
// its symbolic dims, found, compared and set through protobuf reflection; and the polynomials
// they are fitted to (See Note [Symbolic dims by differences] in kiln/exported_program.h).
//
//   std::vector<IntSlot> slots = int_slots(msg);        // every size, stride, int attribute
//   zero_int_slots(&copy);                              // what must match between captures
//   set_int_slot(&msg, slots[3].path, 7);               // a run's substitution
#pragma once

#include <google/protobuf/message.h>

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::exporting {

// (field number, repeated index or -1) pairs from the root message.
using SlotPath = std::vector<int32_t>;

struct IntSlot {
  SlotPath path;
  int64_t value = 0;
};

// Every integer that may be symbolic (TensorSpec sizes, strides and offset; Attribute int_value
// and scalar_int; IntList values), in field order.
std::vector<IntSlot> int_slots(const google::protobuf::Message& m);
// Sets every such integer to 0 (two captures with the same structure then compare equal).
void zero_int_slots(google::protobuf::Message* m);
// The integer at `path`; ValueError when `path` names no such integer of `root`.
int64_t get_int_slot(const google::protobuf::Message& root, const SlotPath& path);
void set_int_slot(google::protobuf::Message* root, const SlotPath& path, int64_t v);
// "graph.nodes[3] ('view').args[1].attribute.ints.values[0]" (ValueError as get_int_slot).
std::string slot_str(const google::protobuf::Message& root, const SlotPath& path);

// c + sum coefficient * product of symbols (one or two of them).
struct Poly {
  struct Term {
    int64_t coefficient = 0;
    std::vector<int> symbols;
  };
  int64_t constant = 0;
  std::vector<Term> terms;

  bool is_constant() const { return terms.empty(); }
  int64_t eval(const std::vector<int64_t>& symbols) const;
  // "batch", "2*batch + 1", "batch*seq", "7".
  std::string str(const std::vector<std::string>& names) const;
};

// The captures of Note [Symbolic dims by differences] for symbols at example sizes `example`,
// moved to `alt` (the pairs and singles) and `third` (the check): the symbol sizes of each.
// Order: the example, each single, each pair (i < j), the check.
std::vector<std::vector<int64_t>> capture_points(const std::vector<int64_t>& example,
                                                 const std::vector<int64_t>& alt,
                                                 const std::vector<int64_t>& third);
// Fits one integer from its values at those points; "" and *out, or why it is no such
// polynomial.
std::string fit(const std::vector<std::vector<int64_t>>& points, const std::vector<int64_t>& values,
                Poly* out);

}  // namespace kiln::exporting
