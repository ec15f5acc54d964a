// kiln::data::DataLoader: batching, ordering and background prefetch (Note [Loader epochs]).
#include "kiln/data/dataloader.h"

#include <condition_variable>
#include <exception>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "kiln/error.h"

namespace kiln::data {

// Note [Prefetch window]: workers claim batch numbers in order and may run at most `window`
// (= num_workers * prefetch_factor) batches ahead of the first one the caller has not taken;
// finished batches wait in `ready` until the caller asks for them, so order never depends on
// which worker finishes first.
struct DataLoader::Run {
  struct Slot {
    std::optional<Example> batch;  // nullopt without an error: the stream ended
    std::exception_ptr error;
  };
  std::vector<int64_t> order;  // map-style: this epoch's sampler order
  int64_t num_batches = 0;     // map-style: batches in this epoch
  int64_t window = 0;
  std::mutex mu;
  std::condition_variable work_cv, ready_cv;
  bool stop = false;
  int64_t next_claim = 0;  // the next batch a worker starts
  int64_t next_take = 0;   // the next batch the caller takes
  std::map<int64_t, Slot> ready;
  std::vector<std::thread> threads;

  ~Run() {
    {
      std::lock_guard<std::mutex> l(mu);
      stop = true;
    }
    work_cv.notify_all();
    for (std::thread& t : threads) t.join();
  }

  // Waits for batch k (the caller's next), rethrowing its worker's exception.
  std::optional<Example> take(int64_t k) {
    std::unique_lock<std::mutex> l(mu);
    ready_cv.wait(l, [&] { return ready.count(k) != 0; });
    Slot s = std::move(ready.at(k));
    ready.erase(k);
    next_take = k + 1;
    l.unlock();
    work_cv.notify_all();
    if (s.error) std::rethrow_exception(s.error);
    return std::move(s.batch);
  }

  // Blocks until batch number `k` may start; false when the run stops or `limit` is reached.
  bool claim(int64_t& k, int64_t limit) {
    std::unique_lock<std::mutex> l(mu);
    work_cv.wait(l, [&] { return stop || next_claim >= limit || next_claim < next_take + window; });
    if (stop || next_claim >= limit) return false;
    k = next_claim++;
    return true;
  }

  void put(int64_t k, Slot s) {
    {
      std::lock_guard<std::mutex> l(mu);
      ready.emplace(k, std::move(s));
    }
    ready_cv.notify_all();
  }
};

namespace {
void check_options(const DataLoaderOptions& o) {
  KILN_CHECK(o.batch_size >= 1, Value, "DataLoader: batch_size must be >= 1, got ", o.batch_size);
  KILN_CHECK(o.num_workers >= 0, Value, "DataLoader: num_workers must be >= 0, got ",
             o.num_workers);
  KILN_CHECK(o.prefetch_factor >= 1, Value, "DataLoader: prefetch_factor must be >= 1, got ",
             o.prefetch_factor);
}
}  // namespace

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options)
    : dataset_(std::move(dataset)), options_(std::move(options)) {
  KILN_CHECK(dataset_ != nullptr, Value, "DataLoader: the dataset is null");
  check_options(options_);
  if (!options_.sampler) {
    if (options_.shuffle)
      options_.sampler = std::make_shared<RandomSampler>(dataset_->size(), options_.seed);
    else
      options_.sampler = std::make_shared<SequentialSampler>(dataset_->size());
  }
}

DataLoader::DataLoader(std::shared_ptr<IterableDataset> dataset, DataLoaderOptions options)
    : stream_(std::move(dataset)), options_(std::move(options)) {
  KILN_CHECK(stream_ != nullptr, Value, "DataLoader: the dataset is null");
  check_options(options_);
  KILN_CHECK(!options_.shuffle && !options_.sampler, Value,
             "DataLoader: an IterableDataset has no indices, so shuffle and sampler do not apply "
             "(shuffle inside the dataset instead)");
}

DataLoader::~DataLoader() = default;

int64_t DataLoader::size() const {
  KILN_CHECK(!stream_, Type, "DataLoader: an IterableDataset has no length");
  const int64_t n = options_.sampler->size(), b = options_.batch_size;
  return options_.drop_last ? n / b : (n + b - 1) / b;
}

Example DataLoader::make_batch(const std::vector<int64_t>& indices) const {
  if (!options_.collate) return dataset_->get_batch(indices);
  std::vector<Example> examples;
  examples.reserve(indices.size());
  for (int64_t i : indices) examples.push_back(dataset_->get(i));
  return options_.collate(examples);
}

namespace {
// Up to `n` examples from `s`, collated; nullopt when none are left (or, with drop_last, fewer
// than n).
std::optional<Example> read_batch(IterableDataset& s, const DataLoaderOptions& o) {
  std::vector<Example> examples;
  while (static_cast<int64_t>(examples.size()) < o.batch_size) {
    std::optional<Example> e = s.next();
    if (!e) break;
    examples.push_back(std::move(*e));
  }
  if (examples.empty() || (o.drop_last && static_cast<int64_t>(examples.size()) < o.batch_size))
    return std::nullopt;
  return o.collate ? o.collate(examples) : collate_stack(examples);
}
}  // namespace

std::optional<Example> DataLoader::next() {
  if (stream_) return next_iterable();
  if (!run_) {
    std::vector<int64_t> order = options_.sampler->indices(pos_.epoch);
    KILN_CHECK(static_cast<int64_t>(order.size()) == options_.sampler->size(), Value,
               "DataLoader: the sampler's size() is ", options_.sampler->size(), " but epoch ",
               pos_.epoch, " has ", order.size(), " indices");
    run_ = std::make_unique<Run>();
    Run& r = *run_;
    r.order = std::move(order);
    r.num_batches = size();
    r.next_claim = r.next_take = pos_.batch;
    r.window = int64_t{options_.num_workers} * options_.prefetch_factor;
    for (int w = 0; w < options_.num_workers; ++w)
      r.threads.emplace_back([this, &r] {
        int64_t k = 0;
        while (r.claim(k, r.num_batches)) {
          const int64_t b = options_.batch_size;
          const int64_t end = std::min<int64_t>((k + 1) * b, r.order.size());
          std::vector<int64_t> idx(r.order.begin() + k * b, r.order.begin() + end);
          Run::Slot s;
          try {
            s.batch = make_batch(idx);
          } catch (...) {
            s.error = std::current_exception();
          }
          r.put(k, std::move(s));
        }
      });
  }
  Run& r = *run_;
  if (pos_.batch >= r.num_batches) {
    run_.reset();
    pos_ = {pos_.epoch + 1, 0};
    return std::nullopt;
  }
  std::optional<Example> batch;
  if (options_.num_workers == 0) {
    const int64_t b = options_.batch_size, k = pos_.batch;
    const int64_t end = std::min<int64_t>((k + 1) * b, r.order.size());
    batch = make_batch(std::vector<int64_t>(r.order.begin() + k * b, r.order.begin() + end));
  } else {
    try {
      batch = r.take(pos_.batch);
    } catch (...) {
      run_.reset();  // the next call restarts at this batch
      throw;
    }
  }
  ++pos_.batch;
  return batch;
}

std::optional<Example> DataLoader::next_iterable() {
  if (!run_) {
    stream_->reset();
    for (int64_t i = 0; i < pos_.batch * options_.batch_size; ++i)
      KILN_CHECK(stream_->next().has_value(), Index, "DataLoader: cannot resume at batch ",
                 pos_.batch, " of epoch ", pos_.epoch, ": the stream ended after ", i, " examples");
    run_ = std::make_unique<Run>();
    Run& r = *run_;
    r.next_claim = r.next_take = pos_.batch;
    r.window = int64_t{options_.num_workers} * options_.prefetch_factor;
    // One reader thread: a stream has one cursor (Note [Dataset threads]).
    if (options_.num_workers > 0)
      r.threads.emplace_back([this, &r] {
        int64_t k = 0;
        while (r.claim(k, INT64_MAX)) {
          Run::Slot s;
          try {
            s.batch = read_batch(*stream_, options_);
          } catch (...) {
            s.error = std::current_exception();
          }
          const bool last = !s.batch || s.error;
          r.put(k, std::move(s));
          if (last) return;
        }
      });
  }
  std::optional<Example> batch;
  try {
    batch = options_.num_workers == 0 ? read_batch(*stream_, options_) : run_->take(pos_.batch);
  } catch (...) {
    run_.reset();  // the next call re-reads the stream up to this batch
    throw;
  }
  if (!batch) {
    run_.reset();
    pos_ = {pos_.epoch + 1, 0};
    return std::nullopt;
  }
  ++pos_.batch;
  return batch;
}

void DataLoader::set_position(LoaderPosition p) {
  KILN_CHECK(p.epoch >= 0 && p.batch >= 0, Index, "DataLoader: position (epoch ", p.epoch,
             ", batch ", p.batch, ") has a negative field");
  if (!stream_)
    KILN_CHECK(p.batch <= size(), Index, "DataLoader: batch ", p.batch,
               " is past the end of an epoch of ", size(), " batches");
  run_.reset();
  pos_ = p;
}

std::string LoaderPosition::to_json() const {
  return nlohmann::json{{"epoch", epoch}, {"batch", batch}}.dump();
}

LoaderPosition LoaderPosition::from_json(std::string_view json) {
  nlohmann::json j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  auto field = [&](const char* name) {
    KILN_CHECK(j.is_object() && j.contains(name) && j[name].is_number_integer(), Value,
               "LoaderPosition: expected {\"epoch\": int, \"batch\": int}, got '", json, "'");
    return j[name].get<int64_t>();
  };
  return {field("epoch"), field("batch")};
}

}  // namespace kiln::data
