// Fuzz target: checkpoint::RestorePlanFromJson, the restore plan a worker
// reads from ENDURE_RESTORE_PLAN, on any text. A plan it accepts has its
// sources in shard order, and serialising it again (RestorePlanToJson, what
// the agent writes) parses back to the same plan.
#include <cstddef>
#include <cstdint>

#include "checkpoint/restore_plan.h"
#include "fuzz/fuzz_util.h"

using namespace endure;
using checkpoint::RestorePlan;

namespace {

bool SamePlan(const RestorePlan& a, const RestorePlan& b) {
  if (a.step != b.step || a.sources.size() != b.sources.size()) return false;
  for (size_t i = 0; i < a.sources.size(); ++i) {
    const checkpoint::ShardCopy& x = a.sources[i].copy;
    const checkpoint::ShardCopy& y = b.sources[i].copy;
    if (x.step != y.step || x.shard != y.shard || x.shards != y.shards || x.tier != y.tier ||
        x.node != y.node || x.path != y.path || x.bytes != y.bytes || x.xxh3 != y.xxh3 ||
        a.sources[i].loader_rank != b.sources[i].loader_rank) {
      return false;
    }
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Result<RestorePlan> plan = checkpoint::RestorePlanFromJson(fuzz::AsText(data, size));
  if (!plan.ok()) {
    FUZZ_CHECK(plan.status().code() == StatusCode::kInvalidArgument);
    return 0;
  }
  for (size_t i = 0; i < plan->sources.size(); ++i) {
    const checkpoint::ShardCopy& c = plan->sources[i].copy;
    FUZZ_CHECK(c.shard == static_cast<int>(i));
    FUZZ_CHECK(c.step == plan->step);
    (void)c.Describe();
  }
  (void)plan->Summary();
  const std::string text = checkpoint::RestorePlanToJson(*plan).dump(
      -1, ' ', false, nlohmann::json::error_handler_t::strict);
  Result<RestorePlan> again = checkpoint::RestorePlanFromJson(text);
  FUZZ_CHECK(again.ok());
  FUZZ_CHECK(SamePlan(*plan, *again));
  return 0;
}
