// libkiln_sharding does not link libnccl, so loading Kiln loads no NCCL; where the NCCL backend is
// built, its first use loads NCCL and resolves every function the backend calls. Neither needs a
// GPU (See Note [Loading NCCL lazily] in sharding/comm/nccl_lib.h).
#include <link.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/dist/process_group.h"
#include "test_util.h"
#ifdef KILN_HAVE_NCCL
#include "../../sharding/comm/nccl_lib.h"  // private to kiln_sharding
#endif

namespace kiln::testing {
namespace {

// The DT_NEEDED entries of the loaded library whose path contains `name` (empty when not loaded).
std::vector<std::string> needed_by(const char* name) {
  struct Ctx {
    const char* name;
    std::vector<std::string> needed;
  } ctx{name, {}};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* p) -> int {
        auto& c = *static_cast<Ctx*>(p);
        if (!info->dlpi_name || !std::strstr(info->dlpi_name, c.name)) return 0;
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          if (info->dlpi_phdr[i].p_type != PT_DYNAMIC) continue;
          const auto* dyn =
              reinterpret_cast<const ElfW(Dyn)*>(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
          ElfW(Addr) strtab = 0;
          for (const ElfW(Dyn)* d = dyn; d->d_tag != DT_NULL; ++d)
            if (d->d_tag == DT_STRTAB) strtab = d->d_un.d_ptr;
          if (strtab < info->dlpi_addr) strtab += info->dlpi_addr;  // not relocated in place
          for (const ElfW(Dyn)* d = dyn; d->d_tag != DT_NULL; ++d)
            if (d->d_tag == DT_NEEDED)
              c.needed.emplace_back(reinterpret_cast<const char*>(strtab + d->d_un.d_val));
        }
        return 1;
      },
      &ctx);
  return ctx.needed;
}

TEST(NcclLib, ShardingDoesNotLinkNccl) {
  dist::is_initialized();  // libkiln_sharding is loaded
  std::vector<std::string> needed = needed_by("libkiln_sharding");
  ASSERT_FALSE(needed.empty()) << "libkiln_sharding is not loaded";
  bool has_tensor = false;
  for (const std::string& n : needed) {
    EXPECT_EQ(n.rfind("libnccl", 0), std::string::npos) << "libkiln_sharding links " << n;
    has_tensor = has_tensor || n.find("libkiln_tensor") != std::string::npos;
  }
  EXPECT_TRUE(has_tensor) << "the DT_NEEDED walk read nothing sensible";
}

#ifdef KILN_HAVE_NCCL
TEST(NcclLib, FirstUseLoadsEveryFunction) {
  const dist::NcclLib& lib = dist::nccl_lib();
#define KILN_NCCL_EXPECT(name) EXPECT_NE(lib.name, nullptr) << "nccl" #name;
  KILN_NCCL_FUNCTIONS(KILN_NCCL_EXPECT)
#undef KILN_NCCL_EXPECT
  EXPECT_STRNE(lib.GetErrorString(ncclInvalidArgument), "");
  EXPECT_EQ(&dist::nccl_lib(), &lib);
  std::ifstream maps("/proc/self/maps");
  std::stringstream text;
  text << maps.rdbuf();
  EXPECT_NE(text.str().find("libnccl"), std::string::npos);
}
#endif

}  // namespace
}  // namespace kiln::testing
