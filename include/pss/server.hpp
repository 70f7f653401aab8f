// pss/server.hpp: ParameterServer, the shards one ps task owns and the requests that read and change them.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include <xtensor/xarray.hpp>
#include <xtensor/xnoalias.hpp>

#include <nlohmann/json.hpp>

#include <pss/concepts/optimizer.hpp>
#include <pss/detail/checkpoint_format.hpp>
#include <pss/detail/environment.hpp>
#include <pss/detail/request_rules.hpp>
#include <pss/config.hpp>
#include <pss/dtype.hpp>
#include <pss/errors.hpp>
#include <pss/message.hpp>
#include <pss/tensor.hpp>

PSS_NAMESPACE_BEGIN

namespace detail {

/// count_non_finite of one row (up to 2^32 - 1 elements), inlined into a loop over rows: the call, the
/// chunking and the reduction of the whole-buffer form cost more than a short row's check.
template <FloatingElement T>
inline std::size_t count_non_finite_row(const T* row, std::size_t n) noexcept {
    using Bits = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
    constexpr Bits exponent = static_cast<Bits>(sizeof(T) == 4 ? 0x7f800000u : 0x7ff0000000000000u);
    Bits count = 0;
    for (std::size_t i = 0; i < n; ++i) {
        Bits bits;
        std::memcpy(&bits, row + i, sizeof bits);
        count += static_cast<Bits>((bits & exponent) == exponent);
    }
    return static_cast<std::size_t>(count);
}

/// Sums the gradient rows of each repeated id into the id's first row, in the order given, and drops
/// the repeats from `ids` and `positions`: id i's row is row `positions[i]` of `rows`, or row i while
/// `positions` is empty (filled then, only when an id repeats). The ids stay in the order of their first
/// rows, and no row is copied: a few repeats among 1,024 ids cost a few row additions. Linear: an
/// open-addressing table of twice the ids' count (16 KiB for 1,024 ids) finds each id's first row, where
/// sorting them cost more than applying the rows. With `count_non_finite`, returns how many values of
/// the rows as given are NaN or infinite, each row read once, in the same pass (a pass of its own read
/// the rows from memory before this one: 0.08 of a 4096-row update's rate against a plain scatter).
/// @pre every id is >= 0 and every position a row of `rows`, `width` elements each (validated)
template <class T>
std::size_t sum_duplicate_rows(std::vector<std::int64_t>& ids, std::vector<std::size_t>& positions, T* rows,
                               std::size_t width, bool count_non_finite = false) {
    std::size_t non_finite = 0;
    auto check = [&](const T* row) {
        if constexpr (FloatingElement<T>)
            if (count_non_finite) non_finite += count_non_finite_row(row, width);
    };
    if (ids.size() < 2) {
        if (!ids.empty()) check(rows + (positions.empty() ? 0 : positions[0]) * width);
        return non_finite;
    }
    std::size_t capacity = 4;
    while (capacity < 2 * ids.size()) capacity *= 2;
    std::vector<std::uint64_t> keys(capacity, 0);                       // id + 1; 0 is an empty slot
    const auto first = std::make_unique_for_overwrite<std::size_t[]>(capacity);  // the id's place in ids
    std::size_t kept = 0;  // ids[0, kept) are the distinct ids so far, each at its first row
    for (std::size_t i = 0; i < ids.size(); ++i) {
        const T* in = rows + (positions.empty() ? i : positions[i]) * width;
        check(in);
        const auto key = static_cast<std::uint64_t>(ids[i]) + 1;
        // Fibonacci hashing: nearby ids spread over the table.
        std::size_t at = static_cast<std::size_t>((key * 0x9E3779B97F4A7C15ull) >> 32) & (capacity - 1);
        while (keys[at] != 0 && keys[at] != key) at = (at + 1) & (capacity - 1);
        if (keys[at] == 0) {
            keys[at] = key;
            first[at] = kept;
            if (kept != i) {  // an earlier repeat left a gap
                ids[kept] = ids[i];
                positions[kept] = positions[i];
            }
            ++kept;
            continue;
        }
        if (positions.empty()) {  // the first repeat: until here every row was where its id is
            positions.resize(ids.size());
            std::iota(positions.begin(), positions.end(), std::size_t{0});
        }
        T* out = rows + positions[first[at]] * width;
        for (std::size_t j = 0; j < width; ++j) out[j] += in[j];
    }
    ids.resize(kept);
    if (!positions.empty()) positions.resize(kept);
    return non_finite;
}

/// How many of `values` are NaN or infinite: those whose exponent bits are all ones. Counted on the
/// bits, in an integer of the element's width, so that the loop vectorises (a loop of std::isfinite did
/// not, and made a 1 MB in-process push 3 times slower).
template <FloatingElement T>
std::size_t count_non_finite(const T* values, std::size_t n) noexcept {
    using Bits = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
    constexpr Bits exponent = static_cast<Bits>(sizeof(T) == 4 ? 0x7f800000u : 0x7ff0000000000000u);
    std::size_t total = 0;
    for (std::size_t begin = 0; begin < n;) {
        const std::size_t end = begin + std::min<std::size_t>(n - begin, std::size_t{1} << 30);
        Bits count = 0;  // the element's width: one vector lane per element
        for (std::size_t i = begin; i < end; ++i) {
            Bits bits;
            std::memcpy(&bits, values + i, sizeof bits);
            count += static_cast<Bits>((bits & exponent) == exponent);
        }
        total += static_cast<std::size_t>(count);
        begin = end;
    }
    return total;
}

/// An optimizer's slots for element type T, or nothing for an integer type (never instantiated there).
template <class OptimizerPolicy, class T, bool = FloatingElement<T>>
struct OptionalSlots {
    using type = std::monostate;
};
template <class OptimizerPolicy, class T>
struct OptionalSlots<OptimizerPolicy, T, true> {
    using type = std::optional<typename OptimizerPolicy::template Slots<T>>;
};

}  // namespace detail

/// @brief How a ParameterServer applies pushed gradients (see consistency.hpp).
struct SyncOptions {
    bool synchronous = false;      ///< false: apply each push when it arrives (TensorFlow's mode)
    std::uint64_t workers = 1;     ///< synchronous: pushes that make up one step (one per worker)
    std::uint64_t staleness = 0;   ///< synchronous: how many steps a pull may run ahead of the applied ones
};

/// @brief What a ParameterServer refuses to apply.
struct ServerOptions {
    /// Refuse a gradient holding NaN or infinity (`apply_gradient`, `apply_sparse_gradient`) with an
    /// InvalidArgumentError naming the variable and the count of bad values; the shard is left as it
    /// was. One such push would otherwise turn the variable's every value NaN, silently. The check reads
    /// the gradient once more before the optimizer does.
    bool refuse_non_finite_gradients = true;

    /// @brief The defaults, changed by the environment (what a strategy's ps tasks run with):
    /// `PSS_NON_FINITE_GRADIENTS=apply` applies non-finite gradients, `refuse` (the default) refuses them.
    /// @throws InvalidArgumentError `pss: PSS_NON_FINITE_GRADIENTS is "maybe"; give "refuse" or "apply"`
    [[nodiscard]] static ServerOptions from_environment(
        const detail::EnvironmentLookup& lookup = detail::process_environment) {
        ServerOptions options;
        if (const auto value = lookup("PSS_NON_FINITE_GRADIENTS")) {
            if (*value != "refuse" && *value != "apply")
                throw InvalidArgumentError("pss: PSS_NON_FINITE_GRADIENTS is \"" + *value +
                                           "\"; give \"refuse\" or \"apply\"");
            options.refuse_non_finite_gradients = *value == "refuse";
        }
        return options;
    }
};

/// @brief The state of one parameter-server task: its shards, each with its optimizer slots.
///
/// A ParameterServer is driven by one thread (the transport's task), so it needs no locks: requests to
/// one task are handled one at a time. `handle` validates every request completely before it changes
/// anything, so a request that fails leaves the shard as it was.
///
/// In synchronous training a pull (`read` or `gather` with a `step`) for a step not applied yet is held:
/// `handle(request, respond)` keeps `respond` and answers once the push that completes the step arrives.
/// A held pull is answered with an error when its shard is destroyed (`not_found`), or the server is
/// destroyed or stops serving (`unavailable`, see `release_held`), so that no sender waits forever. A
/// checkpoint restore sets a shard's count of applied steps to the checkpoint's step (`commit_restore`),
/// and answers the held pulls that count makes ready.
/// @tparam OptimizerPolicy applies gradients; its slots live beside each float shard.
template <Optimizer OptimizerPolicy>
class ParameterServer {
public:
    /// @param optimizer applies gradients to this task's shards
    /// @param sync how pushes are applied: asynchronously (the default) or per step from all workers
    /// @param options what the server refuses to apply
    explicit ParameterServer(OptimizerPolicy optimizer = {}, SyncOptions sync = {}, ServerOptions options = {})
        : optimizer_(std::move(optimizer)), sync_(sync), options_(options) {
        if (sync_.synchronous && sync_.workers == 0)
            throw InvalidArgumentError("pss: ParameterServer: synchronous training needs at least one worker");
    }

    ParameterServer(const ParameterServer&) = delete;
    ParameterServer& operator=(const ParameterServer&) = delete;

    /// Answers the pulls still held: the server is going away, their step will not come.
    ~ParameterServer() { release_held(); }

    /// @brief Answers every held pull `ErrorCode::unavailable`: the task stops serving, so their steps
    /// will not be applied here. Call it once the transport has stopped handing this server requests
    /// (after its `shutdown()`), since a ParameterServer takes no locks.
    void release_held() noexcept {
        for (auto& entry : shards_) {  // not a structured binding: clang 14 cannot capture one in a lambda
            Shard& shard = entry.second;
            std::visit([&](auto& state) { release_held(shard, state, ErrorCode::unavailable, "the parameter server shut down"); },
                       shard.state);
        }
    }

    /// @brief Drops every shard and staged restore (a new run begins: a restarted chief creates its
    /// variables again); held pulls are answered `ErrorCode::not_found` with `why`. Called by the thread
    /// that hands this server its requests.
    void clear(const std::string& why) noexcept {
        for (auto& entry : shards_) {
            Shard& shard = entry.second;
            std::visit([&](auto& state) { release_held(shard, state, ErrorCode::not_found, why.c_str()); }, shard.state);
        }
        shards_.clear();
        staged_.clear();
        learning_rate_.reset();
    }

    /// @brief Handles one request and answers it through `respond`, at once, or (a synchronous pull for a
    /// step not applied yet) when that step is applied. Errors become replies (never exceptions), so a
    /// bad request cannot take the task down.
    void handle(Request&& request, Responder respond) noexcept {
        Reply reply = run(std::move(request), &respond);
        if (respond) respond(std::move(reply));  // else held: answered by the push that completes its step
    }

    /// @brief Handles one request and returns its reply at once: a synchronous pull for a step not
    /// applied yet is answered `ErrorCode::not_ready` (the caller asks again), never held.
    Reply handle(Request&& request) noexcept { return run(std::move(request), nullptr); }

    /// @brief Number of shards this task holds.
    [[nodiscard]] std::size_t num_shards() const noexcept { return shards_.size(); }

private:
    template <class T>  // unconstrained: clang 14 crashes on a constrained member template in std::variant
    struct State {
        xt::xarray<T> value;
        // Slots exist for float shards only, and only once the first gradient arrives: a variable that is
        // never trained (or an Adam shard before its first step) costs only its value.
        typename detail::OptionalSlots<OptimizerPolicy, T>::type slots{};
        // Synchronous training: the steps applied so far, and the pushes of steps not complete yet.
        std::uint64_t applied = 0;
        struct Pending {
            std::uint64_t pushes = 0;
            bool pushes_dense = false;
            std::vector<TaskId> senders;         // the proven senders of its pushes
            xt::xarray<T> dense;                 // the sum of the dense gradients of the step
            struct Rows {
                std::vector<std::int64_t> ids;
                xt::xarray<T> rows;
            };
            std::vector<Rows> sparse;            // the sparse gradients of the step, in arrival order
        };
        std::map<std::uint64_t, Pending> pending;
        // Synchronous pulls waiting for their step, answered from push_step.
        struct Held {
            Request request;
            Responder respond;
        };
        std::vector<Held> held;
    };
    using AnyState = std::variant<State<float>, State<double>, State<std::int32_t>, State<std::int64_t>, State<std::string>>;

    struct Shard {
        std::string name;
        Shape shape;
        DType dtype;
        AnyState state;
    };

    struct KeyHash {
        std::size_t operator()(const ShardKey& k) const noexcept {
            return std::hash<std::uint64_t>{}(k.variable * 1000003u ^ k.shard);
        }
    };

    /// Runs `request`; a pull that has to wait for its step moves `*hold` into the shard (hold null: it
    /// is answered not_ready instead).
    Reply run(Request&& request, Responder* hold) noexcept {
        try {
            return dispatch(std::move(request), hold);
        } catch (...) {
            return Reply::of_current_exception();
        }
    }

    Reply dispatch(Request&& request, Responder* hold) {
        if (request.kind == RequestKind::heartbeat) return {};  // alive (a transport usually answers it itself)
        if (request.kind != RequestKind::operation)
            throw InvalidArgumentError(std::string("pss: a ") +
                                       (request.kind == RequestKind::call ? "call" : "shutdown") +
                                       " request reached a parameter server, which takes variable operations only "
                                       "(functions run on worker tasks)");
        if (request.op == Op::create) return create(std::move(request));
        if (request.op == Op::set_learning_rate) return set_learning_rate(request);
        auto it = shards_.find(request.key);
        if (it == shards_.end())
            throw NotFoundError("pss: " + std::string(op_name(request.op)) + ": no shard " +
                                std::to_string(request.key.variable) + "/" + std::to_string(request.key.shard) +
                                " on this task (the variable was destroyed or never created here)");
        Shard& shard = it->second;
        if (request.op == Op::save_shard) return save_shard(shard, request.name);
        if (request.op == Op::restore_shard) return restore_shard(request.key, shard, request);
        if (request.op == Op::commit_restore) return commit_restore(request.key, shard, request.step);
        if (request.op == Op::abort_restore) {
            staged_.erase(request.key);
            return {};
        }
        if (request.op == Op::destroy) {
            staged_.erase(request.key);
            std::visit([&](auto& state) { release_held(shard, state, ErrorCode::not_found, "the variable was destroyed"); },
                       shard.state);
            shards_.erase(it);
            return {};
        }
        // A request its sender in this process checked against the whole variable is not checked again.
        if (!request.in_process.checked)
            detail::validate_request(request.op, shard.name, shard.shape, shard.dtype, request.payload, request.ids);
        return std::visit([&](auto& state) { return apply(shard, state, std::move(request), hold); }, shard.state);
    }

    Reply create(Request&& request) {
        const std::string what = "pss: create variable '" + request.name + "': ";
        if (request.payload.has_value() == request.initializer.has_value())
            throw InvalidArgumentError(what + (request.payload.has_value()
                                                   ? "both an initial value and an initializer were sent; send one"
                                                   : "no initial value and no initializer were sent"));
        if (shards_.contains(request.key))
            throw AlreadyExistsError(what + "shard " + std::to_string(request.key.variable) + "/" +
                                     std::to_string(request.key.shard) + " exists already on this task");
        if (request.initializer) {
            // Drawn here, from the shard's first row on: the same values however the variable is split.
            if (auto why = request.initializer->problem(std::numeric_limits<std::uint64_t>::max()))
                throw InvalidArgumentError(what + *why);
            request.payload = detail::initial_shard(*request.initializer);
        }
        Shard shard{request.name, request.payload.shape(), request.payload.dtype(), State<float>{}};
        request.payload.visit_any_mut([&]<class T>(xt::xarray<T>& value) {
            State<T> state;
            state.value = std::move(value);
            shard.state = std::move(state);
        });
        shards_.emplace(request.key, std::move(shard));
        return {};
    }

    /// A synchronous pull for `step` may run once the steps up to `step - 1 - staleness` are applied.
    template <class T>
    [[nodiscard]] bool step_ready(const State<T>& state, std::uint64_t step) const noexcept {
        return step == 0 || state.applied + 1 + sync_.staleness >= step;
    }

    template <class T>
    Reply apply(const Shard& shard, State<T>& state, Request&& request, Responder* hold) {
        xt::xarray<T>& value = state.value;
        Reply reply;
        if (sync_.synchronous && (request.op == Op::read || request.op == Op::gather) && !step_ready(state, request.step))
        {
            if (hold != nullptr && *hold) {
                state.held.push_back({std::move(request), std::move(*hold)});
                return reply;  // not sent: the responder has moved into `held`
            }
            reply = Reply::error(ErrorCode::not_ready, "pss: " + std::string(op_name(request.op)) + " on variable '" +
                                                           shard.name + "' for step " + std::to_string(request.step) +
                                                           ": step " + std::to_string(state.applied + 1) +
                                                           " is not applied yet");
            reply.payload = std::move(request.payload);  // the caller asks again with the same buffer
            return reply;
        }
        switch (request.op) {
            case Op::read: {
                // Reuse the caller's buffer when it has the right shape: no fresh pages to fault in.
                if (request.payload.has_value() && request.payload.dtype() == dtype_of<T> &&
                    request.payload.shape() == shard.shape) {
                    auto& out = request.payload.template get<T>();
                    std::copy(value.begin(), value.end(), out.begin());
                    reply.payload = std::move(request.payload);
                } else {
                    reply.payload = xt::xarray<T>(value);
                }
                return reply;
            }
            case Op::gather: {
                const std::size_t width = detail::row_elements(shard.shape);
                if (request.in_process.into) {  // the caller's result, in this process
                    T* out = gather_target<T>(shard, request, width);
                    gather_rows(value.data(), request.ids, width,
                                [&](std::size_t i) { return out + request.in_process.into_rows[i] * width; });
                    return reply;
                }
                xt::xarray<T> out = xt::xarray<T>::from_shape(detail::rows_shape(shard.shape, request.ids.size()));
                gather_rows(value.data(), request.ids, width, [&](std::size_t i) { return out.data() + i * width; });
                reply.payload = std::move(out);
                return reply;
            }
            case Op::assign: std::swap(value, request.payload.template get<T>()); break;
            case Op::assign_add:
            case Op::assign_sub:
                if constexpr (Element<T>) add_whole(request.op, value, request.payload.template get<T>());
                break;
            case Op::scatter_add:
            case Op::scatter_sub:
            case Op::scatter_update:
            case Op::scatter_mul:
            case Op::scatter_div:
            case Op::scatter_min:
            case Op::scatter_max:
                scatter(request.op, value, request.ids,
                        request.in_process.from ? rows_source<T>(shard, request) : request.payload.template get<T>(),
                        request.in_process.from_rows);
                break;
            case Op::apply_dense:
            case Op::apply_sparse:
                if constexpr (FloatingElement<T>) {
                    // A sender in this process may leave the rows where they lie in its tensor; a ps that keeps
                    // the gradient until its synchronous step completes takes a copy of them.
                    if (request.in_process.from) {
                        rows_source<T>(shard, request);  // their form, checked before a row is read
                        if (sync_.synchronous) {
                            request.payload = detail::take_rows(*request.in_process.from, request.in_process.from_rows);
                            request.in_process.from.reset();
                            request.in_process.from_rows.clear();
                        }
                    }
                    Tensor& rows = request.in_process.from ? *request.in_process.from : request.payload;
                    if (request.op == Op::apply_sparse && !sync_.synchronous) {
                        // Repeats summed and the rows checked in one pass, before anything of the shard changes.
                        const std::size_t width = detail::row_elements(shard.shape), sent = request.ids.size();
                        const std::size_t bad =
                            detail::sum_duplicate_rows(request.ids, request.in_process.from_rows, rows.template get<T>().data(),
                                                       width, options_.refuse_non_finite_gradients);
                        if (bad != 0) throw non_finite(shard, request.op, bad, sent * width);
                    } else if (options_.refuse_non_finite_gradients) {
                        const auto& gradient = request.payload.template get<T>();
                        const std::size_t bad = detail::count_non_finite(gradient.data(), gradient.size());
                        if (bad != 0) throw non_finite(shard, request.op, bad, gradient.size());
                    }
                    // The rate for the push's step, found before anything changes (a schedule may refuse it).
                    const auto at_step = optimizer_for(request.step, shard, request.op);
                    if (!state.slots) state.slots.emplace(optimizer_.make_slots(std::as_const(value)));
                    if (sync_.synchronous) {
                        push_step(shard, state, std::move(request));
                        return reply;  // the gradient's buffer is kept until its step is applied
                    }
                    const OptimizerPolicy& optimizer = at_step ? *at_step : optimizer_;
                    if (request.op == Op::apply_dense)
                        optimizer.apply_dense(value, *state.slots, request.payload.template get<T>());
                    else
                        apply_distinct_rows(optimizer, state, request.ids, request.in_process.from_rows, std::as_const(rows));
                }
                break;
            case Op::create:
            case Op::destroy:
            case Op::save_shard:
            case Op::restore_shard:
            case Op::commit_restore:
            case Op::abort_restore:
            case Op::set_learning_rate: break;
        }
        reply.payload = std::move(request.payload);  // hand the spent buffer back for reuse
        return reply;
    }

    static InvalidArgumentError non_finite(const Shard& shard, Op op, std::size_t bad, std::size_t total) {
        return InvalidArgumentError("pss: " + std::string(op_name(op)) + " on variable '" + shard.name +
                                    "': the gradient holds " + std::to_string(bad) + " non-finite value" +
                                    (bad == 1 ? "" : "s") + " (NaN or infinity) of " + std::to_string(total) +
                                    "; nothing was applied (ServerOptions::refuse_non_finite_gradients)");
    }

    /// Where an in-process scatter's or apply_sparse's rows lie (Request::InProcess::from). Only
    /// Variable::update_rows sets it, in this process; its form is checked all the same, before a row is read.
    template <class T>
    static xt::xarray<T>& rows_source(const Shard& shard, const Request& request) {
        Tensor& from = *request.in_process.from;
        const auto& positions = request.in_process.from_rows;
        const std::size_t width = detail::row_elements(shard.shape);
        const Shape shape = from.has_value() ? from.shape() : Shape{};
        const bool fits = (request.op == Op::apply_sparse || is_scatter(request.op)) && from.has_value() &&
                          from.dtype() == dtype_of<T> &&
                          !shape.empty() && !shard.shape.empty() &&
                          std::equal(shape.begin() + 1, shape.end(), shard.shape.begin() + 1, shard.shape.end()) &&
                          positions.size() == request.ids.size() &&
                          std::all_of(positions.begin(), positions.end(), [&](std::size_t p) { return p < shape[0]; });
        if (!fits)
            throw InvalidArgumentError("pss: " + std::string(op_name(request.op)) + " on variable '" + shard.name +
                                       "': the rows' source " +
                                       (from.has_value() ? "of shape " + format_shape(shape) : std::string("(empty)")) +
                                       " does not hold " + std::to_string(request.ids.size()) + " rows of " +
                                       std::to_string(width) + " " + std::string(dtype_name(dtype_of<T>)) +
                                       " elements at the positions given");
        return from.template get<T>();
    }

    /// Lets `optimizer` apply rows of distinct ids (detail::sum_duplicate_rows): row ids[i]'s gradient
    /// is row positions[i] of `rows` (row i while `positions` is empty). No row is copied unless the
    /// optimizer cannot take rows by position.
    template <class T>
    void apply_distinct_rows(const OptimizerPolicy& optimizer, State<T>& state, std::span<const std::int64_t> distinct,
                             std::span<const std::size_t> positions, const Tensor& rows) {
        if (positions.empty()) return optimizer.apply_sparse(state.value, *state.slots, distinct, rows.template get<T>());
        if constexpr (detail::optimizer_has_apply_sparse_by_position<OptimizerPolicy, T>) {
            optimizer.apply_sparse(state.value, *state.slots, distinct, rows.template get<T>(), positions);
        } else {
            const Tensor gathered = detail::take_rows(rows, positions);
            optimizer.apply_sparse(state.value, *state.slots, distinct, gathered.template get<T>());
        }
    }

    /// The optimizer for a push of training step `step`: empty when it is the strategy's own (its rate a
    /// constant, none set for the run), else a copy at the rate set for the run, or at its schedule's
    /// rate for the step (Keras evaluates a schedule at `iterations`, the steps before this one: step - 1).
    /// @throws FailedPreconditionError when the rate is a schedule and the push names no step;
    /// InvalidArgumentError when the schedule's rate for the step is negative or not finite
    std::optional<OptimizerPolicy> optimizer_for(std::uint64_t step, const Shard& shard, Op op) const {
        if (learning_rate_) return optimizer_.with_learning_rate(*learning_rate_);
        const LearningRate& rate = optimizer_.learning_rate();
        if (!rate.is_schedule()) return std::nullopt;
        const auto what = [&] { return std::string(op_name(op)) + " on variable '" + shard.name + "'"; };
        if (step == 0)
            throw FailedPreconditionError(
                "pss: " + what() + ": the optimizer's learning rate is a schedule (" + rate.schedule()->class_name() +
                "), so each push must name its training step (1, 2, ...) for the schedule to be evaluated at: "
                "apply_gradient(gradient, step) (Sequential::fit does)");
        const auto iterations = static_cast<std::int64_t>(std::min<std::uint64_t>(step - 1, INT64_MAX));
        const double r = rate(iterations);
        if (!(r >= 0) || !std::isfinite(r))
            throw InvalidArgumentError("pss: " + what() + ": the learning-rate schedule " +
                                       rate.schedule()->class_name() + " gave " + detail::format_number(r) +
                                       " for step " + std::to_string(step) + " (iterations " +
                                       std::to_string(iterations) + "); a rate must be a finite number >= 0");
        return optimizer_.with_learning_rate(r);
    }

    /// Op::set_learning_rate: the rate every push applies from now on (a float64 scalar), or the
    /// optimizer's own again (no payload).
    Reply set_learning_rate(const Request& request) {
        if (!request.payload.has_value()) {
            learning_rate_.reset();
            return {};
        }
        if (request.payload.dtype() != DType::float64 || request.payload.rank() != 0)
            throw InvalidArgumentError("pss: set_learning_rate: the rate is a float64 scalar, but a " +
                                       std::string(dtype_name(request.payload.dtype())) + " of shape " +
                                       format_shape(request.payload.shape()) + " was sent");
        const double rate = request.payload.template get<double>()();
        detail::check_settable_learning_rate(optimizer_, rate, "set_learning_rate");
        learning_rate_ = rate;
        return {};
    }

    /// Synchronous training: adds a push to its step, then applies every complete step in order, each
    /// from the mean of its workers' gradients. Dense gradients are summed as they arrive (exact for
    /// two workers, since addition commutes; with more, the last bits may follow the arrival order).
    template <class T>
    void push_step(const Shard& shard, State<T>& state, Request&& request) {
        const std::uint64_t step = request.step;
        const std::string what = std::string(op_name(request.op)) + " on variable '" + shard.name + "'";
        if (step == 0)
            throw FailedPreconditionError("pss: " + what +
                                          ": training is synchronous, so every push must name its step (1, 2, ...)");
        // A proven sender's push to a step it pushed to already is a closure run again after its worker
        // was lost (at least once): the first push counts, the same one again changes nothing.
        if (request.sender && step <= state.applied) return;
        if (step <= state.applied)
            throw InvalidArgumentError("pss: " + what + ": step " + std::to_string(step) +
                                       " is applied already; a worker pushed twice, or too late");
        // A push may be ahead of this shard by one step more than the staleness bound: its worker's pulls
        // may have been checked against other shards only. Every worker finished step s - 2 - staleness
        // (its pushes were answered) before any worker could pull step s anywhere, so a push of step s
        // further ahead than that comes from no worker of this run: it is refused, not kept (a stranger's
        // pushes for far-future steps would otherwise hold memory for ever). It waits in `pending` until
        // the steps before it are applied.
        if (step > state.applied + 2 + sync_.staleness)
            throw InvalidArgumentError("pss: " + what + ": step " + std::to_string(step) + " is too far ahead: step " +
                                       std::to_string(state.applied) + " is the last applied, and with staleness " +
                                       std::to_string(sync_.staleness) + " no worker can push beyond step " +
                                       std::to_string(state.applied + 2 + sync_.staleness));
        auto& pending = state.pending[step];
        // A proven worker: one push per step, so that no one task completes a step alone. The chief may
        // push more: it completes a failed fit's steps with an empty push for each closure that never ran.
        if (request.sender && request.sender->type != "chief") {
            if (std::find(pending.senders.begin(), pending.senders.end(), *request.sender) != pending.senders.end())
                return;  // pushed again (see above)
            pending.senders.push_back(*request.sender);
        }
        auto& grad = request.payload.template get<T>();
        if (request.op == Op::apply_dense) {
            if (!pending.pushes_dense)
                pending.dense = std::move(grad);
            else
                xt::noalias(pending.dense) += grad;
            pending.pushes_dense = true;
        } else {
            pending.sparse.push_back({std::move(request.ids), std::move(grad)});
        }
        ++pending.pushes;
        for (auto it = state.pending.begin();
             it != state.pending.end() && it->first == state.applied + 1 && it->second.pushes >= sync_.workers;
             it = state.pending.erase(it)) {
            auto& done = it->second;
            const T scale = T{1} / static_cast<T>(sync_.workers);
            // Cannot throw: each push of the step was checked against it when it arrived.
            const auto at_step = optimizer_for(it->first, shard, request.op);
            const OptimizerPolicy& optimizer = at_step ? *at_step : optimizer_;
            if (done.pushes_dense) {
                done.dense *= scale;
                optimizer.apply_dense(state.value, *state.slots, std::as_const(done.dense));
            }
            if (!done.sparse.empty()) {
                // Sum the workers' rows in an order that does not depend on their arrival, so that a
                // synchronous run gives the same bits every time.
                std::sort(done.sparse.begin(), done.sparse.end(), [](const auto& a, const auto& b) {
                    if (a.ids != b.ids) return a.ids < b.ids;
                    return std::lexicographical_compare(a.rows.begin(), a.rows.end(), b.rows.begin(), b.rows.end());
                });
                std::vector<std::int64_t> ids;
                for (const auto& part : done.sparse) ids.insert(ids.end(), part.ids.begin(), part.ids.end());
                const Shape shape(state.value.shape().begin(), state.value.shape().end());
                xt::xarray<T> rows = xt::xarray<T>::from_shape(detail::rows_shape(shape, ids.size()));
                auto out = rows.begin();
                for (const auto& part : done.sparse) out = std::copy(part.rows.begin(), part.rows.end(), out);
                std::vector<std::size_t> positions;  // the rows in the order of their ids
                const std::size_t width = detail::row_elements(shape);
                detail::sum_duplicate_rows(ids, positions, rows.data(), width);
                for (std::size_t i = 0; i < ids.size(); ++i) {
                    T* row = rows.data() + (positions.empty() ? i : positions[i]) * width;
                    for (std::size_t j = 0; j < width; ++j) row[j] *= scale;
                }
                if (!ids.empty()) apply_distinct_rows(optimizer, state, ids, positions, Tensor(std::move(rows)));
            }
            ++state.applied;
        }
        answer_ready(shard, state);
    }

    /// Answers the held pulls whose step is applied now, in the order they arrived.
    template <class T>
    void answer_ready(const Shard& shard, State<T>& state) {
        if (std::none_of(state.held.begin(), state.held.end(),
                         [&](const auto& h) { return step_ready(state, h.request.step); }))
            return;
        std::vector<typename State<T>::Held> ready, waiting;
        for (auto& h : state.held) (step_ready(state, h.request.step) ? ready : waiting).push_back(std::move(h));
        state.held = std::move(waiting);
        for (auto& h : ready) h.respond(run_held(shard, state, std::move(h.request)));
    }

    template <class T>
    Reply run_held(const Shard& shard, State<T>& state, Request&& request) noexcept {
        try {
            return apply(shard, state, std::move(request), nullptr);
        } catch (...) {
            return Reply::of_current_exception();
        }
    }

    /// Answers every held pull of a shard with `code`: its step will not be applied here.
    template <class T>
    static void release_held(const Shard& shard, State<T>& state, ErrorCode code, const char* why) noexcept {
        auto held = std::move(state.held);
        state.held.clear();
        for (auto& h : held)
            h.respond(Reply::error(code, "pss: " + std::string(op_name(h.request.op)) + " on variable '" + shard.name +
                                             "' for step " + std::to_string(h.request.step) + " was waiting when " +
                                             why + "; the step will not be applied"));
    }

    /// Copies row ids[i] of the shard to `to(i)`, a few rows' first bytes asked for ahead: random rows
    /// of a large shard miss the cache, and the misses of rows copied by a call each overlap only so.
    template <class T, class To>
    static void gather_rows(const T* value, std::span<const std::int64_t> ids, std::size_t width, To&& to) {
        const auto loop = [&](auto copy_row) {
            for (std::size_t i = 0; i < ids.size(); ++i) {
                if (i + detail::sparse_prefetch_rows < ids.size())
                    detail::prefetch_row<T>(static_cast<std::size_t>(ids[i + detail::sparse_prefetch_rows]) * width,
                                            width, value);
                copy_row(to(i), value + static_cast<std::size_t>(ids[i]) * width);
            }
        };
        if constexpr (std::is_trivially_copyable_v<T>)
            detail::with_row_copy(width * sizeof(T), [&](auto copy) {
                loop([&](T* to, const T* from) {
                    copy(reinterpret_cast<std::byte*>(to), reinterpret_cast<const std::byte*>(from));
                });
            });
        else
            loop([&](T* to, const T* from) { std::copy_n(from, width, to); });
    }

    /// Where an in-process gather writes (Request::InProcess::into). Only Variable::sparse_read sets
    /// it, in this process, with a row of the result for each id; its form is checked all the same.
    template <class T>
    static T* gather_target(const Shard& shard, const Request& request, std::size_t width) {
        Tensor& into = *request.in_process.into;
        const bool fits = into.has_value() && into.dtype() == dtype_of<T> && !into.shape().empty() &&
                          detail::row_elements(into.shape()) == width &&
                          request.in_process.into_rows.size() == request.ids.size() &&
                          request.ids.size() <= into.shape()[0];
        if (!fits)
            throw InvalidArgumentError("pss: gather on variable '" + shard.name + "': the rows' destination " +
                                       (into.has_value() ? "of shape " + format_shape(into.shape()) : std::string("(empty)")) +
                                       " does not take " + std::to_string(request.ids.size()) + " rows of " +
                                       std::to_string(width) + " " + std::string(dtype_name(dtype_of<T>)) + " elements");
        return into.template get<T>().data();
    }

    /// Row ids[i] of the shard combined with row positions[i] of `rows` (row i while `positions` is empty).
    template <class T>
    static void scatter(Op op, xt::xarray<T>& value, std::span<const std::int64_t> ids, const xt::xarray<T>& rows,
                        std::span<const std::size_t> positions) {
        // A loop over rows, not xt::keep: a view with a repeated index would add that row only once.
        const std::size_t width = detail::row_elements(Shape(value.shape().begin(), value.shape().end()));
        auto row = [&](std::size_t i) { return rows.data() + (positions.empty() ? i : positions[i]) * width; };
        [[maybe_unused]] auto each_row = [&]<Op K>() {
            for (std::size_t i = 0; i < ids.size(); ++i) {
                T* out = value.data() + static_cast<std::size_t>(ids[i]) * width;
                const T* in = row(i);
                for (std::size_t j = 0; j < width; ++j) out[j] = detail::combine_elements<K>(out[j], in[j]);
            }
        };
        // One loop per operation, so that each inner loop is a plain one the compiler vectorizes.
        if (op == Op::scatter_update) {
            for (std::size_t i = 0; i < ids.size(); ++i)
                std::copy_n(row(i), width, value.data() + static_cast<std::size_t>(ids[i]) * width);
            return;
        }
        if constexpr (Element<T>) {  // strings are only scatter_updated (detail::validate_request)
            switch (op) {
                case Op::scatter_add: return each_row.template operator()<Op::scatter_add>();
                case Op::scatter_sub: return each_row.template operator()<Op::scatter_sub>();
                case Op::scatter_mul: return each_row.template operator()<Op::scatter_mul>();
                case Op::scatter_div: return each_row.template operator()<Op::scatter_div>();
                case Op::scatter_min: return each_row.template operator()<Op::scatter_min>();
                case Op::scatter_max: return each_row.template operator()<Op::scatter_max>();
                default: return;
            }
        }
    }

    /// value += delta or value -= delta; integers wrap around as in scatter (detail::combine_elements).
    template <class T>
    static void add_whole(Op op, xt::xarray<T>& value, const xt::xarray<T>& delta) {
        if constexpr (std::is_integral_v<T>) {
            T* out = value.data();
            const T* in = delta.data();
            if (op == Op::assign_add)
                for (std::size_t i = 0; i < value.size(); ++i) out[i] = detail::combine_elements<Op::scatter_add>(out[i], in[i]);
            else
                for (std::size_t i = 0; i < value.size(); ++i) out[i] = detail::combine_elements<Op::scatter_sub>(out[i], in[i]);
        } else if (op == Op::assign_add) {
            xt::noalias(value) += delta;
        } else {
            xt::noalias(value) -= delta;
        }
    }

    // ---- checkpoints ------------------------------------------------------------------------------------

    /// A shard's value and slots read from a checkpoint, waiting for commit_restore.
    template <class T>
    struct Staged {
        xt::xarray<T> value;
        typename detail::OptionalSlots<OptimizerPolicy, T>::type slots{};
    };
    using AnyStaged =
        std::variant<Staged<float>, Staged<double>, Staged<std::int32_t>, Staged<std::int64_t>, Staged<std::string>>;

    /// Writes `<prefix>.npy` (the value) and `<prefix>.<slot>.npy` for each slot tensor of a float shard
    /// (fresh slots when no gradient came yet), each fsync'd; replies with their records and the slots'
    /// counters as JSON in the message. Writes from the shard's own memory: no copy. The prefix must
    /// name a file in a save's temporary directory (`detail::check_save_prefix`): any peer can send it.
    Reply save_shard(const Shard& shard, const std::string& prefix) {
        detail::check_save_prefix(prefix);
        return std::visit([&](auto& state) { return save_state(shard, state, prefix); }, shard.state);
    }

    template <class T>
    Reply save_state(const Shard& shard, const State<T>& state, const std::string& prefix) const {
        nlohmann::json out;
        if constexpr (std::same_as<T, std::string>)
            out["value"] = detail::write_npy_strings(prefix + ".npy", "save_shard on variable '" + shard.name + "'",
                                                     shard.shape, state.value.data(), state.value.size());
        else
            out["value"] = detail::write_npy(prefix + ".npy", shard.dtype, shard.shape, state.value.data(),
                                             state.value.size() * sizeof(T));
        nlohmann::json slots = nlohmann::json::object(), counters = nlohmann::json::object();
        if constexpr (FloatingElement<T>) {
            using SlotsType = typename OptimizerPolicy::template Slots<T>;
            std::optional<SlotsType> fresh;
            const SlotsType& current = state.slots ? *state.slots : fresh.emplace(optimizer_.make_slots(state.value));
            OptimizerPolicy::for_each_slot(current, [&](std::string_view name, const auto& item) {
                if constexpr (std::integral<std::decay_t<decltype(item)>>) {
                    counters[std::string(name)] = static_cast<std::int64_t>(item);
                } else {
                    if (!std::equal(item.shape().begin(), item.shape().end(), shard.shape.begin(), shard.shape.end()))
                        throw InternalError("pss: save_shard on variable '" + shard.name + "': slot '" +
                                            std::string(name) + "' has shape " + format_shape(item.shape()) +
                                            " but the shard has " + format_shape(shard.shape) +
                                            "; the optimizer breaks the Optimizer concept's rule");
                    slots[std::string(name)] = detail::write_npy(prefix + "." + detail::file_stem(name) + ".npy",
                                                                 shard.dtype, shard.shape, item.data(),
                                                                 item.size() * sizeof(T));
                }
            });
        }
        out["slots"] = std::move(slots);
        out["counters"] = std::move(counters);
        Reply reply;
        reply.message = out.dump();
        return reply;
    }

    /// Reads this shard's rows of a saved variable (value and slots) from whichever saved shards hold
    /// them, checks them, and keeps them staged: the shard itself is not changed until commit_restore.
    Reply restore_shard(const ShardKey& key, const Shard& shard, const Request& request) {
        const std::string what = "restore_shard on variable '" + shard.name + "'";
        const auto newline = request.name.find('\n');
        if (newline == std::string::npos || request.ids.size() != 2 || request.ids[0] < 0 || request.ids[1] < request.ids[0])
            throw InvalidArgumentError("pss: " + what +
                                       ": the request must name \"directory\\nvariable\" and a row range [begin, end)");
        const std::string dir = request.name.substr(0, newline), name = request.name.substr(newline + 1);
        const auto begin = static_cast<std::size_t>(request.ids[0]), end = static_cast<std::size_t>(request.ids[1]);
        detail::check_restore_directory(dir);
        const detail::CheckpointIndex index = detail::read_index(dir);
        const detail::SavedVariable* saved = index.find(name);
        if (saved == nullptr) throw NotFoundError("pss: " + what + ": " + dir + " has no variable '" + name + "'");
        const bool rows_fit =
            shard.shape.empty()
                ? saved->shape.empty()
                : saved->shape.size() == shard.shape.size() && end - begin == shard.shape[0] && end <= saved->shape[0] &&
                      std::equal(shard.shape.begin() + 1, shard.shape.end(), saved->shape.begin() + 1);
        if (saved->dtype != shard.dtype || !rows_fit)
            throw InvalidArgumentError("pss: " + what + ": rows [" + std::to_string(begin) + ", " + std::to_string(end) +
                                       ") of the saved shape " + format_shape(saved->shape) + " dtype " +
                                       std::string(dtype_name(saved->dtype)) + " do not fit this shard of shape " +
                                       format_shape(shard.shape) + " dtype " + std::string(dtype_name(shard.dtype)));
        std::visit([&](const auto& state) {
            using T = typename std::decay_t<decltype(state.value)>::value_type;
            Staged<T> staged;
            staged.value = xt::xarray<T>::from_shape(shard.shape);
            detail::read_saved_rows(dir, *saved, "", begin, end, staged.value.data());
            if constexpr (FloatingElement<T>) {
                auto slots = optimizer_.make_slots(std::as_const(staged.value));
                const auto pieces = detail::pieces_of_rows(*saved, begin, end);
                OptimizerPolicy::for_each_slot(slots, [&](std::string_view slot, auto& item) {
                    if constexpr (std::integral<std::decay_t<decltype(item)>>) {
                        // A counter of the saved shards that hold these rows; when they differ (shards
                        // trained asynchronously and resharded), the largest.
                        bool found = false;
                        for (const auto& piece : pieces) {
                            const auto& counters = saved->shards[piece.shard].counters;
                            auto it = counters.find(std::string(slot));
                            if (it == counters.end())
                                throw InvalidArgumentError("pss: " + what + ": " + dir + " has no counter '" +
                                                           std::string(slot) + "' for shard " +
                                                           std::to_string(piece.shard) + " of '" + name + "'");
                            item = found ? std::max<std::int64_t>(item, it->second) : it->second;
                            found = true;
                        }
                    } else {
                        detail::read_saved_rows(dir, *saved, std::string(slot), begin, end, item.data());
                    }
                });
                staged.slots.emplace(std::move(slots));
            }
            staged_.insert_or_assign(key, AnyStaged(std::move(staged)));
        }, shard.state);
        return {};
    }

    /// Replaces the shard's value and slots by its staged ones. In synchronous training the shard's count
    /// of applied steps becomes `step`, the checkpoint's, whether the count was behind it (a fresh shard)
    /// or ahead (a running cluster taken back to an older checkpoint), so that the next step it applies
    /// is the one after the checkpoint's, as a resumed run numbers it (and a learning-rate schedule is
    /// evaluated at it). Every push waiting for its step is dropped, whatever its step: its gradient is of
    /// values the restore replaced. Held pulls whose step now counts as applied are answered with the
    /// restored values; the others wait for their step as before.
    Reply commit_restore(const ShardKey& key, Shard& shard, std::uint64_t step) {
        auto it = staged_.find(key);
        if (it == staged_.end())
            throw FailedPreconditionError("pss: commit_restore on variable '" + shard.name +
                                          "': nothing is staged for it (restore_shard first)");
        std::visit([&](auto& state) {
            using T = typename std::decay_t<decltype(state.value)>::value_type;
            auto* staged = std::get_if<Staged<T>>(&it->second);
            if (staged == nullptr)
                throw InternalError("pss: commit_restore on variable '" + shard.name + "': the staged dtype differs");
            state.value = std::move(staged->value);
            state.slots = std::move(staged->slots);
            if (sync_.synchronous) {
                state.applied = step;
                state.pending.clear();
                answer_ready(shard, state);
            }
        }, shard.state);
        staged_.erase(it);
        return {};
    }

    OptimizerPolicy optimizer_;
    std::optional<double> learning_rate_;  // set for the run (Op::set_learning_rate): every push applies it
    SyncOptions sync_;
    ServerOptions options_;
    std::unordered_map<ShardKey, Shard, KeyHash> shards_;
    std::unordered_map<ShardKey, AnyStaged, KeyHash> staged_;
};

PSS_NAMESPACE_END
