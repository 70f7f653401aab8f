// pss/distribute.hpp: the distribution strategy interface (tf.distribute.Strategy), its scope, and the
// default strategy that holds the variables made outside any scope.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include <xtensor/xarray.hpp>
#include <xtensor/xreducer.hpp>

#include <pss/concepts/optimizer.hpp>
#include <pss/config.hpp>
#include <pss/dtype.hpp>
#include <pss/errors.hpp>
#include <pss/initializer.hpp>
#include <pss/message.hpp>
#include <pss/optimizer/sgd.hpp>
#include <pss/server.hpp>
#include <pss/tensor.hpp>
#include <pss/timeouts.hpp>
#include <pss/variable.hpp>

PSS_NAMESPACE_BEGIN

namespace detail {

/// How a coordinator reaches worker tasks that run in other processes: a call request to worker `worker`,
/// and whether a lost worker is up again.
class RemoteWorkers {
public:
    virtual ~RemoteWorkers() = default;
    virtual std::future<Reply> call(int worker, Request request) = 0;
    /// Asks worker `worker` whether it is up, once: ok when it answers, unavailable at once when nothing
    /// listens at its address (no wait for it to start).
    virtual std::future<Reply> probe(int worker) = 0;
    /// The cluster's timeouts: a lost worker is probed every heartbeat interval, and a coordinator whose
    /// every worker is lost waits the start-up timeout for one to come back.
    [[nodiscard]] virtual const Timeouts& timeouts() const noexcept = 0;
};

}  // namespace detail

/// @brief How `Strategy::reduce` combines values (tf.distribute.ReduceOp).
enum class ReduceOp { sum, mean };

/// @brief The distribution strategy interface (tf.distribute.Strategy): places the variables created
/// while its scope is active.
class Strategy {
public:
    Strategy() = default;
    Strategy(const Strategy&) = delete;
    Strategy& operator=(const Strategy&) = delete;
    virtual ~Strategy() = default;

    /// @brief Replicas that compute one step in lockstep: 1 for parameter-server training on CPU workers.
    [[nodiscard]] virtual int num_replicas_in_sync() const = 0;

    /// @brief Creates a variable from `initial_value` (moved) and places its shards.
    virtual Variable create_variable(Tensor initial_value, std::string name) = 0;

    /// @brief Creates a variable of `shape` and `dtype` whose first values `initializer` draws where each
    /// shard lives (a ps task), and places its shards; see `Variable(shape, dtype, initializer, name)`.
    /// @throws InvalidArgumentError for an initializer InitializerSpec::problem refuses
    Variable create_variable(const Shape& shape, DType dtype, const InitializerSpec& initializer, std::string name) {
        return create_initialized_variable(shape, dtype, initializer, std::move(name));
    }

    /// @brief TensorFlow's `strategy.run(fn, args)`: runs `fn(args...)` on each replica of the worker
    /// running the current closure and gives its per-replica value. Every strategy here has one replica
    /// per worker (num_replicas_in_sync() is 1, as TensorFlow's ParameterServerStrategy on CPU workers),
    /// so `fn` runs once, on this thread, and its value is the per-replica value; a TensorFlow step of
    /// the form `strategy.run(replica_fn, args)` then `strategy.reduce(...)` ports as it is.
    template <class F, class... Args>
    decltype(auto) run(F&& fn, Args&&... args) {
        return std::invoke(std::forward<F>(fn), std::forward<Args>(args)...);
    }

    /// @brief TensorFlow's `strategy.reduce(op, value, axis=None)`: the replicas' values combined by
    /// `op`; with one replica, the value itself.
    template <class T>
    [[nodiscard]] T reduce(ReduceOp, T value) const {
        return value;
    }

    /// @brief TensorFlow's `strategy.reduce(op, value, axis)`: also sums (or averages) along `axis`, as
    /// a per-example loss is reduced to the batch's (an integer mean divides as integers do).
    /// @throws InvalidArgumentError when `value` has no axis `axis`
    template <Element T>
    [[nodiscard]] xt::xarray<T> reduce(ReduceOp op, const xt::xarray<T>& value, std::size_t axis) const {
        if (axis >= value.dimension())
            throw InvalidArgumentError("pss: strategy.reduce along axis " + std::to_string(axis) + " of a value of " +
                                       std::to_string(value.dimension()) + " axes");
        xt::xarray<T> out = xt::sum(value, {axis});
        if (op == ReduceOp::mean && value.shape()[axis] != 0) out /= static_cast<T>(value.shape()[axis]);
        return out;
    }

    /// @brief RAII guard of a strategy's scope (Python's `with strategy.scope():`).
    class [[nodiscard]] Scope {
    public:
        explicit Scope(Strategy& strategy) : previous_(current()) { current() = &strategy; }
        Scope(const Scope&) = delete;
        Scope& operator=(const Scope&) = delete;
        ~Scope() { current() = previous_; }

    private:
        Strategy* previous_;
    };

    /// @brief Makes this strategy current on this thread until the returned guard is destroyed.
    [[nodiscard]] Scope scope() { return Scope(*this); }

    /// @brief The strategy whose scope is active on this thread, or nullptr.
    [[nodiscard]] static Strategy*& current() noexcept {
        thread_local Strategy* strategy = nullptr;
        return strategy;
    }

    /// @brief The worker tasks when they are other processes; nullptr when they are threads of this one.
    [[nodiscard]] virtual detail::RemoteWorkers* remote_workers() noexcept { return nullptr; }

protected:
    /// How a strategy creates a variable from an initializer. This default draws the whole value in
    /// this process and creates the variable from it: right for a strategy that keeps its variables here.
    virtual Variable create_initialized_variable(const Shape& shape, DType dtype, const InitializerSpec& initializer,
                                                 std::string name) {
        detail::check_initializer(name, shape, dtype, initializer);
        return create_variable(detail::initial_value(initializer, dtype, shape), std::move(name));
    }

private:
    friend class ClusterCoordinator;
    std::mutex coordinator_mutex_;
    std::weak_ptr<void> coordinator_;  // the ClusterCoordinator's shared state while one exists
};

namespace detail {

/// This process's device, as TensorFlow names where a variable created outside any scope lives:
/// "/job:localhost/replica:0/task:0/device:CPU:0", or this task's once a strategy made this process one
/// task of a multi-process cluster ("/job:chief/replica:0/task:0/device:CPU:0").
class LocalDevice {
public:
    static std::string get() {
        std::lock_guard lock(mutex());
        return name();
    }
    static void set(std::string device) {
        std::lock_guard lock(mutex());
        name() = std::move(device);
    }

private:
    static std::mutex& mutex() {
        static std::mutex m;
        return m;
    }
    static std::string& name() {
        static std::string n = "/job:localhost/replica:0/task:0/device:CPU:0";
        return n;
    }
};

/// The coordinator's own store: a ParameterServer run by the calling thread, behind a lock.
class LocalChannel final : public Channel {
public:
    PSS_INLINE std::future<Reply> send(int, Request request) override;  // the key function (see PSS_INLINE)
    [[nodiscard]] std::string device(int) const override { return LocalDevice::get(); }
    [[nodiscard]] bool shares_memory() const noexcept override { return true; }

private:
    std::mutex mutex_;
    ParameterServer<SGD> server_;
};

}  // namespace detail


/// @brief The strategy used outside any scope (TensorFlow's default strategy): variables live on the
/// coordinator, in this process.
class DefaultStrategy final : public Strategy {
public:
    [[nodiscard]] PSS_INLINE int num_replicas_in_sync() const override;  // the key function (see PSS_INLINE)
    using Strategy::create_variable;
    Variable create_variable(Tensor initial_value, std::string name) override {
        const std::uint64_t id = next_id_.fetch_add(1);
        return detail::create_sharded(channel_, id, std::move(name), std::move(initial_value), {1}, {-1});
    }

private:
    std::shared_ptr<detail::Channel> channel_ = std::make_shared<detail::LocalChannel>();
    std::atomic<std::uint64_t> next_id_{1};
};

namespace detail {

/// A store in this process, run by the calling thread behind a lock, for OneDeviceStrategy: its own
/// optimizer and device name.
template <class OptimizerPolicy>
class DeviceChannel final : public Channel {
public:
    DeviceChannel(OptimizerPolicy optimizer, std::string device) : server_(std::move(optimizer)), device_(std::move(device)) {}
    std::future<Reply> send(int, Request request) override {
        std::promise<Reply> p;
        {
            std::lock_guard lock(mutex_);
            p.set_value(server_.handle(std::move(request)));
        }
        return p.get_future();
    }
    [[nodiscard]] std::string device(int) const override { return device_; }
    [[nodiscard]] bool shares_memory() const noexcept override { return true; }

private:
    std::mutex mutex_;
    ParameterServer<OptimizerPolicy> server_;
    std::string device_;
};

/// TensorFlow's spelling of this process's CPU `index`.
inline std::string local_cpu(const std::string& index) { return "/job:localhost/replica:0/task:0/device:CPU:" + index; }

}  // namespace detail

/// @brief TensorFlow's `tf.distribute.OneDeviceStrategy(device)`: the variables created in its scope
/// live in this process, on that device, and `Optimizer` applies their gradients; the same `scope()`,
/// `run`, `reduce` and `get_strategy()` as the parameter-server strategies, so that code written
/// against `pss::Strategy&` switches between them (a debugging run on one machine, say).
///
/// @par Example
/// @code
/// pss::OneDeviceStrategy<> strategy("/cpu:0");
/// auto scope = strategy.scope();
/// pss::Variable w(xt::xarray<float>{1, 2}, "w");  // w.device() is "/job:localhost/replica:0/task:0/device:CPU:0"
/// @endcode
template <Optimizer OptimizerPolicy = SGD>
class OneDeviceStrategy final : public Strategy {
public:
    /// @param device a CPU of this process, as TensorFlow spells it: "/cpu:0", "/CPU:0", "/device:CPU:0",
    ///        or the full "/job:localhost/replica:0/task:0/device:CPU:0"
    /// @throws InvalidArgumentError for another device (a GPU: pss holds variables in CPU memory)
    explicit OneDeviceStrategy(const std::string& device = "/cpu:0", OptimizerPolicy optimizer = {})
        : channel_(std::make_shared<detail::DeviceChannel<OptimizerPolicy>>(std::move(optimizer), canonical(device))) {}

    [[nodiscard]] int num_replicas_in_sync() const override { return 1; }
    /// @brief The device, as TensorFlow names it: "/job:localhost/replica:0/task:0/device:CPU:0".
    [[nodiscard]] std::string device() const { return channel_->device(-1); }
    using Strategy::create_variable;
    Variable create_variable(Tensor initial_value, std::string name) override {
        const std::uint64_t id = next_id_.fetch_add(1);
        const std::size_t rows = initial_value.has_value() && initial_value.rank() > 0 ? initial_value.shape()[0] : 0;
        return detail::create_sharded(channel_, id, std::move(name), std::move(initial_value), {rows}, {-1});
    }

private:
    static std::string canonical(const std::string& device) {
        for (const char* prefix : {"/cpu:", "/CPU:", "/device:CPU:", "/job:localhost/replica:0/task:0/device:CPU:"}) {
            const std::string p(prefix);
            const std::string index = device.starts_with(p) ? device.substr(p.size()) : std::string();
            if (!index.empty() && index.find_first_not_of("0123456789") == std::string::npos)
                return detail::local_cpu(index);
        }
        throw InvalidArgumentError("pss: OneDeviceStrategy: device \"" + device +
                                   "\" is not a CPU of this process; pss holds variables in CPU memory: give \"/cpu:0\"");
    }

    std::shared_ptr<detail::DeviceChannel<OptimizerPolicy>> channel_;
    std::atomic<std::uint64_t> next_id_{1};
};

/// @brief The strategy whose scope is active on this thread; outside any scope, the process's
/// DefaultStrategy (variables on the coordinator), as tf.distribute.get_strategy().
[[nodiscard]] inline Strategy& get_strategy() {
    if (Strategy* s = Strategy::current()) return *s;
    static DefaultStrategy default_strategy;
    return default_strategy;
}

/// @brief True when a strategy's scope is active on this thread (tf.distribute.has_strategy()).
[[nodiscard]] inline bool has_strategy() noexcept { return Strategy::current() != nullptr; }

// Declared in variable.hpp: creating a variable from a value goes through the current strategy.
inline Variable::Variable(Tensor initial_value, std::string name)
    : Variable(get_strategy().create_variable(std::move(initial_value), std::move(name))) {}

inline Variable::Variable(const Shape& shape, DType dtype, const InitializerSpec& initializer, std::string name)
    : Variable(get_strategy().create_variable(shape, dtype, initializer, std::move(name))) {}

#if PSS_DEFINITIONS
// The key functions (see PSS_INLINE in pss/config.hpp).
PSS_INLINE std::future<Reply> detail::LocalChannel::send(int, Request request) {
    std::promise<Reply> p;
    {
        std::lock_guard lock(mutex_);
        p.set_value(server_.handle(std::move(request)));
    }
    return p.get_future();
}
PSS_INLINE int DefaultStrategy::num_replicas_in_sync() const { return 1; }
#endif

PSS_NAMESPACE_END
