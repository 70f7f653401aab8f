// pss/transport/in_process.hpp: InProcessTransport, every task a thread of one process, payloads moved.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include <pss/cluster/cluster_spec.hpp>
#include <pss/config.hpp>
#include <pss/detail/reply_batch.hpp>
#include <pss/message.hpp>

PSS_NAMESPACE_BEGIN

/// @brief The embedded transport: each served task is its own thread, owning its state, with a mailbox.
///
/// `send` moves the Request (and so its tensor buffer) into the task's mailbox; the task's thread runs
/// the handler, whose Responder moves the Reply into the future, then or later (from any thread). A
/// variable operation sent to an idle task runs on the sending thread, still one request of the task at
/// a time and in order (see Mailbox). No element is copied; a task's state is touched only by the one
/// request running on it, and a gather may write into its caller's result (Request::into). Models the
/// Transport concept.
class InProcessTransport {
public:
    /// Its tasks are threads of this process: a gather may write into the caller's result (Request::into).
    static constexpr bool shares_memory = true;

    explicit InProcessTransport(const ClusterSpec& spec) : spec_(spec) {}
    InProcessTransport(const InProcessTransport&) = delete;
    InProcessTransport& operator=(const InProcessTransport&) = delete;
    ~InProcessTransport() { shutdown(); }

    /// @brief Starts `task`'s thread, which hands every request to `handler` with its Responder.
    /// @throws InvalidArgumentError when `task` is not in the cluster spec or is served already.
    void serve(const TaskId& task, RequestHandler handler) {
        if (task.index < 0 || task.index >= spec_.num_tasks(task.type))
            throw InvalidArgumentError("pss: InProcessTransport: task " + task.to_string() +
                                       " is not in the cluster spec");
        std::lock_guard lock(tasks_mutex_);
        auto& slot = tasks_[key(task)];
        if (slot) throw InvalidArgumentError("pss: InProcessTransport: task " + task.to_string() + " is served twice");
        slot = std::make_shared<Mailbox>(std::move(handler));
    }

    /// @brief Moves `request` to `task`; the future becomes ready when the task's handler answers it.
    std::future<Reply> send(const TaskId& task, Request request) {
        std::shared_ptr<Mailbox> box;
        {
            std::lock_guard lock(tasks_mutex_);
            if (auto it = tasks_.find(key(task)); it != tasks_.end()) box = it->second;
        }
        auto [target, future] = detail::ReplyTarget::of(request);
        if (box == nullptr || !box->post(std::move(request), target))
            target(Reply::error(ErrorCode::unavailable,
                                "pss: task " + task.to_string() + " is not serving (never started, or shut down)"));
        return std::move(future);
    }

    /// @brief Hands the requests already queued to their handlers, then stops every task's thread.
    /// Idempotent. A reply held by a handler comes when the handler answers (or drops) it.
    void shutdown() {
        std::map<std::string, std::shared_ptr<Mailbox>> tasks;
        {
            std::lock_guard lock(tasks_mutex_);
            tasks.swap(tasks_);
        }
        for (auto& [name, box] : tasks) box->close();
    }

private:
    /// A task's queue and thread. A variable operation sent while the task is idle (nothing queued,
    /// nothing running) runs at once on the sending thread instead: the requests of one task still run
    /// one at a time and in the order sent, and an embedding lookup or a small push costs no wake-up of
    /// another thread (on this 2-core machine a wake-up cost more than the lookup itself).
    class Mailbox {
    public:
        explicit Mailbox(RequestHandler handler) : handler_(std::move(handler)), thread_([this] { run(); }) {}
        ~Mailbox() { close(); }

        /// False when the mailbox is closed: the request was not taken, and `target` is left to answer.
        bool post(Request request, detail::ReplyTarget& target) {
            {
                std::unique_lock lock(mutex_);
                if (closed_) return false;
                if (!queue_.empty() || busy_ || !runs_on_sender(request)) {
                    queue_.emplace_back(std::move(request), std::move(target));
                    pending_.store(true, std::memory_order_release);
                    lock.unlock();
                    ready_.notify_one();
                    return true;
                }
                busy_ = true;
            }
            handle(std::move(request), std::move(target));
            return true;
        }

        void close() {
            {
                std::lock_guard lock(mutex_);
                closed_ = true;
            }
            ready_.notify_all();
            std::lock_guard join_lock(join_mutex_);
            if (thread_.joinable()) thread_.join();
            std::unique_lock lock(mutex_);  // a request running on its sender's thread ends first
            ready_.wait(lock, [&] { return !busy_; });
        }

    private:
        /// What a sender may run itself: variable operations that touch memory only. Checkpoint files,
        /// creation and calls stay on the task's thread (the ps tasks save their shards in parallel).
        static bool runs_on_sender(const Request& request) noexcept {
            return request.kind == RequestKind::operation && (is_pull(request.op) || is_push(request.op));
        }

        /// Runs one request (busy_ is set), then lets the next one run.
        void handle(Request&& request, detail::ReplyTarget&& target) {
            struct Done {  // also when the handler throws
                Mailbox& box;
                ~Done() {
                    bool wake = false;
                    {
                        std::lock_guard lock(box.mutex_);
                        box.busy_ = false;
                        wake = !box.queue_.empty() || box.closed_;
                    }
                    if (wake) box.ready_.notify_all();
                }
            } done{*this};
            handler_(std::move(request), Responder(std::move(target)));
        }

        void run() {
            for (;;) {
                // A short spin before sleeping: a training loop sends its next request within microseconds,
                // and waking a sleeping thread costs more than the request itself for small payloads. Kept
                // because it measures faster: without it (the condition variable alone), a 1 MB push of
                // bench_in_process took 98 to 113 us against 77 to 87 us with it, on a loaded 2-core machine.
                for (int spin = 0; spin < 200 && !pending_.load(std::memory_order_acquire); ++spin)
                    std::this_thread::yield();
                std::unique_lock lock(mutex_);
                ready_.wait(lock, [&] { return (!queue_.empty() && !busy_) || (closed_ && queue_.empty()); });
                if (queue_.empty()) return;  // closed, and everything queued has been handled
                auto [request, target] = std::move(queue_.front());
                queue_.pop_front();
                pending_.store(!queue_.empty(), std::memory_order_release);
                busy_ = true;
                lock.unlock();
                handle(std::move(request), std::move(target));
            }
        }

        RequestHandler handler_;
        std::mutex mutex_;
        std::condition_variable ready_;
        std::deque<std::pair<Request, detail::ReplyTarget>> queue_;
        bool closed_ = false;
        bool busy_ = false;                 // a request is running, on this thread or on its sender's
        std::atomic<bool> pending_{false};  // the queue is not empty; read without the lock while spinning
        std::mutex join_mutex_;
        std::thread thread_;  // last: it starts after everything it uses exists
    };

    static std::string key(const TaskId& task) { return task.type + ":" + std::to_string(task.index); }

    ClusterSpec spec_;
    std::mutex tasks_mutex_;
    std::map<std::string, std::shared_ptr<Mailbox>> tasks_;
};

PSS_NAMESPACE_END
