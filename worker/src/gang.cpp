#include "gang.h"

#include <absl/strings/str_cat.h>

#include "coordinator_link.h"
#include "kiln/dist/process_group.h"
#include "kiln/dist/store.h"
#include "kiln/error.h"
#include "reports.h"

namespace kiln::worker {

namespace {

// How long a rank waits for rank 0 to publish the store.
constexpr uint32_t kRendezvousWaitMs = 60000;

absl::Status rendezvous(CoordinatorLink& link, const std::string& session_id, int rank,
                        int world_size, const std::string& host, Device device,
                        std::shared_ptr<dist::TCPStore>& store) {
  proto::StoreRequest req;
  req.set_session_id(session_id);
  req.set_key("store");
  if (rank == 0) {
    store = std::make_shared<dist::TCPStore>(host, 0, /*is_server=*/true);
    req.set_op("set");
    req.set_value(absl::StrCat(host, ":", store->port()));
    if (auto st = link.store(req); !st.ok()) return st.status();
  } else {
    req.set_op("get");
    req.set_wait_ms(kRendezvousWaitMs);
    auto got = link.store(req);
    if (!got.ok()) return got.status();
    const std::string& addr = got->value();
    size_t colon = addr.rfind(':');
    if (colon == std::string::npos)
      return absl::InvalidArgumentError(
          absl::StrCat("session '", session_id, "': bad store address '", addr, "'"));
    store = std::make_shared<dist::TCPStore>(addr.substr(0, colon),
                                             std::stoi(addr.substr(colon + 1)));
  }
  dist::InitOptions o;
  o.backend = device.is_cuda() ? "nccl" : "ucx";
  o.init_method = "";
  o.rank = rank;
  o.world_size = world_size;
  o.store = store;
  o.group_name = kGangGroupName;
  dist::init_process_group(o);
  return absl::OkStatus();
}

}  // namespace

std::shared_future<absl::Status> Gang::join(CoordinatorLink& link, const std::string& session_id,
                                            int rank, int world_size, const std::string& host,
                                            Device device) {
  std::lock_guard<std::mutex> lock(mu_);
  if (session_id == session_id_) return ready_;  // another stream of the same session
  if (ready_.valid()) ready_.wait();
  if (dist::is_initialized()) dist::destroy_process_group();
  store_.reset();
  session_id_ = session_id;
  {
    std::lock_guard<std::mutex> a(abort_mu_);
    joined_ = session_id;
  }
  report_collectives_of(session_id);  // See Note [Collective reports] in reports.h
  ready_ = std::async(std::launch::async, [this, &link, session_id, rank, world_size, host,
                                           device]() -> absl::Status {
             try {
               return rendezvous(link, session_id, rank, world_size, host, device, store_);
             } catch (const std::exception& e) {
               return absl::UnavailableError(absl::StrCat(
                   "joining the process group of session '", session_id, "': ", e.what()));
             }
           }).share();
  return ready_;
}

void Gang::leave() {
  std::lock_guard<std::mutex> lock(mu_);
  if (ready_.valid()) ready_.wait();
  ready_ = {};
  session_id_.clear();
  {
    std::lock_guard<std::mutex> a(abort_mu_);
    joined_.clear();
  }
  report_collectives_of("");
  if (dist::is_initialized()) dist::destroy_process_group();
  store_.reset();
}

void Gang::abort(const std::string& session_id, const std::string& why) {
  std::lock_guard<std::mutex> a(abort_mu_);
  if (session_id.empty() || session_id != joined_) return;
  dist::abort_process_groups(absl::StrCat("session '", session_id, "' ", why));
}

}  // namespace kiln::worker
