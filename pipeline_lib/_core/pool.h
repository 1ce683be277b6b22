// Helper threads kept from call to call. A thread started and joined per call cost 50-80 us of
// CPU time (most of it in the kernel) for a batch of 64 KB, more than the second thread saved,
// and 0.3 ms for a text of 1 MB.
//
// run(helpers, task) calls task(0) on the calling thread and task(1), ..., task(helpers) on pool
// threads, and returns once every one that started has returned: a slot that no pool thread has
// taken when task(0) returns is dropped, so a task must leave nothing undone that the others need
// it for (encode_batch's workers take chunks from a shared counter until none are left). Tasks
// must not throw. Pool threads never run Python code, so they need no care at interpreter exit;
// they wait on a condition variable for work, and end after kIdleExit without any. A child made
// by fork() starts with a pool of its own (the parent's threads are not in it).
#pragma once

#include <pthread.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <system_error>
#include <thread>

namespace tokcore {

class HelperPool {
public:
    using Task = std::function<void(size_t)>;

    static HelperPool& get() {
        static const bool registered = [] {
            pthread_atfork(nullptr, nullptr, [] { instance() = new HelperPool(); });  // the old one leaks
            return true;
        }();
        (void)registered;
        return *instance();
    }

    void run(size_t helpers, const Task& task) {
        Job job{&task, helpers};
        if (helpers > 0) {
            std::lock_guard<std::mutex> lock(mu_);
            jobs_.push_back(&job);
            unclaimed_ += helpers;
            while (idle_ + starting_ < unclaimed_ && threads_ < kMaxThreads) {
                try {
                    std::thread(&HelperPool::loop, this).detach();
                } catch (const std::system_error&) {
                    break;  // no thread can start now: fewer helpers, task(0) does their share
                }
                ++threads_;
                ++starting_;
            }
            work_.notify_all();
        }
        task(0);
        if (helpers == 0) return;
        std::unique_lock<std::mutex> lock(mu_);
        if (job.claimed < job.slots) {  // still queued: no other thread takes a slot from now on
            for (auto it = jobs_.begin(); it != jobs_.end(); ++it) {
                if (*it == &job) {
                    jobs_.erase(it);
                    break;
                }
            }
            unclaimed_ -= job.slots - job.claimed;
        }
        job.closed = true;
        job.finished.wait(lock, [&] { return job.running == 0; });
    }

private:
    static constexpr size_t kMaxThreads = 256;
    // A pool thread idle this long ends, so that a process that stopped encoding holds no threads
    // (Python 3.12 warns at fork() in a process that has threads).
    static constexpr std::chrono::seconds kIdleExit{2};

    struct Job {
        Job(const Task* t, size_t n) : task(t), slots(n) {}
        const Task* task;
        size_t slots;
        size_t claimed = 0;  // slots taken by pool threads (the lock held)
        size_t running = 0;  // of those, the ones not returned yet
        bool closed = false;
        std::condition_variable finished;
    };

    static HelperPool*& instance() {
        static HelperPool* pool = new HelperPool();  // never destroyed: its threads outlive main()
        return pool;
    }

    void loop() {
        pthread_setname_np(pthread_self(), "tokenmill-pool");  // as ps, top and /proc show it
        std::unique_lock<std::mutex> lock(mu_);
        --starting_;
        for (;;) {
            ++idle_;
            const bool work = work_.wait_for(lock, kIdleExit, [&] { return !jobs_.empty(); });
            --idle_;
            if (!work) {  // idle for a while: the thread ends (a later call starts another)
                --threads_;
                return;
            }
            Job* job = jobs_.front();
            const size_t slot = ++job->claimed;
            --unclaimed_;
            if (job->claimed == job->slots) jobs_.pop_front();
            ++job->running;
            lock.unlock();
            (*job->task)(slot);
            lock.lock();
            if (--job->running == 0 && job->closed) job->finished.notify_all();
        }
    }

    std::mutex mu_;
    std::condition_variable work_;
    std::deque<Job*> jobs_;
    size_t unclaimed_ = 0;  // slots of queued jobs that no thread has taken
    size_t threads_ = 0, idle_ = 0, starting_ = 0;
};

}  // namespace tokcore
