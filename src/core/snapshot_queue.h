// The persistence cadence's queue (a piece of the node core): the snapshots
// a node's workers announced and its tier store has not taken up yet. The
// store replicates (T1) and persists (T2) one at a time, behind training;
// when workers announce faster than that, only the newest snapshot of a rank
// is worth its replica, but a snapshot whose step is due in durable storage
// (DurableStepDue) must not be superseded by a newer one that is not: that
// would skip the durable step, and with a steady lag skip most of them. So
// each rank has at most two notices waiting: the newest due one, and after
// it the newest of all. Pure.
#pragma once

#include <algorithm>
#include <deque>
#include <utility>

namespace endure::core {

// `Notice` has `int rank`, `int64_t step` and `bool durable` (due in T2).
// Adds `incoming` to `queue` (oldest first) by the rule above; a notice older
// than one already waiting for its rank is dropped.
template <typename Notice>
void QueueSnapshot(std::deque<Notice>& queue, Notice incoming) {
  const auto same_rank = [&](const Notice& q) { return q.rank == incoming.rank; };
  for (const Notice& q : queue) {
    if (same_rank(q) && q.step > incoming.step) return;  // late: a newer one waits
  }
  if (incoming.durable) {
    // It supersedes whatever its rank had waiting.
    std::erase_if(queue, same_rank);
    queue.push_back(std::move(incoming));
    return;
  }
  // It supersedes the rank's newest-of-all, never its due one.
  auto newest = std::find_if(queue.begin(), queue.end(),
                             [&](const Notice& q) { return same_rank(q) && !q.durable; });
  if (newest != queue.end()) queue.erase(newest);
  queue.push_back(std::move(incoming));
}

}  // namespace endure::core
