#pragma once
// Fault injection for tests, through one environment variable:
//
//   HP_FAULT_INJECT=<point>[,<point>...]
//
// Each named point is a place in the code that calls fault::hit("<point>");
// when the variable names it, the point does its action there: `kill`
// (the process raises SIGKILL, as a crash would) or `throw` (a
// std::runtime_error saying what failed, as a failed write would). The
// points, their actions and where they are, are the table in fault.cpp
// (`hp-train --fault-points` prints it); adding a point is one line there
// plus the hit() call. An unknown name in the variable is refused at
// start-up (check_environment) with the legal list. Free of LibTorch.
#include <string>
#include <vector>

namespace hp::fault {

enum class Action { kKill, kThrow };

struct Point {
  const char* name;  ///< "checkpoint.after_files"
  Action action;
  const char* where;  ///< one line: where it fires
};

/// Every point, in the table's order.
const std::vector<Point>& points();

/// "kill" / "throw".
const char* action_name(Action a);

/// The variable's name, "HP_FAULT_INJECT".
constexpr const char* kVariable = "HP_FAULT_INJECT";

/// The unknown names in HP_FAULT_INJECT ("" when it is unset or all are
/// known), comma-separated.
std::string unknown_points();
/// "checkpoint.after_files, checkpoint.before_rename, ..."
std::string legal_points();
/// Throws std::invalid_argument ("HP_FAULT_INJECT = <value>: unknown fault
/// point <name> (legal: ...)") when the variable names an unknown point.
void check_environment();

/// Whether HP_FAULT_INJECT names `point` (read on every call, so a test may
/// set it between calls). `point` must be in the table (else
/// std::logic_error: a hit() without its table line).
bool armed(const char* point);

/// Does `point`'s action when it is armed: SIGKILL, or throws
/// std::runtime_error("<what>: injected failure (HP_FAULT_INJECT=<point>)").
/// `what` says what failed ("cannot write <file> (tensor '<name>')"); it is
/// only used by throw points.
void hit(const char* point, const std::string& what = "");

}  // namespace hp::fault
