#include "backends/comm/flight_analysis.h"

#include <algorithm>
#include <cstdio>

namespace hp::dist::flight {

namespace {

std::string secs(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", std::max(0.0, s));
  return buf;
}

std::string op_with_bytes(const Entry& e) { return e.op + " (" + std::to_string(e.bytes) + " bytes)"; }

/// "(it is in <where>; last heartbeat X ago)" or, when the beats stopped,
/// " and its heartbeat stopped (last seen in <where>; last heartbeat X ago)".
std::string whereabouts(const Heartbeat& hb, double now, double heartbeat_seconds, bool& stale) {
  const double age = now - hb.time;
  stale = age > kStaleBeats * heartbeat_seconds;
  return std::string(stale ? "last seen in " : "it is in ") + describe(hb.action) + "; last heartbeat " +
         secs(age) + " ago";
}

int index_of(const std::vector<int>& members, int rank) {
  auto it = std::find(members.begin(), members.end(), rank);
  return it == members.end() ? -1 : static_cast<int>(it - members.begin());
}

}  // namespace

std::vector<std::string> diagnose(const Heartbeat& waiting, const std::string& group, double waited,
                                  const std::map<int, Heartbeat>& members, double now, double heartbeat_seconds) {
  std::vector<std::string> out;
  auto git = waiting.groups.find(group);
  if (git == waiting.groups.end() || !git->second.pending) return out;
  const GroupProgress& mine = git->second;
  const Entry& e = mine.current;
  const std::string head = "stall on group '" + group + "': ";
  // An operation issued ahead (an asynchronous reduction launched during
  // backward, a receive posted early) says where it was issued and where the
  // rank is now.
  const std::string issued = describe(e.action), now_at = describe(waiting.action);
  const std::string tail = "; rank " + std::to_string(waiting.rank) + " has waited " + secs(waited) + " in " + e.op +
                           " (" + (issued == now_at ? issued : "issued in " + issued + "; now in " + now_at) + ")";
  if (e.kind == Kind::kCollective) {
    bool all_in = true;
    for (int m : mine.members) {
      if (m == waiting.rank) continue;
      auto hb = members.find(m);
      const std::string what = e.op + " #" + std::to_string(e.seq);
      if (hb == members.end() || !hb->second.groups.count(group)) {
        out.push_back(head + "rank " + std::to_string(m) + " has not entered " + what +
                      " and has never sent a heartbeat" + tail);
        all_in = false;
        continue;
      }
      const GroupProgress& theirs = hb->second.groups.at(group);
      if (theirs.pending && theirs.current.kind == Kind::kCollective && theirs.current.seq == e.seq) {
        if (theirs.current.op != e.op) {
          out.push_back("collective mismatch on group '" + group + "' #" + std::to_string(e.seq) + ": rank " +
                        std::to_string(waiting.rank) + " calls " + op_with_bytes(e) + ", rank " + std::to_string(m) +
                        " calls " + op_with_bytes(theirs.current));
          all_in = false;
        }
        continue;
      }
      if (theirs.issued >= e.seq) continue;  // it entered (and may have left) this one
      all_in = false;
      bool stale = false;
      const std::string where = whereabouts(hb->second, now, heartbeat_seconds, stale);
      out.push_back(head + "rank " + std::to_string(m) + " has not entered " + what +
                    (stale ? " and its heartbeat stopped (" : " (") + where + ")" + tail);
    }
    if (all_in && out.empty()) {
      // Everyone reached the operation, but a member that stopped beating
      // while inside it (frozen, swapped out, stopped by a debugger) holds the
      // rest: name it, not the transport.
      for (int m : mine.members) {
        if (m == waiting.rank) continue;
        bool stale = false;
        const std::string where = whereabouts(members.at(m), now, heartbeat_seconds, stale);
        if (stale) {
          out.push_back(head + "rank " + std::to_string(m) + " entered " + e.op + " #" + std::to_string(e.seq) +
                        " but its heartbeat stopped (" + where + ")" + tail);
        }
      }
    }
    if (all_in && out.empty()) {
      out.push_back(head + "every member is in " + e.op + " #" + std::to_string(e.seq) + " for " + secs(waited) +
                    " (waiting on the transport)");
    }
    return out;
  }
  // Point to point: the peer is a member index of the group.
  const int peer = e.peer >= 0 && e.peer < static_cast<int>(mine.members.size()) ? mine.members[e.peer] : -1;
  const int me = index_of(mine.members, waiting.rank);
  auto hb = members.find(peer);
  const std::string msg = "message #" + std::to_string(e.seq);
  if (hb == members.end() || !hb->second.groups.count(group)) {
    out.push_back(head + "rank " + std::to_string(peer) + " has never sent a heartbeat" + tail);
    return out;
  }
  const GroupProgress& theirs = hb->second.groups.at(group);
  bool stale = false;
  const std::string where = whereabouts(hb->second, now, heartbeat_seconds, stale);
  if (e.kind == Kind::kRecv) {
    auto sent = theirs.sent.find(me);
    if (sent == theirs.sent.end() || sent->second < e.seq) {
      out.push_back(head + "rank " + std::to_string(peer) + " has not sent " + msg + " to rank " +
                    std::to_string(waiting.rank) + (stale ? " and its heartbeat stopped (" : " (") + where + ")" + tail);
    } else if (stale) {
      // Posted, but the sender froze before the transport delivered it: the
      // sender is what to look at, not the network.
      out.push_back(head + "rank " + std::to_string(peer) + " posted " + msg + " to rank " +
                    std::to_string(waiting.rank) + " but it never arrived and its heartbeat stopped (" + where + ")" +
                    tail);
    } else {
      out.push_back(head + "rank " + std::to_string(peer) + " sent " + msg + " to rank " +
                    std::to_string(waiting.rank) + ", still in transit after " + secs(waited));
    }
  } else {
    out.push_back(head + "rank " + std::to_string(peer) + " has not received " + msg + " from rank " +
                  std::to_string(waiting.rank) + (stale ? " and its heartbeat stopped (" : " (") + where + ")" + tail);
  }
  return out;
}

std::vector<std::string> compare_records(const std::map<int, Heartbeat>& last, double now, double heartbeat_seconds) {
  std::vector<std::string> out;
  std::map<std::string, std::vector<int>> groups;  // "name [members]" -> members
  std::map<std::string, std::string> names;
  for (const auto& [rank, hb] : last) {
    for (const auto& [name, g] : hb.groups) {
      std::string key = name + " [";
      for (std::size_t i = 0; i < g.members.size(); ++i) key += (i ? "," : "") + std::to_string(g.members[i]);
      key += "]";
      groups[key] = g.members;
      names[key] = name;
    }
  }
  for (const auto& [key, members] : groups) {
    if (members.size() < 2) continue;
    const std::string& name = names.at(key);
    out.push_back("group '" + key.substr(0, name.size()) + "' ranks " + key.substr(name.size() + 1) + ":");
    std::uint64_t most = 0;
    for (int m : members) {
      auto hb = last.find(m);
      if (hb != last.end() && hb->second.groups.count(name)) most = std::max(most, hb->second.groups.at(name).issued);
    }
    for (int m : members) {
      auto hb = last.find(m);
      if (hb == last.end() || !hb->second.groups.count(name)) {
        out.push_back("  rank " + std::to_string(m) + ": no record");
        continue;
      }
      const GroupProgress& g = hb->second.groups.at(name);
      std::string line = "  rank " + std::to_string(m) + ": entered " + std::to_string(g.issued) + ", completed " +
                         std::to_string(g.done);
      if (g.pending) {
        line += ", in " + g.current.op + " #" + std::to_string(g.current.seq) + " (" + to_string(g.current.state) +
                ", " + describe(g.current.action) + ")";
      } else {
        line += ", in no operation of this group (" + describe(hb->second.action) + ")";
      }
      if (g.issued < most) line += "  <- behind by " + std::to_string(most - g.issued);
      out.push_back(line);
    }
    // Every member still waiting in one operation: diagnose it as the live
    // watchdog would.
    for (int m : members) {
      auto hb = last.find(m);
      if (hb == last.end() || !hb->second.groups.count(name) || !hb->second.groups.at(name).pending) continue;
      for (auto& l : diagnose(hb->second, name, now - hb->second.groups.at(name).current.start, last, now,
                              heartbeat_seconds)) {
        if (std::find(out.begin(), out.end(), "  " + l) == out.end()) out.push_back("  " + l);
      }
    }
  }
  return out;
}

}  // namespace hp::dist::flight
