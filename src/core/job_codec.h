// JobCodec: the JobMachine's inputs and outputs as one line of text each.
//
// An event line is its kind and its fields, `key=value` separated by
// spaces, every field always present and in a fixed order:
//
//   step_end generation=0 rank=1 step=12 loss=2.4810000000000001 ...
//   worker_exit generation=0 rank=1 node=1 exit_code=- signal=9 log_cause="" ...
//
// Strings are quoted with C escapes (\" \\ \n \t \xNN), doubles are written
// with 17 significant digits (they read back bit for bit, nan and inf
// included), an absent optional is `-`, a time point or duration is
// nanoseconds, a list is comma-separated. The distinct value types are
// written as their number (generation=3, rank=1, step=12, node=0; -1 where
// none), a fault kind as its quoted name (kind="kill-agent", the names of
// faults::FaultKindName), a log action as its quoted name or "" for none
// (log_action="evict_node"), and an incident's cause as its quoted name
// (cause="signal 9 SIGKILL"): the same text as when they were plain ints
// and strings, so journals written before read back. The controller journals each
// input in this form (src/controller/state_store.h) and replays it; the
// scenario tests (tests/testdata/job_machine/) read events and write
// actions in it. Decoding is strict: a journal or a scenario file is input
// that may be damaged, and every error names the kind, the field and what
// was expected.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"
#include "core/job_machine.h"

namespace endure::core {

std::string EncodeEvent(const JobEvent& event);
Result<JobEvent> DecodeEvent(std::string_view line);

// Actions are only written (a scenario's expected output, a log line).
std::string EncodeAction(const JobAction& action);

// One incident as a line: its id, generation, cause, rank, node, action,
// the step it failed at and restored to, and its timeline in seconds since
// `start` (what a scenario test checks), then its reason.
std::string EncodeIncident(const Incident& incident, TimePoint start);

}  // namespace endure::core
