// Shutdown signals for long-running binaries. BlockShutdownSignals() must run in main()
// before any thread starts, so every thread inherits the mask; WaitForShutdownSignal()
// then returns the signal number (SIGINT or SIGTERM) in the calling thread, so no work
// ever runs inside a signal handler.
#ifndef ONLINEPS_COMMON_SIGNALS_H_
#define ONLINEPS_COMMON_SIGNALS_H_

#include <csignal>

namespace onlineps {

inline void BlockShutdownSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

inline int WaitForShutdownSignal() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  int sig = 0;
  sigwait(&set, &sig);
  return sig;
}

// A shutdown signal already delivered to this process (taken, so it is handled once), or
// 0 when none is pending. For start-up waits that must end when the process is stopped.
inline int TakePendingShutdownSignal() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  const timespec now{0, 0};
  const int sig = sigtimedwait(&set, nullptr, &now);
  return sig > 0 ? sig : 0;
}

}  // namespace onlineps

#endif  // ONLINEPS_COMMON_SIGNALS_H_
