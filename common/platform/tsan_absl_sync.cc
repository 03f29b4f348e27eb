// Makes Debian's Abseil synchronization visible to ThreadSanitizer.
//
// TSan sees only code compiled with -fsanitize=thread, and Debian builds
// libabsl_synchronization without it: an absl::Mutex's lock and unlock happen
// out of its sight, so every field a Mutex guards would look like a data race
// between the threads that take turns holding it. Under --config=tsan
// (.bazelrc) this file is linked into every program and defines absl's
// out-of-line synchronization entry points itself. The dynamic linker finds
// these definitions (in the program, or a library it loads before Abseil's)
// first, for every caller; each tells TSan what the call does, with the
// <sanitizer/tsan_interface.h> annotations Abseil makes when it is itself
// built with TSan, and calls the library's function, found with
// dlsym(RTLD_NEXT). Memory touched without holding the mutex is still
// reported (tsan_absl_sync_test shows both sides), and TSan checks lock order
// too. Condition functions run inside the library's lock operations, where
// TSan ignores memory accesses, so their reads are not checked.
//
// Without TSan the file compiles to nothing.
#if defined(__SANITIZE_THREAD__)

#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <atomic>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/base/options.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

static_assert(ABSL_OPTION_USE_INLINE_NAMESPACE,
              "the symbol names below assume Abseil's inline namespace");

namespace {

#define DOWNPOUR_TSAN_STRINGIFY_INNER(x) #x
#define DOWNPOUR_TSAN_STRINGIFY(x) DOWNPOUR_TSAN_STRINGIFY_INNER(x)

// The library's definition of absl::<member>, by its mangled name: "_ZN" (or
// "_ZNK" for a const member) + "4absl" + the inline namespace + `member`,
// which is the rest of the mangled name (substitutions like NS0_ name the
// inline namespace, so they do not depend on it).
template <typename Function>
Function Next(const char* member, bool is_const = false) {
  const std::string inline_namespace = DOWNPOUR_TSAN_STRINGIFY(ABSL_OPTION_INLINE_NAMESPACE_NAME);
  const std::string name = std::string(is_const ? "_ZNK" : "_ZN") + "4absl" +
                           std::to_string(inline_namespace.size()) + inline_namespace + member;
  void* next = dlsym(RTLD_NEXT, name.c_str());
  if (next == nullptr) {
    std::fprintf(stderr,
                 "tsan_absl_sync: %s not found in the loaded libraries (%s); "
                 "the Abseil this program links is not the one it was built "
                 "against\n",
                 name.c_str(), dlerror());
    std::abort();
  }
  return reinterpret_cast<Function>(next);
}

// The mutexes this thread holds in shared (reader) mode, so that Await and
// CondVar::Wait, which release and retake a mutex in whichever mode it is
// held, tell TSan the right one. Nesting is shallow; kMaxReaderLocks more
// than any code here holds at once.
constexpr int kMaxReaderLocks = 16;
struct ReaderLocks {
  const absl::Mutex* held[kMaxReaderLocks];
  int count;
};
thread_local ReaderLocks reader_locks;

void AddReaderLock(const absl::Mutex* mu) {
  if (reader_locks.count == kMaxReaderLocks) {
    std::fprintf(stderr, "tsan_absl_sync: over %d reader locks held at once\n", kMaxReaderLocks);
    std::abort();
  }
  reader_locks.held[reader_locks.count++] = mu;
}

void RemoveReaderLock(const absl::Mutex* mu) {
  for (int i = reader_locks.count - 1; i >= 0; --i) {
    if (reader_locks.held[i] == mu) {
      reader_locks.held[i] = reader_locks.held[--reader_locks.count];
      return;
    }
  }
}

unsigned HeldMode(const absl::Mutex* mu) {
  for (int i = 0; i < reader_locks.count; ++i) {
    if (reader_locks.held[i] == mu) return __tsan_mutex_read_lock;
  }
  return 0;
}

// The library calls its own entry points too (LockWhenWithTimeout calls
// LockWhenWithDeadline, a Notification locks its own Mutex), and those calls
// come back here. Only the outermost call on a thread, the one the
// program's code made, is annotated.
thread_local int interposed_depth = 0;

class Interposed {
 public:
  Interposed() : outermost_(interposed_depth++ == 0) {}
  ~Interposed() { --interposed_depth; }
  Interposed(const Interposed&) = delete;
  Interposed& operator=(const Interposed&) = delete;

  bool outermost() const { return outermost_; }

 private:
  const bool outermost_;
};

// Brackets a call that acquires `mu` in `mode`. For a try lock, the call's
// result goes through Took().
class Acquiring : public Interposed {
 public:
  Acquiring(absl::Mutex* mu, unsigned mode) : mu_(mu), mode_(mode) {
    if (outermost()) __tsan_mutex_pre_lock(mu_, mode_);
  }
  ~Acquiring() {
    if (!outermost()) return;
    __tsan_mutex_post_lock(mu_, acquired_ ? mode_ : mode_ | __tsan_mutex_try_lock_failed, 0);
    if (acquired_ && (mode_ & __tsan_mutex_read_lock)) AddReaderLock(mu_);
  }

  bool Took(bool acquired) {
    acquired_ = acquired;
    return acquired;
  }

 private:
  absl::Mutex* const mu_;
  const unsigned mode_;
  bool acquired_ = true;
};

// Brackets a call that releases `mu`, held in `mode`.
class Releasing : public Interposed {
 public:
  Releasing(absl::Mutex* mu, unsigned mode) : mu_(mu), mode_(mode) {
    if (!outermost()) return;
    if (mode_ & __tsan_mutex_read_lock) RemoveReaderLock(mu_);
    __tsan_mutex_pre_unlock(mu_, mode_);
  }
  ~Releasing() {
    if (outermost()) __tsan_mutex_post_unlock(mu_, mode_);
  }

 private:
  absl::Mutex* const mu_;
  const unsigned mode_;
};

// Brackets a call that releases `mu`, waits, and takes it again in the mode
// it was held in, as Mutex::Await and CondVar::Wait do. The release is
// annotated before the call, the acquisition after it; the call itself runs
// as a lock operation, during which TSan ignores memory accesses (the
// condition evaluations).
class ReleasedDuring : public Interposed {
 public:
  explicit ReleasedDuring(absl::Mutex* mu) : mu_(mu), mode_(HeldMode(mu)) {
    if (!outermost()) return;
    __tsan_mutex_pre_unlock(mu_, mode_);
    __tsan_mutex_post_unlock(mu_, mode_);
    __tsan_mutex_pre_lock(mu_, mode_);
  }
  ~ReleasedDuring() {
    if (outermost()) __tsan_mutex_post_lock(mu_, mode_, 0);
  }

 private:
  absl::Mutex* const mu_;
  const unsigned mode_;
};

// Where Notification keeps its flag: HasBeenNotified() reads it inline, in
// instrumented code, with an acquire load, so Notify() releases at its
// address (the store itself happens inside the library).
struct NotificationLayout {
  absl::Mutex mutex;
  std::atomic<bool> notified_yet;
};
static_assert(sizeof(NotificationLayout) == sizeof(absl::Notification),
              "absl::Notification's layout changed");

void* NotifiedFlag(const absl::Notification* notification) {
  return const_cast<char*>(reinterpret_cast<const char*>(notification)) +
         offsetof(NotificationLayout, notified_yet);
}

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

void Mutex::Lock() {
  static const auto next = Next<void (*)(Mutex*)>("5Mutex4LockEv");
  Acquiring acquiring(this, 0);
  next(this);
}

void Mutex::ReaderLock() {
  static const auto next = Next<void (*)(Mutex*)>("5Mutex10ReaderLockEv");
  Acquiring acquiring(this, __tsan_mutex_read_lock);
  next(this);
}

bool Mutex::TryLock() {
  static const auto next = Next<bool (*)(Mutex*)>("5Mutex7TryLockEv");
  Acquiring acquiring(this, __tsan_mutex_try_lock);
  return acquiring.Took(next(this));
}

bool Mutex::ReaderTryLock() {
  static const auto next = Next<bool (*)(Mutex*)>("5Mutex13ReaderTryLockEv");
  Acquiring acquiring(this, __tsan_mutex_try_read_lock);
  return acquiring.Took(next(this));
}

void Mutex::LockWhen(const Condition& cond) {
  static const auto next =
      Next<void (*)(Mutex*, const Condition&)>("5Mutex8LockWhenERKNS0_9ConditionE");
  Acquiring acquiring(this, 0);
  next(this, cond);
}

void Mutex::ReaderLockWhen(const Condition& cond) {
  static const auto next =
      Next<void (*)(Mutex*, const Condition&)>("5Mutex14ReaderLockWhenERKNS0_9ConditionE");
  Acquiring acquiring(this, __tsan_mutex_read_lock);
  next(this, cond);
}

// The *WithTimeout/*WithDeadline lock functions hold the mutex when they
// return, whether or not the condition became true.
bool Mutex::LockWhenWithTimeout(const Condition& cond, Duration timeout) {
  static const auto next = Next<bool (*)(Mutex*, const Condition&, Duration)>(
      "5Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  Acquiring acquiring(this, 0);
  return next(this, cond, timeout);
}

bool Mutex::ReaderLockWhenWithTimeout(const Condition& cond, Duration timeout) {
  static const auto next = Next<bool (*)(Mutex*, const Condition&, Duration)>(
      "5Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  Acquiring acquiring(this, __tsan_mutex_read_lock);
  return next(this, cond, timeout);
}

bool Mutex::LockWhenWithDeadline(const Condition& cond, Time deadline) {
  static const auto next = Next<bool (*)(Mutex*, const Condition&, Time)>(
      "5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  Acquiring acquiring(this, 0);
  return next(this, cond, deadline);
}

bool Mutex::ReaderLockWhenWithDeadline(const Condition& cond, Time deadline) {
  static const auto next = Next<bool (*)(Mutex*, const Condition&, Time)>(
      "5Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  Acquiring acquiring(this, __tsan_mutex_read_lock);
  return next(this, cond, deadline);
}

void Mutex::Unlock() {
  static const auto next = Next<void (*)(Mutex*)>("5Mutex6UnlockEv");
  Releasing releasing(this, 0);
  next(this);
}

void Mutex::ReaderUnlock() {
  static const auto next = Next<void (*)(Mutex*)>("5Mutex12ReaderUnlockEv");
  Releasing releasing(this, __tsan_mutex_read_lock);
  next(this);
}

void Mutex::Await(const Condition& cond) {
  static const auto next =
      Next<void (*)(Mutex*, const Condition&)>("5Mutex5AwaitERKNS0_9ConditionE");
  ReleasedDuring released(this);
  next(this, cond);
}

bool Mutex::AwaitWithTimeout(const Condition& cond, Duration timeout) {
  static const auto next = Next<bool (*)(Mutex*, const Condition&, Duration)>(
      "5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  ReleasedDuring released(this);
  return next(this, cond, timeout);
}

bool Mutex::AwaitWithDeadline(const Condition& cond, Time deadline) {
  static const auto next = Next<bool (*)(Mutex*, const Condition&, Time)>(
      "5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  ReleasedDuring released(this);
  return next(this, cond, deadline);
}

// TSan forgets the mutex (and reports destroying it while held).
Mutex::~Mutex() {
  static const auto next = Next<void (*)(Mutex*)>("5MutexD2Ev");
  Interposed call;
  if (call.outermost()) __tsan_mutex_destroy(this, 0);
  next(this);
}

void CondVar::Wait(Mutex* mu) {
  static const auto next = Next<void (*)(CondVar*, Mutex*)>("7CondVar4WaitEPNS0_5MutexE");
  ReleasedDuring released(mu);
  next(this, mu);
}

bool CondVar::WaitWithTimeout(Mutex* mu, Duration timeout) {
  static const auto next = Next<bool (*)(CondVar*, Mutex*, Duration)>(
      "7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  ReleasedDuring released(mu);
  return next(this, mu, timeout);
}

bool CondVar::WaitWithDeadline(Mutex* mu, Time deadline) {
  static const auto next =
      Next<bool (*)(CondVar*, Mutex*, Time)>("7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  ReleasedDuring released(mu);
  return next(this, mu, deadline);
}

// What a thread did before Notify() happens before what a thread does after
// its wait returns true (or HasBeenNotified() does).
void Notification::Notify() {
  static const auto next = Next<void (*)(Notification*)>("12Notification6NotifyEv");
  Interposed call;
  if (call.outermost()) __tsan_release(NotifiedFlag(this));
  next(this);
}

void Notification::WaitForNotification() const {
  static const auto next = Next<void (*)(const Notification*)>(
      "12Notification19WaitForNotificationEv", /*is_const=*/true);
  Interposed call;
  next(this);
  if (call.outermost()) __tsan_acquire(NotifiedFlag(this));
}

bool Notification::WaitForNotificationWithTimeout(Duration timeout) const {
  static const auto next = Next<bool (*)(const Notification*, Duration)>(
      "12Notification30WaitForNotificationWithTimeoutENS0_8DurationE", /*is_const=*/true);
  Interposed call;
  const bool notified = next(this, timeout);
  if (notified && call.outermost()) __tsan_acquire(NotifiedFlag(this));
  return notified;
}

bool Notification::WaitForNotificationWithDeadline(Time deadline) const {
  static const auto next = Next<bool (*)(const Notification*, Time)>(
      "12Notification31WaitForNotificationWithDeadlineENS0_4TimeE", /*is_const=*/true);
  Interposed call;
  const bool notified = next(this, deadline);
  if (notified && call.outermost()) __tsan_acquire(NotifiedFlag(this));
  return notified;
}

// What each thread did before DecrementCount() happens before what follows
// Wait(), and before what follows the DecrementCount() that returns true.
bool BlockingCounter::DecrementCount() {
  static const auto next = Next<bool (*)(BlockingCounter*)>("15BlockingCounter14DecrementCountEv");
  Interposed call;
  if (call.outermost()) __tsan_release(this);
  const bool last = next(this);
  if (last && call.outermost()) __tsan_acquire(this);
  return last;
}

void BlockingCounter::Wait() {
  static const auto next = Next<void (*)(BlockingCounter*)>("15BlockingCounter4WaitEv");
  Interposed call;
  next(this);
  if (call.outermost()) __tsan_acquire(this);
}

ABSL_NAMESPACE_END
}  // namespace absl

#endif  // defined(__SANITIZE_THREAD__)
