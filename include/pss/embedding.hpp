// pss/embedding.hpp: embedding_lookup_sparse and safe_embedding_lookup_sparse (tf.nn's), over a sharded
// variable, with the sparse gradient rows that train it.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <xtensor/xarray.hpp>

#include <pss/config.hpp>
#include <pss/dtype.hpp>
#include <pss/errors.hpp>
#include <pss/tensor.hpp>
#include <pss/variable.hpp>

PSS_NAMESPACE_BEGIN

/// @brief A batch of id lists, as TensorFlow's `SparseTensor` of ids (and of weights) that
/// `embedding_lookup_sparse` takes: entry e puts id `ids[e]`, with weight `weights[e]` (1 when
/// `weights` is empty), in row `rows[e]` of a batch of `batch_size` rows.
///
/// | field        | TensorFlow                 |
/// | ------------ | -------------------------- |
/// | `rows`       | `sp_ids.indices[:, 0]`     |
/// | `ids`        | `sp_ids.values`            |
/// | `weights`    | `sp_weights.values`, or `sp_weights=None` when empty |
/// | `batch_size` | `sp_ids.dense_shape[0]`    |
///
/// Entries may come in any order; a row may hold any number of them, none included.
/// Every member has a default (`= {}`), so that designated initializers may leave any out without
/// -Wmissing-field-initializers.
struct SparseIds {
    std::vector<std::int64_t> rows = {};
    std::vector<std::int64_t> ids = {};
    std::vector<double> weights = {};
    std::size_t batch_size = 0;
};

/// @brief How the embeddings of one row's ids are combined (TensorFlow's `combiner`): their weighted
/// sum, that sum divided by the sum of the weights (`mean`, TensorFlow's default), or divided by the
/// square root of the sum of the squared weights (`sqrtn`).
enum class Combiner { sum, mean, sqrtn };

/// @brief Gradient rows for `Variable::apply_sparse_gradient(ids, std::move(rows))`: one row per
/// entry looked up, a repeated id once per entry (the ps sums them).
struct SparseGradient {
    std::vector<std::int64_t> ids;
    Tensor rows;
};

class SparseLookup;

namespace detail {
inline SparseLookup lookup_sparse(const Variable& params, SparseIds input, Combiner combiner, bool safe,
                                  std::optional<std::int64_t> default_id, std::string_view what);
}  // namespace detail

/// @brief What a sparse lookup gives: `value`, of shape `(batch_size, dims...)`, and what training
/// needs for the backward pass (the lookup is linear in the embeddings, so the gradient needs no value).
class SparseLookup {
public:
    /// @brief The combined embeddings: row r combines the embeddings of row r's ids; a row without ids
    /// is zeros (TensorFlow's output instead stops after the last row that has an id).
    Tensor value;

    /// @brief The gradient rows of the embeddings looked up, given the gradient of the loss with
    /// respect to `value`: entry e's row is `weight_e * factor_r * output_gradient[r]` for its row r
    /// (factor 1, 1 / sum of weights, or 1 / sqrt(sum of squared weights)).
    /// @throws InvalidArgumentError when `output_gradient`'s shape or dtype is not `value`'s
    [[nodiscard]] SparseGradient gradient(const Tensor& output_gradient) const {
        if (!output_gradient.has_value() || output_gradient.dtype() != value.dtype() ||
            output_gradient.shape() != value.shape())
            throw InvalidArgumentError(
                "pss: the gradient of an embedding_lookup_sparse must have the shape " + format_shape(value.shape()) +
                " and dtype " + std::string(dtype_name(value.dtype())) + " of its value, got " +
                (output_gradient.has_value() ? "shape " + format_shape(output_gradient.shape()) + " dtype " +
                                                   std::string(dtype_name(output_gradient.dtype()))
                                             : std::string("none")));
        Shape shape = value.shape();
        shape[0] = ids_.size();
        SparseGradient out{ids_, Tensor::uninitialized(value.dtype(), shape)};
        const std::size_t width = detail::row_elements(shape);
        visit_dtype(value.dtype(), [&]<class T>(std::type_identity<T>) {
            if constexpr (FloatingElement<T>) {
                const T* dy = output_gradient.get<T>().data();
                T* rows = out.rows.get<T>().data();
                for (std::size_t e = 0; e < ids_.size(); ++e) {
                    const T scale = static_cast<T>(scales_[e]);
                    const T* in = dy + static_cast<std::size_t>(rows_[e]) * width;
                    for (std::size_t j = 0; j < width; ++j) rows[e * width + j] = scale * in[j];
                }
            }
        });
        return out;
    }

private:
    friend SparseLookup detail::lookup_sparse(const Variable&, SparseIds, Combiner, bool, std::optional<std::int64_t>,
                                              std::string_view);
    std::vector<std::int64_t> ids_;   // the ids looked up, one per entry kept
    std::vector<std::int64_t> rows_;  // each entry's row
    std::vector<double> scales_;      // each entry's weight times its row's combiner factor
};

namespace detail {

/// The lookup of both forms: the safe one prunes and fills empty rows with `default_id`; `what` names
/// the call in errors.
inline SparseLookup lookup_sparse(const Variable& params, SparseIds input, Combiner combiner, bool safe,
                                  std::optional<std::int64_t> default_id, std::string_view what) {
    const std::string where = "pss: " + std::string(what) + " on variable '" + params.name() + "': ";
    if (!is_floating(params.dtype()))
        throw InvalidArgumentError(where + "the variable's dtype is " + std::string(dtype_name(params.dtype())) +
                                   "; embeddings are float32 or float64");
    if (params.shape().empty()) throw InvalidArgumentError(where + "embeddings need a variable of rank 1 or more");
    if (input.rows.size() != input.ids.size())
        throw InvalidArgumentError(where + "the sparse ids have " + std::to_string(input.rows.size()) + " rows but " +
                                   std::to_string(input.ids.size()) + " ids; give one row per id");
    if (!input.weights.empty() && input.weights.size() != input.ids.size())
        throw InvalidArgumentError(where + "the sparse ids have " + std::to_string(input.ids.size()) + " ids but " +
                                   std::to_string(input.weights.size()) +
                                   " weights; give one weight per id, or none for weight 1");
    for (std::size_t e = 0; e < input.rows.size(); ++e)
        if (input.rows[e] < 0 || static_cast<std::uint64_t>(input.rows[e]) >= input.batch_size)
            throw InvalidArgumentError(where + "entry " + std::to_string(e) + " is in row " +
                                       std::to_string(input.rows[e]) + ", outside the batch of " +
                                       std::to_string(input.batch_size) + " rows");
    if (default_id && *default_id < 0)
        throw InvalidArgumentError(where + "default_id is " + std::to_string(*default_id) +
                                   "; it must be a row of the variable");
    if (safe) {  // prune what TensorFlow's safe form prunes, then give each empty row default_id
        SparseIds kept{{}, {}, {}, input.batch_size};
        std::vector<bool> filled(input.batch_size, false);
        for (std::size_t e = 0; e < input.ids.size(); ++e) {
            if (input.ids[e] < 0 || (!input.weights.empty() && !(input.weights[e] > 0))) continue;
            kept.rows.push_back(input.rows[e]);
            kept.ids.push_back(input.ids[e]);
            kept.weights.push_back(input.weights.empty() ? 1.0 : input.weights[e]);
            filled[static_cast<std::size_t>(input.rows[e])] = true;
        }
        if (default_id)
            for (std::size_t r = 0; r < input.batch_size; ++r)
                if (!filled[r]) {
                    kept.rows.push_back(static_cast<std::int64_t>(r));
                    kept.ids.push_back(*default_id);
                    kept.weights.push_back(1.0);
                }
        input = std::move(kept);
    }
    // The combiner's factor of each row, from its weights.
    std::vector<double> total(input.batch_size, 0.0);
    for (std::size_t e = 0; e < input.ids.size(); ++e) {
        const double w = input.weights.empty() ? 1.0 : input.weights[e];
        total[static_cast<std::size_t>(input.rows[e])] += combiner == Combiner::sqrtn ? w * w : w;
    }
    std::vector<double> scales(input.ids.size());
    for (std::size_t e = 0; e < input.ids.size(); ++e) {
        const double w = input.weights.empty() ? 1.0 : input.weights[e];
        const double t = total[static_cast<std::size_t>(input.rows[e])];
        scales[e] = combiner == Combiner::sum ? w : combiner == Combiner::mean ? w / t : w / std::sqrt(t);
    }
    // One sparse_read: a request per shard touched, in parallel; an id out of range fails it.
    const Tensor looked = params.sparse_read(input.ids);
    Shape shape = params.shape();
    shape[0] = input.batch_size;
    SparseLookup out;
    out.value = Tensor::zeros(params.dtype(), shape);
    const std::size_t width = row_elements(shape);
    visit_dtype(params.dtype(), [&]<class T>(std::type_identity<T>) {
        if constexpr (FloatingElement<T>) {
            const T* in = looked.get<T>().data();
            T* value = out.value.get<T>().data();
            for (std::size_t e = 0; e < input.ids.size(); ++e) {
                const T scale = static_cast<T>(scales[e]);
                T* row = value + static_cast<std::size_t>(input.rows[e]) * width;
                for (std::size_t j = 0; j < width; ++j) row[j] += scale * in[e * width + j];
            }
        }
    });
    out.ids_ = std::move(input.ids);
    out.rows_ = std::move(input.rows);
    out.scales_ = std::move(scales);
    return out;
}

}  // namespace detail

/// @brief TensorFlow's `tf.nn.embedding_lookup_sparse(params, sp_ids, sp_weights, combiner)`: row r of
/// the value combines the embeddings (rows of `params`) of row r's ids, read with one `sparse_read`
/// (a request per shard touched, in parallel).
/// @throws InvalidArgumentError naming the variable when an id is outside [0, shape[0]) (as sparse_read),
/// an entry's row is outside the batch, the rows, ids and weights differ in length, or the variable is
/// not float32 or float64
///
/// @par Example
/// @code
/// // two examples: ids {3, 7} and {7}
/// auto looked = pss::embedding_lookup_sparse(table, {.rows = {0, 0, 1}, .ids = {3, 7, 7}, .batch_size = 2});
/// // ... compute the loss from looked.value, and its gradient dy ...
/// auto g = looked.gradient(dy);
/// table.apply_sparse_gradient(g.ids, std::move(g.rows));
/// @endcode
[[nodiscard]] inline SparseLookup embedding_lookup_sparse(const Variable& params, SparseIds sp_ids,
                                                          Combiner combiner = Combiner::mean) {
    return detail::lookup_sparse(params, std::move(sp_ids), combiner, false, std::nullopt, "embedding_lookup_sparse");
}

/// @brief TensorFlow's `tf.nn.safe_embedding_lookup_sparse(params, sp_ids, sp_weights, combiner,
/// default_id)`: as embedding_lookup_sparse, after pruning the entries whose id is negative or whose
/// weight is not positive; a row left without entries is the embedding of `default_id` when given,
/// else zeros.
/// @throws InvalidArgumentError as embedding_lookup_sparse (an id at or beyond shape[0] is still an
/// error, as in TensorFlow), and when `default_id` is negative
[[nodiscard]] inline SparseLookup safe_embedding_lookup_sparse(const Variable& params, SparseIds sp_ids,
                                                               Combiner combiner = Combiner::mean,
                                                               std::optional<std::int64_t> default_id = std::nullopt) {
    return detail::lookup_sparse(params, std::move(sp_ids), combiner, true, default_id,
                                 "safe_embedding_lookup_sparse");
}

PSS_NAMESPACE_END
