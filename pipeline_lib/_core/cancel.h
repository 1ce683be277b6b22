// Cooperative cancellation of long native calls (no Python here: the bindings plug in the
// signal check).
//
// A call that may run long creates one `Scope` and every thread working for it binds it
// (`Bind`). Long loops fetch their thread's `Poll` once (`current()`) and call
// `tick(units)` as they go, units being roughly bytes or elements processed: a decrement
// and a branch until ~kBudget units have passed (~0.1-3 ms of work), then a real check:
//
//   * cancel_all() ran since the call started (a global epoch) -> stop;
//   * another thread of the same call stopped -> stop;
//   * the scope has a signal check (the call started on Python's main thread) and
//     kSignalEvery passed since the last one: run it (it takes the GIL and calls
//     PyErr_CheckSignals()); a handler that raised -> stop.
//
// Stopping throws `Cancelled`; everything is RAII, so the call unwinds, frees what it
// allocated and joins its threads. A thread with no scope bound gets a private Poll that
// never fires, so the core also runs outside the bindings.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>

namespace tokcore {

struct Cancelled : std::exception {
    const char* what() const noexcept override { return "native call cancelled"; }
};

namespace cancel {

inline std::atomic<uint64_t>& epoch() {
    static std::atomic<uint64_t> e{0};
    return e;
}

// Stop every call that started before now; later calls run normally.
inline void cancel_all() { epoch().fetch_add(1, std::memory_order_relaxed); }

// Returns true when the call must stop (a Python signal handler raised).
using SignalCheck = bool (*)();

class Scope {
public:
    explicit Scope(SignalCheck signals = nullptr)
        : start_(epoch().load(std::memory_order_relaxed)), signals_(signals) {}
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

    bool cancelled() const {
        return stopped_.load(std::memory_order_relaxed) || epoch().load(std::memory_order_relaxed) != start_;
    }
    void stop() { stopped_.store(true, std::memory_order_relaxed); }
    SignalCheck signals() const { return signals_; }

private:
    uint64_t start_;
    SignalCheck signals_;
    std::atomic<bool> stopped_{false};
};

class Poll {
public:
    static constexpr int64_t kBudget = int64_t{1} << 16;
    static constexpr std::chrono::milliseconds kSignalEvery{50};

    Poll() = default;
    // `with_signals`: this thread may run the scope's signal check (only the thread that
    // made the call: PyErr_CheckSignals is a no-op elsewhere).
    Poll(Scope* scope, bool with_signals)
        : scope_(scope), signals_(with_signals ? scope->signals() : nullptr),
          last_signal_check_(std::chrono::steady_clock::now()) {}

    void tick(uint64_t units = 1) {
        left_ -= static_cast<int64_t>(units);
        if (left_ < 0) check();
    }

    Scope* scope() const { return scope_; }

    void check() {
        left_ = kBudget;
        if (scope_ == nullptr) return;
        if (scope_->cancelled()) throw Cancelled();
        if (signals_ == nullptr) return;
        const auto now = std::chrono::steady_clock::now();
        if (now - last_signal_check_ < kSignalEvery) return;
        last_signal_check_ = now;
        if (signals_()) {
            scope_->stop();
            throw Cancelled();
        }
    }

private:
    int64_t left_ = kBudget;
    Scope* scope_ = nullptr;
    SignalCheck signals_ = nullptr;
    std::chrono::steady_clock::time_point last_signal_check_{};
};

inline Poll*& current_slot() {
    thread_local Poll* p = nullptr;
    return p;
}

// This thread's Poll: the bound scope's, or an idle one.
inline Poll& current() {
    Poll* p = current_slot();
    if (p != nullptr) return *p;
    thread_local Poll idle;
    return idle;
}

// Binds `scope` to this thread for its lifetime (restoring what was bound before).
class Bind {
public:
    Bind(Scope* scope, bool with_signals) : poll_(scope, with_signals), saved_(current_slot()) {
        current_slot() = &poll_;
    }
    ~Bind() { current_slot() = saved_; }
    Bind(const Bind&) = delete;
    Bind& operator=(const Bind&) = delete;

private:
    Poll poll_;
    Poll* saved_;
};

}  // namespace cancel
}  // namespace tokcore
