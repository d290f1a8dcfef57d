// fuzz_seeds DIR: writes the generated seeds of the fuzz corpora into
// DIR/<target>/gen-*, each made by the code that makes such inputs in a run
// (RestorePlanToJson as the controller sends a plan, CheckpointDir's
// manifest, EncodeTensors, EncodeReplicaFrame, EncodeFaults), so that the
// seeds follow the formats when they change. `make fuzz-seeds` runs it on
// fuzz/corpus. Not a fuzz target: it is built without libFuzzer's main.
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/replica_link.h"
#include "checkpoint/restore_plan.h"
#include "checkpoint/tensor_blob.h"
#include "common/env.h"
#include "common/hash.h"
#include "faults/fault.h"
#include "fuzz/fuzz_util.h"
#include "fuzz/manifest_fixture.h"

using namespace endure;
using namespace std::chrono_literals;

namespace {

int failures = 0;

void Write(const std::string& dir, const std::string& target, const std::string& name,
           std::string_view bytes) {
  const std::string path = dir + "/" + target + "/gen-" + name;
  Status st = Env::Default()->CreateDirs(dir + "/" + target);
  if (st.ok()) st = WriteFileAtomically(Env::Default(), path, bytes);
  if (!st.ok()) {
    std::fprintf(stderr, "fuzz_seeds: %s\n", st.ToString().c_str());
    ++failures;
  }
}

std::string PlanJson(const std::vector<checkpoint::ShardCopy>& copies, int64_t limit) {
  checkpoint::RestorePlan plan = checkpoint::ChooseRestorePoint(copies, limit);
  FUZZ_CHECK(checkpoint::AssignLoaders(plan, {{"node0", {0, 1}}, {"node1", {2, 3}}}).ok());
  return checkpoint::RestorePlanToJson(plan).dump();
}

checkpoint::ShardCopy Copy(int64_t step, int shard, int shards, checkpoint::Tier tier,
                           const std::string& node) {
  checkpoint::ShardCopy c;
  c.step = step;
  c.shard = shard;
  c.shards = shards;
  c.tier = tier;
  c.node = node;
  c.path = tier == checkpoint::Tier::kT2
               ? "runs/demo/ckpt/step-" + std::to_string(step) + "/shard-0000" +
                     std::to_string(shard) + ".bin"
               : "/dev/shm/endure-demo/" + node + "/rank-" + std::to_string(shard) + ".slot-0";
  c.bytes = 1000 + static_cast<uint64_t>(shard);
  c.xxh3 = Xxh3(c.path);
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_seeds DIR (e.g. fuzz/corpus)\n");
    return 2;
  }
  const std::string dir = argv[1];
  using checkpoint::Tier;

  // Restore plans: memory tiers with a refused copy, the durable tier, a fresh start.
  std::vector<checkpoint::ShardCopy> copies = {
      Copy(20, 0, 2, Tier::kT0, "node0"), Copy(20, 1, 2, Tier::kT1, "node0"),
      Copy(20, 1, 2, Tier::kT0, "node1"), Copy(10, 0, 2, Tier::kT2, ""),
      Copy(10, 1, 2, Tier::kT2, "")};
  copies[2].refused = "checksum mismatch";
  const std::string memory_plan = PlanJson(copies, 100);
  Write(dir, "restore_plan", "memory", memory_plan);
  Write(dir, "restore_plan", "durable", PlanJson(copies, 15));
  Write(dir, "restore_plan", "fresh", PlanJson(copies, 5));

  // Manifests of the manifest target's fixture: both shards, and one listed.
  {
    fuzz::MemEnv env;
    const std::vector<checkpoint::ShardEntry> entries = fuzz::WriteFixtureShards(&env);
    checkpoint::CheckpointDir ckpt(&env, fuzz::kManifestRoot);
    const std::string manifest = JoinPath(ckpt.StepDir(fuzz::kManifestStep), "MANIFEST.json");
    FUZZ_CHECK(ckpt.CommitStep(fuzz::kManifestStep, entries).ok());
    Write(dir, "manifest", "two-shards", *env.ReadFile(manifest));
    FUZZ_CHECK(ckpt.CommitStep(fuzz::kManifestStep, {entries[0]}).ok());
    Write(dir, "manifest", "one-shard", *env.ReadFile(manifest));
    // The same shard bytes are seeds of the tensor decoder.
    Write(dir, "tensors", "shard", *ckpt.ReadShard(fuzz::kManifestStep, 0));
  }

  // Tensors of every dtype, a scalar and an empty one.
  {
    std::vector<checkpoint::TensorBlob> blobs = {
        {"model/w", "float32", {2, 3}, std::string(24, '\x01')},
        {"opt/step", "int64", {}, std::string(8, '\x02')},
        {"mask", "bool", {0, 7}, ""},
        {"half", "bfloat16", {3}, std::string(6, '\x03')},
        {"bytes", "uint8", {4}, "abcd"},
    };
    Write(dir, "tensors", "mixed", checkpoint::EncodeTensors(blobs));
    Write(dir, "tensors", "none", checkpoint::EncodeTensors({}));
  }

  // A replica frame as SendReplica writes it.
  {
    checkpoint::ReplicaHeader h;
    h.node = "node1";
    h.shard = 1;
    h.shards = 4;
    h.step = 120;
    h.bytes = 4096;
    h.xxh3 = 0x0123456789abcdefULL;
    Write(dir, "replica_frame", "frame", *checkpoint::EncodeReplicaFrame("job-token-42", h));
    // What issue 9 found: a node name that is a path out of the receiver's directory.
    h.node = "../../../tmp/x";
    Write(dir, "replica_frame", "traversal", *checkpoint::EncodeReplicaFrame("job-token-42", h));
  }

  // Faults of every kind, as the agent hands them to workers.
  std::string faults_json;
  {
    std::vector<faults::Fault> list;
    auto add = [&list](faults::FaultKind kind, int rank, int64_t step) -> faults::Fault& {
      faults::Fault f;
      f.id = "f" + std::to_string(list.size() + 1);
      f.kind = kind;
      f.rank = rank;
      f.step = step;
      return list.emplace_back(std::move(f));
    };
    add(faults::FaultKind::kKill, 1, 40);
    add(faults::FaultKind::kExit, 0, 7).exit_code = 3;
    add(faults::FaultKind::kSlow, 1, 5).factor = 3.5;
    add(faults::FaultKind::kLog, 0, 9).line =
        "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen";
    add(faults::FaultKind::kNan, 1, 200);
    add(faults::FaultKind::kHang, 0, 120);
    faults::Fault& agent = add(faults::FaultKind::kKillAgent, -1, -1);
    agent.node = "node1";
    agent.at = 90s;
    add(faults::FaultKind::kDiskFull, 0, 12);
    add(faults::FaultKind::kCorruptT1, 1, -1).at = 1500ms;
    faults_json = faults::EncodeFaults(list);
    Write(dir, "faults", "all-kinds", faults_json);
  }

  // A worker's environment under an agent (less the socket).
  Write(dir, "client_env", "worker",
        "RANK=1\nENDURE_GENERATION=3\nENDURE_TOKEN=job-token-42\nENDURE_CKPT_DIR=runs/demo/ckpt\n"
        "ENDURE_CKPT_EVERY=10\nENDURE_RESTORE_STEP=20\nENDURE_T0_DIR=/dev/shm/endure-demo/node0\n"
        "ENDURE_T0_SLOT_BYTES=1048576\nENDURE_SKIP_STEPS=3, 7,12\n"
        "ENDURE_HEARTBEAT_INTERVAL=500ms\nENDURE_STACKS_FILE=/tmp/stacks-1.txt\n"
        "ENDURE_RESTORE_PLAN=" +
            memory_plan + "\nENDURE_FAULTS=" + faults_json + "\n");
  return failures == 0 ? 0 : 1;
}
