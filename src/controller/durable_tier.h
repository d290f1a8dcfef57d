// DurableTier: the checkpoint book's I/O on the durable directory (T2), as
// the controller's host mounts it. The book (core/checkpoint_book.h) decides
// what to list, commit and remove; this carries it out and hands back the
// result as the machine's next input. It also reads and verifies the durable
// copies a restore plan would use before the plan goes to the agents: the
// book chooses a restore point from what it knows, the files say whether
// they still hold it. Owned by the controller's loop thread; not
// thread-safe.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/restore_plan.h"
#include "common/env.h"
#include "core/job_machine.h"

namespace endure::controller {

class DurableTier {
 public:
  // `dir` absolute; `env` must outlive this.
  DurableTier(Env* env, std::string dir);

  // Its committed steps (manifests only: no shard is read) and leftovers.
  core::DurableListed List() const;

  // Carries out one of the book's actions (ListDurableAction,
  // WriteManifestAction, RemoveStepAction) and returns its result, the
  // machine's next input; nullopt for any other action. A commit trusts the
  // checksums the agents reported (no shard is read back); failures are
  // logged and come back in the result.
  std::optional<core::JobEvent> CarryOut(const core::JobAction& action);

  // Reads and verifies each durable copy `plan` would load, filling in its
  // path, size and checksum from the step's manifest. Returns the copies
  // that failed (empty: the plan holds); each is an input of the machine,
  // after which the book chooses again.
  std::vector<core::ShardRefused> Verify(checkpoint::RestorePlan& plan) const;

  // When `step`'s directory last changed (its manifest's commit), in Unix
  // seconds; nullopt when it cannot be read.
  std::optional<double> CommittedAtUnix(core::StepNumber step) const;

 private:
  checkpoint::CheckpointDir dir_;
};

// Whether `action` is the checkpoint book's (DurableTier carries it out).
bool IsCheckpointAction(const core::JobAction& action);

// The machine's restore point for `start`, its durable copies verified by
// `tier`: each that fails goes to `input` (a ShardRefused, which the machine
// must be stepped with) and the book chooses again, until one holds.
checkpoint::RestorePlan VerifiedPlan(const core::JobMachine& machine, const DurableTier& tier,
                                     const core::StartGenerationAction& start,
                                     const std::function<void(const core::JobEvent&)>& input);

// The machine's input that says generation `generation` restores `plan`
// (`text`: what it chose and refused).
core::RestoreChosen RestoreChosenFor(core::Generation generation,
                                     const checkpoint::RestorePlan& plan);

}  // namespace endure::controller
