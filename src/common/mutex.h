// Mutex, MutexLock and CondVar: std::mutex and std::condition_variable with
// clang's thread-safety annotations, so that what a mutex guards is checked
// by the compiler and not only written in a comment. The clang build (`make
// fuzz-build`, part of `make test`) compiles every library with
// -Wthread-safety -Werror=thread-safety; GCC ignores the annotations.
//
//   class Queue {
//     Mutex mu_;
//     CondVar cv_;
//     std::deque<int> items_ GUARDED_BY(mu_);
//     void PushLocked(int v) REQUIRES(mu_);
//   };
//   MutexLock lock(&mu_);
//   cv_.Wait(lock, [&]() REQUIRES(mu_) { return !items_.empty(); });
//
// A condition runs with the mutex held: annotate it REQUIRES(the mutex), or
// the analysis reports every guarded member it reads.
//
// The macros are those of clang's documentation
// (https://clang.llvm.org/docs/ThreadSafetyAnalysis.html) and of abseil.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#if defined(__clang__)
#define ENDURE_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define ENDURE_THREAD_ANNOTATION(x)
#endif

// abseil (through gRPC's headers) defines some of the same names, to the
// same attributes: ours replace them.
#undef GUARDED_BY
#undef PT_GUARDED_BY
#undef ACQUIRED_BEFORE
#undef ACQUIRED_AFTER
#undef NO_THREAD_SAFETY_ANALYSIS
#define CAPABILITY(x) ENDURE_THREAD_ANNOTATION(capability(x))
#define SCOPED_CAPABILITY ENDURE_THREAD_ANNOTATION(scoped_lockable)
#define GUARDED_BY(x) ENDURE_THREAD_ANNOTATION(guarded_by(x))
#define PT_GUARDED_BY(x) ENDURE_THREAD_ANNOTATION(pt_guarded_by(x))
#define ACQUIRED_BEFORE(...) ENDURE_THREAD_ANNOTATION(acquired_before(__VA_ARGS__))
#define ACQUIRED_AFTER(...) ENDURE_THREAD_ANNOTATION(acquired_after(__VA_ARGS__))
#define REQUIRES(...) ENDURE_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define ACQUIRE(...) ENDURE_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define RELEASE(...) ENDURE_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define EXCLUDES(...) ENDURE_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define RETURN_CAPABILITY(x) ENDURE_THREAD_ANNOTATION(lock_returned(x))
#define NO_THREAD_SAFETY_ANALYSIS ENDURE_THREAD_ANNOTATION(no_thread_safety_analysis)
#define ASSERT_CAPABILITY(x) ENDURE_THREAD_ANNOTATION(assert_capability(x))

namespace endure {

class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }

 private:
  friend class MutexLock;
  std::mutex mu_;
};

// Holds a Mutex for its scope. Unlock() and Lock() let a scope drop the
// mutex around a call that must not run under it.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ACQUIRE(mu) : lock_(mu->mu_) {}
  ~MutexLock() RELEASE() {}
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void Unlock() RELEASE() { lock_.unlock(); }
  void Lock() ACQUIRE() { lock_.lock(); }

 private:
  friend class CondVar;
  std::unique_lock<std::mutex> lock_;
};

// Waits release the lock's mutex until `done()` holds and hold it again
// when they return. The templates are not analysed (they cannot name the
// caller's mutex); the condition is, by its REQUIRES.
class CondVar {
 public:
  template <class Condition>
  void Wait(MutexLock& lock, Condition done) NO_THREAD_SAFETY_ANALYSIS {
    cv_.wait(lock.lock_, done);
  }
  // done() when it returns: false when `deadline` passed first.
  template <class C, class D, class Condition>
  bool WaitUntil(MutexLock& lock, std::chrono::time_point<C, D> deadline,
                 Condition done) NO_THREAD_SAFETY_ANALYSIS {
    return cv_.wait_until(lock.lock_, deadline, done);
  }
  template <class R, class P, class Condition>
  bool WaitFor(MutexLock& lock, std::chrono::duration<R, P> timeout,
               Condition done) NO_THREAD_SAFETY_ANALYSIS {
    return cv_.wait_for(lock.lock_, timeout, done);
  }
  void NotifyOne() { cv_.notify_one(); }
  void NotifyAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace endure
