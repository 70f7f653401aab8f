// pss/variable.hpp: Variable, the client handle of a variable (sharded or not) held by ps tasks.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <concepts>
#include <cstdio>
#include <exception>
#include <thread>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <future>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <xtensor/xarray.hpp>

#include <pss/compression.hpp>
#include <pss/config.hpp>
#include <pss/detail/step_profile.hpp>
#include <pss/dtype.hpp>
#include <pss/errors.hpp>
#include <pss/initializer.hpp>
#include <pss/message.hpp>
#include <pss/detail/closure_context.hpp>
#include <pss/detail/reply_batch.hpp>
#include <pss/detail/request_rules.hpp>
#include <pss/partitioner/shard_rows.hpp>
#include <pss/tensor.hpp>

PSS_NAMESPACE_BEGIN

class Variable;
class TensorFuture;

namespace detail {

template <class T>
struct Codec;

/// How a Variable reaches the tasks that hold its shards. A strategy implements it over its transport;
/// the one virtual call per request is the price of a Variable type that does not depend on the
/// strategy's policies (so that layers, functions and containers can hold any strategy's variables).
class Channel {
public:
    virtual ~Channel() = default;
    /// Sends `request` to ps task `task` (or to the coordinator's own store when `task` is -1).
    virtual std::future<Reply> send(int task, Request request) = 0;
    /// TensorFlow's device string of a task: "/job:ps/replica:0/task:1/device:CPU:0".
    [[nodiscard]] virtual std::string device(int task) const = 0;
    /// True when the ps tasks apply pushes by step (synchronous training): then a step's push goes to
    /// every shard, empty where no row falls, so that each shard can count the step complete.
    [[nodiscard]] virtual bool synchronous() const noexcept { return false; }
    /// True when the ps tasks run in this process (the embedded transport, the coordinator's own store):
    /// a gather then writes its rows straight into the caller's result (Request::into).
    [[nodiscard]] virtual bool shares_memory() const noexcept { return false; }
    /// What this process's compressed pushes still owe each shard (Compression's error feedback).
    [[nodiscard]] ErrorFeedback& error_feedback() noexcept { return error_feedback_; }

private:
    ErrorFeedback error_feedback_;
};

/// Sends `request` to `task` through `channel`, its reply into a new slot of `batch`; returns the slot.
inline std::size_t send_into(const std::shared_ptr<ReplyBatch>& batch, Channel& channel, int task, Request request) {
    const std::size_t slot = batch->add();
    request.in_process.reply_to = {batch, slot};
    try {
        if (auto future = channel.send(task, std::move(request)); future.valid()) batch->attach(slot, std::move(future));
    } catch (...) {  // a channel that raises (a simulated worker lost): the slot is answered, nobody waits for ever
        batch->deliver(slot, Reply::of_current_exception());
        throw;
    }
    return slot;
}

struct VariableInfo;

/// The requests of one Variable operation in flight: where each went, the batch their replies come to,
/// and each request as it is sent again when its ps answers "not ready" (a synchronous pull the ps
/// cannot hold). Variable::post sends them; finish waits for the replies.
struct Exchange {
    std::shared_ptr<const VariableInfo> variable;
    Op op = Op::read;
    bool pull = false;
    bool checked = false;
    std::shared_ptr<ReplyBatch> batch = std::make_shared<ReplyBatch>();
    std::vector<int> tasks;
    std::vector<std::size_t> slots;
    std::vector<Request> again;  // each request without its payload

    /// Sends request `i` (again).
    void post(std::size_t i, Request r);
    /// Waits for every reply and returns their payloads, asking again (after a growing pause) where a
    /// ps was not ready; raises the first error once every reply arrived, or CancelledError when the
    /// closure waiting on a held pull was cancelled.
    std::vector<Tensor> finish();
};

/// Where one shard lives and which rows of the whole variable it holds. Its ps task knows it by the
/// key {variable, index}: its own variable's id, or a part's in a variable built from a list.
struct ShardInfo {
    std::uint32_t index = 0;
    int task = -1;
    Shape shape;
    std::size_t row_offset = 0;
    std::uint64_t variable = 0;
};

/// What every handle of one variable shares. The last handle of a whole variable destroys its shards.
struct VariableInfo {
    std::string name;  // without ":0"
    Shape shape;
    DType dtype = DType::float32;
    std::uint64_t id = 0;
    std::vector<ShardInfo> shards;
    std::shared_ptr<Channel> channel;
    std::shared_ptr<const VariableInfo> owner;  // set on a handle to one shard of a sharded variable
    bool borrowed = false;  // a handle received by a worker: the coordinator's handles own the shards
    /// A variable built from a list: one handle per shard, which own them (and are its shards()).
    std::vector<std::shared_ptr<const VariableInfo>> parts;
    /// The shards split the rows by TensorFlow's rule (shard_rows()), so a row's shard is arithmetic;
    /// false only for a variable built from parts of other sizes.
    bool split_by_rule = true;
    /// How its float32 gradients and values travel; a shard's handle follows its owner's.
    mutable std::atomic<Compression> compression{Compression::none};

    VariableInfo() = default;
    VariableInfo(const VariableInfo&) = delete;
    VariableInfo& operator=(const VariableInfo&) = delete;
    ~VariableInfo() {
        if (owner || borrowed || !channel || !parts.empty()) return;
        channel->error_feedback().forget(id);
        for (const auto& shard : shards) {
            Request request;
            request.op = Op::destroy;
            request.key = {shard.variable, shard.index};
            (void)channel->send(shard.task, std::move(request));  // best effort: the task may be gone
        }
    }
};

}  // namespace detail

/// @brief A handle to a variable held by parameter-server tasks (or by the coordinator), as tf.Variable.
///
/// A variable the strategy's partitioner splits along axis 0 has several shards, each on its own ps
/// task and named `name/part_i` (TensorFlow's ShardedVariable); `ShardedVariable` names this same type.
/// A variable holds numbers (float32, float64, int32, int64) or byte strings (DType::string, as a
/// vocabulary): a string variable is read, assigned, gathered (sparse_read, slice) and scatter_updated,
/// and any other operation on it throws InvalidArgumentError before anything is sent.
/// Every operation crosses the transport as requests, one per shard touched, issued in parallel. Each is
/// validated completely before any request is sent, so an operation that fails changes no shard.
/// Handles are cheap to copy and share one variable; the last handle destroys the shards.
///
/// @par Example
/// @code
/// auto scope = strategy.scope();
/// pss::Variable w(xt::xarray<std::int32_t>{1, 2, 3, 4, 5}, "weights");
/// std::cout << w;  // <pss::Variable 'weights:0' shape=(5,) dtype=int32, value=[1, 2, 3, 4, 5]>
/// @endcode
class Variable {
public:
    /// @brief An empty handle; every operation on it throws FailedPreconditionError.
    Variable() = default;

    /// @brief Creates a variable with `initial_value` through `get_strategy()`: on the ps tasks of the
    /// strategy whose scope is active, else on the coordinator. Moves the value: no element is copied.
    /// Defined in <pss/distribute.hpp> (which <pss/pss.hpp> includes), beside get_strategy(): the
    /// handle itself knows no strategy and no server.
    explicit Variable(Tensor initial_value, std::string name = "Variable");

    /// @brief Creates a variable of `shape` and `dtype` whose first values `initializer` draws, on the
    /// ps task of each shard (TensorFlow calls a sharded variable's initializer once per shard, with the
    /// shard's offset): the coordinator never holds the value, so it can create a table larger than its
    /// memory. The values do not depend on how the variable is split (see InitializerSpec). Through
    /// `get_strategy()`, as the constructor from a value; a strategy that keeps variables in this process
    /// draws the value here. Defined in <pss/distribute.hpp>.
    /// @throws InvalidArgumentError naming the variable for an initializer InitializerSpec::problem refuses
    /// (a random one for an integer dtype, bounds out of order, a string dtype)
    ///
    /// @par Example
    /// @code
    /// pss::Variable table(pss::Shape{32'000'000, 32}, pss::DType::float32,
    ///                     pss::InitializerSpec::random_uniform(-0.05, 0.05, 42), "table");
    /// @endcode
    Variable(const Shape& shape, DType dtype, const InitializerSpec& initializer, std::string name = "Variable");

    /// @brief As the constructor from an InitializerSpec, from any initializer that describes itself as
    /// one (Keras' `pss::initializers::RandomUniform(-0.05, 0.05, 42)`, `GlorotUniform()`, ...:
    /// `initializer.spec(shape, seed)`); one without a seed of its own draws with a seed made from the
    /// variable's name.
    /// @throws InvalidArgumentError when the initializer cannot describe itself (a user's class whose
    /// `spec` gives nothing): create the variable from its value instead
    template <class Init>
        requires requires(const Init& init, const Shape& shape) {
            { init.spec(shape, std::uint64_t{}) } -> std::same_as<std::optional<InitializerSpec>>;
        }
    Variable(const Shape& shape, DType dtype, const Init& initializer, std::string name = "Variable")
        : Variable(shape, dtype, described(initializer.spec(shape, detail::name_seed(name)), name), name) {}

    /// @brief TensorFlow's `ShardedVariable(variables, name)`: one variable whose rows are those of
    /// `parts`, in order (their shards where a part is sharded itself), each left where it lives.
    /// Every operation works on it as on a variable the strategy split, a row found by the parts'
    /// sizes (which need not follow the partitioners' rule, as TensorFlow's dense operations allow;
    /// its sparse ones here too). The parts keep their shards: this handle keeps them alive, and its
    /// `shards()` are the parts' shards. `id()` is 0: no strategy numbered it.
    /// @throws InvalidArgumentError, with TensorFlow's checks: `parts` empty or holding an empty
    /// handle, parts of different dtypes, a scalar part, parts whose shapes differ beyond axis 0, or parts
    /// of different clusters
    ///
    /// @par Example
    /// @code
    /// pss::Variable v0(xt::xarray<float>{{0, 1}}, "v0"), v1(xt::xarray<float>{{2, 3}, {4, 5}}, "v1");
    /// pss::ShardedVariable s({v0, v1}, "s");  // shape (3, 2); s.sparse_read(ids{2}) is {{4, 5}}
    /// @endcode
    Variable(std::vector<Variable> parts, std::string name);

    /// @brief Used by strategies: a handle over already created shards.
    explicit Variable(std::shared_ptr<const detail::VariableInfo> info) : info_(std::move(info)) {}
    /// @brief Used by strategies and checkpoints: what every handle of this variable shares (its shards,
    /// their tasks and row offsets, the channel to them); null for an empty handle.
    [[nodiscard]] const std::shared_ptr<const detail::VariableInfo>& info_ptr() const noexcept { return info_; }

    /// @brief TensorFlow's name of the variable's value: `weights:0`.
    [[nodiscard]] std::string name() const { return info().name + ":0"; }
    [[nodiscard]] const Shape& shape() const { return info().shape; }
    [[nodiscard]] DType dtype() const { return info().dtype; }
    /// @brief The device of the first shard: `/job:ps/replica:0/task:0/device:CPU:0`.
    [[nodiscard]] std::string device() const { return info().channel->device(info().shards.front().task); }
    [[nodiscard]] std::size_t num_shards() const { return info().shards.size(); }
    /// @brief The number its strategy gave the variable (1, 2, ...): unique among that strategy's variables.
    [[nodiscard]] std::uint64_t id() const { return info().id; }
    /// @brief How this variable's gradients and values travel (Compression); `none` unless set here or by
    /// the strategy's set_compression when it was created.
    [[nodiscard]] Compression compression() const {
        const detail::VariableInfo& i = info();
        return (i.owner ? *i.owner : i).compression.load(std::memory_order_relaxed);
    }
    /// @brief Sends this variable's gradients and reads its values as `c` from now on, through every
    /// handle of this process and those it sends to workers afterwards (Compression).
    /// @throws InvalidArgumentError when `c` is not `none` and the variable is not float32
    void set_compression(Compression c) {
        const detail::VariableInfo& i = info();
        if (c != Compression::none && i.dtype != DType::float32)
            throw InvalidArgumentError("pss: set_compression(" + std::string(compression_name(c)) + ") of variable '" +
                                       name() + "': its dtype is " + std::string(dtype_name(i.dtype)) +
                                       "; only float32 variables travel compressed");
        (i.owner ? *i.owner : i).compression.store(c, std::memory_order_relaxed);
    }
    [[nodiscard]] bool is_sharded() const { return num_shards() > 1; }
    /// @brief The ps task index of each shard (-1 for the coordinator).
    [[nodiscard]] std::vector<int> shard_tasks() const {
        std::vector<int> tasks;
        for (const auto& s : info().shards) tasks.push_back(s.task);
        return tasks;
    }
    /// @brief The shard holding row `row` of the whole variable, and the row's index inside it. Shards
    /// split the rows by TensorFlow's rule (see shard_rows()), every handle's shards included.
    /// @pre the variable has rank 1 or more and row < shape()[0]
    [[nodiscard]] ShardRow shard_of_row(std::size_t row) const {
        const detail::VariableInfo& i = info();
        return i.split_by_rule ? RowSplit(i.shape.empty() ? 0 : i.shape[0], i.shards.size())(row) : part_of_row(i, row);
    }
    /// @brief One handle per shard, named `name/part_i` (TensorFlow's `ShardedVariable.variables`); for
    /// a variable built from a list, the parts' own handles (their shards where a part is sharded).
    [[nodiscard]] std::vector<Variable> shards() const;

    /// @brief The whole value, gathered from every shard.
    /// @param step in synchronous training, the step this pull is for: it waits until the steps it
    /// must see are applied (see consistency.hpp); 0 reads whatever is there.
    [[nodiscard]] Tensor read_value(std::uint64_t step = 0) const;
    /// @brief read_value without waiting: the reads are sent now, and the future's get() waits for
    /// their replies (so a step reads many variables in one round trip, not one each).
    [[nodiscard]] TensorFuture read_value_async(std::uint64_t step = 0) const;
    /// @brief The whole value as an xarray of the variable's element type (std::string for DType::string).
    /// @throws InvalidArgumentError when T is not the variable's dtype.
    template <TensorElement T>
    [[nodiscard]] xt::xarray<T> read(std::uint64_t step = 0) const {
        check_dtype<T>("read");
        return std::move(read_value(step).get<T>());
    }
    /// @brief Reads the whole value into `out`, reusing its memory when its shape already matches
    /// (a training loop pulling the same variable each step touches no fresh page).
    template <Element T>
    void read_into(xt::xarray<T>& out, std::uint64_t step = 0) const;

    // Updates. Each takes its payload by value (move it in: nothing is copied for an unsharded variable)
    // and hands the spent buffer back, so that a loop can reuse its memory for the next step.

    /// @brief value = `value`. @throws InvalidArgumentError on a shape or dtype mismatch.
    Tensor assign(Tensor value) { return update(Op::assign, std::move(value)); }
    /// @brief value += `delta`.
    Tensor assign_add(Tensor delta) { return update(Op::assign_add, std::move(delta)); }
    /// @brief value -= `delta`.
    Tensor assign_sub(Tensor delta) { return update(Op::assign_sub, std::move(delta)); }
    /// @brief The strategy's optimizer applies `gradient` (same shape) to every shard.
    /// @param step in synchronous training, the step the gradient belongs to (1, 2, ...)
    /// @throws FailedPreconditionError for an integer variable.
    Tensor apply_gradient(Tensor gradient, std::uint64_t step = 0) {
        return update(Op::apply_dense, std::move(gradient), step);
    }

    /// @brief value[ids[i]] += rows[i]; a repeated id adds each of its rows. Like every scatter, the
    /// rows are grouped by shard and sent in parallel, each validated (ids, shape, dtype) before any
    /// shard changes.
    Tensor scatter_add(std::span<const std::int64_t> ids, Tensor rows) {
        return update_rows(Op::scatter_add, ids, std::move(rows));
    }
    /// @brief value[ids[i]] -= rows[i].
    Tensor scatter_sub(std::span<const std::int64_t> ids, Tensor rows) {
        return update_rows(Op::scatter_sub, ids, std::move(rows));
    }
    /// @brief value[ids[i]] = rows[i]; for a repeated id the last row stays.
    Tensor scatter_update(std::span<const std::int64_t> ids, Tensor rows) {
        return update_rows(Op::scatter_update, ids, std::move(rows));
    }
    /// @brief value[ids[i]] *= rows[i]; a repeated id is multiplied by each of its rows (tf.Variable.scatter_mul).
    /// Integers wrap around on overflow, as TensorFlow's kernels do.
    Tensor scatter_mul(std::span<const std::int64_t> ids, Tensor rows) {
        return update_rows(Op::scatter_mul, ids, std::move(rows));
    }
    /// @brief value[ids[i]] /= rows[i], in order for a repeated id (tf.Variable.scatter_div). Integers
    /// divide toward zero, as C++ and TensorFlow do; floating values follow IEEE 754 (x / 0 is infinity).
    /// @throws InvalidArgumentError naming the row when an integer divisor holds 0: nothing changes.
    Tensor scatter_div(std::span<const std::int64_t> ids, Tensor rows) {
        return update_rows(Op::scatter_div, ids, std::move(rows));
    }
    /// @brief value[ids[i]] = min(value[ids[i]], rows[i]) (tf.Variable.scatter_min).
    Tensor scatter_min(std::span<const std::int64_t> ids, Tensor rows) {
        return update_rows(Op::scatter_min, ids, std::move(rows));
    }
    /// @brief value[ids[i]] = max(value[ids[i]], rows[i]) (tf.Variable.scatter_max).
    Tensor scatter_max(std::span<const std::int64_t> ids, Tensor rows) {
        return update_rows(Op::scatter_max, ids, std::move(rows));
    }
    /// @brief The optimizer applies gradient `rows` to rows `ids`; rows of a repeated id are summed first.
    /// In synchronous training every shard receives a push, empty when no id falls in it, so that each
    /// shard can count its step complete; asynchronous pushes go to the shards the ids fall in.
    Tensor apply_sparse_gradient(std::span<const std::int64_t> ids, Tensor rows, std::uint64_t step = 0) {
        return update_rows(Op::apply_sparse, ids, std::move(rows), step);
    }

    /// @brief Rows `ids` of the value, in the order asked for (tf.nn.embedding_lookup): one request per
    /// shard touched, issued in parallel.
    /// @throws InvalidArgumentError naming the id and the shape when an id is outside [0, shape[0]).
    [[nodiscard]] Tensor sparse_read(std::span<const std::int64_t> ids, std::uint64_t step = 0) const;
    /// @brief sparse_read without waiting: validated (an error of the call is raised here) and sent
    /// now; the future's get() waits for the rows. The ids are copied: `ids` may go at once.
    [[nodiscard]] TensorFuture sparse_read_async(std::span<const std::int64_t> ids, std::uint64_t step = 0) const;

    /// @brief Elements [begin[d], end[d]) along each axis d, as TensorFlow's `v[1:3, 0:2]` on a
    /// ShardedVariable: only the rows [begin[0], end[0]) travel, from the shards that hold them (one
    /// request per shard touched, in parallel); the other axes are cut here. Axes past `begin.size()`
    /// are taken whole: `v.slice({1}, {3})` is rows 1 and 2.
    /// @throws InvalidArgumentError naming the axis when begin and end differ in length, have more
    /// entries than the variable has axes, or an axis has begin > end or end beyond its size (where
    /// Python's slices would clip, C++ callers get told)
    [[nodiscard]] Tensor slice(const Shape& begin, const Shape& end, std::uint64_t step = 0) const;

    /// @brief `<pss::Variable 'weights:0' shape=(5,) dtype=int32, value=[1, 2, 3, 4, 5]>`
    [[nodiscard]] std::string to_string() const {
        return "<pss::Variable '" + name() + "' shape=" + format_shape(shape()) + " dtype=" +
               std::string(dtype_name(dtype())) + ", value=" + format_values(read_value()) + ">";
    }
    friend std::ostream& operator<<(std::ostream& os, const Variable& v) { return os << v.to_string(); }

    [[nodiscard]] explicit operator bool() const noexcept { return info_ != nullptr; }

private:
    template <class T>
    friend struct detail::Codec;

    const detail::VariableInfo& info() const {
        if (!info_) throw FailedPreconditionError("pss: this Variable handle is empty (default-constructed or moved from)");
        return *info_;
    }

    template <TensorElement T>
    void check_dtype(const char* what) const {
        if (dtype_of<T> != dtype())
            throw InvalidArgumentError("pss: " + std::string(what) + " of variable '" + name() + "' as " +
                                       std::string(dtype_name(dtype_of<T>)) + ": the variable's dtype is " +
                                       std::string(dtype_name(dtype())));
    }

    std::string describe(Op op) const { return std::string(op_name(op)) + " on variable '" + name() + "'"; }

    /// True when this handle's shapes are its ps tasks' and those tasks are in this process: a ps may
    /// then skip checking the requests against its shard and write into the caller's memory. A handle
    /// decoded from a message (borrowed) may lie about its shapes, so its requests are checked by the
    /// ps and its replies by check_reply.
    [[nodiscard]] bool shapes_trusted() const noexcept {
        if (!info_) return false;
        const detail::VariableInfo& i = *info_;
        return !i.borrowed && (i.owner == nullptr || !i.owner->borrowed) && i.channel != nullptr &&
               i.channel->shares_memory();
    }

    /// `ids` grouped by shard, in their order within each shard: shard s's rows (its own numbering) and
    /// the position in `ids` each came from. Counted first, so each list is allocated once and filled
    /// through a pointer (push_back's stores of the ends cost more than the rest for 4096 ids).
    struct ByShard {
        std::vector<std::vector<std::int64_t>> rows;
        std::vector<std::vector<std::size_t>> positions;
    };
    [[nodiscard]] ByShard group_by_shard(std::span<const std::int64_t> ids) const {
        const auto& shards = info().shards;
        const std::size_t k = shards.size();
        // Each id's shard in 4 bytes (its row there is the id less the shard's first row): a 16-byte
        // ShardRow an id, stored and loaded again, cost a fifth of a 4096-id lookup.
        const auto shard_of = std::make_unique_for_overwrite<std::uint32_t[]>(ids.size());
        std::vector<std::size_t> counts(k);
        for_each_shard_row(ids, [&](std::size_t i, ShardRow at) {
            shard_of[i] = static_cast<std::uint32_t>(at.shard);
            ++counts[at.shard];
        });
        ByShard out{std::vector<std::vector<std::int64_t>>(k), std::vector<std::vector<std::size_t>>(k)};
        std::vector<std::int64_t*> next_row(k);
        std::vector<std::size_t*> next_position(k);
        std::vector<std::int64_t> first_row(k);
        for (std::size_t s = 0; s < k; ++s) {
            out.rows[s].resize(counts[s]);
            out.positions[s].resize(counts[s]);
            next_row[s] = out.rows[s].data();
            next_position[s] = out.positions[s].data();
            first_row[s] = static_cast<std::int64_t>(shards[s].row_offset);
        }
        for (std::size_t i = 0; i < ids.size(); ++i) {
            const std::uint32_t shard = shard_of[i];
            *next_row[shard]++ = ids[i] - first_row[shard];
            *next_position[shard]++ = i;
        }
        return out;
    }

    /// Calls `f(i, shard_of_row(rows[i]))` for each row, the split's divisions done once.
    template <class Row, class F>
    void for_each_shard_row(std::span<const Row> rows, F&& f) const {
        const detail::VariableInfo& i = info();
        if (i.split_by_rule) {
            const RowSplit split(i.shape.empty() ? 0 : i.shape[0], i.shards.size());
            for (std::size_t k = 0; k < rows.size(); ++k) f(k, split(static_cast<std::size_t>(rows[k])));
            return;
        }
        for (std::size_t k = 0; k < rows.size(); ++k) f(k, part_of_row(i, static_cast<std::size_t>(rows[k])));
    }

    /// shard_of_row() of a variable built from parts of any sizes: the last shard that starts at or
    /// before the row (one of zero rows shares its offset with the next, which holds the row).
    static ShardRow part_of_row(const detail::VariableInfo& i, std::size_t row) {
        const auto after = std::upper_bound(i.shards.begin(), i.shards.end(), row,
                                            [](std::size_t r, const detail::ShardInfo& s) { return r < s.row_offset; });
        const auto shard = static_cast<std::size_t>(after - i.shards.begin()) - 1;
        return ShardRow{shard, row - i.shards[shard].row_offset};
    }

    /// A reply's value must be what was asked for before any byte of it is copied by this handle's
    /// shapes: a handle received from a peer may lie about them, and a ps (or a peer posing as one)
    /// may answer anything.
    void check_reply(Op op, const Tensor& part, const Shape& expected, std::uint32_t shard) const {
        if (part.has_value() && part.dtype() == dtype() && part.shape() == expected) return;
        throw InvalidArgumentError(
            "pss: " + describe(op) + ": shard " + std::to_string(shard) + " answered " +
            (part.has_value() ? "shape " + format_shape(part.shape()) + " dtype " + std::string(dtype_name(part.dtype()))
                              : std::string("no value")) +
            " where shape " + format_shape(expected) + " dtype " + std::string(dtype_name(dtype())) +
            " was asked for; this handle does not describe the variable its parameter servers hold");
    }

    Request request(Op op, const detail::ShardInfo& shard, std::uint64_t step = 0) const {
        Request r;
        r.op = op;
        r.key = {shard.variable, shard.index};
        r.step = step;
        if (op == Op::read || op == Op::gather || op == Op::apply_dense || op == Op::apply_sparse) r.compression = compression();
        return r;
    }

    /// A compressed push's gradient rounded with this worker's error feedback (Compression): the
    /// request's payload, for its shard (`width` values a row when it carries rows `r.ids`).
    void round_push(Request& r) const {
        if ((r.op != Op::apply_dense && r.op != Op::apply_sparse) || r.compression == Compression::none ||
            !r.payload.has_value() || r.payload.size() == 0)
            return;  // only gradients are rounded with feedback (a read's offered buffer is not)
        auto& values = r.payload.get<float>();
        const std::span<float> all(values.data(), values.size());
        const int worker = worker_index();
        detail::ErrorFeedback& feedback = info().channel->error_feedback();
        if (r.op == Op::apply_dense) return feedback.round_dense(r.key.variable, r.key.shard, worker, r.compression, all);
        feedback.round_rows(r.key.variable, r.key.shard, worker, r.compression, r.ids, all,
                            r.ids.empty() ? 0 : values.size() / r.ids.size());
    }

    /// Sends each request to its task (all in flight at once) and returns the replies' payloads in the
    /// same order. A synchronous pull that is not ready yet is asked again, with a growing pause. The
    /// first error is thrown after every reply has arrived, so no request is left running. In a Group,
    /// a write's requests are sent and the group waits for them: its payloads are empty.
    std::vector<Tensor> exchange(std::vector<std::pair<int, Request>> outgoing) const;
    /// Sends each request to its task; Exchange::finish waits for the replies.
    detail::Exchange post(std::vector<std::pair<int, Request>> outgoing) const;
    /// Marks a single request that exchange() waits for at once (Request::in_process.waited_at_once).
    static void wait_at_once(std::vector<std::pair<int, Request>>& outgoing);
    /// read_value and read_value_async: the reads sent (`waited_at_once`: by read_value, which waits
    /// at once), and the whole value made of their replies.
    detail::Exchange post_read(std::uint64_t step, bool waited_at_once = false) const;
    Tensor assemble_read(std::vector<Tensor> parts) const;
    /// sparse_read and sparse_read_async: a gather in flight, and what makes its result.
    struct Gather {
        detail::Exchange sent;
        std::size_t rows = 0;
        ByShard grouped;
        std::vector<std::size_t> asked;  // the shards asked, in the order of the requests
        bool in_place = false;           // the ps tasks write into *out
        std::shared_ptr<Tensor> out;     // the result (null: one shard, whose reply is the result)
    };
    Gather post_gather(std::span<const std::int64_t> ids, std::uint64_t step) const;
    Tensor finish_gather(Gather& g) const;
    /// Raises CancelledError for `op` when the closure running on this thread was cancelled.
    void refuse_if_cancelled(Op op) const;


    static const InitializerSpec& described(const std::optional<InitializerSpec>& spec, const std::string& name) {
        if (!spec)
            throw InvalidArgumentError("pss: variable '" + name +
                                       "': its initializer cannot describe itself to the ps tasks (its spec() gives "
                                       "nothing); create the variable from its value: pss::Variable(value, name)");
        return *spec;
    }

    Tensor update(Op op, Tensor payload, std::uint64_t step = 0);
    Tensor update_rows(Op op, std::span<const std::int64_t> ids, Tensor rows, std::uint64_t step = 0);

    std::shared_ptr<const detail::VariableInfo> info_;
};

/// @brief TensorFlow's ShardedVariable: in pss one Variable type covers one shard or many.
using ShardedVariable = Variable;

/// @brief A value a Variable operation reads, still in flight (Variable::read_value_async,
/// Variable::sparse_read_async): its requests were sent when it was made; get() waits for their
/// replies and returns the value, or raises the operation's error. A future dropped without get()
/// leaves its replies to nobody. Move-only, as std::future.
///
/// @par Example
/// @code
/// pss::TensorFuture a = w1.read_value_async(), b = w2.read_value_async();  // both in flight
/// pss::Tensor x = a.get(), y = b.get();
/// @endcode
class TensorFuture {
public:
    TensorFuture() = default;
    TensorFuture(TensorFuture&&) noexcept = default;
    TensorFuture& operator=(TensorFuture&&) noexcept = default;
    TensorFuture(const TensorFuture&) = delete;
    TensorFuture& operator=(const TensorFuture&) = delete;

    /// @brief True until get() was called (false for a default-constructed one).
    [[nodiscard]] bool valid() const noexcept { return static_cast<bool>(finish_); }

    /// @brief Waits for the replies and returns the value; raises what the operation would.
    /// @throws FailedPreconditionError when there is no value to get (get() was called already).
    [[nodiscard]] Tensor get() {
        if (!finish_)
            throw FailedPreconditionError("pss: TensorFuture::get: no value to get (get() was called already, or the "
                                          "future was made empty)");
        auto finish = std::exchange(finish_, nullptr);
        return finish();
    }

private:
    friend class Variable;
    explicit TensorFuture(std::function<Tensor()> finish) : finish_(std::move(finish)) {}
    std::function<Tensor()> finish_;
};

/// @brief Variable operations sent together and waited for as one, as tf.group groups operations.
///
/// While a Group is the innermost one of its thread, every operation that changes a variable (assign,
/// assign_add, assign_sub, the scatters, apply_gradient, apply_sparse_gradient) is validated (an error
/// of the call is raised by the call, before anything is sent), sent, and returns at once: an empty
/// Tensor, since its payload is not handed back. `wait()` waits for all of them as one (the thread
/// sleeps once, not once per reply) and raises the first error among their replies, in the order they
/// were sent. A read in a Group waits for its own reply, as outside one; a ps task takes one thread's
/// requests in order, so it sees the writes sent to its shards before it.
///
/// The requests of a Group to one ps task leave together: the TCP transport writes the requests queued
/// for a connection in one system call, and the ps writes their replies together.
///
/// A Group belongs to the thread that made it; groups nest (the inner one takes the writes while it
/// lives). Its destructor waits for what was not waited for; an error it then finds is printed to
/// stderr, since a destructor cannot raise it: call `wait()`.
///
/// @par Example
/// @code
/// pss::Group group;
/// for (std::size_t i = 0; i < weights.size(); ++i) weights[i].apply_gradient(std::move(gradients[i]));
/// group.wait();  // every push applied, or the first error raised
/// @endcode
class Group {
public:
    Group() : previous_(std::exchange(current_slot(), this)) {}
    Group(const Group&) = delete;
    Group& operator=(const Group&) = delete;
    ~Group() {
        current_slot() = previous_;
        if (pending() == 0) return;
        try {
            wait();
        } catch (const std::exception& e) {
            if (std::uncaught_exceptions() == 0)
                std::fprintf(stderr, "pss: a Group was destroyed before its wait() raised this error: %s\n", e.what());
        }
    }

    /// @brief Waits for every operation sent in this group since the last wait, then raises the first
    /// error among their replies (an Error subclass, as the operation would have raised). The group
    /// can be used again after.
    void wait() {
        batch_->wait();
        const std::size_t n = batch_->size();
        std::exception_ptr error;
        failed_.clear();
        for (std::size_t i = 0; i < n; ++i) {
            Reply reply = batch_->take(i);
            if (reply.ok()) continue;
            if (std::find(failed_.begin(), failed_.end(), sent_by_[i]) == failed_.end()) failed_.push_back(sent_by_[i]);
            if (!error) try {
                    (void)reply.take();
                } catch (...) {
                    error = std::current_exception();
                }
        }
        batch_->clear();
        sent_by_.clear();
        if (error) std::rethrow_exception(error);
    }

    /// @brief The ids (Variable::id) of the variables an operation of which failed, among those the
    /// last wait() waited for, each once, in the order sent: what a synchronous training step completes
    /// with an empty push, so that the step completes at the ps tasks.
    [[nodiscard]] const std::vector<std::uint64_t>& failed() const noexcept { return failed_; }

    /// @brief The number of requests sent in this group and not yet waited for (one per shard an
    /// operation reached).
    [[nodiscard]] std::size_t pending() const { return batch_->size(); }

    /// @brief The innermost group of the calling thread, or null.
    [[nodiscard]] static Group* current() noexcept { return current_slot(); }

private:
    friend class Variable;

    static Group*& current_slot() noexcept {
        static thread_local Group* group = nullptr;
        return group;
    }

    std::shared_ptr<detail::ReplyBatch> batch_ = std::make_shared<detail::ReplyBatch>();
    std::vector<std::uint64_t> sent_by_;  // the variable of each request, by its slot in batch_
    std::vector<std::uint64_t> failed_;
    Group* previous_;
};

/// @brief Rows `ids` of `params` (tf.nn.embedding_lookup).
[[nodiscard]] inline Tensor embedding_lookup(const Variable& params, std::span<const std::int64_t> ids) {
    return params.sparse_read(ids);
}

namespace detail {

/// Creates a variable's shards through `channel`: shard i holds rows_of[i] rows and lives on task tasks[i].
/// The name a ps task knows shard `index` of `info` by, in errors: the variable's name when it has
/// one shard, else "name/part_<index>" (TensorFlow's).
inline std::string shard_name(const VariableInfo& info, std::uint32_t index) {
    return info.shards.size() == 1 ? info.name : info.name + "/part_" + std::to_string(index);
}

/// Creates the shards of a variable of `shape` and `dtype` through `channel`: shard i holds rows_of[i]
/// rows and lives on task tasks[i]; `fill(request, shard)` gives request i its first value (a payload
/// or an initializer).
template <class Fill>
Variable create_shards(const std::shared_ptr<Channel>& channel, std::uint64_t id, std::string name, Shape shape,
                       DType dtype, const std::vector<std::size_t>& rows_of, const std::vector<int>& tasks, Fill fill) {
    auto info = std::make_shared<VariableInfo>();
    info->name = std::move(name);
    info->shape = std::move(shape);
    info->dtype = dtype;
    info->id = id;
    info->channel = channel;
    std::vector<Request> requests;
    std::vector<std::future<Reply>> futures;
    std::size_t offset = 0;
    for (std::uint32_t i = 0; i < rows_of.size(); ++i) {
        ShardInfo shard{i, tasks[i], info->shape, offset, id};
        if (rows_of.size() > 1) shard.shape[0] = rows_of[i];
        Request request;
        request.op = Op::create;
        request.key = {id, i};
        fill(request, std::as_const(shard));
        offset += rows_of[i];
        info->shards.push_back(std::move(shard));
        requests.push_back(std::move(request));
    }
    for (std::uint32_t i = 0; i < rows_of.size(); ++i) {
        requests[i].name = shard_name(*info, i);
        futures.push_back(channel->send(tasks[i], std::move(requests[i])));
    }
    std::vector<Reply> replies;
    for (auto& f : futures) replies.push_back(f.get());
    for (auto& r : replies) r.take();
    return Variable(std::move(info));
}

/// create_shards, each shard sent its rows of `initial_value`.
inline Variable create_sharded(const std::shared_ptr<Channel>& channel, std::uint64_t id, std::string name,
                               Tensor initial_value, const std::vector<std::size_t>& rows_of,
                               const std::vector<int>& tasks) {
    if (!initial_value.has_value())
        throw InvalidArgumentError("pss: variable '" + name + "': the initial value is empty");
    const Shape shape = initial_value.shape();
    const DType dtype = initial_value.dtype();
    return create_shards(channel, id, std::move(name), shape, dtype, rows_of, tasks,
                         [&](Request& request, const ShardInfo& shard) {
                             request.payload = rows_of.size() == 1 ? std::move(initial_value)
                                                                   : slice_rows(initial_value, shard.row_offset, shard.shape[0]);
                         });
}

/// The error of creating variable `name` of `shape` and `dtype` from `initializer`, if any.
inline void check_initializer(const std::string& name, const Shape& shape, DType dtype, const InitializerSpec& initializer) {
    const std::string what = "pss: variable '" + name + "' of shape " + format_shape(shape) + " and dtype " +
                             std::string(dtype_name(dtype)) + ": ";
    if (auto why = initializer.problem(dtype)) throw InvalidArgumentError(what + *why);
    if (bounded_elements(shape, std::numeric_limits<std::uint64_t>::max() / 8) < 0)
        throw InvalidArgumentError(what + "the shape has more elements than memory can hold");
}

/// create_shards, each shard drawn by its ps task from `initializer`: no value is made here.
inline Variable create_sharded(const std::shared_ptr<Channel>& channel, std::uint64_t id, std::string name,
                               const Shape& shape, DType dtype, const InitializerSpec& initializer,
                               const std::vector<std::size_t>& rows_of, const std::vector<int>& tasks) {
    check_initializer(name, shape, dtype, initializer);
    return create_shards(channel, id, std::move(name), shape, dtype, rows_of, tasks,
                         [&](Request& request, const ShardInfo& shard) {
                             request.initializer = ShardInitializer{initializer, dtype, shape, shard.row_offset,
                                                                    shape.empty() ? 0 : shard.shape[0]};
                         });
}

}  // namespace detail

// ---------------------------------------------------------------------------------------------------
// Implementation
// ---------------------------------------------------------------------------------------------------

inline Variable::Variable(std::vector<Variable> parts, std::string name) {
    const std::string where = "pss: ShardedVariable '" + name + "': ";
    if (parts.empty())
        throw InvalidArgumentError(where + "the list of variables is empty; give a non-empty list of variables");
    auto list = [&](auto describe) {
        std::string text;
        for (const auto& p : parts) text += (text.empty() ? "" : ", ") + describe(p);
        return "[" + text + "]";
    };
    for (std::size_t i = 0; i < parts.size(); ++i)
        if (!parts[i])
            throw InvalidArgumentError(where + "element " + std::to_string(i) +
                                       " of the list is an empty handle; every element must be a variable");
    const Variable& first = parts.front();
    for (const auto& p : parts)
        if (p.dtype() != first.dtype())
            throw InvalidArgumentError(where + "all variables must have the same dtype; got dtypes " +
                                       list([](const Variable& v) { return std::string(dtype_name(v.dtype())); }));
    for (std::size_t i = 0; i < parts.size(); ++i)
        if (parts[i].shape().empty())
            throw InvalidArgumentError(where + "element " + std::to_string(i) + " ('" + parts[i].name() +
                                       "') is a scalar; the variables are joined along axis 0");
    for (const auto& p : parts)
        if (!std::equal(p.shape().begin() + 1, p.shape().end(), first.shape().begin() + 1, first.shape().end()))
            throw InvalidArgumentError(where + "all variables must have the same shape except for the first axis; "
                                       "got shapes " +
                                       list([](const Variable& v) { return format_shape(v.shape()); }));
    for (std::size_t i = 0; i < parts.size(); ++i)
        if (parts[i].info().channel != first.info().channel)
            throw InvalidArgumentError(where + "element " + std::to_string(i) + " ('" + parts[i].name() + "', on " +
                                       parts[i].device() + ") was created by another strategy than element 0 ('" +
                                       first.name() + "'); the variables must share one cluster");
    auto joined = std::make_shared<detail::VariableInfo>();
    joined->name = std::move(name);
    joined->dtype = first.dtype();
    joined->shape = first.shape();
    joined->shape[0] = 0;
    joined->channel = first.info().channel;
    for (const auto& p : parts)
        for (const Variable& shard : p.shards()) {  // a sharded part contributes each of its shards
            detail::ShardInfo s = shard.info().shards.front();
            s.row_offset = joined->shape[0];
            joined->shape[0] += s.shape[0];
            joined->shards.push_back(std::move(s));
            joined->parts.push_back(shard.info_ptr());
        }
    for (std::size_t i = 0; i < joined->shards.size(); ++i)
        if (joined->shards[i].shape[0] != shard_rows(joined->shape[0], joined->shards.size(), i)) joined->split_by_rule = false;
    info_ = std::move(joined);
}

inline std::vector<Variable> Variable::shards() const {
    if (!info().parts.empty()) return std::vector<Variable>(info().parts.begin(), info().parts.end());
    if (!is_sharded()) return {*this};
    std::vector<Variable> out;
    for (const auto& shard : info().shards) {
        auto part = std::make_shared<detail::VariableInfo>();
        part->name = info().name + "/part_" + std::to_string(shard.index);
        part->shape = shard.shape;
        part->dtype = info().dtype;
        part->id = info().id;
        part->shards = {detail::ShardInfo{shard.index, shard.task, shard.shape, 0, shard.variable}};
        part->channel = info().channel;
        part->owner = info_;
        out.emplace_back(std::move(part));
    }
    return out;
}

namespace detail {

inline void Exchange::post(std::size_t i, Request r) {
    r.in_process.checked = checked;
    again[i].op = r.op;  // the request without its payload
    again[i].key = r.key;
    again[i].step = r.step;
    again[i].compression = r.compression;
    if (pull && r.step != 0) {  // only a synchronous pull is answered "not ready" and sent again
        again[i].ids = r.ids;
        again[i].in_process = r.in_process;
    }
    slots[i] = send_into(batch, *variable->channel, tasks[i], std::move(r));
}

inline std::vector<Tensor> Exchange::finish() {
    std::vector<Tensor> out(tasks.size());
    std::vector<std::size_t> waiting(tasks.size());
    for (std::size_t i = 0; i < waiting.size(); ++i) waiting[i] = i;
    std::exception_ptr error;
    const ClosureContext* closure = ClosureContext::current();
    auto cancelled = [closure] { return closure != nullptr && closure->cancelled(); };
    auto abandon = [&](std::size_t i) {
        return std::make_exception_ptr(CancelledError(
            "pss: " + std::string(op_name(again[i].op)) + " on variable '" + variable->name + ":0' for step " +
            std::to_string(again[i].step) + " was abandoned: another closure failed, so the step may never complete"));
    };
    // A ps holds a synchronous pull until its step is applied, so the reply may take a whole step of the
    // slowest worker: such a wait wakes every millisecond to see whether the coordinator gave up on it.
    // Only a pull is held; a push is answered at once, and its effect stands whether or not it is awaited.
    auto wait = [&] {
        const bool held = pull && again[waiting.front()].step != 0;
        if (!held || closure == nullptr || closure->failures == nullptr) return batch->wait(), true;
        while (!batch->wait_for(std::chrono::milliseconds(1)))
            if (cancelled()) return false;
        return true;
    };
    for (auto pause = std::chrono::microseconds(20); !waiting.empty(); pause = std::min(pause * 2, std::chrono::microseconds(2000))) {
        // The replies still to come when a wait is given up are not waited for: nobody will read them.
        const bool all_in = wait();
        std::vector<std::size_t> retry;
        for (std::size_t i : waiting) {
            if (!all_in && !batch->ready(slots[i])) {
                if (!error) error = abandon(i);
                break;
            }
            Reply reply = batch->take(slots[i]);
            if (reply.code == ErrorCode::not_ready && !error && pull && again[i].step != 0) {
                retry.push_back(i);
                again[i].payload = std::move(reply.payload);
                continue;
            }
            try {
                // A pull asked for compressed values that no wire narrowed (a ps in this process): rounded
                // here, so that the numbers do not depend on the transport.
                const bool round = pull && again[i].compression != Compression::none &&
                                   reply.compression == Compression::none && reply.ok() &&
                                   reply.payload.has_value() && reply.payload.dtype() == DType::float32;
                out[i] = reply.take();
                if (round) round_in_place(again[i].compression, std::span(out[i].get<float>().data(), out[i].size()));
            } catch (...) {
                if (!error) error = std::current_exception();
            }
        }
        // A ps that cannot hold a pull answers not_ready: ask again after a pause, unless cancelled.
        if (!error && !retry.empty() && cancelled()) error = abandon(retry.front());
        if (error) break;  // what is not ready is not asked again: the operation has failed
        if (!retry.empty()) std::this_thread::sleep_for(pause);
        for (std::size_t i : retry) post(i, std::move(again[i]));
        waiting = std::move(retry);
    }
    if (error) std::rethrow_exception(error);
    return out;
}

}  // namespace detail

inline void Variable::refuse_if_cancelled(Op op) const {
    // A closure running when another failed is cancelled cooperatively, as TensorFlow's are: its next
    // variable operation raises, before anything is sent.
    if (const auto* running = detail::ClosureContext::current(); running != nullptr && running->cancelled())
        throw CancelledError("pss: " + describe(op) +
                             " was not sent: another closure failed, and the closures running meanwhile are "
                             "cancelled (their RemoteValues give this error); reschedule it");
}

inline detail::Exchange Variable::post(std::vector<std::pair<int, Request>> outgoing) const {
    const Op first_op = outgoing.empty() ? Op::create : outgoing.front().second.op;
    refuse_if_cancelled(first_op);
    detail::Exchange x;
    x.variable = info_;
    x.op = first_op;
    x.pull = is_pull(first_op);
    // Every operation sent from here was validated against the whole variable (or needs nothing); a ps
    // in this process need not do it again, when this handle's shapes are its own.
    x.checked = shapes_trusted();
    x.tasks.reserve(outgoing.size());
    for (auto& [task, r] : outgoing) x.tasks.push_back(task);
    x.slots.resize(outgoing.size());
    x.again.resize(outgoing.size());
    for (std::size_t i = 0; i < outgoing.size(); ++i) x.post(i, std::move(outgoing[i].second));
    return x;
}

inline std::vector<Tensor> Variable::exchange(std::vector<std::pair<int, Request>> outgoing) const {
    // Profiled (when a benchmark enables it) as a pull or a push by what the first request does.
    const Op first_op = outgoing.empty() ? Op::create : outgoing.front().second.op;
    const bool pull = is_pull(first_op);
    const bool push = is_push(first_op);
    const detail::StepProfile::Timer timer(pull ? detail::StepProfile::Counter::pull : detail::StepProfile::Counter::push,
                                           pull || push);
    for (auto& [task, r] : outgoing) round_push(r);  // a compressed gradient, for its shard
    // A write in a Group is sent, and waited for by the group: its replies go to the group's batch.
    if (Group* group = Group::current(); group != nullptr && push) {
        refuse_if_cancelled(first_op);
        const bool checked = shapes_trusted();
        for (auto& [task, r] : outgoing) {
            r.in_process.checked = checked;
            group->sent_by_.push_back(info().id);  // before the slot exists: send_into may raise after adding it
            detail::send_into(group->batch_, *info().channel, task, std::move(r));
        }
        return std::vector<Tensor>(outgoing.size());
    }
    wait_at_once(outgoing);
    return post(std::move(outgoing)).finish();
}

inline void Variable::wait_at_once(std::vector<std::pair<int, Request>>& outgoing) {
    // One request waited for here and now may be exchanged on this thread (see
    // Request::in_process.waited_at_once); not a synchronous pull, which a ps may hold for a whole step
    // while this thread looks every millisecond whether its closure was cancelled.
    if (outgoing.size() == 1 && !(is_pull(outgoing.front().second.op) && outgoing.front().second.step != 0))
        outgoing.front().second.in_process.waited_at_once = true;
}

inline detail::Exchange Variable::post_read(std::uint64_t step, bool waited_at_once) const {
    std::vector<std::pair<int, Request>> outgoing;
    for (const auto& s : info().shards) outgoing.emplace_back(s.task, request(Op::read, s, step));
    if (waited_at_once) wait_at_once(outgoing);
    return post(std::move(outgoing));
}

inline Tensor Variable::assemble_read(std::vector<Tensor> parts) const {
    const auto& shards = info().shards;
    for (std::size_t i = 0; i < parts.size(); ++i) check_reply(Op::read, parts[i], shards[i].shape, shards[i].index);
    if (parts.size() == 1) return std::move(parts.front());
    Tensor whole = Tensor::uninitialized(dtype(), shape());
    for (std::size_t i = 0; i < parts.size(); ++i)
        detail::RowCopy(whole, parts[i])(shards[i].row_offset, 0, shards[i].shape[0]);
    return whole;
}

inline Tensor Variable::read_value(std::uint64_t step) const {
    const detail::StepProfile::Timer timer(detail::StepProfile::Counter::pull);
    return assemble_read(post_read(step, true).finish());
}

inline TensorFuture Variable::read_value_async(std::uint64_t step) const {
    auto sent = std::make_shared<detail::Exchange>(post_read(step));
    return TensorFuture([variable = *this, sent] { return variable.assemble_read(sent->finish()); });
}

template <Element T>
void Variable::read_into(xt::xarray<T>& out, std::uint64_t step) const {
    check_dtype<T>("read_into");
    if (num_shards() == 1) {
        Request r = request(Op::read, info().shards.front(), step);
        r.payload = std::move(out);
        std::vector<std::pair<int, Request>> outgoing;
        outgoing.emplace_back(info().shards.front().task, std::move(r));
        Tensor part = std::move(exchange(std::move(outgoing)).front());
        check_reply(Op::read, part, info().shards.front().shape, info().shards.front().index);
        out = std::move(part.template get<T>());
        return;
    }
    out = std::move(read_value(step).get<T>());
}

inline Tensor Variable::update(Op op, Tensor payload, std::uint64_t step) {
    detail::validate_request(op, info().name, shape(), dtype(), payload, {}, ":0");
    const auto& shards = info().shards;
    std::vector<std::pair<int, Request>> outgoing;
    if (shards.size() == 1) {
        Request r = request(op, shards.front(), step);
        r.payload = std::move(payload);
        outgoing.emplace_back(shards.front().task, std::move(r));
        return std::move(exchange(std::move(outgoing)).front());
    }
    for (const auto& s : shards) {
        Request r = request(op, s, step);
        r.payload = detail::slice_rows(payload, s.row_offset, s.shape[0]);
        outgoing.emplace_back(s.task, std::move(r));
    }
    exchange(std::move(outgoing));
    return payload;
}

inline Tensor Variable::update_rows(Op op, std::span<const std::int64_t> ids, Tensor rows, std::uint64_t step) {
    detail::validate_request(op, info().name, shape(), dtype(), rows, ids, ":0");
    const auto& shards = info().shards;
    std::vector<std::pair<int, Request>> outgoing;
    if (shards.size() == 1) {
        Request r = request(op, shards.front(), step);
        r.payload = std::move(rows);
        r.ids.assign(ids.begin(), ids.end());
        outgoing.emplace_back(shards.front().task, std::move(r));
        return std::move(exchange(std::move(outgoing)).front());
    }
    // Grouped by shard, keeping their order within each shard (scatter_update's last row wins).
    ByShard grouped = group_by_shard(ids);
    // A ps in this process takes the rows where they lie in `rows`, not from a copy a shard; unless it
    // keeps a gradient's for a synchronous step, or they are rounded as a wire would carry them.
    const bool synchronous = info().channel->synchronous();
    std::shared_ptr<Tensor> source;
    if ((is_scatter(op) || (op == Op::apply_sparse && !synchronous && compression() == Compression::none)) &&
        shapes_trusted())
        source = std::make_shared<Tensor>(std::move(rows));
    for (std::size_t s = 0; s < shards.size(); ++s) {
        auto& positions = grouped.positions[s];
        if (positions.empty() && !(step != 0 && synchronous)) continue;
        Request r = request(op, shards[s], step);
        r.ids = std::move(grouped.rows[s]);
        if (source) {
            r.compression = Compression::none;  // as decided above, whatever another thread set since
            r.in_process.from = source;
            r.in_process.from_rows = std::move(positions);
        } else {
            r.payload = detail::take_rows(rows, positions);
        }
        outgoing.emplace_back(shards[s].task, std::move(r));
    }
    exchange(std::move(outgoing));
    if (!source) return rows;
    // In a Group the ps tasks may read the rows after this returns: the buffer stays with them.
    if (Group::current() != nullptr) return Tensor{};
    return std::move(*source);
}

inline Tensor Variable::slice(const Shape& begin, const Shape& end, std::uint64_t step) const {
    const Shape& whole = shape();
    auto refuse = [&](const std::string& why) {
        throw InvalidArgumentError("pss: slice of variable '" + name() + "' of shape " + format_shape(whole) + " from " +
                                   format_shape(begin) + " to " + format_shape(end) + ": " + why);
    };
    if (begin.size() != end.size()) refuse("begin and end must have one entry per axis sliced");
    if (begin.size() > whole.size())
        refuse("the variable has " + std::to_string(whole.size()) + " axes, fewer than the " +
               std::to_string(begin.size()) + " sliced");
    for (std::size_t d = 0; d < begin.size(); ++d) {
        if (begin[d] > end[d])
            refuse("axis " + std::to_string(d) + " begins at " + std::to_string(begin[d]) + ", after its end " +
                   std::to_string(end[d]));
        if (end[d] > whole[d])
            refuse("axis " + std::to_string(d) + " ends at " + std::to_string(end[d]) + ", beyond its size " +
                   std::to_string(whole[d]));
    }
    if (begin.empty()) return read_value(step);
    std::vector<std::int64_t> rows(end[0] - begin[0]);
    for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<std::int64_t>(begin[0] + i);
    Tensor picked = sparse_read(rows, step);
    Shape from(whole.size(), 0), to = picked.shape();
    for (std::size_t d = 1; d < begin.size(); ++d) {
        from[d] = begin[d];
        to[d] = end[d];
    }
    if (from == Shape(whole.size(), 0) && to == picked.shape()) return picked;  // whole rows: no copy
    return detail::slice_block(picked, from, to);
}

inline Variable::Gather Variable::post_gather(std::span<const std::int64_t> ids, std::uint64_t step) const {
    detail::validate_request(Op::gather, info().name, shape(), dtype(), {}, ids, ":0");
    const auto& shards = info().shards;
    Gather g;
    g.rows = ids.size();
    std::vector<std::pair<int, Request>> outgoing;
    if (ids.empty()) {  // no shard is asked
        g.out = std::make_shared<Tensor>(Tensor::uninitialized(dtype(), detail::rows_shape(shape(), 0)));
    } else if (shards.size() == 1) {
        outgoing.emplace_back(shards.front().task, request(Op::gather, shards.front(), step));
        outgoing.front().second.ids.assign(ids.begin(), ids.end());
    } else {
        g.grouped = group_by_shard(ids);
        // A ps in this process writes its rows straight into the result; one elsewhere answers with them.
        g.in_place = shapes_trusted();
        g.out = std::make_shared<Tensor>(Tensor::uninitialized(dtype(), detail::rows_shape(shape(), ids.size())));
        for (std::size_t s = 0; s < shards.size(); ++s) {
            if (g.grouped.rows[s].empty()) continue;
            Request r = request(Op::gather, shards[s], step);
            r.ids = std::move(g.grouped.rows[s]);
            if (g.in_place) {
                r.in_process.into = g.out;
                r.in_process.into_rows = std::move(g.grouped.positions[s]);
            }
            outgoing.emplace_back(shards[s].task, std::move(r));
            g.asked.push_back(s);
        }
    }
    g.sent = post(std::move(outgoing));
    return g;
}

inline Tensor Variable::finish_gather(Gather& g) const {
    auto parts = g.sent.finish();
    const auto& shards = info().shards;
    if (!g.out) {  // one shard, which answered with the rows
        check_reply(Op::gather, parts.front(), detail::rows_shape(shards.front().shape, g.rows), shards.front().index);
        return std::move(parts.front());
    }
    if (g.in_place) {
        // The ps tasks wrote their rows here (this process): rounded as a wire would have, as the requests asked.
        if (!g.sent.again.empty() && g.sent.again.front().compression != Compression::none)
            detail::round_in_place(g.sent.again.front().compression, std::span(g.out->get<float>().data(), g.out->size()));
    } else {
        for (std::size_t p = 0; p < parts.size(); ++p) {
            const auto& positions = g.grouped.positions[g.asked[p]];
            check_reply(Op::gather, parts[p], detail::rows_shape(shards[g.asked[p]].shape, positions.size()),
                        shards[g.asked[p]].index);
            detail::RowCopy(*g.out, parts[p]).rows(positions.size(), [&](std::size_t j) { return positions[j]; },
                                                  [](std::size_t j) { return j; });
        }
    }
    return std::move(*g.out);
}

inline Tensor Variable::sparse_read(std::span<const std::int64_t> ids, std::uint64_t step) const {
    const detail::StepProfile::Timer timer(detail::StepProfile::Counter::pull);
    Gather g = post_gather(ids, step);
    return finish_gather(g);
}

inline TensorFuture Variable::sparse_read_async(std::span<const std::int64_t> ids, std::uint64_t step) const {
    auto g = std::make_shared<Gather>(post_gather(ids, step));
    return TensorFuture([variable = *this, g] { return variable.finish_gather(*g); });
}

PSS_NAMESPACE_END
