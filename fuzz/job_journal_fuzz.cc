// Fuzz target: core::DecodeEvent, the controller's journal (one input per
// line, STATE_DIR/controller.db) on any text, replayed into a JobMachine as
// a restarted controller does. Each line decodes or is refused with
// InvalidArgument; one that decodes re-encodes to a line that decodes to
// the same text again; and stepping the decoded inputs, in order, into a
// machine (configured by the first line when it is a configure, else by a
// default 2-node job) never crashes, whatever they say.
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>

#include "core/job_codec.h"
#include "core/job_machine.h"
#include "fuzz/fuzz_util.h"

using namespace endure;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::istringstream lines{std::string(fuzz::AsText(data, size))};
  core::JobMachine machine(core::At(Duration(0)));
  bool configured = false;
  int64_t at_ms = 0;
  std::string line;
  while (std::getline(lines, line)) {
    Result<core::JobEvent> event = core::DecodeEvent(line);
    if (!event.ok()) {
      FUZZ_CHECK(event.status().code() == StatusCode::kInvalidArgument);
      continue;
    }
    const std::string encoded = core::EncodeEvent(*event);
    Result<core::JobEvent> again = core::DecodeEvent(encoded);
    FUZZ_CHECK(again.ok());
    FUZZ_CHECK(core::EncodeEvent(*again) == encoded);
    if (!configured && !std::holds_alternative<core::Configure>(*event)) {
      core::JobMachineOptions o;
      o.nodes = 2;
      (void)machine.Step(core::Configure{o, {}}, core::At(Duration(0)));
    }
    configured = true;
    at_ms += 100;
    (void)machine.Step(*event, core::At(std::chrono::milliseconds(at_ms)));
  }
  return 0;
}
