#pragma once
// How a worker leaves when it is told to stop. Every launcher (hp-launch,
// torchrun, Slurm, Open MPI, Kubernetes) stops a worker with SIGTERM and
// kills it some seconds later; the worker must leave before then, whatever
// it is doing: training, blocked in a collective whose peer died, waiting at
// the end of the run for a background checkpoint save.
//
// install() gives SIGTERM to a thread of its own: the handler only wakes it
// (async-signal-safe), and the thread collects what the process was doing
// from the registered notes (the step and phase, a background save that is
// abandoned, where the flight record went), prints one line
//
//   hp-train: rank 1 stopped by SIGTERM from hp-launch (pid 4242) at step 7,
//   forward of micro-batch 0; <notes>; exit code 143
//
// and ends the process with _exit(143) (128 + SIGTERM) without running
// destructors: nothing waits for a thread, a peer or a save. A background
// save cut off this way is never committed (a checkpoint commit is atomic,
// so `latest` names a complete step whatever the moment). Notes get
// kNoteBudget in all; a second SIGTERM, or the budget running out, ends the
// process at once with the same code. Free of LibTorch.
#include <chrono>
#include <csignal>
#include <functional>
#include <string>

namespace hp::stop {

/// The exit code of a worker that left on SIGTERM.
constexpr int kExitCode = 128 + SIGTERM;

/// How long the notes may take before the process leaves without them.
constexpr std::chrono::milliseconds kNoteBudget{2000};

/// Takes over SIGTERM for this process (the first call; later calls only
/// change the rank named in the line). `rank` is the worker's global rank.
void install(int rank);

/// Whether SIGTERM has arrived (the process is leaving).
bool requested();

/// Who sent the SIGTERM, "hp-launch (pid 4242)", once requested().
std::string sender();

/// Adds a note, called on the stop thread when SIGTERM arrives: it returns
/// a clause for the line ("" for none) and may do bounded work (write a
/// flight record). Returns an id for remove_note. Thread-safe.
int add_note(std::function<std::string()> note);

/// Removes a note; waits if the stop thread is running the notes (then the
/// process is about to end anyway). Call it before what the note reads is
/// destroyed.
void remove_note(int id);

/// RAII form of add_note / remove_note.
class Note {
 public:
  explicit Note(std::function<std::string()> note) : id_(add_note(std::move(note))) {}
  ~Note() { remove_note(id_); }
  Note(const Note&) = delete;
  Note& operator=(const Note&) = delete;

 private:
  int id_;
};

}  // namespace hp::stop
