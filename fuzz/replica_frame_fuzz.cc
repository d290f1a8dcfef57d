// Fuzz target: checkpoint::DecodeReplicaFrame, what a ReplicaServer parses
// from any peer before it asks for the payload, on any bytes. A frame it
// accepts has a valid shard, step and node name, and encodes
// (EncodeReplicaFrame, what SendReplica writes) to a frame that decodes to
// the same header.
#include <cstddef>
#include <cstdint>

#include "checkpoint/replica_link.h"
#include "common/names.h"
#include "fuzz/fuzz_util.h"

using namespace endure;
using checkpoint::ReplicaFrame;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Result<ReplicaFrame> frame = checkpoint::DecodeReplicaFrame(fuzz::AsText(data, size));
  if (!frame.ok()) {
    FUZZ_CHECK(frame.status().code() == StatusCode::kInvalidArgument);
    return 0;
  }
  const checkpoint::ReplicaHeader& h = frame->header;
  FUZZ_CHECK(h.shards >= 1 && h.shard >= 0 && h.shard < h.shards);
  FUZZ_CHECK(h.step >= 0);
  // The receiver names files after the node: never a path (issue 9).
  FUZZ_CHECK(IsValidNodeName(h.node));

  Result<std::string> bytes = checkpoint::EncodeReplicaFrame(frame->token, h);
  FUZZ_CHECK(bytes.ok());
  Result<ReplicaFrame> again = checkpoint::DecodeReplicaFrame(*bytes);
  FUZZ_CHECK(again.ok());
  const checkpoint::ReplicaHeader& g = again->header;
  FUZZ_CHECK(again->token == frame->token && g.node == h.node && g.shard == h.shard &&
             g.shards == h.shards && g.step == h.step && g.bytes == h.bytes && g.xxh3 == h.xxh3);
  return 0;
}
