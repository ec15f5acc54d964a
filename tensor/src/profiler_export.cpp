// The profiler's export side: raw per-thread records into a Trace (names, shapes, nesting, self
// times, FLOPs, memory per op), key_averages and its table, and the Chrome trace JSON writer.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <ostream>
#include <sstream>
#include <unordered_map>

#include "kiln/dispatcher.h"
#include "kiln/error.h"
#include "kiln/profiler.h"
#include "kiln/scalar_type.h"
#include "profiler_internal.h"

namespace kiln::profiler {
namespace {

using Shape = std::vector<int64_t>;

int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// The shape of argument i when it is a single tensor, else nullptr.
const Shape* arg_shape(const Event& e, size_t i) {
  if (i >= e.input_shapes.size() || e.input_shapes[i].size() != 1) return nullptr;
  if (e.input_types[i] == "TensorList") return nullptr;
  return &e.input_shapes[i][0];
}

// Note [Profiler FLOPs]: counted from the recorded shapes at export, never on the hot path, for
// the ops that dominate training time; every other op reports -1 (unknown), as PyTorch does.
// A multiply-add is 2 FLOPs. mm (M,K)@(K,N): 2MKN; bmm/baddbmm: 2BMKN; addmm: 2MKN (the bias
// add is not counted); linear (...,K) with weight (N,K): 2*prod(...)*K*N; matmul: 2*numel(out)*K;
// conv1d/conv2d/convolution: 2*numel(out)*prod(weight[1:]) (Cin/groups * kernel per output);
// conv_transpose2d: 2*numel(input)*prod(weight[1:]); add/sub/mul/div: numel(out).
// Composites nest (linear contains its addmm), so a parent and its child both report FLOPs,
// as in PyTorch's table; sum only one level when totalling.
int64_t compute_flops(const Event& e) {
  const std::string& n = e.name;
  auto in = [&](size_t i) { return arg_shape(e, i); };
  const Shape* out = e.output_shapes.empty() ? nullptr : &e.output_shapes[0];
  if (n == "mm") {
    const Shape *a = in(0), *b = in(1);
    if (a && b && a->size() == 2 && b->size() == 2) return 2 * (*a)[0] * (*a)[1] * (*b)[1];
  } else if (n == "addmm") {
    const Shape *a = in(1), *b = in(2);
    if (a && b && a->size() == 2 && b->size() == 2) return 2 * (*a)[0] * (*a)[1] * (*b)[1];
  } else if (n == "bmm" || n == "baddbmm") {
    size_t o = n == "bmm" ? 0 : 1;
    const Shape *a = in(o), *b = in(o + 1);
    if (a && b && a->size() == 3 && b->size() == 3)
      return 2 * (*a)[0] * (*a)[1] * (*a)[2] * (*b)[2];
  } else if (n == "linear") {
    const Shape *x = in(0), *w = in(1);
    if (x && w && !x->empty() && w->size() == 2) return 2 * numel(*x) * (*w)[0];
  } else if (n == "matmul") {
    const Shape* a = in(0);
    if (a && out && !a->empty()) return 2 * numel(*out) * a->back();
  } else if (n == "conv1d" || n == "conv2d" || n == "convolution" || n == "conv_transpose2d") {
    const Shape *x = in(0), *w = in(1);
    if (!x || !w || w->empty() || !out) return -1;
    int64_t per = numel(*w) / std::max<int64_t>((*w)[0], 1);
    return 2 * numel(n == "conv_transpose2d" ? *x : *out) * per;
  } else if (n == "add" || n == "sub" || n == "mul" || n == "div") {
    if (out) return numel(*out);
  }
  return -1;
}

void decode_entry(const int64_t*& p, std::vector<Shape>& shapes, std::string& type) {
  int64_t h = *p++;
  switch (detail::entry_kind(h)) {
    case detail::EntryKind::Other:
      type = "Scalar";
      return;
    case detail::EntryKind::None:
      type = "None";
      return;
    case detail::EntryKind::Tensor: {
      int64_t n = detail::entry_count(h);
      shapes.emplace_back(p, p + n);
      p += n;
      type = scalar_type_name(static_cast<ScalarType>(detail::entry_dtype(h)));
      return;
    }
    case detail::EntryKind::List: {
      int64_t count = detail::entry_count(h);
      for (int64_t i = 0; i < count; ++i) {
        std::string ignored;
        std::vector<Shape> one;
        decode_entry(p, one, ignored);
        shapes.push_back(one.empty() ? Shape{} : std::move(one[0]));
      }
      type = "TensorList";
      return;
    }
  }
}

// Sorts one thread's events (parents before children) and links parents, self times and the
// memory each op allocated. `first` is the thread's first index in `events`.
void nest(std::vector<Event>& events, size_t first, std::vector<int16_t>& depth,
          const std::vector<MemoryEvent>& mem) {
  size_t n = events.size() - first;
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const Event &x = events[first + a], &y = events[first + b];
    if (x.start_ns != y.start_ns) return x.start_ns < y.start_ns;
    if (depth[a] != depth[b]) return depth[a] < depth[b];
    return x.end_ns > y.end_ns;
  });
  std::vector<Event> sorted;
  std::vector<int16_t> sdepth;
  sorted.reserve(n);
  for (size_t i : order) {
    sorted.push_back(std::move(events[first + i]));
    sdepth.push_back(depth[i]);
  }
  std::vector<size_t> stack;  // indices into sorted
  std::vector<int64_t> child_ns(n, 0);
  size_t m = 0;  // next memory event
  auto charge = [&](const MemoryEvent& me) {
    for (size_t s : stack) sorted[s].memory += me.bytes;
    if (!stack.empty()) sorted[stack.back()].self_memory += me.bytes;
  };
  auto pop_until = [&](int64_t t) {
    while (!stack.empty() && sorted[stack.back()].end_ns < t) stack.pop_back();
  };
  for (size_t i = 0; i < n; ++i) {
    Event& e = sorted[i];
    while (m < mem.size() && mem[m].ts_ns < e.start_ns) {
      pop_until(mem[m].ts_ns);
      charge(mem[m++]);
    }
    while (!stack.empty()) {
      const Event& p = sorted[stack.back()];
      if (p.start_ns <= e.start_ns && e.end_ns <= p.end_ns && sdepth[stack.back()] < sdepth[i])
        break;
      stack.pop_back();
    }
    if (!stack.empty()) {
      e.parent = static_cast<int32_t>(first + stack.back());
      child_ns[stack.back()] += e.end_ns - e.start_ns;
    }
    stack.push_back(i);
  }
  for (; m < mem.size(); ++m) {
    pop_until(mem[m].ts_ns);
    charge(mem[m]);
  }
  for (size_t i = 0; i < n; ++i) {
    sorted[i].self_ns = sorted[i].end_ns - sorted[i].start_ns - child_ns[i];
    events[first + i] = std::move(sorted[i]);
  }
}

}  // namespace

namespace detail {

void build_trace(std::vector<Drained>& drained, uint32_t epoch, int64_t origin_ns, bool shapes,
                 bool flops, std::vector<Event>& events, std::vector<MemoryEvent>& memory) {
  std::sort(drained.begin(), drained.end(),
            [](const Drained& a, const Drained& b) { return a.thread < b.thread; });
  for (Drained& d : drained) {
    size_t first = events.size();
    std::vector<int16_t> depth;
    for (const RawEvent& r : d.events) {
      if (r.epoch != epoch) continue;
      Event e;
      e.name = r.op ? std::string(r.op->name()) : d.names[r.name];
      e.kind = r.kind;
      e.start_ns = r.start_ns - origin_ns;
      e.end_ns = r.end_ns - origin_ns;
      e.thread = d.thread;
      e.device = r.device;
      e.bytes = r.bytes;
      if (r.dtype >= 0) e.dtype = scalar_type_name(static_cast<ScalarType>(r.dtype));
      if (shapes && r.op) {
        const int64_t* p = d.arena.data() + r.arena_begin;
        const int64_t* outputs = d.arena.data() + r.outputs_begin;
        while (p < outputs) {
          e.input_shapes.emplace_back();
          e.input_types.emplace_back();
          decode_entry(p, e.input_shapes.back(), e.input_types.back());
        }
        const int64_t* end = d.arena.data() + r.arena_end;
        while (p < end) {
          std::vector<Shape> one;
          std::string type;
          decode_entry(p, one, type);
          e.output_shapes.push_back(one.empty() ? Shape{} : std::move(one[0]));
        }
      }
      if (flops && r.op) e.flops = compute_flops(e);
      events.push_back(std::move(e));
      depth.push_back(r.depth);
    }
    std::vector<MemoryEvent> mem;
    for (const RawMemory& r : d.memory) {
      if (r.epoch != epoch) continue;
      mem.push_back(MemoryEvent{r.ts_ns - origin_ns, r.addr, r.bytes, r.total, r.device, d.thread});
    }
    std::stable_sort(mem.begin(), mem.end(),
                     [](const MemoryEvent& a, const MemoryEvent& b) { return a.ts_ns < b.ts_ns; });
    nest(events, first, depth, mem);
    memory.insert(memory.end(), mem.begin(), mem.end());
  }
  std::stable_sort(memory.begin(), memory.end(),
                   [](const MemoryEvent& a, const MemoryEvent& b) { return a.ts_ns < b.ts_ns; });
}

}  // namespace detail

namespace {

void write_shape(std::ostream& os, const Shape& s) {
  os << '[';
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << ']';
}

// One argument's dims as PyTorch prints them: [16, 32], [] or [[2], [3]] for a list.
void write_arg_dims(std::ostream& os, const Event& e, size_t i) {
  const std::vector<Shape>& shapes = e.input_shapes[i];
  if (e.input_types[i] == "TensorList") {
    os << '[';
    for (size_t j = 0; j < shapes.size(); ++j) {
      if (j) os << ", ";
      write_shape(os, shapes[j]);
    }
    os << ']';
  } else {
    write_shape(os, shapes.empty() ? Shape{} : shapes[0]);
  }
}

std::string shapes_string(const Event& e) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < e.input_shapes.size(); ++i) {
    if (i) os << ", ";
    write_arg_dims(os, e, i);
  }
  os << ']';
  return os.str();
}

// Microseconds with nanosecond digits, exactly (no float rounding): 1234567 ns -> "1234.567".
void write_us(std::ostream& os, int64_t ns) {
  if (ns < 0) {
    os << '-';
    ns = -ns;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%lld.%03lld", static_cast<long long>(ns / 1000),
                static_cast<long long>(ns % 1000));
  os << buf;
}

void write_json_string(std::ostream& os, std::string_view s) {
  os << '"';
  for (char c : s) {
    switch (c) {
      case '"':
        os << "\\\"";
        break;
      case '\\':
        os << "\\\\";
        break;
      case '\n':
        os << "\\n";
        break;
      case '\t':
        os << "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          os << buf;
        } else {
          os << c;
        }
    }
  }
  os << '"';
}

std::string format_time(double us) {
  char buf[32];
  if (us >= 1e6)
    std::snprintf(buf, sizeof buf, "%.3fs", us / 1e6);
  else if (us >= 1e3)
    std::snprintf(buf, sizeof buf, "%.3fms", us / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.3fus", us);
  return buf;
}

std::string format_memory(int64_t b) {
  char buf[32];
  double a = std::abs(static_cast<double>(b));
  if (a >= 1024.0 * 1024 * 1024)
    std::snprintf(buf, sizeof buf, "%.2f Gb", b / 1073741824.0);
  else if (a >= 1024.0 * 1024)
    std::snprintf(buf, sizeof buf, "%.2f Mb", b / 1048576.0);
  else if (a >= 1024.0)
    std::snprintf(buf, sizeof buf, "%.2f Kb", b / 1024.0);
  else
    std::snprintf(buf, sizeof buf, "%lld b", static_cast<long long>(b));
  return buf;
}

std::string format_flops(int64_t f) {
  char buf[32];
  double x = static_cast<double>(f);
  const char* units[] = {"", "K", "M", "G", "T", "P"};
  int u = 0;
  while (x >= 1000.0 && u < 5) {
    x /= 1000.0;
    ++u;
  }
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(f));
  else
    std::snprintf(buf, sizeof buf, "%.3f%s", x, units[u]);
  return buf;
}

const char* category(Event::Kind k) {
  switch (k) {
    case Event::Kind::Op:
      return "cpu_op";
    case Event::Kind::UserRange:
      return "user_annotation";
    case Event::Kind::Step:
      return "profiler_step";
  }
  return "cpu_op";
}

}  // namespace

KeyAverages Trace::key_averages(bool group_by_input_shape) const {
  KeyAverages ka;
  ka.grouped_by_shape = group_by_input_shape;
  ka.with_memory = profile_memory;
  ka.with_flops = with_flops;
  KILN_CHECK(!group_by_input_shape || record_shapes, Value,
             "key_averages(group_by_input_shape=True) needs profile(record_shapes=True)");
  std::unordered_map<std::string, size_t> index;
  std::vector<const Event*> order;
  for (const Event& e : events_) order.push_back(&e);
  std::stable_sort(order.begin(), order.end(),
                   [](const Event* a, const Event* b) { return a->start_ns < b->start_ns; });
  for (const Event* e : order) {
    std::string shapes = group_by_input_shape ? shapes_string(*e) : std::string();
    std::string key = e->name;
    if (group_by_input_shape) key += '\x1f' + shapes;
    auto [it, fresh] = index.emplace(key, ka.rows.size());
    if (fresh) {
      ka.rows.emplace_back();
      ka.rows.back().key = e->name;
      ka.rows.back().input_shapes = shapes;
    }
    FunctionEventAvg& r = ka.rows[it->second];
    ++r.count;
    r.cpu_time_total_ns += e->end_ns - e->start_ns;
    r.self_cpu_time_total_ns += e->self_ns;
    if (e->flops > 0) r.flops += e->flops;
    r.bytes += e->bytes;
    r.cpu_memory_usage += e->memory;
    r.self_cpu_memory_usage += e->self_memory;
  }
  return ka;
}

std::string KeyAverages::table(std::string_view sort_by, int64_t row_limit) const {
  static const char* const kKeys[] = {"",
                                      "count",
                                      "cpu_time",
                                      "cpu_time_total",
                                      "self_cpu_time_total",
                                      "cpu_memory_usage",
                                      "self_cpu_memory_usage",
                                      "flops"};
  auto known = std::find(std::begin(kKeys), std::end(kKeys), sort_by) != std::end(kKeys);
  if (!known) {
    std::string all;
    for (const char* k : kKeys)
      if (*k) all += std::string(all.empty() ? "" : ", ") + k;
    KILN_FAIL(Value, "key_averages().table: unknown sort_by '", sort_by, "' (expected one of ", all,
              ")");
  }
  std::vector<const FunctionEventAvg*> rs;
  for (const FunctionEventAvg& r : rows) rs.push_back(&r);
  auto key = [&](const FunctionEventAvg* r) -> double {
    if (sort_by == "count") return static_cast<double>(r->count);
    if (sort_by == "cpu_time") return r->cpu_time_avg_us();
    if (sort_by == "cpu_time_total") return static_cast<double>(r->cpu_time_total_ns);
    if (sort_by == "self_cpu_time_total") return static_cast<double>(r->self_cpu_time_total_ns);
    if (sort_by == "cpu_memory_usage") return static_cast<double>(r->cpu_memory_usage);
    if (sort_by == "self_cpu_memory_usage") return static_cast<double>(r->self_cpu_memory_usage);
    return static_cast<double>(r->flops);
  };
  if (!sort_by.empty())
    std::stable_sort(
        rs.begin(), rs.end(),
        [&](const FunctionEventAvg* a, const FunctionEventAvg* b) { return key(a) > key(b); });
  if (row_limit >= 0 && static_cast<int64_t>(rs.size()) > row_limit) rs.resize(row_limit);

  int64_t self_total = 0;
  for (const FunctionEventAvg& r : rows) self_total += r.self_cpu_time_total_ns;
  size_t name_w = 4;
  for (const FunctionEventAvg* r : rs)
    name_w = std::max(name_w, std::min<size_t>(r->key.size(), 55));
  std::vector<std::pair<std::string, size_t>> cols = {{"Name", name_w},  {"Self CPU %", 12},
                                                      {"Self CPU", 12},  {"CPU total %", 12},
                                                      {"CPU total", 12}, {"CPU time avg", 12}};
  if (with_memory) {
    cols.push_back({"CPU Mem", 12});
    cols.push_back({"Self CPU Mem", 12});
  }
  cols.push_back({"# of Calls", 12});
  if (with_flops) cols.push_back({"Total FLOPs", 12});
  if (grouped_by_shape) {
    size_t w = 12;
    for (const FunctionEventAvg* r : rs)
      w = std::max(w, std::min<size_t>(r->input_shapes.size(), 80));
    cols.push_back({"Input Shapes", w});
  }
  std::ostringstream os;
  auto line = [&] {
    for (size_t i = 0; i < cols.size(); ++i)
      os << (i ? "  " : "") << std::string(cols[i].second, '-');
    os << '\n';
  };
  auto cell = [&](size_t i, const std::string& s) {
    std::string v = s.size() > cols[i].second ? s.substr(0, cols[i].second - 3) + "..." : s;
    os << (i ? "  " : "") << std::setw(static_cast<int>(cols[i].second)) << v;
  };
  auto pct = [&](int64_t ns) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%.2f%%", self_total ? 100.0 * ns / self_total : 0.0);
    return std::string(buf);
  };
  line();
  for (size_t i = 0; i < cols.size(); ++i) cell(i, cols[i].first);
  os << '\n';
  line();
  for (const FunctionEventAvg* r : rs) {
    size_t c = 0;
    cell(c++, r->key);
    cell(c++, pct(r->self_cpu_time_total_ns));
    cell(c++, format_time(r->self_cpu_time_total_ns / 1e3));
    cell(c++, pct(r->cpu_time_total_ns));
    cell(c++, format_time(r->cpu_time_total_ns / 1e3));
    cell(c++, format_time(r->cpu_time_avg_us()));
    if (with_memory) {
      cell(c++, format_memory(r->cpu_memory_usage));
      cell(c++, format_memory(r->self_cpu_memory_usage));
    }
    cell(c++, std::to_string(r->count));
    if (with_flops) cell(c++, r->flops ? format_flops(r->flops) : "--");
    if (grouped_by_shape) cell(c++, r->input_shapes);
    os << '\n';
  }
  line();
  os << "Self CPU time total: " << format_time(self_total / 1e3) << '\n';
  return os.str();
}

void Trace::write_chrome_trace(std::ostream& os) const {
  os << "{\"schemaVersion\": 1, \"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  os << R"({"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "kiln"}})";
  std::vector<uint32_t> threads;
  for (const Event& e : events_) threads.push_back(e.thread);
  for (const MemoryEvent& m : memory_) threads.push_back(m.thread);
  std::sort(threads.begin(), threads.end());
  threads.erase(std::unique(threads.begin(), threads.end()), threads.end());
  for (uint32_t t : threads)
    os << ",\n{\"ph\": \"M\", \"name\": \"thread_name\", \"pid\": 0, \"tid\": " << t
       << ", \"args\": {\"name\": \"kiln thread " << t << "\"}}";
  for (const Event& e : events_) {
    os << ",\n{\"ph\": \"X\", \"cat\": \"" << category(e.kind) << "\", \"name\": ";
    write_json_string(os, e.name);
    os << ", \"pid\": 0, \"tid\": " << e.thread << ", \"ts\": ";
    write_us(os, e.start_ns);
    os << ", \"dur\": ";
    write_us(os, e.end_ns - e.start_ns);
    if (e.kind != Event::Kind::Op) {
      os << '}';
      continue;
    }
    os << ", \"args\": {\"Device\": \"" << e.device.str() << "\", \"Bytes\": " << e.bytes;
    if (!e.dtype.empty()) os << ", \"dtype\": \"" << e.dtype << '"';
    if (e.flops >= 0) os << ", \"FLOPs\": " << e.flops;
    if (record_shapes) {
      os << ", \"Input Dims\": [";
      for (size_t i = 0; i < e.input_shapes.size(); ++i) {
        if (i) os << ", ";
        write_arg_dims(os, e, i);
      }
      os << "], \"Input type\": [";
      for (size_t i = 0; i < e.input_types.size(); ++i)
        os << (i ? ", " : "") << '"' << e.input_types[i] << '"';
      os << "], \"Output Dims\": [";
      for (size_t i = 0; i < e.output_shapes.size(); ++i) {
        if (i) os << ", ";
        write_shape(os, e.output_shapes[i]);
      }
      os << ']';
    }
    os << "}}";
  }
  for (const MemoryEvent& m : memory_) {
    os << ",\n{\"ph\": \"i\", \"s\": \"t\", \"cat\": \"cpu_instant_event\", \"name\": "
          "\"[memory]\", "
          "\"pid\": 0, \"tid\": "
       << m.thread << ", \"ts\": ";
    write_us(os, m.ts_ns);
    os << ", \"args\": {\"Addr\": " << m.addr << ", \"Bytes\": " << m.bytes
       << ", \"Total Allocated\": " << m.total_allocated << ", \"Device Type\": \""
       << device_type_name(m.device.type()) << "\", \"Device Id\": " << m.device.index() << "}}";
    os << ",\n{\"ph\": \"C\", \"name\": \"" << device_type_name(m.device.type())
       << " memory\", \"pid\": 0, \"ts\": ";
    write_us(os, m.ts_ns);
    os << ", \"args\": {\"allocated\": " << m.total_allocated << "}}";
  }
  os << "\n]}\n";
}

void Trace::export_chrome_trace(const std::string& path) const {
  std::ofstream f(path, std::ios::out | std::ios::trunc);
  KILN_CHECK(f.is_open(), Runtime, "export_chrome_trace: cannot open '", path,
             "' for writing: ", std::strerror(errno));
  write_chrome_trace(f);
  f.flush();
  KILN_CHECK(f.good(), Runtime, "export_chrome_trace: writing '", path,
             "' failed: ", std::strerror(errno));
}

}  // namespace kiln::profiler
