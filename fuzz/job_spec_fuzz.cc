// Fuzz target: the TOML job-spec parser (controller::ParseJobSpec) on any
// text. A spec it accepts must be as complete and valid as job_spec.h
// promises: positive world size, faults that validate with unique ids and
// ranks inside the job, machine options that validate (a JobMachine can be
// built from them), and faults that survive the ENDURE_FAULTS encoding.
#include <cstddef>
#include <cstdint>

#include "controller/job_spec.h"
#include "core/job_machine.h"
#include "faults/fault.h"
#include "fuzz/fuzz_util.h"

using namespace endure;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Result<controller::JobSpec> spec =
      controller::ParseJobSpec(fuzz::AsText(data, size), "fuzz.toml");
  if (!spec.ok()) {
    FUZZ_CHECK(spec.status().code() == StatusCode::kInvalidArgument);
    FUZZ_CHECK(spec.status().message().rfind("fuzz.toml:", 0) == 0);
    return 0;
  }
  FUZZ_CHECK(!spec->name.empty() && !spec->command.empty() && !spec->state_dir.empty());
  FUZZ_CHECK(spec->nodes >= 1 && spec->ranks_per_node >= 1);
  FUZZ_CHECK(static_cast<int64_t>(spec->nodes) * spec->ranks_per_node <= INT32_MAX);
  FUZZ_CHECK(spec->world_size() >= 1);
  FUZZ_CHECK(!spec->checkpoint.dir.empty() && spec->checkpoint.keep >= 1);
  FUZZ_CHECK(faults::ValidateFaults(spec->faults).ok());
  for (const faults::Fault& f : spec->faults) FUZZ_CHECK(f.rank < spec->world_size());

  Result<std::vector<faults::Fault>> again =
      faults::DecodeFaults(faults::EncodeFaults(spec->faults));
  FUZZ_CHECK(again.ok() && *again == spec->faults);

  const core::JobMachineOptions options = controller::MachineOptions(*spec);
  FUZZ_CHECK(options.Validate().ok());
  std::vector<core::ExternalFault> external = controller::ExternalFaults(*spec);
  for (const core::ExternalFault& e : external) FUZZ_CHECK(e.rank.value < spec->world_size());
  core::JobMachine machine(options, std::move(external), core::TimePoint{});
  return 0;
}
