// pss/concepts/optimizer.hpp: the Optimizer concept, how a shard applies a gradient and which slots it keeps.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <ranges>
#include <span>
#include <string_view>
#include <utility>

#include <nlohmann/json_fwd.hpp>
#include <xtensor/xarray.hpp>

#include <pss/config.hpp>
#include <pss/optimizer/schedules.hpp>

PSS_NAMESPACE_BEGIN

namespace detail {

/// @brief Requirement 1 of Optimizer: the strategy and every ps task keep their own copy.
template <class O>
concept optimizer_copy_constructible = std::copy_constructible<O>;

/// @brief Requirement 2 of Optimizer: `O::name()` names the algorithm, as Keras' `optimizer.name`.
template <class O>
concept optimizer_has_name = requires {
    { O::name() } -> std::convertible_to<std::string_view>;
};

/// @brief Requirement 3 of Optimizer: `O::Slots<T>` is the per-shard state (for element type T).
template <class O, class T>
concept optimizer_has_slots = requires { typename O::template Slots<T>; };

/// @brief Requirement 4 of Optimizer: a const optimizer makes the slots of a shard from its value.
template <class O, class T>
concept optimizer_has_make_slots = requires(const O& o, const xt::xarray<T>& value) {
    { o.make_slots(value) } -> std::same_as<typename O::template Slots<T>>;
};

/// @brief Requirement 5 of Optimizer: a const optimizer applies a dense gradient to a whole shard.
template <class O, class T>
concept optimizer_has_apply_dense =
    requires(const O& o, xt::xarray<T>& value, typename O::template Slots<T>& slots, const xt::xarray<T>& grad) {
        o.apply_dense(value, slots, grad);
    };

/// @brief Requirement 6 of Optimizer: a const optimizer applies gradient rows to some rows of a shard.
template <class O, class T>
concept optimizer_has_apply_sparse =
    requires(const O& o, xt::xarray<T>& value, typename O::template Slots<T>& slots,
             std::span<const std::int64_t> rows, const xt::xarray<T>& grad_rows) {
        o.apply_sparse(value, slots, rows, grad_rows);
    };

/// @brief Optional, beside requirement 6: the gradient of row `rows[i]` is row `positions[i]` of
/// `grad_rows`. A ps in its caller's process applies the caller's rows where they lie when the
/// optimizer has it (SGD, Momentum, Adagrad and Adam do), and gathers them into a copy when not.
template <class O, class T>
concept optimizer_has_apply_sparse_by_position =
    requires(const O& o, xt::xarray<T>& value, typename O::template Slots<T>& slots,
             std::span<const std::int64_t> rows, const xt::xarray<T>& grad_rows,
             std::span<const std::size_t> positions) {
        o.apply_sparse(value, slots, rows, grad_rows, positions);
    };

/// @brief What `O::for_each_slot` calls on a mutable Slots<T>: each slot tensor, then each counter,
/// by name. Declared only: the concept checks calls, nothing runs it.
template <class T>
struct SlotVisitorArchetype {
    void operator()(std::string_view name, xt::xarray<T>& tensor) const;
    void operator()(std::string_view name, std::int64_t& counter) const;
};

/// @brief What `O::for_each_slot` calls on a const Slots<T>.
template <class T>
struct ConstSlotVisitorArchetype {
    void operator()(std::string_view name, const xt::xarray<T>& tensor) const;
    void operator()(std::string_view name, const std::int64_t& counter) const;
};

/// @brief Requirement 7 of Optimizer: `O::for_each_slot(slots, f)` shows a checkpoint every slot tensor
/// and counter of a shard, by name, mutable and const.
template <class O, class T>
concept optimizer_has_for_each_slot =
    requires(typename O::template Slots<T>& slots, const typename O::template Slots<T>& const_slots) {
        O::for_each_slot(slots, SlotVisitorArchetype<T>{});
        O::for_each_slot(const_slots, ConstSlotVisitorArchetype<T>{});
    };

/// @brief Requirements 3 to 6 for one element type.
template <class O, class T>
concept optimizer_for_element = optimizer_has_slots<O, T> && optimizer_has_make_slots<O, T> &&
                                optimizer_has_apply_dense<O, T> && optimizer_has_apply_sparse<O, T>;

/// @brief Requirement 8 of Optimizer: `O::slot_names()` names the slot tensors a checkpoint saves.
template <class O>
concept optimizer_has_slot_names = requires {
    { O::slot_names() } -> std::ranges::input_range;
    requires std::convertible_to<std::ranges::range_value_t<decltype(O::slot_names())>, std::string_view>;
};

/// @brief Requirement 9 of Optimizer: `o.get_config()` is the hyperparameters as a JSON object
/// (Keras' `get_config()`), for a checkpoint's index. Only its declaration is needed here.
template <class O>
concept optimizer_has_get_config = requires(const O& o) {
    requires std::same_as<decltype(o.get_config()), nlohmann::json>;
};

/// @brief Requirement 10 of Optimizer: `o.learning_rate()` is the rate, a constant or a schedule, and
/// `o.with_learning_rate(rate)` the same optimizer at a constant rate (how a ps applies a schedule).
template <class O>
concept optimizer_has_learning_rate = requires(const O& o, double rate) {
    { o.learning_rate() } -> std::convertible_to<const LearningRate&>;
    { o.with_learning_rate(rate) } -> std::same_as<O>;
};

}  // namespace detail

/// @brief Optimizer: how a parameter server applies a gradient to a shard it owns, dense or to some
/// rows, and which per-shard state (slots: momentum, accumulators) it keeps beside the shard.
///
/// The counterpart of a Keras optimizer's `update_step` on a ps. An Optimizer object holds only
/// hyperparameters; all state that changes lives in `Slots<T>`, created on the ps beside each shard,
/// so one optimizer object serves every shard and every task.
///
/// @par Requirements
/// For T in {float, double}: `o` is a `const O`, `value` an `xt::xarray<T>&` (the shard), `slots` an
/// `O::Slots<T>&`, `grad` a `const xt::xarray<T>&`, `rows` a `std::span<const std::int64_t>`,
/// `grad_rows` a `const xt::xarray<T>&`.
///
/// | expression | type | semantics |
/// | --- | --- | --- |
/// | `O(o)` | `O` | copies the hyperparameters |
/// | `O::name()` | convertible to `std::string_view` | the algorithm's Keras name: "SGD", "Adam" |
/// | `typename O::template Slots<T>` | | per-shard state; a struct of xarrays and counters |
/// | `o.make_slots(value)` | `O::Slots<T>` | fresh slots for a shard whose value is `value`: each slot tensor has value's shape |
/// | `o.apply_dense(value, slots, grad)` | any | applies `grad` (value's shape) to the whole shard |
/// | `o.apply_sparse(value, slots, rows, grad_rows)` | any | applies row i of `grad_rows` to row `rows[i]` of the shard |
/// | `o.apply_sparse(value, slots, rows, grad_rows, positions)` (optional) | any | applies row `positions[i]` of `grad_rows` to row `rows[i]`; `positions` a `std::span<const std::size_t>`, one a row, each below `grad_rows.shape()[0]` (the same update as gathering those rows first) |
/// | `O::for_each_slot(slots, f)` | any | calls `f(name, tensor)` for each slot tensor (`xt::xarray<T>&`, const for const slots) in `slot_names()` order, then `f(name, counter)` for each `std::int64_t` counter (Adam's "iterations") |
/// | `O::slot_names()` | an input range of string_view | the slot tensors' names, Keras 3's: {} for SGD, {"momentum"}, {"accumulator"}, {"momentum", "velocity"} for Adam |
/// | `o.get_config()` | `nlohmann::json` | the hyperparameters by Keras' names, `{"learning_rate": 0.01}` |
/// | `o.learning_rate()` | convertible to `const LearningRate&` | the rate: a constant, or a LearningRateSchedule of the training step (Keras' `optimizer.learning_rate`) |
/// | `o.with_learning_rate(rate)` | `O` | the same hyperparameters with the constant rate `rate` (a double, finite and >= 0) |
///
/// @par Rules the compiler cannot check
/// - The caller (the ps) checks shapes before it calls: `grad` has value's shape; `value` has rank >= 1
///   for apply_sparse and `grad_rows` has shape (rows.size(), value.shape[1:]...); every id in `rows` is
///   in [0, value.shape[0]) and appears once (the ps sums duplicate ids first). `slots` were made by
///   `make_slots` of the same optimizer for this shard.
/// - An apply is atomic with respect to the shard: the ps handles one request per shard at a time, so
///   a model needs no locks. A const optimizer keeps no mutable state, so one object may apply to
///   different shards from different threads at once.
/// - apply_sparse is lazy, as TF1's sparse apply ops and LazyAdam: it reads and writes only the listed
///   rows of the value and the same rows of each slot tensor; every other row, and its slot rows, are
///   left exactly as they were. Updating every row once with apply_sparse equals apply_dense.
/// - Step counters (Adam's t) are per shard, in the slots, and count dense and sparse applies alike
///   (an apply_sparse with no rows counts too).
/// - The learning rate: the ps applies each push with `o.with_learning_rate(r)` when the rate is a
///   schedule (r is the schedule's value for the push's step s, `o.learning_rate()(s - 1)`, Keras'
///   iterations before the apply) or was set for the run (`set_learning_rate`, LearningRateScheduler),
///   and with `o` itself otherwise; so an apply of `o` uses its constant rate, and may throw
///   FailedPreconditionError when the rate is a schedule (it does not know the step).
/// - The update is deterministic: the same value, slots and gradient give the same bits.
/// - for_each_slot shows all the state of a Slots<T>: slots whose tensors and counters are assigned
///   those of another Slots<T> (by name, through for_each_slot) update to the same bits as that one.
///   Every slot tensor has the shard's shape, so a checkpoint can split and join slots by rows.
///
/// @par Models
/// SGD, Momentum (Nesterov too), Adagrad, Adam; the least model is `pss::archetypes::OptimizerArchetype`
/// (tests/archetypes/optimizer.hpp). `tests/test_policies.cpp` has the conformance suite every model runs.
template <class O>
concept Optimizer = detail::optimizer_copy_constructible<O> && detail::optimizer_has_name<O> &&
                    detail::optimizer_for_element<O, float> && detail::optimizer_for_element<O, double> &&
                    detail::optimizer_has_for_each_slot<O, float> && detail::optimizer_has_for_each_slot<O, double> &&
                    detail::optimizer_has_slot_names<O> && detail::optimizer_has_get_config<O> &&
                    detail::optimizer_has_learning_rate<O>;

PSS_NAMESPACE_END
