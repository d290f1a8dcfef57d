// EtcdClient: the few calls of etcd's v3 API (gRPC, proto/etcd.proto) that
// controller leadership needs: leases (grant, keep alive, revoke) and the
// two transactions of an election, campaign and resign. Every call has a
// deadline and returns what etcd answered or why it could not; none retries
// (the election decides when to try again). With several endpoints, a call
// that cannot reach one moves the next call on to the next endpoint.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/duration.h"
#include "common/status.h"

namespace endure::controller {

struct EtcdClientOptions {
  std::vector<std::string> endpoints;          // host:port of etcd's client URLs (plain TCP)
  Duration timeout = std::chrono::seconds(2);  // of a call without a deadline of its own

  // Names the first bad field.
  Status Validate() const;
};

// "host:port,host:port" (an `http://` prefix on each is accepted, as etcd
// prints its URLs) into its endpoints; kInvalidArgument names `flag`.
Result<std::vector<std::string>> ParseEtcdEndpoints(const std::string& text,
                                                    const std::string& flag);

struct EtcdLease {
  int64_t id = 0;
  Duration ttl{0};       // as granted or renewed; zero: the lease is gone
  int64_t revision = 0;  // the store's revision when etcd answered
};

// What a campaign found. When it did not win, `leader` and `leader_lease`
// describe the key that holds the leadership (empty and 0: none), and
// `finished` / `finished_revision` the job's end as a resigning leader
// recorded it (empty and 0: none).
struct EtcdCampaign {
  bool won = false;
  int64_t revision = 0;
  std::string leader;
  int64_t leader_lease = 0;
  std::string finished;
  int64_t finished_revision = 0;
};

// Not thread-safe: one thread at a time (the election's).
class EtcdClient {
 public:
  // Connects lazily: no call is made here. `options` must be valid.
  static Result<std::unique_ptr<EtcdClient>> Make(EtcdClientOptions options);
  virtual ~EtcdClient() = default;

  // Whether etcd answers at all (a read of `key`).
  virtual Status Ping(const std::string& key, Clock::TimePoint deadline) = 0;
  // A lease of `ttl` (whole seconds; etcd may grant longer).
  virtual Result<EtcdLease> GrantLease(Duration ttl, Clock::TimePoint deadline) = 0;
  // Renews lease `id`; a ttl of zero in the answer: etcd no longer has it.
  virtual Result<EtcdLease> KeepAlive(int64_t id, Clock::TimePoint deadline) = 0;
  // Ends lease `id` and deletes its keys.
  virtual Status RevokeLease(int64_t id, Clock::TimePoint deadline) = 0;
  // In one transaction: if nobody holds `leader_key` and `finished_key` was
  // not written after revision `since`, puts `leader_key` = `value` bound to
  // `lease` (won); else reads both keys.
  virtual Result<EtcdCampaign> Campaign(const std::string& leader_key, const std::string& value,
                                        int64_t lease, const std::string& finished_key,
                                        int64_t since, Clock::TimePoint deadline) = 0;
  // In one transaction: if `leader_key` is still bound to `lease`, puts
  // `finished_key` = `finished` (no lease: it outlives this process) and
  // deletes `leader_key`. Returns whether it was still held.
  virtual Result<bool> Resign(const std::string& leader_key, int64_t lease,
                              const std::string& finished_key, const std::string& finished,
                              Clock::TimePoint deadline) = 0;
};

}  // namespace endure::controller
