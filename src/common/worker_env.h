// The worker contract's environment: the ENDURE_* variables the agent sets
// for each worker it starts (and the controller passes through the start
// command), and the client library reads (Session::FromEnvironment; the C
// API and the Python package read them through it). One list, so that the
// writer and the reader cannot drift apart; docs/python.md and the client's
// header describe what each means to a program.
#pragma once

namespace endure::worker_env {

// Always set.
inline constexpr char kAgentSocket[] = "ENDURE_AGENT_SOCKET";  // the agent's datagram socket
inline constexpr char kToken[] = "ENDURE_TOKEN";               // this generation's credential
inline constexpr char kGeneration[] = "ENDURE_GENERATION";
inline constexpr char kNodeId[] = "ENDURE_NODE_ID";
inline constexpr char kRestoreStep[] = "ENDURE_RESTORE_STEP";  // -1: start afresh
inline constexpr char kSkipSteps[] = "ENDURE_SKIP_STEPS";      // steps to skip, "3,17"
inline constexpr char kFaults[] = "ENDURE_FAULTS";             // this rank's injected faults (JSON)
inline constexpr char kStacksFile[] = "ENDURE_STACKS_FILE";    // where to dump its own stacks
// The job's checkpointing (the controller sets them from the spec).
inline constexpr char kCkptDir[] = "ENDURE_CKPT_DIR";
inline constexpr char kCkptEvery[] = "ENDURE_CKPT_EVERY";
inline constexpr char kSdcCheckEvery[] = "ENDURE_SDC_CHECK_EVERY";
inline constexpr char kHeartbeatInterval[] = "ENDURE_HEARTBEAT_INTERVAL";
// The node's memory tier, with checkpoints enabled.
inline constexpr char kT0Dir[] = "ENDURE_T0_DIR";
inline constexpr char kT0SlotBytes[] = "ENDURE_T0_SLOT_BYTES";
// Restores and in-process restarts.
inline constexpr char kRestorePlan[] = "ENDURE_RESTORE_PLAN";           // the plan, inline
inline constexpr char kRestorePlanFile[] = "ENDURE_RESTORE_PLAN_FILE";  // the plan, in a file
inline constexpr char kPeerRestore[] = "ENDURE_PEER_RESTORE";  // "1": take the state from a peer
inline constexpr char kRejoinFile[] = "ENDURE_REJOIN_FILE";    // where a rejoin offer appears
// A warm standby: started ahead of its generation, it waits for its start.
inline constexpr char kStandby[] = "ENDURE_STANDBY";
// Tags a worker and its descendants (the agent finds them by it).
inline constexpr char kWorkerTag[] = "ENDURE_WORKER_TAG";

}  // namespace endure::worker_env
