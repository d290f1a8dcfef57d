// Fuzz target: the simulator's TOML scenarios (sim::LoadScenarioString, what
// `endure sim --scenario FILE` reads) on any text, followed by Finalize, the
// check of every knob. Errors are statuses; nothing is simulated.
#include <cstddef>
#include <cstdint>

#include "fuzz/fuzz_util.h"
#include "sim/scenario.h"

using namespace endure;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  sim::SimConfig config;
  const Status loaded = sim::LoadScenarioString(fuzz::AsText(data, size), "fuzz.toml", config);
  if (!loaded.ok()) {
    FUZZ_CHECK(loaded.code() == StatusCode::kInvalidArgument);
    return 0;
  }
  const Status finalized = sim::Finalize(config);
  if (!finalized.ok()) {
    FUZZ_CHECK(finalized.code() == StatusCode::kInvalidArgument);
    return 0;
  }
  FUZZ_CHECK(config.nodes >= 1 && !config.causes.empty());
  return 0;
}
