// Clang thread-safety annotations (https://clang.llvm.org/docs/ThreadSafetyAnalysis.html).
// Under clang with -Wthread-safety the compiler proves that guarded state is touched only
// with its lock held; under other compilers every macro expands to nothing. Use them with
// the annotated Mutex / MutexLock / CondVar of common/mutex.h (std::mutex is not
// annotated). scripts/check_thread_safety.sh builds the tree this way with -Werror.
#ifndef ONLINEPS_COMMON_THREAD_ANNOTATIONS_H_
#define ONLINEPS_COMMON_THREAD_ANNOTATIONS_H_

#if defined(__clang__)
#define ONLINEPS_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define ONLINEPS_THREAD_ANNOTATION(x)  // no-op
#endif

// A class that is a lock (Mutex), or a scoped holder of one (MutexLock).
#define CAPABILITY(x) ONLINEPS_THREAD_ANNOTATION(capability(x))
#define SCOPED_CAPABILITY ONLINEPS_THREAD_ANNOTATION(scoped_lockable)

// Data members: the member (GUARDED_BY) or what it points to (PT_GUARDED_BY) is read
// and written only with the lock held.
#define GUARDED_BY(x) ONLINEPS_THREAD_ANNOTATION(guarded_by(x))
#define PT_GUARDED_BY(x) ONLINEPS_THREAD_ANNOTATION(pt_guarded_by(x))

// Lock order between the locks of one object: this one is taken before / after those.
// Checked with -Wthread-safety-beta.
#define ACQUIRED_BEFORE(...) ONLINEPS_THREAD_ANNOTATION(acquired_before(__VA_ARGS__))
#define ACQUIRED_AFTER(...) ONLINEPS_THREAD_ANNOTATION(acquired_after(__VA_ARGS__))

// Functions: the caller must hold (REQUIRES), hold at least shared (REQUIRES_SHARED),
// or must not hold (EXCLUDES) the locks.
#define REQUIRES(...) ONLINEPS_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define REQUIRES_SHARED(...) ONLINEPS_THREAD_ANNOTATION(requires_shared_capability(__VA_ARGS__))
#define EXCLUDES(...) ONLINEPS_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))

// Functions that take or give back locks.
#define ACQUIRE(...) ONLINEPS_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define ACQUIRE_SHARED(...) ONLINEPS_THREAD_ANNOTATION(acquire_shared_capability(__VA_ARGS__))
#define RELEASE(...) ONLINEPS_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define RELEASE_SHARED(...) ONLINEPS_THREAD_ANNOTATION(release_shared_capability(__VA_ARGS__))
#define RELEASE_GENERIC(...) ONLINEPS_THREAD_ANNOTATION(release_generic_capability(__VA_ARGS__))
#define TRY_ACQUIRE(...) ONLINEPS_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
#define TRY_ACQUIRE_SHARED(...) \
  ONLINEPS_THREAD_ANNOTATION(try_acquire_shared_capability(__VA_ARGS__))
#define ASSERT_CAPABILITY(x) ONLINEPS_THREAD_ANNOTATION(assert_capability(x))
#define ASSERT_SHARED_CAPABILITY(x) ONLINEPS_THREAD_ANNOTATION(assert_shared_capability(x))
#define RETURN_CAPABILITY(x) ONLINEPS_THREAD_ANNOTATION(lock_returned(x))

// Turns the analysis off for one function; say why beside it.
#define NO_THREAD_SAFETY_ANALYSIS ONLINEPS_THREAD_ANNOTATION(no_thread_safety_analysis)

// leveldb's older names, for readers who know them.
#define LOCKABLE CAPABILITY("mutex")
#define SCOPED_LOCKABLE SCOPED_CAPABILITY
#define EXCLUSIVE_LOCKS_REQUIRED(...) REQUIRES(__VA_ARGS__)
#define SHARED_LOCKS_REQUIRED(...) REQUIRES_SHARED(__VA_ARGS__)
#define LOCKS_EXCLUDED(...) EXCLUDES(__VA_ARGS__)
#define LOCK_RETURNED(x) RETURN_CAPABILITY(x)

#endif  // ONLINEPS_COMMON_THREAD_ANNOTATIONS_H_
