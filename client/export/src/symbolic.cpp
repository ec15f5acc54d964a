// Symbolic integers of an exported program (symbolic.h). See Note [Symbolic dims by
// differences] in kiln/exported_program.h.
#include "symbolic.h"

#include <google/protobuf/descriptor.h>

#include <functional>
#include <sstream>

#include "kiln/error.h"

namespace kiln::exporting {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

// Whether `f` is an integer that may depend on the dims.
bool symbolic_field(const FieldDescriptor* f) {
  if (f->cpp_type() != FieldDescriptor::CPPTYPE_INT64) return false;
  const std::string& m = f->containing_type()->full_name();
  const std::string& n = f->name();
  if (m == "kiln.proto.TensorSpec") return n == "sizes" || n == "strides" || n == "offset";
  if (m == "kiln.proto.Attribute") return n == "int_value" || n == "scalar_int";
  return m == "kiln.proto.IntList" && n == "values";
}

// Calls visit(message, field, index or -1, path) for every symbolic integer present in `m`.
using Visit = std::function<void(Message*, const FieldDescriptor*, int, const SlotPath&)>;

void walk(Message* m, SlotPath& path, const Visit& visit) {
  const Reflection* r = m->GetReflection();
  const auto* d = m->GetDescriptor();
  for (int k = 0; k < d->field_count(); ++k) {
    const FieldDescriptor* f = d->field(k);
    const bool message = f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE;
    if (!message && !symbolic_field(f)) continue;
    if (f->is_repeated()) {
      for (int i = 0; i < r->FieldSize(*m, f); ++i) {
        path.push_back(f->number());
        path.push_back(i);
        if (message)
          walk(r->MutableRepeatedMessage(m, f, i), path, visit);
        else
          visit(m, f, i, path);
        path.resize(path.size() - 2);
      }
      continue;
    }
    // A oneof member or a submessage only where set; a plain proto3 integer always.
    if ((message || f->containing_oneof() != nullptr) && !r->HasField(*m, f)) continue;
    path.push_back(f->number());
    path.push_back(-1);
    if (message)
      walk(r->MutableMessage(m, f), path, visit);
    else
      visit(m, f, -1, path);
    path.resize(path.size() - 2);
  }
}

// The message and field `path` ends at (the last pair's index in *index), checking every step.
Message* resolve(Message* root, const SlotPath& path, const FieldDescriptor** field, int* index,
                 std::string* where) {
  KILN_CHECK(!path.empty() && path.size() % 2 == 0, Value, "symbolic integer: malformed path");
  Message* m = root;
  for (size_t p = 0; p < path.size(); p += 2) {
    const Reflection* r = m->GetReflection();
    const FieldDescriptor* f = m->GetDescriptor()->FindFieldByNumber(path[p]);
    const int i = path[p + 1];
    KILN_CHECK(f != nullptr, Value, "symbolic integer: ", *where, " has no field ", path[p]);
    *where += (where->empty() ? "" : ".") + f->name();
    if (f->is_repeated()) {
      KILN_CHECK(i >= 0 && i < r->FieldSize(*m, f), Value, "symbolic integer: ", *where,
                 " has no element ", i);
      *where += "[" + std::to_string(i) + "]";
    } else {
      KILN_CHECK(i == -1, Value, "symbolic integer: ", *where, " is not a list");
      KILN_CHECK(f->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE || r->HasField(*m, f), Value,
                 "symbolic integer: ", *where, " is absent");
    }
    const bool last = p + 2 == path.size();
    if (last) {
      KILN_CHECK(symbolic_field(f), Value, "symbolic integer: ", *where,
                 " is not an integer that may be symbolic");
      KILN_CHECK(f->is_repeated() || f->containing_oneof() == nullptr || r->HasField(*m, f), Value,
                 "symbolic integer: ", *where, " is not set");
      *field = f;
      *index = i;
      return m;
    }
    KILN_CHECK(f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE, Value,
               "symbolic integer: ", *where, " is not a message");
    m = f->is_repeated() ? r->MutableRepeatedMessage(m, f, i) : r->MutableMessage(m, f);
    if (f->name() == "nodes" && f->containing_type()->name() == "Graph") {
      const FieldDescriptor* op = m->GetDescriptor()->FindFieldByName("op");
      if (op != nullptr) *where += " ('" + m->GetReflection()->GetString(*m, op) + "')";
    }
  }
  KILN_ASSERT(false);
  return nullptr;
}

int64_t read(const Message& m, const FieldDescriptor* f, int i) {
  const Reflection* r = m.GetReflection();
  return i < 0 ? r->GetInt64(m, f) : r->GetRepeatedInt64(m, f, i);
}

void write(Message* m, const FieldDescriptor* f, int i, int64_t v) {
  const Reflection* r = m->GetReflection();
  if (i < 0)
    r->SetInt64(m, f, v);
  else
    r->SetRepeatedInt64(m, f, i, v);
}

}  // namespace

std::vector<IntSlot> int_slots(const Message& m) {
  std::vector<IntSlot> out;
  SlotPath path;
  // walk() takes a mutable message for zero_int_slots; this visitor only reads.
  walk(const_cast<Message*>(&m), path,
       [&](Message* owner, const FieldDescriptor* f, int i, const SlotPath& p) {
         out.push_back({p, read(*owner, f, i)});
       });
  return out;
}

void zero_int_slots(Message* m) {
  SlotPath path;
  walk(m, path, [](Message* owner, const FieldDescriptor* f, int i, const SlotPath&) {
    write(owner, f, i, 0);
  });
}

int64_t get_int_slot(const Message& root, const SlotPath& path) {
  const FieldDescriptor* f = nullptr;
  int i = -1;
  std::string where;
  const Message* m = resolve(const_cast<Message*>(&root), path, &f, &i, &where);
  return read(*m, f, i);
}

void set_int_slot(Message* root, const SlotPath& path, int64_t v) {
  const FieldDescriptor* f = nullptr;
  int i = -1;
  std::string where;
  Message* m = resolve(root, path, &f, &i, &where);  // sets f and i first
  write(m, f, i, v);
}

std::string slot_str(const Message& root, const SlotPath& path) {
  const FieldDescriptor* f = nullptr;
  int i = -1;
  std::string where;
  resolve(const_cast<Message*>(&root), path, &f, &i, &where);
  return where;
}

int64_t Poly::eval(const std::vector<int64_t>& symbols) const {
  int64_t v = constant;
  for (const Term& t : terms) {
    int64_t p = t.coefficient;
    for (int s : t.symbols) p *= symbols.at(s);
    v += p;
  }
  return v;
}

std::string Poly::str(const std::vector<std::string>& names) const {
  std::ostringstream os;
  bool first = true;
  for (const Term& t : terms) {
    int64_t c = t.coefficient;
    if (!first) {
      os << (c < 0 ? " - " : " + ");
      c = c < 0 ? -c : c;
    } else if (c == -1) {
      os << "-";
      c = 1;
    }
    if (c != 1) os << c << "*";
    for (size_t k = 0; k < t.symbols.size(); ++k) os << (k ? "*" : "") << names.at(t.symbols[k]);
    first = false;
  }
  if (first) return std::to_string(constant);
  if (constant != 0) os << (constant < 0 ? " - " : " + ") << (constant < 0 ? -constant : constant);
  return os.str();
}

std::vector<std::vector<int64_t>> capture_points(const std::vector<int64_t>& example,
                                                 const std::vector<int64_t>& alt,
                                                 const std::vector<int64_t>& third) {
  const size_t k = example.size();
  std::vector<std::vector<int64_t>> points{example};
  for (size_t i = 0; i < k; ++i) {
    points.push_back(example);
    points.back()[i] = alt[i];
  }
  for (size_t i = 0; i < k; ++i) {
    for (size_t j = i + 1; j < k; ++j) {
      points.push_back(example);
      points.back()[i] = alt[i];
      points.back()[j] = alt[j];
    }
  }
  points.push_back(third);
  return points;
}

std::string fit(const std::vector<std::vector<int64_t>>& points, const std::vector<int64_t>& values,
                Poly* out) {
  const std::vector<int64_t>& v = points.front();
  const size_t k = v.size();
  KILN_ASSERT(points.size() == values.size() && points.size() == 2 + k + k * (k - 1) / 2);
  const int64_t x0 = values[0];
  auto not_poly = [&]() {
    std::ostringstream os;
    os << "it is not a sum of integer multiples of the dims and their pairwise products: it is";
    for (size_t p = 0; p < points.size(); ++p) {
      os << (p ? "," : "") << " " << values[p] << " at (";
      for (size_t i = 0; i < k; ++i) os << (i ? ", " : "") << points[p][i];
      os << ")";
    }
    return os.str();
  };
  auto delta = [&](size_t i) { return points[1 + i][i] - v[i]; };
  std::vector<std::vector<int64_t>> b(k, std::vector<int64_t>(k, 0));
  size_t p = 1 + k;
  for (size_t i = 0; i < k; ++i) {
    for (size_t j = i + 1; j < k; ++j, ++p) {
      const int64_t d = values[p] - values[1 + i] - values[1 + j] + x0;
      const int64_t dd = delta(i) * delta(j);
      if (d % dd != 0) return not_poly();
      b[i][j] = b[j][i] = d / dd;
    }
  }
  Poly poly;
  std::vector<int64_t> a(k);
  for (size_t i = 0; i < k; ++i) {
    const int64_t d = values[1 + i] - x0;
    if (d % delta(i) != 0) return not_poly();
    a[i] = d / delta(i);
    for (size_t j = 0; j < k; ++j) a[i] -= b[i][j] * v[j];
    if (a[i] != 0) poly.terms.push_back({a[i], {static_cast<int>(i)}});
  }
  for (size_t i = 0; i < k; ++i)
    for (size_t j = i + 1; j < k; ++j)
      if (b[i][j] != 0) poly.terms.push_back({b[i][j], {static_cast<int>(i), static_cast<int>(j)}});
  poly.constant = 0;
  poly.constant = x0 - poly.eval(v);
  for (size_t q = 0; q < points.size(); ++q)
    if (poly.eval(points[q]) != values[q]) return not_poly();
  *out = std::move(poly);
  return "";
}

}  // namespace kiln::exporting
