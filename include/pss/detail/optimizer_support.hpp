// pss/detail/optimizer_support.hpp: blockwise evaluation, shape checks and hyperparameter checks shared by the optimizers.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <xtensor/xadapt.hpp>
#include <xtensor/xarray.hpp>

#include <pss/config.hpp>
#include <pss/errors.hpp>
#include <pss/tensor.hpp>

/// Marks an optimizer's block kernel: every call inside it (xtensor's assignment loops included) is
/// inlined, so the expression objects never escape and their data pointers stay in registers. Without
/// it the loop reloads every pointer after each SIMD store (xsimd stores may alias anything) and runs
/// at about half the speed of a plain loop.
#if defined(__GNUC__) || defined(__clang__)
#define PSS_DETAIL_FLATTEN [[gnu::flatten]]
#else
#define PSS_DETAIL_FLATTEN
#endif

PSS_NAMESPACE_BEGIN

namespace detail {

/// @brief Elements per block of a fused update: 8 KiB per operand, so Adam's four operands (value, m,
/// v, gradient) stay in a 32 KiB L1 cache between its three statements.
template <class T>
inline constexpr std::size_t optimizer_block_elements = 8192 / sizeof(T);

/// @brief A one-dimensional xtensor view of `n` elements at `data`, owning nothing.
template <class T>
[[nodiscard]] inline auto adapt_block(T* data, std::size_t n) {
    // The pointer goes in by value (a prvalue): an lvalue would make the adaptor hold a reference to it.
    return xt::adapt(static_cast<T*>(data), n, xt::no_ownership(), std::array<std::size_t, 1>{n});
}

/// @brief Calls `f(offset, count)` for consecutive blocks of at most `block` elements covering [0, n).
template <class F>
inline void for_each_block(std::size_t n, std::size_t block, F&& f) {
    for (std::size_t offset = 0; offset < n; offset += block) f(offset, std::min(block, n - offset));
}

/// @brief Dense apply: calls `f(offset, count)` over blocks of the whole shard (offsets into value,
/// slots and gradient alike).
template <class T, class F>
inline void for_each_dense_block(std::size_t n, F&& f) {
    for_each_block(n, optimizer_block_elements<T>, f);
}

/// @brief Rows ahead of the current one whose shard and slot rows a sparse apply or a gather prefetches.
/// Eight: a row from memory takes longer than eight rows' work (bench_training with fresh ids each call,
/// so that the rows come from memory as in training: the lookup 0.8 to 1.8 times as fast as with four
/// rows ahead, mostly 1.2 to 1.3, the sparse update 1.1 to 1.25; sixteen halved the update's rate).
inline constexpr std::size_t sparse_prefetch_rows = 8;

/// @brief Bytes of a row prefetched ahead (the rest of a long row streams in as it is read).
inline constexpr std::size_t sparse_prefetch_bytes = 512;

/// @brief Asks for the first bytes of row `row` of each tensor in `bases` (shard and slots) to be
/// loaded into cache. Random rows of a large shard miss the cache and the TLB; a plain loop overlaps
/// those misses across rows by itself, a kernel with xtensor's per-call setup needs to be told.
template <class T, class... Ptrs>
inline void prefetch_row(std::size_t row_offset, std::size_t row_elements, Ptrs... bases) {
#if defined(__GNUC__) || defined(__clang__)
    const std::size_t bytes = std::min(row_elements * sizeof(T), sparse_prefetch_bytes);
    for (std::size_t b = 0; b < bytes; b += 64)
        (__builtin_prefetch(reinterpret_cast<const char*>(bases + row_offset) + b, 1), ...);
#else
    (void)row_offset;
    (void)row_elements;
    ((void)bases, ...);
#endif
}

/// @brief Sparse apply: for row i, calls `f(value_offset, grad_offset, count)` over blocks of row
/// `rows[i]` of the shard (value_offset, also the slots' offset) and row `positions[i]` of the gradient
/// rows (row i when `positions` is empty). `bases` are the shard's and the slots' data pointers,
/// prefetched a few rows ahead.
template <class T, class F, class... Ptrs>
inline void for_each_sparse_block(std::span<const std::int64_t> rows, std::span<const std::size_t> positions,
                                  std::size_t row_elements, F&& f, Ptrs... bases) {
    for (std::size_t i = 0; i < rows.size(); ++i) {
        if (i + sparse_prefetch_rows < rows.size())
            prefetch_row<T>(static_cast<std::size_t>(rows[i + sparse_prefetch_rows]) * row_elements, row_elements,
                            bases...);
        const std::size_t value_row = static_cast<std::size_t>(rows[i]) * row_elements;
        const std::size_t grad_row = (positions.empty() ? i : positions[i]) * row_elements;
        for_each_block(row_elements, optimizer_block_elements<T>,
                       [&](std::size_t offset, std::size_t count) { f(value_row + offset, grad_row + offset, count); });
    }
}

/// @brief Checks that a dense gradient has the shard's shape.
/// @throws InvalidArgumentError `pss: SGD.apply_dense: the gradient has shape (3,) but the shard has shape (4,)`
template <class T>
inline void check_dense(std::string_view optimizer, const xt::xarray<T>& value, const xt::xarray<T>& grad) {
    if (!std::ranges::equal(value.shape(), grad.shape()))
        throw InvalidArgumentError("pss: " + std::string(optimizer) + ".apply_dense: the gradient has shape " +
                                   format_shape(grad.shape()) + " but the shard has shape " +
                                   format_shape(value.shape()) + "; a dense gradient has the shard's shape");
}

/// @brief Checks a sparse gradient against the shard and returns the elements per row. The caller
/// has validated already; this guards the shard's memory against a caller that did not.
/// @param positions where each row's gradient is among `grad_rows` (empty: row i is row i)
/// @throws InvalidArgumentError for a shape mismatch, a row id outside the shard or a position outside
/// the gradient rows.
template <class T>
inline std::size_t check_sparse(std::string_view optimizer, const xt::xarray<T>& value,
                                std::span<const std::int64_t> rows, const xt::xarray<T>& grad_rows,
                                std::span<const std::size_t> positions = {}) {
    const std::string who = "pss: " + std::string(optimizer) + ".apply_sparse: ";
    if (value.dimension() == 0)
        throw InvalidArgumentError(who + "the shard is a scalar; sparse gradients need a shard of rank 1 or more");
    const auto& vs = value.shape();
    const auto& gs = grad_rows.shape();
    const bool by_position = !positions.empty();
    if (gs.size() != vs.size() || (!by_position && gs[0] != rows.size()) ||
        !std::equal(vs.begin() + 1, vs.end(), gs.begin() + 1))
        throw InvalidArgumentError(who + "the gradient rows have shape " + format_shape(gs) + " but " +
                                   std::to_string(rows.size()) + " rows of a shard of shape " + format_shape(vs) +
                                   " need shape " + format_shape(rows_shape(vs, rows.size())));
    if (by_position && positions.size() != rows.size())
        throw InvalidArgumentError(who + std::to_string(positions.size()) + " gradient positions were given for " +
                                   std::to_string(rows.size()) + " rows; give one a row");
    for (std::int64_t r : rows)
        if (r < 0 || static_cast<std::size_t>(r) >= vs[0])
            throw InvalidArgumentError(who + "row id " + std::to_string(r) + " is outside the shard's " +
                                       std::to_string(vs[0]) + " rows");
    for (std::size_t p : positions)
        if (p >= gs[0])
            throw InvalidArgumentError(who + "gradient position " + std::to_string(p) + " is outside the " +
                                       std::to_string(gs[0]) + " gradient rows");
    std::size_t row_elements = 1;
    for (std::size_t i = 1; i < vs.size(); ++i) row_elements *= vs[i];
    return row_elements;
}

/// @brief "0.9", "1e-07": a hyperparameter as Python prints it (shortest round trip is not needed).
[[nodiscard]] inline std::string format_number(double x) {
    std::ostringstream out;
    out << x;
    return out.str();
}

/// @brief Throws InvalidArgumentError "pss: <optimizer>: <name> is <value>, but it must be <rule>"
/// unless `ok`; `value` must also be finite.
inline void check_hyperparameter(bool ok, std::string_view optimizer, std::string_view name, double value,
                                 std::string_view rule) {
    if (ok && std::isfinite(value)) return;
    throw InvalidArgumentError("pss: " + std::string(optimizer) + ": " + std::string(name) + " is " +
                               format_number(value) + ", but it must be " + std::string(rule));
}

}  // namespace detail

PSS_NAMESPACE_END
