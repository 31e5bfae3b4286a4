#pragma once
// Comparing ranks: given this rank's operation in flight and the other
// members' heartbeats, who is behind, where, and for how long; which ranks
// call different operations at the same sequence number. The same rules
// serve the live watchdog and `hp-flight` over written records.
#include <map>
#include <string>
#include <vector>

#include "hp/comm/flight_recorder.h"

namespace hp::dist::flight {

/// A heartbeat older than this many beats means the rank stopped beating.
constexpr double kStaleBeats = 3.0;

/// Lines about `waiting`'s operation in flight on `group` (pending for
/// `waited` seconds), from the members' heartbeats (by global rank; a
/// missing member is reported as such). `now` is the wall clock.
/// Formats:
///   stall on group 'dp': rank 1 has not entered all_reduce #57 (it is in step 29, backward of micro-batch 1;
///     last heartbeat 0.4 s ago)
///   stall on group 'dp': rank 1 has not entered all_reduce #57 and its heartbeat stopped (last seen in step 29,
///     backward of micro-batch 1; last heartbeat 12.0 s ago)
///   stall on group 'pp': rank 0 has not sent message #6 to rank 1 (it is in ...; last heartbeat ...)
///   collective mismatch on group 'dp' #57: rank 0 calls all_reduce (4096 bytes), rank 1 calls broadcast (4096 bytes)
///   stall on group 'dp': rank 1 entered all_reduce #57 but its heartbeat stopped (last seen in ...)
///   stall on group 'dp': every member is in all_reduce #57 for 12.0 s (waiting on the transport)
std::vector<std::string> diagnose(const Heartbeat& waiting, const std::string& group, double waited,
                                  const std::map<int, Heartbeat>& members, double now, double heartbeat_seconds);

/// The per-group comparison of written records (hp-flight): for every group,
/// each member's collectives entered/completed, its last operation, and
/// the rank behind or the mismatch. One line per fact.
std::vector<std::string> compare_records(const std::map<int, Heartbeat>& last, double now, double heartbeat_seconds);

}  // namespace hp::dist::flight
