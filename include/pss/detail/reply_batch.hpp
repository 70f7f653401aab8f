// pss/detail/reply_batch.hpp: replies of requests sent together, waited for as one.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <future>
#include <mutex>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include <pss/config.hpp>
#include <pss/message.hpp>

PSS_NAMESPACE_BEGIN

namespace detail {

/// The replies of requests sent together (the shards of one Variable operation, or a Group's writes),
/// waited for as one: a transport stores each reply in its slot, and the waiting thread is woken once,
/// when the last one came. A future per request wakes its waiter once per reply that was not in yet
/// (a futex call each: what bounded 1,000 pushes in flight).
///
/// Slots are added by one thread (the sender's), replies delivered from any.
class ReplyBatch {
public:
    /// A slot for one more reply, still to come.
    [[nodiscard]] std::size_t add() {
        std::lock_guard lock(mutex_);
        slots_.emplace_back();
        outstanding_.fetch_add(1, std::memory_order_relaxed);
        return slots_.size() - 1;
    }

    /// Stores the reply of slot `index`, and wakes the waiting thread when it was the last. A slot
    /// answered already keeps its first reply.
    void deliver(std::size_t index, Reply&& reply) noexcept {
        std::lock_guard lock(mutex_);
        if (slots_[index].ready || slots_[index].attached) return;
        slots_[index].reply = std::move(reply);
        slots_[index].ready = true;
        if (outstanding_.fetch_sub(1, std::memory_order_acq_rel) == 1 && waiting_) done_.notify_all();
    }

    /// The reply of slot `index` comes through `future` instead (a transport that fills no slot).
    void attach(std::size_t index, std::future<Reply> future) {
        std::lock_guard lock(mutex_);
        slots_[index].future = std::move(future);
        slots_[index].attached = true;
        outstanding_.fetch_sub(1, std::memory_order_acq_rel);
    }

    /// Waits for every reply.
    void wait() { (void)wait_for(std::chrono::nanoseconds::max()); }

    /// Waits up to `timeout` for every reply; true when all came. Only the thread that adds the slots waits.
    bool wait_for(std::chrono::nanoseconds timeout) {
        const bool forever = timeout == std::chrono::nanoseconds::max();
        const auto deadline = forever ? std::chrono::steady_clock::time_point::max() : std::chrono::steady_clock::now() + timeout;
        // A short spin first: an in-process reply often comes within microseconds, and a sleeping
        // thread's wake-up costs more (bench_ctr's synchronous steps ran 35% slower without it). Not
        // for many replies (a Group's writes), which take longer than a spin, and whose yields take the
        // cores from the threads that answer them.
        if (outstanding_.load(std::memory_order_acquire) <= spin_outstanding)
            for (int spin = 0; spin < 200 && outstanding_.load(std::memory_order_acquire) != 0; ++spin) std::this_thread::yield();
        std::unique_lock lock(mutex_);
        if (outstanding_.load(std::memory_order_acquire) != 0) {
            waiting_ = true;
            const auto all_in = [&] { return outstanding_.load(std::memory_order_acquire) == 0; };
            const bool in = forever ? (done_.wait(lock, all_in), true) : done_.wait_until(lock, deadline, all_in);
            waiting_ = false;
            if (!in) return false;
        }
        // Replies that come by futures are waited for without the lock, which deliveries into other slots
        // take, and within the one deadline. Only this thread touches an attached slot's future.
        std::vector<Slot*> by_future;
        for (auto& slot : slots_)
            if (!slot.ready && slot.attached && slot.future.valid()) by_future.push_back(&slot);
        lock.unlock();
        for (Slot* slot : by_future) {
            if (!forever && slot->future.wait_until(deadline) != std::future_status::ready) return false;
            Reply reply = slot->future.get();
            const std::lock_guard relock(mutex_);
            slot->reply = std::move(reply);
            slot->ready = true;
        }
        return true;
    }

    /// True when slot `index`'s reply is in.
    [[nodiscard]] bool ready(std::size_t index) {
        std::lock_guard lock(mutex_);
        auto& slot = slots_[index];
        if (!slot.ready && slot.future.valid() && slot.future.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
            slot.reply = slot.future.get();
            slot.ready = true;
        }
        return slot.ready;
    }

    /// Slot `index`'s reply, once ready.
    [[nodiscard]] Reply take(std::size_t index) {
        std::lock_guard lock(mutex_);
        return std::move(slots_[index].reply);
    }

    /// The number of slots added since the last clear.
    [[nodiscard]] std::size_t size() {
        std::lock_guard lock(mutex_);
        return slots_.size();
    }

    /// Forgets every slot, once every reply is in (after wait).
    void clear() {
        std::lock_guard lock(mutex_);
        slots_.clear();
    }

private:
    static constexpr std::size_t spin_outstanding = 16;

    struct Slot {
        Reply reply;
        std::future<Reply> future;
        bool ready = false;
        bool attached = false;  // its reply comes by `future`, not by deliver
    };
    std::mutex mutex_;
    std::condition_variable done_;
    std::deque<Slot> slots_;  // a deque: delivering into one slot while another is added moves none
    std::atomic<std::size_t> outstanding_{0};
    bool waiting_ = false;
};

/// Where a transport delivers a request's reply: the request's ReplyBatch slot when it has one
/// (Request::in_process.reply_to), else the promise of the future its `send` returns.
class ReplyTarget {
public:
    ReplyTarget() = default;
    ReplyTarget(ReplyTarget&& other) noexcept : to_(std::exchange(other.to_, std::monostate{})) {}
    ReplyTarget& operator=(ReplyTarget&& other) noexcept {
        if (this != &other) {
            drop();
            to_ = std::exchange(other.to_, std::monostate{});
        }
        return *this;
    }
    ReplyTarget(const ReplyTarget&) = delete;
    ReplyTarget& operator=(const ReplyTarget&) = delete;
    /// One destroyed before it delivered answers `unavailable`: a waiter never waits for ever.
    ~ReplyTarget() { drop(); }

    /// Takes the reply slot out of `request`, if any. The future is the one `send` returns: invalid
    /// when the reply goes to the slot.
    [[nodiscard]] static std::pair<ReplyTarget, std::future<Reply>> of(Request& request) {
        ReplyTarget target;
        if (request.in_process.reply_to) {
            target.to_ = std::exchange(request.in_process.reply_to, {});
            return {std::move(target), std::future<Reply>{}};
        }
        auto& promise = target.to_.emplace<std::promise<Reply>>();
        auto future = promise.get_future();
        return {std::move(target), std::move(future)};
    }

    /// Delivers `reply`; a second call does nothing.
    void operator()(Reply&& reply) noexcept {
        if (auto* promise = std::get_if<std::promise<Reply>>(&to_)) {
            promise->set_value(std::move(reply));
        } else if (auto* slot = std::get_if<ReplySlot>(&to_); slot != nullptr && *slot) {
            slot->batch->deliver(slot->index, std::move(reply));
        } else {
            return;
        }
        to_ = std::monostate{};
    }

    /// True until it delivered (false for an empty one).
    [[nodiscard]] explicit operator bool() const noexcept { return !std::holds_alternative<std::monostate>(to_); }

private:
    void drop() noexcept {
        if (*this)
            (*this)(Reply::error(ErrorCode::unavailable,
                                 "pss: the request was dropped before it was answered (its transport stopped)"));
    }

    std::variant<std::monostate, std::promise<Reply>, ReplySlot> to_;
};

}  // namespace detail

PSS_NAMESPACE_END
