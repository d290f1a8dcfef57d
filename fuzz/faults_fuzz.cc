// Fuzz target: faults::DecodeFaults and ValidateFaults, the ENDURE_FAULTS
// JSON every worker reads, on any text. Integers decode as written, never
// wrapped into range; faults that decode re-encode (EncodeFaults) to JSON
// that decodes to the same faults; faults that also validate give each rank
// only its own step-keyed faults.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>

#include "faults/fault.h"
#include "fuzz/fuzz_util.h"

using namespace endure;
using faults::Fault;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Result<std::vector<Fault>> decoded = faults::DecodeFaults(fuzz::AsText(data, size));
  if (!decoded.ok()) {
    FUZZ_CHECK(decoded.status().code() == StatusCode::kInvalidArgument);
    return 0;
  }
  // Integers are taken as written, never wrapped into range.
  const nlohmann::json raw = nlohmann::json::parse(fuzz::AsText(data, size), nullptr, false);
  for (size_t i = 0; raw.is_array() && i < raw.size(); ++i) {
    const Fault& f = (*decoded)[i];
    const std::pair<const char*, nlohmann::json> fields[] = {
        {"rank", f.rank}, {"step", f.step}, {"exit_code", f.exit_code}};
    for (const auto& [key, value] : fields) {
      if (raw[i].contains(key)) FUZZ_CHECK(raw[i][key].dump() == value.dump());
    }
  }

  const std::string encoded = faults::EncodeFaults(*decoded);
  Result<std::vector<Fault>> again = faults::DecodeFaults(encoded);
  FUZZ_CHECK(again.ok());
  FUZZ_CHECK(*again == *decoded);

  if (!faults::ValidateFaults(*decoded).ok()) return 0;
  for (int rank : {0, 1, 7}) {
    for (const Fault& f : faults::FaultsForRank(*decoded, rank, {})) {
      FUZZ_CHECK(f.rank == rank && f.step >= 1 && !f.at && !faults::FiredByController(f.kind));
    }
  }
  return 0;
}
