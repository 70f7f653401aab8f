// tests/test_policies.cpp: the Partitioner and Optimizer policies: exact shard counts, exact updates, conformance.
#include <algorithm>
#include <array>
#include <concepts>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <random>
#include <vector>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>
#include <xtensor/xarray.hpp>

#include <archetypes/consistency.hpp>
#include <archetypes/optimizer.hpp>
#include <archetypes/partitioner.hpp>
#include <pss/concepts/consistency.hpp>
#include <pss/concepts/optimizer.hpp>
#include <pss/concepts/partitioner.hpp>
#include <pss/consistency.hpp>
#include <pss/dtype.hpp>
#include <pss/errors.hpp>
#include <pss/optimizer/adagrad.hpp>
#include <pss/optimizer/adam.hpp>
#include <pss/optimizer/momentum.hpp>
#include <pss/optimizer/schedules.hpp>
#include <pss/optimizer/sgd.hpp>
#include <pss/partitioner/fixed_shards.hpp>
#include <pss/partitioner/max_size.hpp>
#include <pss/partitioner/min_size.hpp>
#include <pss/partitioner/no_partition.hpp>
#include <pss/partitioner/shard_rows.hpp>

namespace {

using pss::DType;

// ---- helpers ---------------------------------------------------------------------------------------

template <std::size_t N>
std::size_t shards(const auto& partitioner, const std::array<std::size_t, N>& shape, DType dtype = DType::float32) {
    return static_cast<std::size_t>(partitioner(std::span<const std::size_t>(shape), dtype));
}

template <class F>
std::string error_message(F&& f) {
    try {
        f();
    } catch (const pss::Error& e) {
        return e.what();
    }
    return "(nothing thrown)";
}

/// Deterministic, varied values in [-1, 1) (no zeros), so every element of an update differs.
template <class T>
xt::xarray<T> pattern(std::vector<std::size_t> shape, unsigned seed) {
    xt::xarray<T> x = xt::xarray<T>::from_shape(shape);
    std::uint32_t s = 2463534242u + seed * 7919u;
    for (std::size_t i = 0; i < x.size(); ++i) {
        s ^= s << 13;
        s ^= s >> 17;
        s ^= s << 5;
        x.data()[i] = static_cast<T>(static_cast<double>(s % 2000 + 1) / 1000.0 - 1.0005);
    }
    return x;
}

/// The rows `rows` of `x`, stacked: the sparse gradient that carries those rows of a dense one.
template <class T>
xt::xarray<T> take_rows(const xt::xarray<T>& x, const std::vector<std::int64_t>& rows) {
    std::vector<std::size_t> shape(x.shape().begin(), x.shape().end());
    const std::size_t width = x.size() / shape[0];
    shape[0] = rows.size();
    xt::xarray<T> out = xt::xarray<T>::from_shape(shape);
    for (std::size_t i = 0; i < rows.size(); ++i)
        std::copy_n(x.data() + static_cast<std::size_t>(rows[i]) * width, width, out.data() + i * width);
    return out;
}

template <class T>
bool same_bits(const xt::xarray<T>& a, const xt::xarray<T>& b) {
    return std::ranges::equal(a.shape(), b.shape()) && std::equal(a.begin(), a.end(), b.begin());
}

template <class T>
bool row_equal(const xt::xarray<T>& a, const xt::xarray<T>& b, std::size_t row) {
    const std::size_t width = a.size() / a.shape()[0];
    return std::equal(a.data() + row * width, a.data() + (row + 1) * width, b.data() + row * width);
}

template <class T>
doctest::Approx approx(double x) {
    return doctest::Approx(x).epsilon(std::same_as<T, float> ? 1e-6 : 1e-13);
}

std::span<const std::int64_t> as_rows(const std::vector<std::int64_t>& rows) { return rows; }

// ---- near misses -----------------------------------------------------------------------------------

struct VoidPartitioner {
    void operator()(std::span<const std::size_t>, DType) const {}
};
struct MutablePartitioner {  // call operator not const
    std::size_t operator()(std::span<const std::size_t>, DType) { return 1; }
};
struct VectorShapePartitioner {  // takes a vector, not a span
    std::size_t operator()(const std::vector<std::size_t>&, DType) const { return 1; }
};
struct StringPartitioner {  // answers something that is not a count
    std::string operator()(std::span<const std::size_t>, DType) const { return "1"; }
};
struct MoveOnlyPartitioner {
    MoveOnlyPartitioner() = default;
    MoveOnlyPartitioner(MoveOnlyPartitioner&&) = default;
    MoveOnlyPartitioner(const MoveOnlyPartitioner&) = delete;
    std::size_t operator()(std::span<const std::size_t>, DType) const { return 1; }
};

/// An optimizer shaped like the archetype but without a name, with one piece changed by each near miss below.
struct UnnamedOptimizerBase {
    template <class T>
    struct Slots {};
    static std::array<std::string_view, 0> slot_names() { return {}; }
    template <class S, class F>
    static void for_each_slot(S&, F&&) {}
    nlohmann::json get_config() const { return {}; }
    template <class T>
    Slots<T> make_slots(const xt::xarray<T>&) const {
        return {};
    }
    template <class T>
    void apply_dense(xt::xarray<T>&, Slots<T>&, const xt::xarray<T>&) const {}
};
template <class Derived>
struct OptimizerBase : UnnamedOptimizerBase {
    static std::string_view name() { return "near miss"; }
    const pss::LearningRate& learning_rate() const { return rate; }
    Derived with_learning_rate(double) const { return static_cast<const Derived&>(*this); }
    pss::LearningRate rate = 0.01;
};
struct SparseTakesVector : OptimizerBase<SparseTakesVector> {
    template <class T>
    void apply_sparse(xt::xarray<T>&, Slots<T>&, std::vector<int>, const xt::xarray<T>&) const {}
};
struct NoApplySparse : OptimizerBase<NoApplySparse> {};
struct GoodOptimizer : OptimizerBase<GoodOptimizer> {
    template <class T>
    void apply_sparse(xt::xarray<T>&, Slots<T>&, std::span<const std::int64_t>, const xt::xarray<T>&) const {}
};
struct MutableApply : GoodOptimizer {  // apply_dense not const: one optimizer serves every shard
    template <class T>
    void apply_dense(xt::xarray<T>&, Slots<T>&, const xt::xarray<T>&) {}
};
struct SlotsAreAnArray : GoodOptimizer {  // make_slots answers another type than Slots<T>
    template <class T>
    xt::xarray<T> make_slots(const xt::xarray<T>& value) const {
        return value;
    }
};
struct FloatOnly : GoodOptimizer {  // nothing for double
    template <class T>
        requires std::same_as<T, float>
    void apply_dense(xt::xarray<T>&, Slots<T>&, const xt::xarray<T>&) const {}
};
struct NoSlotNames : GoodOptimizer {  // a checkpoint could not name the slot files
    static int slot_names() { return 0; }
};
struct SlotsNotVisitable : GoodOptimizer {  // for_each_slot takes no visitor
    template <class S>
    static void for_each_slot(S&) {}
};
struct ConfigNotJson : GoodOptimizer {  // get_config answers a string
    std::string get_config() const { return "{}"; }
};
struct FixedRate : UnnamedOptimizerBase {  // no learning_rate(): a ps could not apply a schedule
    static std::string_view name() { return "near miss"; }
    template <class T>
    void apply_sparse(xt::xarray<T>&, Slots<T>&, std::span<const std::int64_t>, const xt::xarray<T>&) const {}
};
struct NoName : UnnamedOptimizerBase {
    template <class T>
    void apply_sparse(xt::xarray<T>&, Slots<T>&, std::span<const std::int64_t>, const xt::xarray<T>&) const {}
};

// ---- factories for the conformance suites ------------------------------------------------------------

struct Nesterov : pss::Momentum {
    Nesterov() : pss::Momentum(0.05, 0.9, true) {}
};

template <class O>
O make_optimizer() {
    if constexpr (std::same_as<O, pss::archetypes::OptimizerArchetype>)
        return O(0);
    else if constexpr (std::same_as<O, pss::SGD>)
        return O(0.1);
    else if constexpr (std::same_as<O, pss::Momentum>)
        return O(0.05, 0.9);
    else if constexpr (std::same_as<O, pss::Adagrad>)
        return O(0.1, 0.1, 1e-7);
    else if constexpr (std::same_as<O, pss::Adam>)
        return O(0.01);
    else
        return O();
}

template <class P>
P make_partitioner() {
    if constexpr (std::same_as<P, pss::archetypes::PartitionerArchetype>)
        return P(0);
    else if constexpr (std::same_as<P, pss::FixedShardsPartitioner>)
        return P(8);
    else if constexpr (std::same_as<P, pss::MinSizePartitioner>)
        return P(64, 16);
    else if constexpr (std::same_as<P, pss::MaxSizePartitioner>)
        return P(100);
    else
        return P();
}

}  // namespace

// ---- Partitioner: static tests ---------------------------------------------------------------------

static_assert(pss::Partitioner<pss::NoPartitioner>);
static_assert(pss::Partitioner<pss::FixedShardsPartitioner>);
static_assert(pss::Partitioner<pss::MinSizePartitioner>);
static_assert(pss::Partitioner<pss::MaxSizePartitioner>);
static_assert(pss::Partitioner<pss::archetypes::PartitionerArchetype>);
static_assert(!pss::Partitioner<VoidPartitioner>);
static_assert(!pss::detail::partitioner_returns_shard_count<VoidPartitioner>);
static_assert(!pss::Partitioner<MutablePartitioner>);
static_assert(!pss::Partitioner<VectorShapePartitioner>);
static_assert(!pss::Partitioner<StringPartitioner>);
static_assert(!pss::Partitioner<MoveOnlyPartitioner>);
static_assert(pss::detail::partitioner_returns_shard_count<MoveOnlyPartitioner>);
static_assert(!pss::Partitioner<int>);

// ---- Consistency: static tests --------------------------------------------------------------------

namespace {
struct NoStaleness {  // synchronous without a bound
    static constexpr bool synchronous = true;
};
struct RuntimeSynchronous {  // not a constant: a strategy's behaviour is chosen at compile time
    static inline bool synchronous = true;
    [[maybe_unused]] static constexpr std::uint64_t staleness = 0;
};
struct StringStaleness {
    static constexpr bool synchronous = true;
    [[maybe_unused]] static constexpr const char* staleness = "1";
};
}  // namespace

static_assert(pss::Consistency<pss::Asynchronous>);
static_assert(pss::Consistency<pss::Synchronous>);
static_assert(pss::Consistency<pss::BoundedStaleness<4>>);
static_assert(pss::Consistency<pss::archetypes::ConsistencyArchetype>);
static_assert(!pss::Consistency<NoStaleness>);
static_assert(!pss::detail::consistency_has_staleness_bound<NoStaleness>);
static_assert(!pss::Consistency<RuntimeSynchronous>);
static_assert(!pss::detail::consistency_says_whether_synchronous<RuntimeSynchronous>);
static_assert(!pss::Consistency<StringStaleness>);
static_assert(!pss::Consistency<int>);

// TensorFlow's docstring examples, at compile time.
constexpr std::array<std::size_t, 2> six_by_one{6, 1};
static_assert(pss::MinSizePartitioner(4, 2)(six_by_one, DType::float32) == 2);
static_assert(pss::MinSizePartitioner(4, 10)(six_by_one, DType::float32) == 6);
static_assert(pss::MaxSizePartitioner(4)(six_by_one, DType::float32) == 6);
static_assert(pss::MaxSizePartitioner(4, 2)(six_by_one, DType::float32) == 2);
static_assert(pss::MaxSizePartitioner(1024)(six_by_one, DType::float32) == 1);
static_assert(pss::FixedShardsPartitioner(2)(std::array<std::size_t, 2>{10, 3}, DType::float32) == 2);
static_assert(pss::NoPartitioner{}(six_by_one, DType::float64) == 1);

// shard_rows: TensorFlow's rule, the first dim0 % k shards get one row more.
static_assert(pss::shard_rows(10, 3, 0) == 4 && pss::shard_rows(10, 3, 1) == 3 && pss::shard_rows(10, 3, 2) == 3);
static_assert(pss::shard_row_counts(10, 3) == std::vector<std::size_t>{4, 3, 3});
static_assert(pss::shard_row_counts(3, 3) == std::vector<std::size_t>{1, 1, 1});
static_assert(pss::shard_row_counts(11, 4) == std::vector<std::size_t>{3, 3, 3, 2});
static_assert(pss::shard_row_counts(10, 3).size() == 3 && pss::shard_row_counts(10, 3)[0] == 4);
static_assert(pss::shard_row_offset(10, 3, 0) == 0 && pss::shard_row_offset(10, 3, 1) == 4 &&
              pss::shard_row_offset(10, 3, 2) == 7 && pss::shard_row_offset(10, 3, 3) == 10);
static_assert(pss::shard_of_row(10, 3, 0) == pss::ShardRow{0, 0});
static_assert(pss::shard_of_row(10, 3, 3) == pss::ShardRow{0, 3});
static_assert(pss::shard_of_row(10, 3, 4) == pss::ShardRow{1, 0});
static_assert(pss::shard_of_row(10, 3, 9) == pss::ShardRow{2, 2});
static_assert(pss::shard_rows(10, 0, 0) == 0 && pss::shard_rows(10, 3, 3) == 0);  // out-of-contract calls answer 0

TEST_SUITE("partitioner/no_partition.hpp") {
    TEST_CASE("NoPartitioner: [1024, 1024] float32 and [1] int64 both give 1 shard") {
        CHECK(shards(pss::NoPartitioner{}, std::array<std::size_t, 2>{1024, 1024}) == 1);
        CHECK(shards(pss::NoPartitioner{}, std::array<std::size_t, 1>{1}, DType::int64) == 1);
    }
}

TEST_SUITE("partitioner/fixed_shards.hpp") {
    TEST_CASE("FixedShardsPartitioner: [10, 3] with 2 gives 2 shards, [5] with 8 gives 5, [0] gives 1") {
        CHECK(shards(pss::FixedShardsPartitioner(2), std::array<std::size_t, 2>{10, 3}) == 2);
        CHECK(shards(pss::FixedShardsPartitioner(8), std::array<std::size_t, 1>{5}) == 5);
        CHECK(shards(pss::FixedShardsPartitioner(8), std::array<std::size_t, 1>{0}) == 1);
        CHECK(shards(pss::FixedShardsPartitioner{}, std::array<std::size_t, 1>{5}) == 1);
        CHECK(pss::FixedShardsPartitioner(3).num_shards() == 3);
    }
    TEST_CASE("FixedShardsPartitioner: num_shards 0 and -2 throw InvalidArgumentError naming num_shards") {
        CHECK_THROWS_AS(pss::FixedShardsPartitioner(0), pss::InvalidArgumentError);
        CHECK_THROWS_AS(pss::FixedShardsPartitioner(-2), pss::InvalidArgumentError);
        CHECK(error_message([] { (void)pss::FixedShardsPartitioner(0); }).starts_with(
            "pss: FixedShardsPartitioner: num_shards is 0, but it must be at least 1"));
    }
}

TEST_SUITE("partitioner/min_size.hpp") {
    constexpr std::array<std::size_t, 2> mib4{1024, 1024};  // 4 MiB of float32: 16 x 256 KiB
    TEST_CASE("MinSizePartitioner: [1024,1024] float32 with max_shards 16 gives 16 shards") {
        CHECK(shards(pss::MinSizePartitioner(256 << 10, 16), mib4) == 16);
    }
    TEST_CASE("MinSizePartitioner: [1024,1024] float32 with max_shards 2 gives 2, 32 gives 16, default gives 1") {
        CHECK(shards(pss::MinSizePartitioner(256 << 10, 2), mib4) == 2);
        CHECK(shards(pss::MinSizePartitioner(256 << 10, 32), mib4) == 16);
        CHECK(shards(pss::MinSizePartitioner{}, mib4) == 1);
    }
    TEST_CASE("MinSizePartitioner: [1024,1024] float64 (8 MiB) with max_shards 64 gives 32") {
        CHECK(shards(pss::MinSizePartitioner(256 << 10, 64), mib4, DType::float64) == 32);
    }
    TEST_CASE("MinSizePartitioner: [1025, 256] float32 (1049600 bytes) rounds 4.004 up to 5 shards") {
        CHECK(shards(pss::MinSizePartitioner(256 << 10, 16), std::array<std::size_t, 2>{1025, 256}) == 5);
    }
    TEST_CASE("MinSizePartitioner: a tiny [10] float32 variable with max_shards 16 gives 1 shard") {
        CHECK(shards(pss::MinSizePartitioner(256 << 10, 16), std::array<std::size_t, 1>{10}) == 1);
    }
    TEST_CASE("MinSizePartitioner: never above dim 0: [3, 1000000] float32 with max_shards 16 gives 3") {
        CHECK(shards(pss::MinSizePartitioner(256 << 10, 16), std::array<std::size_t, 2>{3, 1000000}) == 3);
        CHECK(shards(pss::MinSizePartitioner(1, 16), std::array<std::size_t, 1>{0}) == 1);
    }
    TEST_CASE("MinSizePartitioner: min_shard_bytes, max_shards or bytes_per_string below 1 throws naming it") {
        CHECK(error_message([] { (void)pss::MinSizePartitioner(0); })
                  .starts_with("pss: MinSizePartitioner: min_shard_bytes is 0, but it must be at least 1"));
        CHECK(error_message([] { (void)pss::MinSizePartitioner(1024, 0); })
                  .starts_with("pss: MinSizePartitioner: max_shards is 0, but it must be at least 1"));
        CHECK(error_message([] { (void)pss::MinSizePartitioner(1024, 2, -1); })
                  .starts_with("pss: MinSizePartitioner: bytes_per_string is -1, but it must be at least 1"));
        CHECK_THROWS_AS(pss::MinSizePartitioner(-5), pss::InvalidArgumentError);
        const pss::MinSizePartitioner p(1000, 3, 8);
        CHECK(p.min_shard_bytes() == 1000);
        CHECK(p.max_shards() == 3);
        CHECK(p.bytes_per_string() == 8);
    }
    TEST_CASE("MinSizePartitioner: a string element counts as bytes_per_string bytes, as TensorFlow counts it") {
        constexpr std::array<std::size_t, 2> shape{100, 4};  // 400 strings
        CHECK(shards(pss::MinSizePartitioner(256, 100), shape, DType::string) == 25);     // 400 * 16 / 256
        CHECK(shards(pss::MinSizePartitioner(256, 100, 8), shape, DType::string) == 13);  // ceil(400 * 8 / 256)
        CHECK(shards(pss::MinSizePartitioner(256, 100, 1000), shape, DType::string) == 100);  // capped by shape[0]
    }
}

TEST_SUITE("partitioner/max_size.hpp") {
    TEST_CASE("MaxSizePartitioner: [1024,1024] float32 with 1 MiB gives 4 shards, with 4 MiB gives 1") {
        constexpr std::array<std::size_t, 2> mib4{1024, 1024};
        CHECK(shards(pss::MaxSizePartitioner(1 << 20), mib4) == 4);
        CHECK(shards(pss::MaxSizePartitioner(4 << 20), mib4) == 1);
        CHECK(shards(pss::MaxSizePartitioner((1 << 20) - 1), mib4) == 5);  // 255 rows a shard: ceil(1024/255)
    }
    TEST_CASE("MaxSizePartitioner: [1000, 10] float32 with 4096 bytes fits 102 rows a shard and gives 10") {
        CHECK(shards(pss::MaxSizePartitioner(4096), std::array<std::size_t, 2>{1000, 10}) == 10);
    }
    TEST_CASE("MaxSizePartitioner: rows larger than the limit give one shard a row, [7, 1000] -> 7") {
        CHECK(shards(pss::MaxSizePartitioner(100), std::array<std::size_t, 2>{7, 1000}) == 7);
    }
    TEST_CASE("MaxSizePartitioner: max_shards takes precedence, [1000] float64 with 800 bytes gives 10, or 4") {
        CHECK(shards(pss::MaxSizePartitioner(800), std::array<std::size_t, 1>{1000}, DType::float64) == 10);
        CHECK(shards(pss::MaxSizePartitioner(800, 4), std::array<std::size_t, 1>{1000}, DType::float64) == 4);
    }
    TEST_CASE("MaxSizePartitioner: a string element counts as bytes_per_string bytes: [100, 4] strings with 640 "
              "bytes a shard give 10 shards of 16-byte strings, 20 of 32-byte ones") {
        constexpr std::array<std::size_t, 2> shape{100, 4};
        CHECK(shards(pss::MaxSizePartitioner(640), shape, DType::string) == 10);         // 64 bytes a row, 10 rows a shard
        CHECK(shards(pss::MaxSizePartitioner(640, 0, 32), shape, DType::string) == 20);  // 128 bytes a row, 5 rows a shard
        CHECK(shards(pss::MaxSizePartitioner(640, 0, 32), shape, DType::float32) == 3);  // bytes_per_string: strings only
    }
    TEST_CASE("MaxSizePartitioner: dim 0 of 0 or empty rows give 1 shard") {
        CHECK(shards(pss::MaxSizePartitioner(8), std::array<std::size_t, 2>{0, 4}) == 1);
        CHECK(shards(pss::MaxSizePartitioner(8), std::array<std::size_t, 2>{9, 0}) == 1);
    }
    TEST_CASE("MaxSizePartitioner: max_shard_bytes below 1, max_shards below 0, bytes_per_string below 1 throw") {
        CHECK(error_message([] { (void)pss::MaxSizePartitioner(0); })
                  .starts_with("pss: MaxSizePartitioner: max_shard_bytes is 0, but it must be at least 1"));
        CHECK(error_message([] { (void)pss::MaxSizePartitioner(64, -1); })
                  .starts_with("pss: MaxSizePartitioner: max_shards is -1, but it must be at least 1, or 0 for no limit"));
        CHECK(error_message([] { (void)pss::MaxSizePartitioner(64, 0, 0); })
                  .starts_with("pss: MaxSizePartitioner: bytes_per_string is 0, but it must be at least 1"));
        CHECK(pss::MaxSizePartitioner(64).max_shards() == 0);
    }
}

TEST_SUITE("concepts/partitioner.hpp") {
    TEST_CASE_TEMPLATE("Partitioner conformance: every answer is in [1, max(1, shape[0])] and repeatable", P,
                       pss::NoPartitioner, pss::FixedShardsPartitioner, pss::MinSizePartitioner,
                       pss::MaxSizePartitioner, pss::archetypes::PartitionerArchetype) {
        const P partitioner = make_partitioner<P>();
        const P copy(partitioner);
        for (DType dtype : {DType::float32, DType::float64, DType::int32, DType::int64, DType::string})
            for (std::size_t dim0 : {0u, 1u, 2u, 3u, 7u, 64u, 1000u, 100000u})
                for (std::size_t dim1 : {0u, 1u, 5u, 300u}) {
                    const std::array<std::size_t, 2> shape{dim0, dim1};
                    const std::size_t k = shards(partitioner, shape, dtype);
                    CAPTURE(dim0);
                    CAPTURE(dim1);
                    CHECK(k >= 1);
                    CHECK(k <= std::max<std::size_t>(1, dim0));
                    CHECK(shards(copy, shape, dtype) == k);
                }
    }
}

TEST_SUITE("partitioner/shard_rows.hpp") {
    TEST_CASE("shard_rows: for dim0 0..40 and k 1..dim0 counts sum to dim0, offsets chain, shard_of_row inverts") {
        for (std::size_t dim0 = 0; dim0 <= 40; ++dim0)
            for (std::size_t k = 1; k <= std::max<std::size_t>(1, dim0); ++k) {
                std::size_t total = 0;
                for (std::size_t i = 0; i < k; ++i) {
                    CHECK(pss::shard_row_offset(dim0, k, i) == total);
                    const std::size_t rows = pss::shard_rows(dim0, k, i);
                    CHECK(rows == dim0 / k + (i < dim0 % k ? 1 : 0));
                    for (std::size_t r = 0; r < rows; ++r)
                        CHECK(pss::shard_of_row(dim0, k, total + r) == pss::ShardRow{i, r});
                    total += rows;
                }
                CHECK(total == dim0);
            }
    }
    TEST_CASE("RowSplit: its division by multiplication gives the quotients of division, for tables up to 2^32 rows "
              "and beyond (where it divides)") {
        std::mt19937_64 random(3);
        std::size_t wrong = 0, checked = 0;
        for (std::size_t dim0 : {1ul, 7ul, 1000ul, 1048577ul, 4294967295ul, 4294967296ul, 10000000000ul})
            for (std::size_t k = 1; k <= 9 && k <= dim0; ++k) {
                const pss::RowSplit split(dim0, k);
                const std::size_t base = dim0 / k, extra = dim0 % k, boundary = extra * (base + 1);
                auto check = [&](std::size_t row) {
                    const pss::ShardRow expected = row < boundary ? pss::ShardRow{row / (base + 1), row % (base + 1)}
                                                                  : pss::ShardRow{extra + (row - boundary) / base,
                                                                                  (row - boundary) % base};
                    wrong += split(row) == expected ? 0 : 1;
                    ++checked;
                };
                for (std::size_t r = 0; r < std::min<std::size_t>(dim0, 2000); ++r) check(r);
                for (int i = 0; i < 5000; ++i) check(random() % dim0);
                check(dim0 - 1);
                check(boundary);
            }
        CHECK(wrong == 0);
        CHECK(checked > 300000);
    }
}

// ---- Optimizer: static tests -----------------------------------------------------------------------

static_assert(pss::Optimizer<pss::SGD>);
static_assert(pss::Optimizer<pss::Momentum>);
static_assert(pss::Optimizer<pss::Adagrad>);
static_assert(pss::Optimizer<pss::Adam>);
static_assert(pss::Optimizer<pss::archetypes::OptimizerArchetype>);
static_assert(pss::Optimizer<GoodOptimizer>);
static_assert(!pss::Optimizer<SparseTakesVector>);
static_assert(!pss::detail::optimizer_has_apply_sparse<SparseTakesVector, float>);
static_assert(pss::detail::optimizer_has_apply_dense<SparseTakesVector, float>);
static_assert(!pss::Optimizer<NoApplySparse>);
static_assert(!pss::Optimizer<MutableApply>);
static_assert(!pss::detail::optimizer_has_apply_dense<MutableApply, double>);
static_assert(!pss::Optimizer<SlotsAreAnArray>);
static_assert(!pss::detail::optimizer_has_make_slots<SlotsAreAnArray, float>);
static_assert(!pss::Optimizer<FloatOnly>);
static_assert(pss::detail::optimizer_for_element<FloatOnly, float>);
static_assert(!pss::detail::optimizer_for_element<FloatOnly, double>);
static_assert(!pss::Optimizer<NoName>);
static_assert(!pss::detail::optimizer_has_name<NoName>);
static_assert(!pss::Optimizer<int>);
static_assert(!pss::Optimizer<NoSlotNames>);
static_assert(!pss::detail::optimizer_has_slot_names<NoSlotNames>);
static_assert(!pss::Optimizer<SlotsNotVisitable>);
static_assert(!pss::detail::optimizer_has_for_each_slot<SlotsNotVisitable, float>);
static_assert(!pss::Optimizer<ConfigNotJson>);
static_assert(!pss::detail::optimizer_has_get_config<ConfigNotJson>);
static_assert(!pss::Optimizer<FixedRate>);
static_assert(!pss::detail::optimizer_has_learning_rate<FixedRate>);
static_assert(pss::detail::optimizer_has_get_config<FixedRate>);
static_assert(pss::SGD::name() == "SGD" && pss::Momentum::name() == "Momentum" && pss::Adagrad::name() == "Adagrad" &&
              pss::Adam::name() == "Adam");

TEST_SUITE("optimizer/sgd.hpp") {
    TEST_CASE_TEMPLATE("SGD: w 1, g 0.5, learning rate 0.1 gives 0.95, then 0.9", T, float, double) {
        const pss::SGD sgd(0.1);
        xt::xarray<T> w{T(1)};
        const xt::xarray<T> g{T(0.5)};
        auto slots = sgd.make_slots(w);
        sgd.apply_dense(w, slots, g);
        CHECK(w(0) == approx<T>(0.95));
        sgd.apply_dense(w, slots, g);
        CHECK(w(0) == approx<T>(0.9));
    }
    TEST_CASE("SGD: default learning rate is 0.01; a negative or NaN learning rate throws naming it") {
        CHECK(pss::SGD{}.learning_rate() == 0.01);
        CHECK(error_message([] { (void)pss::SGD(-1); })
                  .starts_with("pss: SGD: learning_rate is -1, but it must be a finite number >= 0"));
        CHECK_THROWS_AS(pss::SGD(std::nan("")), pss::InvalidArgumentError);
        CHECK_NOTHROW((void)pss::SGD(0));
    }
    TEST_CASE("SGD: a gradient of shape (3,) for a shard of shape (4,) throws and leaves the shard") {
        const pss::SGD sgd(0.1);
        xt::xarray<float> w{1, 2, 3, 4};
        const xt::xarray<float> g{1, 1, 1};
        auto slots = sgd.make_slots(w);
        CHECK(error_message([&] { sgd.apply_dense(w, slots, g); }) ==
              "pss: SGD.apply_dense: the gradient has shape (3,) but the shard has shape (4,); a dense gradient "
              "has the shard's shape");
        CHECK(w == xt::xarray<float>{1, 2, 3, 4});
    }
    TEST_CASE("SGD: sparse row id 4 of a 4-row shard and a wrong row shape throw InvalidArgumentError") {
        const pss::SGD sgd(0.1);
        xt::xarray<float> w = pattern<float>({4, 2}, 1);
        const xt::xarray<float> before = w;
        auto slots = sgd.make_slots(w);
        const std::vector<std::int64_t> bad{0, 4};
        CHECK_THROWS_AS(sgd.apply_sparse(w, slots, as_rows(bad), pattern<float>({2, 2}, 2)), pss::InvalidArgumentError);
        const std::vector<std::int64_t> good{0, 1};
        CHECK(error_message([&] { sgd.apply_sparse(w, slots, as_rows(good), pattern<float>({2, 3}, 2)); }) ==
              "pss: SGD.apply_sparse: the gradient rows have shape (2, 3) but 2 rows of a shard of shape (4, 2) "
              "need shape (2, 2)");
        const std::vector<std::size_t> positions{1, 7};
        CHECK(error_message([&] { sgd.apply_sparse(w, slots, as_rows(good), pattern<float>({3, 2}, 2), positions); }) ==
              "pss: SGD.apply_sparse: gradient position 7 is outside the 3 gradient rows");
        const std::vector<std::size_t> one{1};
        CHECK(error_message([&] { sgd.apply_sparse(w, slots, as_rows(good), pattern<float>({3, 2}, 2), one); }) ==
              "pss: SGD.apply_sparse: 1 gradient positions were given for 2 rows; give one a row");
        CHECK(same_bits(w, before));
    }
}

TEST_SUITE("optimizer/momentum.hpp") {
    TEST_CASE_TEMPLATE("Momentum: lr 0.1, momentum 0.9, w 1, g 1: m -0.1, w 0.9, then m -0.19, w 0.71", T, float,
                       double) {
        const pss::Momentum opt(0.1, 0.9);
        xt::xarray<T> w{T(1)};
        const xt::xarray<T> g{T(1)};
        auto slots = opt.make_slots(w);
        CHECK(slots.momentum == xt::xarray<T>{T(0)});
        opt.apply_dense(w, slots, g);
        CHECK(slots.momentum(0) == approx<T>(-0.1));
        CHECK(w(0) == approx<T>(0.9));
        opt.apply_dense(w, slots, g);
        CHECK(slots.momentum(0) == approx<T>(-0.19));
        CHECK(w(0) == approx<T>(0.71));
    }
    TEST_CASE_TEMPLATE("Momentum: Nesterov, lr 0.1, momentum 0.9, w 1, g 1: w 0.81, then 0.539", T, float, double) {
        const pss::Momentum opt(0.1, 0.9, true);
        xt::xarray<T> w{T(1)};
        const xt::xarray<T> g{T(1)};
        auto slots = opt.make_slots(w);
        opt.apply_dense(w, slots, g);  // m = -0.1; w += 0.9 * -0.1 - 0.1
        CHECK(w(0) == approx<T>(0.81));
        opt.apply_dense(w, slots, g);  // m = -0.19; w += 0.9 * -0.19 - 0.1
        CHECK(slots.momentum(0) == approx<T>(-0.19));
        CHECK(w(0) == approx<T>(0.539));
    }
    TEST_CASE("Momentum: sparse rows {2, 0} change only those rows and their momentum rows") {
        const pss::Momentum opt(0.1, 0.9);
        xt::xarray<double> w = pattern<double>({4, 3}, 3);
        auto slots = opt.make_slots(w);
        opt.apply_dense(w, slots, pattern<double>({4, 3}, 4));  // every momentum row non-zero
        const xt::xarray<double> w0 = w, m0 = slots.momentum;
        const std::vector<std::int64_t> rows{2, 0};
        opt.apply_sparse(w, slots, as_rows(rows), pattern<double>({2, 3}, 5));
        for (std::size_t r : {1u, 3u}) {
            CHECK(row_equal(w, w0, r));
            CHECK(row_equal(slots.momentum, m0, r));
        }
        for (std::size_t r : {0u, 2u}) {
            CHECK_FALSE(row_equal(w, w0, r));
            CHECK_FALSE(row_equal(slots.momentum, m0, r));
        }
    }
    TEST_CASE("Momentum: defaults are Keras' (0.01, 0.9, no Nesterov); momentum 1.5 or -0.1 throws naming it") {
        const pss::Momentum opt;
        CHECK(opt.learning_rate() == 0.01);
        CHECK(opt.momentum() == 0.9);
        CHECK_FALSE(opt.nesterov());
        CHECK(error_message([] { (void)pss::Momentum(0.1, 1.5); })
                  .starts_with("pss: Momentum: momentum is 1.5, but it must be in [0, 1]"));
        CHECK_THROWS_AS(pss::Momentum(0.1, -0.1), pss::InvalidArgumentError);
        CHECK_THROWS_AS(pss::Momentum(-0.1), pss::InvalidArgumentError);
    }
}

TEST_SUITE("optimizer/adagrad.hpp") {
    TEST_CASE_TEMPLATE("Adagrad: lr 0.1, accumulator 0, epsilon 0, w 1, g 2: acc 4, w 0.9, then acc 8, w 0.8292893", T,
                       float, double) {
        const pss::Adagrad opt(0.1, 0.0, 0.0);
        xt::xarray<T> w{T(1)};
        const xt::xarray<T> g{T(2)};
        auto slots = opt.make_slots(w);
        opt.apply_dense(w, slots, g);
        CHECK(slots.accumulator(0) == approx<T>(4));
        CHECK(w(0) == approx<T>(0.9));
        opt.apply_dense(w, slots, g);
        CHECK(slots.accumulator(0) == approx<T>(8));
        CHECK(w(0) == approx<T>(0.9 - 0.2 / std::sqrt(8.0)));  // 0.82928932
        CHECK(w(0) == approx<T>(0.8292893218813452));
    }
    TEST_CASE_TEMPLATE("Adagrad: defaults (0.001, 0.1, 1e-7), w 1, g 0.5: acc 0.35, w 1 - 0.0005 / (sqrt(0.35) + 1e-7)",
                       T, float, double) {
        const pss::Adagrad opt;
        xt::xarray<T> w{T(1)};
        const xt::xarray<T> g{T(0.5)};
        auto slots = opt.make_slots(w);
        CHECK(slots.accumulator(0) == approx<T>(0.1));
        opt.apply_dense(w, slots, g);
        CHECK(slots.accumulator(0) == approx<T>(0.35));
        CHECK(w(0) == approx<T>(1 - 0.0005 / (std::sqrt(0.35) + 1e-7)));
    }
    TEST_CASE("Adagrad: sparse row {1} changes only row 1 and its accumulator row") {
        const pss::Adagrad opt(0.1);
        xt::xarray<float> w = pattern<float>({3, 5}, 6);
        auto slots = opt.make_slots(w);
        const xt::xarray<float> w0 = w, a0 = slots.accumulator;
        const std::vector<std::int64_t> rows{1};
        opt.apply_sparse(w, slots, as_rows(rows), pattern<float>({1, 5}, 7));
        for (std::size_t r : {0u, 2u}) {
            CHECK(row_equal(w, w0, r));
            CHECK(row_equal(slots.accumulator, a0, r));
        }
        CHECK_FALSE(row_equal(w, w0, 1));
        CHECK_FALSE(row_equal(slots.accumulator, a0, 1));
    }
    TEST_CASE("Adagrad: a negative initial_accumulator_value or epsilon throws naming it") {
        CHECK(error_message([] { (void)pss::Adagrad(0.1, -1); })
                  .starts_with("pss: Adagrad: initial_accumulator_value is -1, but it must be a finite number >= 0"));
        CHECK(error_message([] { (void)pss::Adagrad(0.1, 0.1, -1e-7); })
                  .starts_with("pss: Adagrad: epsilon is -1e-07, but it must be a finite number >= 0"));
        CHECK_THROWS_AS(pss::Adagrad(-0.001), pss::InvalidArgumentError);
    }
}

TEST_SUITE("optimizer/schedules.hpp") {
    TEST_CASE("ExponentialDecay, PiecewiseConstantDecay and CosineDecay give Keras' rates, step by step") {
        const pss::ExponentialDecay exponential(0.1, 10, 0.5);
        CHECK(exponential(0) == 0.1);
        CHECK(exponential(10) == 0.05);
        CHECK(exponential(20) == 0.025);
        CHECK(exponential(5) == 0.1 * std::pow(0.5, 0.5));  // 0.0707...: continuous without staircase
        const pss::ExponentialDecay stairs(0.1, 10, 0.5, true);
        CHECK(stairs(9) == 0.1);
        CHECK(stairs(15) == 0.05);

        // Keras' documented example: 1.0 through step 100000, 0.5 through 110000, then 0.1.
        const pss::PiecewiseConstantDecay piecewise({100000, 110000}, {1.0, 0.5, 0.1});
        CHECK(piecewise(0) == 1.0);
        CHECK(piecewise(100000) == 1.0);
        CHECK(piecewise(100001) == 0.5);
        CHECK(piecewise(110000) == 0.5);
        CHECK(piecewise(110001) == 0.1);
        CHECK(pss::PiecewiseConstantDecay({}, {0.3})(7) == 0.3);

        const pss::CosineDecay cosine(0.1, 100);
        CHECK(cosine(0) == 0.1);
        CHECK(cosine(50) == doctest::Approx(0.05).epsilon(1e-12));
        CHECK(cosine(100) == doctest::Approx(0.0).epsilon(1e-12));
        CHECK(cosine(1000) == cosine(100));  // stays at its end
        CHECK(pss::CosineDecay(0.1, 100, 0.1)(100) == doctest::Approx(0.01).epsilon(1e-12));  // alpha of the first
        // A warm-up from 0 to 0.1 over 10 steps, then 100 steps of cosine decay from 0.1.
        const pss::CosineDecay warm(0.0, 100, 0.0, 0.1, 10);
        CHECK(warm(0) == 0.0);
        CHECK(warm(5) == doctest::Approx(0.05).epsilon(1e-12));
        CHECK(warm(10) == 0.1);
        CHECK(warm(60) == doctest::Approx(0.05).epsilon(1e-12));
        CHECK(warm(110) == doctest::Approx(0.0).epsilon(1e-12));
        CHECK(warm(5000) == warm(110));
    }

    TEST_CASE("schedules: arguments that make no schedule are refused, naming the argument") {
        CHECK(error_message([] { (void)pss::ExponentialDecay(0.1, 0, 0.5); }) ==
              "pss: ExponentialDecay: decay_steps is 0, but it must be a finite number > 0 (the steps over which the "
              "rate is multiplied by decay_rate)");
        CHECK(error_message([] { (void)pss::ExponentialDecay(-1, 10, 0.5); })
                  .starts_with("pss: ExponentialDecay: initial_learning_rate is -1, but it must be"));
        CHECK(error_message([] { (void)pss::PiecewiseConstantDecay({10, 20}, {1.0, 0.5}); }) ==
              "pss: PiecewiseConstantDecay: 2 boundaries and 2 values; give one value more than boundaries (a value "
              "before the first boundary, one after each)");
        CHECK(error_message([] { (void)pss::PiecewiseConstantDecay({20, 20}, {1.0, 0.5, 0.1}); }) ==
              "pss: PiecewiseConstantDecay: boundary 1 (20) is not above boundary 0 (20); the boundaries must increase");
        CHECK(error_message([] { (void)pss::PiecewiseConstantDecay({20}, {1.0, std::nan("")}); })
                  .starts_with("pss: PiecewiseConstantDecay: value 1 is nan, but it must be"));
        CHECK(error_message([] { (void)pss::CosineDecay(0.1, 100, 1.5); })
                  .starts_with("pss: CosineDecay: alpha is 1.5, but it must be in [0, 1]"));
        CHECK(error_message([] { (void)pss::CosineDecay(0.1, 100, 0.0, -0.1, 10); })
                  .starts_with("pss: CosineDecay: warmup_target is -0.1, but it must be"));
        CHECK(error_message([] { (void)pss::LearningRate(std::shared_ptr<const pss::LearningRateSchedule>{}); }) ==
              "pss: LearningRate: the schedule is null");
    }

    TEST_CASE("an optimizer with a schedule: Keras' config, equality by config, its rate fixed per step by "
              "with_learning_rate, and no apply without one") {
        const pss::SGD sgd(pss::ExponentialDecay(0.1, 10, 0.5));
        CHECK(sgd.learning_rate().is_schedule());
        CHECK(sgd.get_config() ==
              nlohmann::json::parse(R"({"name": "SGD", "learning_rate": {"class_name": "ExponentialDecay", "config":
                  {"initial_learning_rate": 0.1, "decay_steps": 10.0, "decay_rate": 0.5, "staircase": false}}})"));
        CHECK(pss::SGD(0.1).get_config() == nlohmann::json::parse(R"({"name": "SGD", "learning_rate": 0.1})"));
        CHECK(sgd == pss::SGD(pss::ExponentialDecay(0.1, 10, 0.5)));
        CHECK_FALSE(sgd == pss::SGD(pss::ExponentialDecay(0.1, 10, 0.6)));
        CHECK_FALSE(sgd == pss::SGD(0.1));
        CHECK(pss::Adam(pss::CosineDecay(0.001, 1000)) == pss::Adam(pss::CosineDecay(0.001, 1000)));
        std::ostringstream printed;
        printed << pss::LearningRate(pss::PiecewiseConstantDecay({5}, {1.0, 0.5})) << " " << pss::LearningRate(0.25);
        CHECK(printed.str() == "PiecewiseConstantDecay(boundaries=[5], values=[1.0,0.5]) 0.25");

        xt::xarray<float> w{1.0f};
        const xt::xarray<float> g{1.0f};
        auto slots = sgd.make_slots(w);
        CHECK(error_message([&] { sgd.apply_dense(w, slots, g); }) ==
              "pss: SGD: the learning rate is a schedule (ExponentialDecay), whose value depends on the training "
              "step; apply through with_learning_rate(rate(step)), as a parameter server does for each push that "
              "names its step");
        CHECK(w(0) == 1.0f);
        const pss::SGD at_step_10 = sgd.with_learning_rate(sgd.learning_rate()(10));
        CHECK(at_step_10.learning_rate() == 0.05);
        at_step_10.apply_dense(w, slots, g);
        CHECK(w(0) == 0.95f);
        CHECK(error_message([&] { (void)sgd.with_learning_rate(-2); })
                  .starts_with("pss: SGD: learning_rate is -2, but it must be a finite number >= 0"));
        // Adam's bias correction uses the rate of the step: alpha = rate * sqrt(1 - 0.999) / (1 - 0.9) at t = 1.
        const pss::Adam adam(pss::PiecewiseConstantDecay({0}, {1.0, 0.5}));
        xt::xarray<double> v{0.0};
        auto adam_slots = adam.make_slots(v);
        adam.with_learning_rate(0.5).apply_dense(v, adam_slots, xt::xarray<double>{1.0});
        CHECK(v(0) == doctest::Approx(-0.5 * std::sqrt(1 - 0.999) / (1 - 0.9) * 0.1 / (std::sqrt(0.001) + 1e-7)));
    }
}

TEST_SUITE("optimizer/adam.hpp") {
    TEST_CASE_TEMPLATE("Adam: defaults, w 1, g 0.5 twice: m 0.05 then 0.095, v 0.00025 then 0.00049975, Keras' w", T,
                       float, double) {
        const pss::Adam adam;
        xt::xarray<T> w{T(1)};
        const xt::xarray<T> g{T(0.5)};
        auto slots = adam.make_slots(w);
        CHECK(slots.iterations == 0);
        adam.apply_dense(w, slots, g);
        CHECK(slots.iterations == 1);
        CHECK(slots.m(0) == approx<T>(0.05));
        CHECK(slots.v(0) == approx<T>(0.00025));
        const double alpha1 = 0.001 * std::sqrt(1 - 0.999) / (1 - 0.9);
        const double w1 = 1 - alpha1 * 0.05 / (std::sqrt(0.00025) + 1e-7);
        CHECK(w(0) == approx<T>(w1));
        CHECK(w(0) == approx<T>(0.9990000063245553));  // 1 - 0.0005 / (0.5 + 1e-7 / sqrt(0.001))
        adam.apply_dense(w, slots, g);
        CHECK(slots.iterations == 2);
        CHECK(slots.m(0) == approx<T>(0.095));
        CHECK(slots.v(0) == approx<T>(0.00049975));
        const double alpha2 = 0.001 * std::sqrt(1 - 0.999 * 0.999) / (1 - 0.9 * 0.9);
        CHECK(w(0) == approx<T>(w1 - alpha2 * 0.095 / (std::sqrt(0.00049975) + 1e-7)));
    }
    TEST_CASE("Adam: the step count is per shard and counts sparse applies, empty ones too") {
        const pss::Adam adam(0.01);
        xt::xarray<double> a = pattern<double>({4, 2}, 8), b = a;
        auto sa = adam.make_slots(a);
        auto sb = adam.make_slots(b);
        const std::vector<std::int64_t> rows{3}, none{};
        adam.apply_sparse(a, sa, as_rows(rows), pattern<double>({1, 2}, 9));
        adam.apply_sparse(a, sa, as_rows(none), xt::xarray<double>::from_shape({0, 2}));
        adam.apply_dense(a, sa, pattern<double>({4, 2}, 10));
        CHECK(sa.iterations == 3);
        CHECK(sb.iterations == 0);  // another shard's slots are not touched
    }
    TEST_CASE("Adam: sparse rows {0, 3} change only those rows of w, m and v (lazy, as LazyAdam)") {
        const pss::Adam adam(0.01);
        xt::xarray<float> w = pattern<float>({5, 4}, 11);
        auto slots = adam.make_slots(w);
        adam.apply_dense(w, slots, pattern<float>({5, 4}, 12));
        const xt::xarray<float> w0 = w, m0 = slots.m, v0 = slots.v;
        const std::vector<std::int64_t> rows{0, 3};
        adam.apply_sparse(w, slots, as_rows(rows), pattern<float>({2, 4}, 13));
        for (std::size_t r : {1u, 2u, 4u}) {
            CHECK(row_equal(w, w0, r));
            CHECK(row_equal(slots.m, m0, r));
            CHECK(row_equal(slots.v, v0, r));
        }
        for (std::size_t r : {0u, 3u}) {
            CHECK_FALSE(row_equal(w, w0, r));
            CHECK_FALSE(row_equal(slots.m, m0, r));
            CHECK_FALSE(row_equal(slots.v, v0, r));
        }
    }
    TEST_CASE_TEMPLATE("Adam: 10007 elements (blocks and tails) match a scalar loop of Keras' formula", T, float,
                       double) {
        const pss::Adam adam(0.01);
        xt::xarray<T> w = pattern<T>({10007}, 14);
        std::vector<T> rw(w.begin(), w.end()), rm(w.size(), 0), rv(w.size(), 0);
        auto slots = adam.make_slots(w);
        for (int step = 1; step <= 3; ++step) {
            const xt::xarray<T> g = pattern<T>({10007}, 15 + static_cast<unsigned>(step));
            adam.apply_dense(w, slots, g);
            const double alpha = 0.01 * std::sqrt(1 - std::pow(0.999, step)) / (1 - std::pow(0.9, step));
            const T a = static_cast<T>(alpha), b1 = static_cast<T>(1 - 0.9), b2 = static_cast<T>(1 - 0.999);
            const T eps = static_cast<T>(1e-7);
            for (std::size_t i = 0; i < rw.size(); ++i) {
                rm[i] += (g(i) - rm[i]) * b1;
                rv[i] += (g(i) * g(i) - rv[i]) * b2;
                rw[i] -= a * rm[i] / (std::sqrt(rv[i]) + eps);
            }
        }
        bool all_close = true;
        for (std::size_t i = 0; i < rw.size(); ++i) all_close = all_close && (w(i) == approx<T>(rw[i]));
        CHECK(all_close);
    }
    TEST_CASE("Adam: defaults are Keras' (0.001, 0.9, 0.999, 1e-7); beta_1 1 or beta_2 -0.5 throws naming it") {
        const pss::Adam adam;
        CHECK(adam.learning_rate() == 0.001);
        CHECK(adam.beta_1() == 0.9);
        CHECK(adam.beta_2() == 0.999);
        CHECK(adam.epsilon() == 1e-7);
        CHECK(error_message([] { (void)pss::Adam(0.001, 1.0); })
                  .starts_with("pss: Adam: beta_1 is 1, but it must be in [0, 1)"));
        CHECK(error_message([] { (void)pss::Adam(0.001, 0.9, -0.5); })
                  .starts_with("pss: Adam: beta_2 is -0.5, but it must be in [0, 1)"));
        CHECK_THROWS_AS(pss::Adam(-0.001), pss::InvalidArgumentError);
        CHECK_THROWS_AS(pss::Adam(0.001, 0.9, 0.999, -1), pss::InvalidArgumentError);
        CHECK_THROWS_AS((void)pss::Adam(std::numeric_limits<double>::infinity()), pss::InvalidArgumentError);
    }
}

namespace {

/// The semantic rules of the Optimizer concept, for one element type.
template <class O, class T>
void check_optimizer_rules(const O& opt) {
    const std::vector<std::size_t> shape{6, 3};
    const std::vector<std::int64_t> all_rows{5, 0, 3, 1, 4, 2};  // every row once, in any order

    SUBCASE("apply_sparse of every row equals apply_dense, three steps, bit for bit") {
        xt::xarray<T> dense = pattern<T>(shape, 20), sparse = dense;
        auto ds = opt.make_slots(std::as_const(dense));
        auto ss = opt.make_slots(std::as_const(sparse));
        for (unsigned step = 0; step < 3; ++step) {
            const xt::xarray<T> g = pattern<T>(shape, 21 + step);
            opt.apply_dense(dense, ds, std::as_const(g));
            const xt::xarray<T> rows = take_rows(g, all_rows);
            opt.apply_sparse(sparse, ss, as_rows(all_rows), std::as_const(rows));
        }
        CHECK(same_bits(dense, sparse));
        CHECK_FALSE(same_bits(dense, pattern<T>(shape, 20)));  // the updates did something
    }
    SUBCASE("apply_sparse leaves every unlisted row as it was, and an empty row list leaves the shard") {
        xt::xarray<T> w = pattern<T>(shape, 30);
        auto slots = opt.make_slots(std::as_const(w));
        opt.apply_dense(w, slots, pattern<T>(shape, 31));
        const xt::xarray<T> before = w;
        const std::vector<std::int64_t> rows{4, 1};
        opt.apply_sparse(w, slots, as_rows(rows), pattern<T>({2, 3}, 32));
        for (std::size_t r : {0u, 2u, 3u, 5u}) CHECK(row_equal(w, before, r));
        CHECK_FALSE(row_equal(w, before, 1));
        CHECK_FALSE(row_equal(w, before, 4));
        const xt::xarray<T> after = w;
        const std::vector<std::int64_t> none{};
        opt.apply_sparse(w, slots, as_rows(none), xt::xarray<T>::from_shape({0, 3}));
        CHECK(same_bits(w, after));
    }
    SUBCASE("apply_dense keeps the shard's shape; a copy of the optimizer updates to the same bits") {
        const O copy(opt);
        xt::xarray<T> a = pattern<T>(shape, 40), b = a;
        auto sa = opt.make_slots(std::as_const(a));
        auto sb = copy.make_slots(std::as_const(b));
        for (unsigned step = 0; step < 2; ++step) {
            const xt::xarray<T> g = pattern<T>(shape, 41 + step);
            opt.apply_dense(a, sa, g);
            copy.apply_dense(b, sb, g);
        }
        CHECK(std::ranges::equal(a.shape(), shape));
        CHECK(same_bits(a, b));
    }
    SUBCASE("one const optimizer applied from two threads to two shards gives the sequential bits") {
        xt::xarray<T> a = pattern<T>({4096, 8}, 50), b = pattern<T>({4096, 8}, 51);
        xt::xarray<T> ra = a, rb = b;
        auto sa = opt.make_slots(std::as_const(a));
        auto sb = opt.make_slots(std::as_const(b));
        auto rsa = opt.make_slots(std::as_const(ra));
        auto rsb = opt.make_slots(std::as_const(rb));
        const xt::xarray<T> ga = pattern<T>({4096, 8}, 52), gb = pattern<T>({4096, 8}, 53);
        for (int i = 0; i < 3; ++i) {
            opt.apply_dense(ra, rsa, ga);
            opt.apply_dense(rb, rsb, gb);
        }
        std::thread t1([&] {
            for (int i = 0; i < 3; ++i) opt.apply_dense(a, sa, ga);
        });
        std::thread t2([&] {
            for (int i = 0; i < 3; ++i) opt.apply_dense(b, sb, gb);
        });
        t1.join();
        t2.join();
        CHECK(same_bits(a, ra));
        CHECK(same_bits(b, rb));
    }
    SUBCASE("for_each_slot shows every slot tensor in slot_names() order, shaped like the shard, and all the state") {
        xt::xarray<T> a = pattern<T>(shape, 70);
        auto sa = opt.make_slots(std::as_const(a));
        opt.apply_dense(a, sa, pattern<T>(shape, 71));
        std::vector<std::string> tensors;
        O::for_each_slot(std::as_const(sa), [&](std::string_view name, const auto& item) {
            if constexpr (!std::integral<std::decay_t<decltype(item)>>) {
                tensors.emplace_back(name);
                CHECK(std::ranges::equal(item.shape(), shape));
            }
        });
        std::vector<std::string> names;
        for (std::string_view n : O::slot_names()) names.emplace_back(n);
        CHECK(tensors == names);
        // Fresh slots given a's slot state by name (as a restore does) continue to the same bits.
        xt::xarray<T> b = a;
        auto sb = opt.make_slots(std::as_const(b));
        O::for_each_slot(sb, [&](std::string_view name, auto& item) {
            O::for_each_slot(std::as_const(sa), [&](std::string_view other, const auto& saved) {
                if constexpr (std::same_as<std::decay_t<decltype(item)>, std::decay_t<decltype(saved)>>)
                    if (name == other) item = saved;
            });
        });
        const xt::xarray<T> g = pattern<T>(shape, 72);
        opt.apply_dense(a, sa, g);
        opt.apply_dense(b, sb, g);
        CHECK(same_bits(a, b));
        const nlohmann::json config = opt.get_config();
        CHECK(config.is_object());
    }
    SUBCASE("rows taken by position update as the same rows gathered first, and the gradient is not changed") {
        if constexpr (pss::detail::optimizer_has_apply_sparse_by_position<O, T>) {
            xt::xarray<T> by_position = pattern<T>({6, 3}, 70), gathered = by_position;
            auto ps = opt.make_slots(std::as_const(by_position));
            auto gs = opt.make_slots(std::as_const(gathered));
            const xt::xarray<T> g = pattern<T>({5, 3}, 71);
            const xt::xarray<T> g_before = g;
            const std::vector<std::int64_t> rows{5, 0, 3};
            const std::vector<std::size_t> positions{4, 0, 2};
            const std::vector<std::int64_t> picked{4, 0, 2};
            for (int k = 0; k < 3; ++k) {  // three applies, so that slots and step counters take part
                opt.apply_sparse(by_position, ps, as_rows(rows), g, std::span<const std::size_t>(positions));
                opt.apply_sparse(gathered, gs, as_rows(rows), take_rows(g, picked));
            }
            CHECK(same_bits(by_position, gathered));
            CHECK(same_bits(g, g_before));
            CHECK_FALSE(same_bits(by_position, pattern<T>({6, 3}, 70)));
        }
    }
    SUBCASE("a row wider than a block (3 x 5000) updates the same sparse as dense") {
        xt::xarray<T> dense = pattern<T>({3, 5000}, 60), sparse = dense;
        auto ds = opt.make_slots(std::as_const(dense));
        auto ss = opt.make_slots(std::as_const(sparse));
        const xt::xarray<T> g = pattern<T>({3, 5000}, 61);
        const std::vector<std::int64_t> rows{2, 0, 1};
        opt.apply_dense(dense, ds, g);
        opt.apply_sparse(sparse, ss, as_rows(rows), take_rows(g, rows));
        CHECK(same_bits(dense, sparse));
    }
}

}  // namespace

// pss's optimizers take gradient rows where they lie; an optimizer without that overload is given a copy.
static_assert(pss::detail::optimizer_has_apply_sparse_by_position<pss::SGD, float> &&
              pss::detail::optimizer_has_apply_sparse_by_position<pss::Momentum, double> &&
              pss::detail::optimizer_has_apply_sparse_by_position<pss::Adagrad, float> &&
              pss::detail::optimizer_has_apply_sparse_by_position<pss::Adam, double>);
static_assert(!pss::detail::optimizer_has_apply_sparse_by_position<pss::archetypes::OptimizerArchetype, float>);

TEST_SUITE("concepts/optimizer.hpp") {
    TEST_CASE_TEMPLATE("Optimizer conformance: sparse of all rows is dense, unlisted rows untouched, const, float32",
                       O, pss::SGD, pss::Momentum, Nesterov, pss::Adagrad, pss::Adam,
                       pss::archetypes::OptimizerArchetype) {
        CHECK_FALSE(std::string_view(O::name()).empty());
        check_optimizer_rules<O, float>(make_optimizer<O>());
    }
    TEST_CASE_TEMPLATE("Optimizer conformance: sparse of all rows is dense, unlisted rows untouched, const, float64",
                       O, pss::SGD, pss::Momentum, Nesterov, pss::Adagrad, pss::Adam,
                       pss::archetypes::OptimizerArchetype) {
        check_optimizer_rules<O, double>(make_optimizer<O>());
    }
}
