// tests/test_checkpoint.cpp: checkpoints on real files: save and restore bit for bit, every reshard, deferred
// restoration, refusals, the manager's atomic commit under SIGKILL, read-only and full directories.
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <numeric>
#include <optional>
#include <sstream>
#include <set>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>
#include <xtensor/xarray.hpp>
#include <xtensor/xio.hpp>

#include <pss/keras.hpp>
#include <pss/pss.hpp>

namespace {

namespace fs = std::filesystem;

/// A fresh directory under the system's temporary directory, removed with everything in it.
struct TempDir {
    std::string path;
    TempDir() {
        std::string pattern = (fs::temp_directory_path() / "pss_ckpt_XXXXXX").string();
        REQUIRE(::mkdtemp(pattern.data()) != nullptr);
        path = pattern;
    }
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
    ~TempDir() {
        std::error_code ec;
        fs::permissions(path, fs::perms::owner_all, fs::perm_options::add, ec);
        fs::remove_all(path, ec);
    }
    [[nodiscard]] std::string operator/(const std::string& name) const { return path + "/" + name; }
};

doctest::Contains contains(const std::string& text) { return doctest::Contains(text.c_str()); }

std::string slurp(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void spit(const std::string& path, const std::string& bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << bytes;
}

template <class T>
xt::xarray<T> pattern(const pss::Shape& shape, int seed) {
    xt::xarray<T> a = xt::xarray<T>::from_shape(shape);
    for (std::size_t i = 0; i < a.size(); ++i) {
        if constexpr (std::is_floating_point_v<T>)
            a.data()[i] = static_cast<T>(std::sin(0.7 * static_cast<double>(i) + seed) * 3.0);
        else
            a.data()[i] = static_cast<T>(static_cast<int>(i) * 7 - seed * 3);
    }
    return a;
}

/// Bit-for-bit equality of two tensors (dtype, shape and bytes).
bool same_bits(const pss::Tensor& a, const pss::Tensor& b) {
    return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.bytes(), b.bytes(), a.nbytes()) == 0;
}

template <class O, int Ps, class C = pss::Asynchronous, int Workers = 1>
using Strat = pss::ParameterServerStrategy<pss::InProcessTransport, pss::FixedShardsPartitioner, O,
                                           pss::LocalClusterResolver<Ps, Workers>, C>;

/// The model of these tests: float32 (10, 3) "emb" (sharded), float64 (5,) "bias", int32 (4, 2), int64 (3,)
/// and a float32 scalar.
struct Model {
    std::vector<pss::Variable> vars;
    pss::Variable& emb() { return vars[0]; }
    pss::Variable& bias() { return vars[1]; }
};

template <class S>
Model build_model(S& strategy, int seed = 0) {
    auto scope = strategy.scope();
    Model m;
    m.vars.emplace_back(pattern<float>({10, 3}, seed), "emb");
    m.vars.emplace_back(pattern<double>({5}, seed + 1), "dense/bias");
    m.vars.emplace_back(pattern<std::int32_t>({4, 2}, seed + 2), "counts");
    m.vars.emplace_back(pattern<std::int64_t>({3}, seed + 3), "ids");
    m.vars.emplace_back(xt::xarray<float>(2.5f), "scale");
    return m;
}

/// One training step of the model's float variables: a dense gradient to each, and sparse rows to emb.
void train_step(Model& m, int k, std::uint64_t step = 0) {
    m.emb().apply_gradient(pattern<float>({10, 3}, 100 + k), step);
    const std::vector<std::int64_t> rows{1, 4, 7, 9, 1};  // a row in every shard of every layout tested
    m.emb().apply_sparse_gradient(rows, pattern<float>({5, 3}, 200 + k), step);
    m.bias().apply_gradient(pattern<double>({5}, 300 + k), step);
    m.vars[4].apply_gradient(xt::xarray<float>(0.25f * static_cast<float>(k + 1)), step);
}

std::vector<pss::Tensor> values(const Model& m) {
    std::vector<pss::Tensor> out;
    for (const auto& v : m.vars) out.push_back(v.read_value());
    return out;
}

/// Every saved tensor of a checkpoint, reassembled whole from its shards: "name" and "name:slot".
std::map<std::string, pss::Tensor> reassemble(const std::string& dir) {
    const auto index = pss::detail::read_index(dir);
    std::map<std::string, pss::Tensor> out;
    for (const auto& v : index.variables) {
        std::vector<std::string> parts{""};
        for (const auto& [slot, record] : v.shards.front().slots) parts.push_back(slot);
        for (const auto& part : parts) {
            pss::Tensor t = pss::Tensor::uninitialized(v.dtype, v.shape);
            pss::detail::read_saved_rows(dir, v, part, 0, v.shape.empty() ? 1 : v.shape[0], t.bytes());
            out.emplace(part.empty() ? v.name : v.name + ":" + part, std::move(t));
        }
    }
    return out;
}

template <class O>
O make_opt() {
    if constexpr (std::same_as<O, pss::SGD>)
        return O(0.1);
    else if constexpr (std::same_as<O, pss::Momentum>)
        return O(0.05, 0.9);
    else if constexpr (std::same_as<O, pss::Adagrad>)
        return O(0.1, 0.1, 1e-7);
    else
        return O(0.01);
}

}  // namespace

TEST_SUITE("checkpoint.hpp") {
    TEST_CASE("Checkpoint: CRC-32 is zlib's: \"123456789\" gives 0xCBF43926, and it continues across calls") {
        CHECK(pss::detail::crc32(0, "123456789", 9) == 0xCBF43926u);
        CHECK(pss::detail::crc32(pss::detail::crc32(0, "1234", 4), "56789", 5) == 0xCBF43926u);
        CHECK(pss::detail::crc32(0, "", 0) == 0u);
        std::string long_text(1000, 'a');
        CHECK(pss::detail::crc32(0, long_text.data(), long_text.size()) == 0x9A38DA03u);  // zlib.crc32(b"a" * 1000)
        CHECK(pss::detail::crc32_by_table(0, long_text.data(), long_text.size()) == 0x9A38DA03u);
        // Folded (where the CPU can) and by table agree at every length around the fold's 64- and 16-byte
        // steps, at every alignment, continuing any CRC.
        std::vector<unsigned char> bytes(4096 + 64);
        std::uint32_t state = 12345;
        for (auto& b : bytes) b = static_cast<unsigned char>((state = state * 1103515245u + 12345u) >> 24);
        int differ = 0, compared = 0;
        for (std::size_t offset = 0; offset < 16; ++offset)
            for (std::size_t n = 0; n <= 300; ++n, ++compared)
                differ += pss::detail::crc32(static_cast<std::uint32_t>(n), bytes.data() + offset, n) !=
                          pss::detail::crc32_by_table(static_cast<std::uint32_t>(n), bytes.data() + offset, n);
        for (std::size_t n = 4096; n <= 4096 + 48; ++n, ++compared)
            differ += pss::detail::crc32(0, bytes.data() + 3, n) != pss::detail::crc32_by_table(0, bytes.data() + 3, n);
        CHECK(compared == 16 * 301 + 49);
        CHECK(differ == 0);
        CHECK(pss::detail::crc32(0, bytes.data(), 4096) == 0x8D119CD4u);  // Python: zlib.crc32 of the same bytes
    }

    TEST_CASE("Checkpoint: optimizers name their slots as Keras 3 and give their config") {
        CHECK(pss::SGD::slot_names().empty());
        CHECK(pss::Momentum::slot_names()[0] == "momentum");
        CHECK(pss::Adagrad::slot_names()[0] == "accumulator");
        CHECK(pss::Adam::slot_names()[0] == "momentum");
        CHECK(pss::Adam::slot_names()[1] == "velocity");
        CHECK(pss::Adam(0.5).get_config() ==
              nlohmann::json{{"name", "Adam"}, {"learning_rate", 0.5}, {"beta_1", 0.9}, {"beta_2", 0.999}, {"epsilon", 1e-7}});
        CHECK(pss::Momentum(0.1, 0.8, true).get_config() ==
              nlohmann::json{{"name", "Momentum"}, {"learning_rate", 0.1}, {"momentum", 0.8}, {"nesterov", true}});
    }

    TEST_CASE("Checkpoint: a table drawn on its ps tasks in 2 shards, saved and restored onto 3, holds what 3 shards "
              "draw themselves") {
        TempDir dir;
        const auto init = pss::InitializerSpec::random_normal(0, 1, 9);
        {
            pss::ParameterServerStrategy<pss::InProcessTransport, pss::FixedShardsPartitioner> two(
                {}, pss::FixedShardsPartitioner(2));
            auto scope = two.scope();
            const pss::Variable table(pss::Shape{7, 3}, pss::DType::float32, init, "table");
            pss::Checkpoint(two).write(dir / "c");
        }
        pss::ParameterServerStrategy<pss::InProcessTransport, pss::FixedShardsPartitioner, pss::SGD,
                                     pss::LocalClusterResolver<3, 1>>
            three({}, pss::FixedShardsPartitioner(3));
        auto scope = three.scope();
        const pss::Variable restored(pss::Shape{7, 3}, pss::DType::float32, pss::InitializerSpec::zeros(), "table");
        pss::Checkpoint(three).restore(dir / "c");
        const pss::Variable drawn(pss::Shape{7, 3}, pss::DType::float32, init, "drawn");
        CHECK(restored.num_shards() == 3);
        CHECK(restored.read<float>() == drawn.read<float>());
        CHECK(drawn.read<float>()(0, 0) != 0.0f);
    }

    TEST_CASE_TEMPLATE("Checkpoint: save then restore into a fresh strategy gives the same values, slots and next step, "
                       "float32/float64/int32/int64",
                       O, pss::SGD, pss::Momentum, pss::Adagrad, pss::Adam) {
        TempDir dir;
        Strat<O, 2> a({}, pss::FixedShardsPartitioner(3), make_opt<O>());
        Model ma = build_model(a);
        for (int k = 0; k < 3; ++k) train_step(ma, k);
        pss::Checkpoint ca(a);
        ca.set_step(3);
        ca.write(dir / "one");

        // The files: one per shard and per slot, with numpy's header and the shard's bytes.
        const auto index = pss::detail::read_index(dir / "one");
        REQUIRE(index.variables.size() == 5);
        CHECK(index.step == 3);
        CHECK(index.optimizer.at("name") == std::string(O::name()));
        CHECK(index.optimizer.at("config") == make_opt<O>().get_config());
        CHECK(index.partitioner == nlohmann::json{{"name", "FixedShardsPartitioner"}, {"num_shards", 3}, {"num_ps", 2}});
        const auto& emb = index.variables[0];
        CHECK(emb.name == "emb");
        REQUIRE(emb.shards.size() == 3);
        CHECK(emb.shards[1].row_offset == 4);
        CHECK(emb.shards[1].shape == pss::Shape{3, 3});
        CHECK(emb.shards[1].value.file == "emb.part_1.npy");
        CHECK(emb.shards[1].slots.size() == O::slot_names().size());
        const std::string part1 = slurp(dir / "one/emb.part_1.npy");
        using namespace std::string_literals;
        const std::string header = "\x93NUMPY\x01\x00v\x00{'descr': '<f4', 'fortran_order': False, 'shape': (3, 3), }"s;
        CHECK(part1.substr(0, header.size()) == header);
        CHECK(part1.size() == 128 + 9 * 4);
        CHECK(part1[127] == '\n');
        const auto emb_now = ma.emb().read<float>();
        CHECK(std::memcmp(part1.data() + 128, emb_now.data() + 12, 9 * 4) == 0);
        CHECK(pss::detail::crc32(0, part1.data(), part1.size()) == emb.shards[1].value.crc32);
        CHECK(index.variables[1].name == "dense/bias");
        CHECK(index.variables[1].shards.front().value.file == "dense.bias.part_0.npy");
        if constexpr (std::same_as<O, pss::Adam>) CHECK(emb.shards[1].counters.at("iterations") == 6);  // 3 dense + 3 sparse
        CHECK(index.variables[2].shards.front().slots.empty());  // int32: no slots

        // Restored into a fresh strategy of the same layout: the same values; saved again, the same files.
        Strat<O, 2> b({}, pss::FixedShardsPartitioner(3), make_opt<O>());
        Model mb = build_model(b, 50);
        pss::Checkpoint cb(b);
        cb.restore(dir / "one");
        CHECK(cb.step() == 3);
        const auto va = values(ma), vb = values(mb);
        for (std::size_t i = 0; i < va.size(); ++i) CHECK(same_bits(va[i], vb[i]));
        cb.write(dir / "two");
        for (const auto& entry : fs::directory_iterator(dir / "one")) {
            const std::string name = entry.path().filename().string();
            if (name == "index.json") continue;
            CHECK_MESSAGE(slurp(entry.path().string()) == slurp(dir / ("two/" + name)), name);
        }
        // The slots took effect: one more step on each gives the same bits.
        train_step(ma, 3);
        train_step(mb, 3);
        const auto wa = values(ma), wb = values(mb);
        for (std::size_t i = 0; i < wa.size(); ++i) CHECK(same_bits(wa[i], wb[i]));
        CHECK_FALSE(same_bits(wa[0], va[0]));
    }

    TEST_CASE("Checkpoint: synchronous Adam, 2 workers: 4 steps, save, restore into a fresh strategy, 3 more steps "
              "== 7 steps without stopping, bit for bit") {
        using S = Strat<pss::Adam, 2, pss::Synchronous, 2>;
        auto run = [](S& s, Model& m, int from, int to) {
            for (int k = from; k < to; ++k) {
                const auto step = static_cast<std::uint64_t>(k - from + 1);
                for (int w = 0; w < 2; ++w) {  // each worker pushes its gradient of the step, once per variable
                    const std::vector<std::int64_t> rows{static_cast<std::int64_t>(k % 10), 3};
                    m.emb().apply_sparse_gradient(rows, pattern<float>({2, 3}, 20 * k + w), step);
                    m.bias().apply_gradient(pattern<double>({5}, 30 * k + w), step);
                    m.vars[4].apply_gradient(xt::xarray<float>(0.5f + static_cast<float>(w)), step);
                }
            }
            (void)s;
        };
        TempDir dir;
        S straight({}, pss::FixedShardsPartitioner(2), pss::Adam(0.05));
        Model ms = build_model(straight);
        run(straight, ms, 0, 7);

        S first({}, pss::FixedShardsPartitioner(2), pss::Adam(0.05));
        Model mf = build_model(first);
        run(first, mf, 0, 4);
        pss::Checkpoint(first).write(dir / "at4");

        S second({}, pss::FixedShardsPartitioner(2), pss::Adam(0.05));
        Model m2 = build_model(second, 9);
        pss::Checkpoint c2(second);
        c2.restore(dir / "at4");
        run(second, m2, 4, 7);
        const auto a = values(ms), b = values(m2);
        for (std::size_t i = 0; i < a.size(); ++i) CHECK(same_bits(a[i], b[i]));
    }

    TEST_CASE("Checkpoint: a synchronous ParameterServer restored from a checkpoint of step 5 takes step 6 next, from "
              "behind (count 0) and from ahead (count 6); a held pull of a step now applied is answered") {
        TempDir dir;
        {  // the checkpoint: "w" = {2, 4} at step 5
            Strat<pss::SGD, 1> s({}, pss::FixedShardsPartitioner(1), pss::SGD(0.5));
            const pss::Variable w = [&] {
                auto scope = s.scope();
                return pss::Variable(xt::xarray<float>{2, 4}, "w");
            }();
            pss::Checkpoint c(s);
            c.set_step(5);
            c.write(dir / "at5");
        }
        pss::ParameterServer<pss::SGD> ps(pss::SGD(0.5), {.synchronous = true, .workers = 2});
        auto request = [](pss::Op op, std::uint64_t step, pss::Tensor payload = {}) {
            pss::Request r;
            r.op = op;
            r.key = {1, 0};
            r.step = step;
            r.payload = std::move(payload);
            return r;
        };
        auto push = [&](std::uint64_t step, float g) {
            return ps.handle(request(pss::Op::apply_dense, step, xt::xarray<float>{g, g}));
        };
        auto read = [&](std::uint64_t step) { return ps.handle(request(pss::Op::read, step)); };
        auto value = [&] { return read(0).payload.get<float>(); };
        std::vector<std::pair<std::uint64_t, pss::Reply>> answered;  // held pulls, by step, as answered
        auto hold = [&](std::uint64_t step) {
            ps.handle(request(pss::Op::read, step),
                      pss::Responder([&answered, step](pss::Reply&& r) { answered.emplace_back(step, std::move(r)); }));
        };
        auto restore = [&] {
            pss::Request stage = request(pss::Op::restore_shard, 0);
            stage.name = dir / "at5" + "\nw";
            stage.ids = {0, 2};
            REQUIRE(ps.handle(std::move(stage)).ok());
            REQUIRE(ps.handle(request(pss::Op::commit_restore, 5)).ok());
        };
        pss::Request create = request(pss::Op::create, 0, xt::xarray<float>{0, 0});
        create.name = "w";
        REQUIRE(ps.handle(std::move(create)).ok());

        // Behind: nothing applied, a pull of step 5 held, half of step 1 pushed.
        hold(5);
        CHECK(push(1, 1).ok());
        CHECK(answered.empty());
        restore();
        REQUIRE(answered.size() == 1);  // step 5 counts as applied: the restore answered it
        CHECK(answered[0].first == 5);
        CHECK(answered[0].second.ok());
        CHECK(answered[0].second.payload.get<float>() == xt::xarray<float>{2, 4});
        const pss::Reply old = push(3, 1);
        CHECK(old.code == pss::ErrorCode::invalid_argument);
        CHECK(old.message == "pss: apply_gradient on variable 'w': step 3 is applied already; a worker pushed twice, or too late");
        pss::Request again = request(pss::Op::apply_dense, 3, xt::xarray<float>{1, 1});
        again.sender = pss::TaskId{"worker", 0};
        CHECK(ps.handle(std::move(again)).ok());  // a proven sender's old step: run again, changes nothing
        CHECK(value() == xt::xarray<float>{2, 4});
        const pss::Reply six = read(6);
        CHECK(six.ok());
        CHECK(six.payload.get<float>() == xt::xarray<float>{2, 4});
        const pss::Reply seven = read(7);
        CHECK(seven.code == pss::ErrorCode::not_ready);
        CHECK(seven.message == "pss: read on variable 'w' for step 7: step 6 is not applied yet");
        CHECK(push(6, 1).ok());
        CHECK(push(6, 3).ok());
        CHECK(value() == xt::xarray<float>{1, 3});  // 0.5 * the mean gradient 2

        // Ahead: step 6 applied, half of step 7 pushed, a pull of step 8 held; the restore goes back to
        // step 5 and drops the half step (its gradient was of the values the restore replaced).
        CHECK(push(7, 5).ok());
        hold(8);
        restore();
        CHECK(value() == xt::xarray<float>{2, 4});
        CHECK(answered.size() == 1);  // step 7 is not applied: the pull of step 8 still waits
        CHECK(read(7).code == pss::ErrorCode::not_ready);
        const pss::Reply ahead = push(8, 1);
        CHECK(ahead.code == pss::ErrorCode::invalid_argument);
        CHECK(ahead.message == "pss: apply_gradient on variable 'w': step 8 is too far ahead: step 5 is the last applied, "
                               "and with staleness 0 no worker can push beyond step 7");
        CHECK(push(6, 1).ok());
        CHECK(push(6, 3).ok());
        CHECK(push(7, 2).ok());
        CHECK(answered.size() == 1);  // the push of step 7 before the restore does not count
        CHECK(push(7, 2).ok());
        REQUIRE(answered.size() == 2);
        CHECK(answered[1].first == 8);
        CHECK(answered[1].second.payload.get<float>() == xt::xarray<float>{0, 2});  // {1, 3} - 0.5 * 2
    }
}

namespace {

/// Trains a model on Ps tasks with `shards` shards, saves it to `dir`, and returns its values.
template <int Ps>
std::vector<pss::Tensor> train_and_save(int shards, const std::string& dir) {
    Strat<pss::Adam, Ps> s({}, pss::FixedShardsPartitioner(shards), pss::Adam(0.02));
    Model m = build_model(s);
    for (int k = 0; k < 3; ++k) train_step(m, k);
    pss::Checkpoint(s).write(dir);
    return values(m);
}

/// Restores `from` into a model on Ps tasks with `shards` shards, saves it again to `to`, and returns
/// the values and the number of shards of emb.
template <int Ps>
std::pair<std::vector<pss::Tensor>, std::size_t> restore_and_save(int shards, const std::string& from, const std::string& to) {
    Strat<pss::Adam, Ps> s({}, pss::FixedShardsPartitioner(shards), pss::Adam(0.02));
    Model m = build_model(s, 77);
    pss::Checkpoint c(s);
    c.restore(from);
    c.write(to);
    return {values(m), m.emb().num_shards()};
}

/// A checkpoint of a trained model on 2 ps in dir/good, and a fresh model (seed 40) on 2 ps to restore into.
struct SavedAndFresh {
    TempDir dir;
    Strat<pss::Adam, 2> s{{}, pss::FixedShardsPartitioner(2), pss::Adam(0.02)};
    Model m;
    std::vector<pss::Tensor> before;
    SavedAndFresh() {
        train_and_save<2>(2, dir / "good");
        m = build_model(s, 40);
        before = values(m);
    }
};

template <int PsFrom, int PsTo>
void check_reshard(int shards_from, int shards_to) {
    TempDir dir;
    const auto saved = train_and_save<PsFrom>(shards_from, dir / "from");
    const auto restored_and_shards = restore_and_save<PsTo>(shards_to, dir / "from", dir / "to");
    const auto& restored = restored_and_shards.first;
    CHECK(restored_and_shards.second == static_cast<std::size_t>(shards_to));
    for (std::size_t i = 0; i < saved.size(); ++i) CHECK(same_bits(saved[i], restored[i]));
    // Slots too: the saved tensors of both checkpoints, reassembled from their shards, are equal.
    const auto a = reassemble(dir / "from"), b = reassemble(dir / "to");
    CHECK(a.size() == 5 + 2 * 3);  // 5 values, momentum and velocity of the 3 float variables
    REQUIRE(a.size() == b.size());
    for (const auto& entry : a) CHECK_MESSAGE(same_bits(entry.second, b.at(entry.first)), entry.first);  // no binding: clang 14
    // And the counters: every shard of emb counted 6 applies.
    // The index is held by name: a range-for over a member of a temporary reads freed memory (C++20).
    const auto index = pss::detail::read_index(dir / "to");
    for (const auto& shard : index.variables[0].shards) CHECK(shard.counters.at("iterations") == 6);
}

}  // namespace

TEST_SUITE("checkpoint.hpp") {
    TEST_CASE("Checkpoint reshard: 1 ps 1 shard -> 4 ps 4 shards, values and slots exact") { check_reshard<1, 4>(1, 4); }
    TEST_CASE("Checkpoint reshard: 4 ps 4 shards -> 1 ps 1 shard, values and slots exact") { check_reshard<4, 1>(4, 1); }
    TEST_CASE("Checkpoint reshard: 4 ps 4 shards -> 2 ps 2 shards, values and slots exact") { check_reshard<4, 2>(4, 2); }
    TEST_CASE("Checkpoint reshard: 3 ps 3 shards (4,3,3 rows) -> 2 ps 2 shards (5,5), values and slots exact") {
        check_reshard<3, 2>(3, 2);
    }

    TEST_CASE("Checkpoint: a string variable is saved as numpy's fixed-width bytes and restored into other shards "
              "exactly; an element ending in a NUL byte is refused") {
        using namespace std::string_literals;
        TempDir dir;
        const xt::xarray<std::string> words{"the", "", "a longer word", "\x01\x02"s, "z"};
        {
            Strat<pss::SGD, 2> s({}, pss::FixedShardsPartitioner(2), pss::SGD(0.1));
            auto scope = s.scope();
            pss::Variable vocab(words, "vocab");  // rows 0-2 and 3-4
            pss::Checkpoint(s).write(dir / "ckpt");
        }
        const auto index = pss::detail::read_index(dir / "ckpt");
        REQUIRE(index.variables.size() == 1);
        CHECK(index.variables[0].dtype == pss::DType::string);
        // Shard 0's file: numpy's header of dtype |S13 (its longest element), then each element padded with NULs.
        const auto& record = index.variables[0].shards.at(0).value;
        std::ifstream in(dir / "ckpt" + "/" + record.file, std::ios::binary);
        const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        CHECK(file.substr(0, record.header_bytes).find("{'descr': '|S13', 'fortran_order': False, 'shape': (3,), }") !=
              std::string::npos);
        CHECK(file.substr(record.header_bytes) == "the" + std::string(10, '\0') + std::string(13, '\0') + "a longer word");

        Strat<pss::SGD, 3> t({}, pss::FixedShardsPartitioner(3), pss::SGD(0.1));
        auto scope = t.scope();
        pss::Variable vocab(xt::xarray<std::string>{"", "", "", "", ""}, "vocab");  // rows 0-1, 2-3, 4
        pss::Checkpoint(t).restore(dir / "ckpt");
        CHECK(vocab.num_shards() == 3);
        CHECK(vocab.read<std::string>() == words);

        vocab.scatter_update(std::vector<std::int64_t>{1}, xt::xarray<std::string>{"x\0"s});
        CHECK_THROWS_WITH_AS(pss::Checkpoint(t).write(dir / "nul"),
                             doctest::Contains("element 1 ends in a NUL byte, which numpy's fixed-width bytes (dtype |S) "
                                               "cannot keep; nothing was saved"),
                             pss::InvalidArgumentError);
    }

    TEST_CASE("Checkpoint: a restore before the variables exist applies as each is created (deferred)") {
        TempDir dir;
        const auto saved = train_and_save<2>(2, dir / "c");
        Strat<pss::Adam, 3> s({}, pss::FixedShardsPartitioner(3), pss::Adam(0.02));
        pss::Checkpoint c(s);
        c.restore(dir / "c");
        CHECK_THROWS_WITH_AS(c.assert_consumed(),
                             contains("saved variables 'counts', 'dense/bias', 'emb', 'ids', 'scale' were not restored"),
                             pss::FailedPreconditionError);
        Model m = build_model(s, 5);
        c.assert_consumed();
        const auto now = values(m);
        for (std::size_t i = 0; i < saved.size(); ++i) CHECK(same_bits(saved[i], now[i]));
        // The hook is gone once every saved variable is restored: a new variable keeps its own value.
        auto scope = s.scope();
        pss::Variable extra(xt::xarray<float>{1.f, 2.f}, "extra");
        CHECK(extra.read<float>() == xt::xarray<float>{1.f, 2.f});
    }

    TEST_CASE_FIXTURE(SavedAndFresh, "Checkpoint: refusals name the file and the problem, and change no variable") {
        auto unchanged = [&] {
            const auto now = values(m);
            for (std::size_t i = 0; i < before.size(); ++i) CHECK(same_bits(before[i], now[i]));
        };
        auto copy = [&](const std::string& name) {
            fs::copy(dir / "good", dir / name, fs::copy_options::recursive);
            return dir / name;
        };
        pss::Checkpoint c(s);
        SUBCASE("a missing .npy file (of the last variable: the others were staged, not changed)") {
            const auto p = copy("missing");
            fs::remove(p + "/scale.npy");
            CHECK_THROWS_WITH_AS(c.restore(p), contains(p + "/scale.npy: No such file or directory"),
                                 pss::NotFoundError);
        }
        SUBCASE("a truncated .npy file") {
            const auto p = copy("truncated");
            fs::resize_file(p + "/emb.part_1.npy", 100);
            CHECK_THROWS_WITH_AS(c.restore(p),
                                 contains(p + "/emb.part_1.npy is truncated: it has 100 bytes where the index says 188"),
                                 pss::InvalidArgumentError);
        }
        SUBCASE("a flipped byte in a slot file: checksum mismatch") {
            const auto p = copy("corrupt");
            std::string bytes = slurp(p + "/emb.part_1.velocity.npy");
            bytes[140] = static_cast<char>(bytes[140] ^ 0x10);
            spit(p + "/emb.part_1.velocity.npy", bytes);
            CHECK_THROWS_WITH_AS(c.restore(p),
                                 contains(p + "/emb.part_1.velocity.npy: checksum mismatch in data bytes [0, 60)"),
                                 pss::InvalidArgumentError);
        }
        SUBCASE("an index of a newer format") {
            const auto p = copy("newer");
            auto j = nlohmann::json::parse(slurp(p + "/index.json"));
            j["format_version"] = 2;
            spit(p + "/index.json", j.dump());
            CHECK_THROWS_WITH_AS(c.restore(p), contains(p + "/index.json: format_version is 2, newer than this pss reads (1)"),
                                 pss::InvalidArgumentError);
        }
        SUBCASE("a variable whose shape differs") {
            const auto p = copy("shape");
            auto j = nlohmann::json::parse(slurp(p + "/index.json"));
            j["variables"][1]["shape"] = {6};
            j["variables"][1]["shards"][0]["shape"] = {4};  // shards of 4 and 2 rows
            j["variables"][1]["shards"][1]["row_offset"] = 4;
            spit(p + "/index.json", j.dump());
            CHECK_THROWS_WITH_AS(c.restore(p),
                                 contains("variable 'dense/bias' was saved with shape (6,) dtype float64 but the "
                                                   "model's has shape (5,) dtype float64"),
                                 pss::InvalidArgumentError);
        }
        SUBCASE("a variable whose dtype differs") {
            const auto p = copy("dtype");
            auto j = nlohmann::json::parse(slurp(p + "/index.json"));
            j["variables"][3]["dtype"] = "int32";
            spit(p + "/index.json", j.dump());
            CHECK_THROWS_WITH_AS(c.restore(p), contains("variable 'ids' was saved with shape (3,) dtype int32"),
                                 pss::InvalidArgumentError);
        }
        SUBCASE("a variable missing from the checkpoint, unless partial") {
            const auto p = copy("partial");
            auto j = nlohmann::json::parse(slurp(p + "/index.json"));
            j["variables"].erase(2);  // counts
            spit(p + "/index.json", j.dump());
            CHECK_THROWS_WITH_AS(c.restore(p),
                                 contains(p + "/index.json has no variable 'counts' (it has 'emb', 'dense/bias', "
                                                       "'ids', 'scale')"),
                                 pss::NotFoundError);
            unchanged();
            c.restore(p, {.partial = true});
            const auto now = values(m);
            CHECK(same_bits(now[2], before[2]));      // counts kept its value
            CHECK_FALSE(same_bits(now[0], before[0]));  // emb restored
            return;
        }
        SUBCASE("an optimizer whose slots differ") {
            Strat<pss::Momentum, 2> other({}, pss::FixedShardsPartitioner(2), pss::Momentum(0.1));
            Model mo = build_model(other);
            const auto mo_before = values(mo);
            pss::Checkpoint co(other);
            CHECK_THROWS_WITH_AS(co.restore(dir / "good"),
                                 contains("the optimizer's slots do not match: saved by Adam with slots momentum, "
                                                   "velocity, restored into Momentum with slots momentum"),
                                 pss::InvalidArgumentError);
            const auto mo_now = values(mo);
            for (std::size_t i = 0; i < mo_now.size(); ++i) CHECK(same_bits(mo_before[i], mo_now[i]));
        }
        SUBCASE("a checkpoint that is not there") {
            CHECK_THROWS_WITH_AS(c.restore(dir / "nowhere"), contains(dir / "nowhere/index.json: No such file"),
                                 pss::NotFoundError);
        }
        unchanged();
    }

    TEST_CASE("Checkpoint: .npy headers and index numbers are read strictly, whatever the bytes") {
        std::string descr;
        bool fortran = true;
        std::vector<std::size_t> shape;
        pss::detail::parse_npy_dictionary("{'descr': '<f4', 'fortran_order': False, 'shape': (6, 3), }          \n",
                                          descr, fortran, shape);
        CHECK(descr == "<f4");
        CHECK_FALSE(fortran);
        CHECK(shape == std::vector<std::size_t>{6, 3});
        pss::detail::parse_npy_dictionary("{'shape':(7,),'fortran_order':True,'descr':'<i8'}\n", descr, fortran, shape);
        CHECK((descr == "<i8" && fortran && shape == std::vector<std::size_t>{7}));
        pss::detail::parse_npy_dictionary("{'descr': '<f8', 'fortran_order': False, 'shape': ()}", descr, fortran, shape);
        CHECK(shape.empty());
        auto refused = [&](std::string_view text) {
            try {
                pss::detail::parse_npy_dictionary(text, descr, fortran, shape);
            } catch (const std::invalid_argument& e) {
                return std::string(e.what());
            }
            return std::string("accepted");
        };
        CHECK(refused("") == "expected '{' at byte 0 of the dictionary");
        CHECK(refused("\n") == "expected '{' at byte 1 of the dictionary");
        CHECK(refused("{}") == "'descr', 'fortran_order' or 'shape' is missing at byte 2 of the dictionary");
        CHECK(refused("{'descr': '<f4', 'fortran_order': False, 'shape': (-1,)}") ==
              "expected a dimension (at most 32) at byte 51 of the dictionary");
        CHECK(refused("{'descr': '<f4', 'descr': '<f8'}") == "key 'descr' is unknown or repeated at byte 26 of the dictionary");
        CHECK(refused("{'descr': '<f4") == "an unterminated string at byte 11 of the dictionary");
        CHECK(refused("{'descr': '<f4', 'fortran_order': Maybe}") ==
              "fortran_order is neither True nor False at byte 34 of the dictionary");
        CHECK(refused("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}") ==
              "a dimension too large at byte 70 of the dictionary");

        // Numbers of an index that are not integers of their field's range (nlohmann's get<T>() would
        // convert them with undefined behaviour).
        TempDir dir;
        train_and_save<2>(2, dir / "good");
        const std::string text = slurp(dir / "good/index.json");
        auto with = [&](auto edit) {
            auto j = nlohmann::json::parse(text);
            edit(j);
            try {
                (void)pss::detail::index_from_json(j.dump(), "index.json");
            } catch (const pss::InvalidArgumentError& e) {
                return std::string(e.what());
            }
            return std::string("accepted");
        };
        CHECK(with([](auto& j) { j["variables"][0]["shards"][0]["value"]["bytes"] = 1e99; }) ==
              "pss: checkpoint: index.json: is malformed (\"bytes\" must be an integer from 0 to 18446744073709551615, not "
              "1e+99)");
        CHECK(with([](auto& j) { j["variables"][0]["shards"][0]["value"]["crc32"] = 4294967296; }) ==
              "pss: checkpoint: index.json: is malformed (\"crc32\" must be an integer from 0 to 4294967295, not "
              "4294967296)");
        CHECK(with([](auto& j) { j["variables"][0]["shape"] = {-10, 3}; }) ==
              "pss: checkpoint: index.json: is malformed (\"shape\" must be an integer from 0 to 18446744073709551615, not "
              "-10)");
        CHECK(with([](auto& j) { j["variables"][0]["shape"] = {std::uint64_t{1} << 61, 3}; }) ==
              "pss: checkpoint: index.json: variable 'emb': its shape (2305843009213693952, 3) is larger than a "
              "checkpoint can hold");
        CHECK(with([](auto& j) { j["format"] = nlohmann::json::array(); }) ==
              "pss: checkpoint: index.json: is not a pss checkpoint index (no \"format\": \"pss-checkpoint\")");
        CHECK(with([](auto&) {}) == "accepted");
    }

    TEST_CASE_FIXTURE(SavedAndFresh, "Checkpoint: a ps writes only into a save's temporary directory and reads only a checkpoint's own files") {
        const auto& info = *m.emb().info_ptr();
        // What any peer of a ps task could send: a save_shard or restore_shard naming a path of its choice.
        auto send = [&](pss::Op op, const std::string& name, std::vector<std::int64_t> ids = {}) {
            pss::Request r;
            r.op = op;
            r.key = {info.id, info.shards[0].index};
            r.name = name;
            r.ids = std::move(ids);
            return info.channel->send(info.shards[0].task, std::move(r)).get();
        };
        auto refused_save = [&](const std::string& prefix, const std::string& why) {
            const pss::Reply reply = send(pss::Op::save_shard, prefix);
            CHECK(reply.code == pss::ErrorCode::invalid_argument);
            CHECK_MESSAGE(reply.message == "pss: save_shard: refused the file prefix '" + prefix + "': " + why, reply.message);
            CHECK_FALSE(fs::exists(prefix + ".npy"));
        };
        const std::string not_a_save = "its directory is not a checkpoint being saved (a name with '.tmp-')";
        const std::string not_normal = "it must be an absolute path without '.', '..' or empty parts";
        refused_save(dir / "evil", not_a_save);
        refused_save("relative.tmp-1/evil", not_normal);
        fs::create_directories(dir / "ckpt.tmp-1-2-3");
        refused_save(dir / "ckpt.tmp-1-2-3/../evil", not_normal);
        refused_save(dir / "ckpt.tmp-1-2-3//evil", not_normal);
        refused_save(dir / "ckpt.tmp-1-2-3/", not_normal);
        refused_save(dir / "ckpt.tmp-9/evil", "its directory does not exist or is not a directory (links are not followed)");
        fs::create_directory_symlink(dir / "elsewhere", dir / "link.tmp-1");
        fs::create_directories(dir / "elsewhere");
        refused_save(dir / "link.tmp-1/evil", "its directory does not exist or is not a directory (links are not followed)");
        CHECK(fs::is_empty(dir / "elsewhere"));
        // Into a save's directory it works, once: a file is never replaced.
        CHECK(send(pss::Op::save_shard, dir / "ckpt.tmp-1-2-3/emb").ok());
        CHECK(fs::file_size(dir / "ckpt.tmp-1-2-3/emb.npy") > 0);
        const pss::Reply again = send(pss::Op::save_shard, dir / "ckpt.tmp-1-2-3/emb");
        CHECK(again.code == pss::ErrorCode::already_exists);

        const pss::Reply relative = send(pss::Op::restore_shard, "good\nemb", {0, 5});
        CHECK(relative.code == pss::ErrorCode::invalid_argument);
        CHECK(relative.message ==
              "pss: restore_shard: refused the checkpoint directory 'good': it must be an absolute path without '.', "
              "'..' or empty parts");
        // An index that names a file outside its directory is refused, by the ps and by Checkpoint.
        fs::copy(dir / "good", dir / "outside", fs::copy_options::recursive);
        auto j = nlohmann::json::parse(slurp(dir / "outside/index.json"));
        j["variables"][0]["shards"][0]["value"]["file"] = "../good/emb.part_0.npy";
        spit(dir / "outside/index.json", j.dump());
        const pss::Reply outside = send(pss::Op::restore_shard, dir / "outside\nemb", {0, 5});
        CHECK(outside.code == pss::ErrorCode::invalid_argument);
        CHECK_MESSAGE(outside.message.find("outside/index.json: is malformed (a file name must be a plain name in the "
                                           "checkpoint's directory, not '../good/emb.part_0.npy')") != std::string::npos,
                      outside.message);
        pss::Checkpoint c(s);
        CHECK_THROWS_WITH_AS(c.restore(dir / "outside"), contains("not '../good/emb.part_0.npy'"), pss::InvalidArgumentError);
        // Nothing staged by the refusals is committed, and no variable changed.
        CHECK(send(pss::Op::commit_restore, "").code == pss::ErrorCode::failed_precondition);
        const auto now = values(m);
        for (std::size_t i = 0; i < before.size(); ++i) CHECK(same_bits(before[i], now[i]));
    }

    TEST_CASE("CheckpointManager: max_to_keep 2 keeps ckpt-2 and ckpt-3, latest names ckpt-3, restore_or_initialize") {
        TempDir dir;
        Strat<pss::Momentum, 2> s({}, pss::FixedShardsPartitioner(2), pss::Momentum(0.1));
        Model m = build_model(s);
        pss::Checkpoint c(s);
        pss::CheckpointManager manager(c, dir / "run", 2);
        CHECK_FALSE(manager.latest().has_value());
        std::vector<std::vector<pss::Tensor>> saved;
        for (int k = 0; k < 3; ++k) {
            train_step(m, k);
            c.set_step(static_cast<std::uint64_t>(k + 1));
            CHECK(manager.save() == dir / ("run/ckpt-" + std::to_string(k + 1)));
            saved.push_back(values(m));
        }
        CHECK(manager.checkpoints() == std::vector<std::string>{dir / "run/ckpt-2", dir / "run/ckpt-3"});
        CHECK(manager.latest() == dir / "run/ckpt-3");
        CHECK(nlohmann::json::parse(slurp(dir / "run/latest")) == nlohmann::json{{"latest", "ckpt-3"}, {"step", 3}});
        std::vector<std::string> names;
        for (const auto& e : fs::directory_iterator(dir / "run")) names.push_back(e.path().filename().string());
        std::sort(names.begin(), names.end());
        CHECK(names == std::vector<std::string>{"ckpt-2", "ckpt-3", "latest"});

        Strat<pss::Momentum, 1> fresh({}, pss::FixedShardsPartitioner(1), pss::Momentum(0.1));
        Model mf = build_model(fresh, 3);
        pss::Checkpoint cf(fresh);
        pss::CheckpointManager mgr(cf, dir / "run", 2);
        CHECK(mgr.restore_or_initialize() == dir / "run/ckpt-3");
        CHECK(cf.step() == 3);
        const auto now = values(mf);
        for (std::size_t i = 0; i < now.size(); ++i) CHECK(same_bits(now[i], saved[2][i]));
        // A save into an existing checkpoint's name is refused.
        CHECK_THROWS_WITH_AS((void)mgr.save(3), contains(dir / "run/ckpt-3 exists already"), pss::AlreadyExistsError);
        CHECK_THROWS_AS(pss::Checkpoint(s).write(dir / "run/ckpt-2"), pss::AlreadyExistsError);
    }
}

namespace {

/// Runs `child` in a forked process and returns its exit status (or the signal that ended it, + 128).
template <class F>
int in_child(F child) {
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        int code = 99;
        try {
            code = child();
        } catch (const std::exception& e) {
            std::fprintf(stderr, "child: %s\n", e.what());
            code = 98;
        }
        std::_Exit(code);
    }
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Atomic: the ps tasks reach their save points on their own threads, in parallel.
std::atomic<int> kill_at_point{-1};  // the child's save kills itself at this point
std::atomic<int> points_passed{0};

void count_or_die(const char* /*point*/) {
    if (points_passed.fetch_add(1) == kill_at_point.load()) ::raise(SIGKILL);
}

/// Saves the model trained `k` steps through a manager of `dir` (k = 1: the first checkpoint).
int save_trained(const std::string& dir, int steps) {
    Strat<pss::Adam, 2> s({}, pss::FixedShardsPartitioner(2), pss::Adam(0.02));
    Model m = build_model(s);
    for (int k = 0; k < steps; ++k) train_step(m, k);
    pss::Checkpoint c(s);
    c.set_step(static_cast<std::uint64_t>(steps));
    pss::CheckpointManager manager(c, dir, 1);
    manager.save();
    return 0;
}

}  // namespace

TEST_SUITE("checkpoint.hpp") {
    TEST_CASE("CheckpointManager: SIGKILL at every point of a save leaves latest() loadable, the old or the new, never a mix" *
              doctest::timeout(300)) {
        TempDir dir;
        const std::string run = dir / "run";
        REQUIRE(in_child([&] { return save_trained(run, 1); }) == 0);
        std::vector<pss::Tensor> old_values, new_values;
        {
            Strat<pss::Adam, 2> s({}, pss::FixedShardsPartitioner(2), pss::Adam(0.02));
            Model m = build_model(s);
            train_step(m, 0);
            old_values = values(m);
            train_step(m, 1);
            new_values = values(m);
        }
        int killed = 0, completed = 0, saw_old = 0, saw_new = 0;
        for (int point = 0; point < 200 && completed == 0; ++point) {
            const int status = in_child([&] {
                kill_at_point = point;
                points_passed = 0;
                pss::detail::checkpoint_save_point_hook = &count_or_die;
                return save_trained(run, 2);
            });
            if (status == 128 + SIGKILL)
                ++killed;
            else if (status == 0)
                ++completed;
            else
                FAIL("the child ended with status " << status);
            // What the crash left: latest() names a complete checkpoint, all of it old or all of it new.
            bool all_old = true, all_new = true;
            {  // the strategy's threads end before the next fork (a child of a threaded process is fragile)
                Strat<pss::Adam, 2> s({}, pss::FixedShardsPartitioner(2), pss::Adam(0.02));
                Model m = build_model(s, 3);
                pss::Checkpoint c(s);
                pss::CheckpointManager manager(c, run, 1);  // also cleans what the crash left
                REQUIRE(manager.restore_or_initialize().has_value());
                const auto now = values(m);
                for (std::size_t i = 0; i < now.size(); ++i) {
                    all_old = all_old && same_bits(now[i], old_values[i]);
                    all_new = all_new && same_bits(now[i], new_values[i]);
                }
                CHECK_MESSAGE((all_old || all_new), "killed at point " << point);
                CHECK(c.step() == (all_new ? 2u : 1u));
            }
            saw_old += all_old ? 1 : 0;
            saw_new += all_new ? 1 : 0;
            if (all_new && status != 0) {  // committed before the kill: start again from the old one
                fs::remove_all(run);
                REQUIRE(in_child([&] { return save_trained(run, 1); }) == 0);
            }
            if (all_new && status == 0) break;
        }
        CHECK(completed == 1);
        CHECK(killed > 20);  // files created, chunks written, fsyncs, index, renames, latest, removal
        CHECK(saw_old > 10);
        CHECK(saw_new >= 1);
        MESSAGE("killed at " << killed << " points: " << saw_old << " left the old checkpoint, " << saw_new << " the new");
    }

    TEST_CASE("CheckpointManager: a read-only directory gives a clear error and keeps the previous checkpoint") {
        TempDir dir;
        ::chmod(dir.path.c_str(), 0755);  // the child, not root, must reach run
        const std::string run = dir / "run";
        REQUIRE(in_child([&] { return save_trained(run, 1); }) == 0);
        const std::string before = slurp(run + "/latest");
        ::chmod(run.c_str(), 0555);
        const int status = in_child([&] {
            if (::geteuid() == 0) {  // root ignores permissions: become nobody for the test
                if (::setgid(65534) != 0 || ::setuid(65534) != 0) return 97;
            }
            try {
                save_trained(run, 2);
            } catch (const pss::FailedPreconditionError& e) {
                const std::string what = e.what();
                return what.find("pss: checkpoint: creating directory " + run + "/ckpt-2.tmp-") != std::string::npos &&
                               what.find("Permission denied") != std::string::npos
                           ? 0
                           : 2;
            }
            return 1;
        });
        CHECK(status == 0);
        ::chmod(run.c_str(), 0755);
        CHECK(slurp(run + "/latest") == before);
        CHECK(fs::exists(run + "/ckpt-1/index.json"));
        Strat<pss::Adam, 2> s({}, pss::FixedShardsPartitioner(2), pss::Adam(0.02));
        Model m = build_model(s, 3);
        pss::Checkpoint c(s);
        pss::CheckpointManager manager(c, run, 1);
        CHECK(manager.restore_or_initialize() == run + "/ckpt-1");
    }

    TEST_CASE("CheckpointManager: a full disk gives a clear error, removes the partial save and keeps the previous") {
        TempDir dir;
        const std::string run = dir / "run";
        fs::create_directories(run);
        // A 192 KiB filesystem when this process may mount one (root, as in the project's containers);
        // otherwise a file-size limit, which fails the write the same way (EFBIG instead of ENOSPC).
        const bool mounted = ::mount("tmpfs", run.c_str(), "tmpfs", 0, "size=192k") == 0;
        struct Unmount {
            bool mounted;
            std::string path;
            ~Unmount() {
                if (mounted) ::umount(path.c_str());
            }
        } unmount{mounted, run};
        REQUIRE(in_child([&] { return save_trained(run, 1); }) == 0);
        const std::string before = slurp(run + "/latest");
        const int status = in_child([&] {
            if (!mounted) {
                std::signal(SIGXFSZ, SIG_IGN);
                const rlimit limit{4096, 4096};
                ::setrlimit(RLIMIT_FSIZE, &limit);
            }
            Strat<pss::Adam, 2> s({}, pss::FixedShardsPartitioner(2), pss::Adam(0.02));
            auto scope = s.scope();
            pss::Variable big(xt::xarray<float>(xt::zeros<float>({64, 1024})), "big");  // 256 KiB
            pss::Checkpoint c(s);
            pss::CheckpointManager manager(c, run, 1);
            try {
                manager.save();
            } catch (const pss::FailedPreconditionError& e) {
                const std::string what = e.what();
                const bool named = what.find("pss: checkpoint: writing " + run + "/ckpt-2.tmp-") != std::string::npos &&
                                   what.find("/big.part_") != std::string::npos;
                const bool reason = what.find(mounted ? "No space left on device" : "File too large") != std::string::npos;
                if (!named || !reason) std::fprintf(stderr, "unexpected message: %s\n", e.what());
                return named && reason ? 0 : 2;
            }
            return 1;
        });
        CHECK(status == 0);
        CHECK(slurp(run + "/latest") == before);
        std::vector<std::string> names;
        for (const auto& e : fs::directory_iterator(run)) names.push_back(e.path().filename().string());
        std::sort(names.begin(), names.end());
        CHECK(names == std::vector<std::string>{"ckpt-1", "latest"});  // the partial ckpt-2 was removed
        MESSAGE(std::string(mounted ? "a full 192 KiB tmpfs" : "RLIMIT_FSIZE (no permission to mount a tmpfs)"));
    }
}

namespace {

using KerasStrategy2 = pss::ParameterServerStrategy<pss::InProcessTransport, pss::FixedShardsPartitioner, pss::Adam,
                                                    pss::LocalClusterResolver<2, 2>, pss::Synchronous>;
using KerasStrategy3 = pss::ParameterServerStrategy<pss::InProcessTransport, pss::FixedShardsPartitioner, pss::Adam,
                                                    pss::LocalClusterResolver<3, 2>, pss::Synchronous>;

struct Data {
    xt::xarray<float> x = xt::xarray<float>::from_shape({12, 3});
    xt::xarray<float> y = xt::xarray<float>::from_shape({12, 1});
    Data() {
        for (std::size_t i = 0; i < 12; ++i) {
            x(i, 0) = static_cast<float>(i % 6);
            x(i, 1) = static_cast<float>((i * 5) % 6);
            x(i, 2) = static_cast<float>((i * 7) % 6);
            y(i, 0) = static_cast<float>(i) * 0.25f - 1.0f;
        }
    }
};

template <class S>
pss::Sequential<S> make_model(S& strategy) {  // a prvalue: Sequential does not move
    return pss::Sequential<S>(strategy,
                              {pss::Embedding(6, 4), pss::GlobalAveragePooling1D(), pss::Dense(3, "tanh"), pss::Dense(1)}, 11);
}

bool same_weights(const std::vector<pss::Tensor>& a, const std::vector<pss::Tensor>& b) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i)
        if (!same_bits(a[i], b[i])) return false;
    return true;
}

/// A synchronous fit of 4 epochs (3 steps each) with `optimizer` against one that stops after epoch 2
/// (its backup kept) and one in a fresh strategy, as a restarted chief's, that resumes from the backup:
/// the resumed one starts at epoch 3 and step 7 and ends with the losses and bits of the straight one.
void check_resume_after_two_of_four(const pss::Adam& optimizer) {
    TempDir dir;
    const Data d;
    KerasStrategy2 s1({}, pss::FixedShardsPartitioner(2), optimizer);
    auto straight = make_model(s1);
    straight.compile(optimizer, "mse");
    const auto full = straight.fit(d.x, d.y, 4, 5, true, false);

    {
        KerasStrategy2 s2({}, pss::FixedShardsPartitioner(2), optimizer);
        auto first = make_model(s2);
        first.compile(optimizer, "mse");
        const auto h = first.fit(d.x, d.y, 2, 5, pss::BackupAndRestore{dir / "backup", false}, true, false);
        CHECK(h.epoch == std::vector<int>{0, 1});
    }  // the process "dies" after epoch 2, its backup kept
    CHECK(fs::exists(dir / "backup/ckpt-2/index.json"));
    CHECK_FALSE(fs::exists(dir / "backup/ckpt-1"));  // the manager keeps one
    CHECK(pss::detail::read_index(dir / "backup/ckpt-2").step == 6);

    KerasStrategy2 s3({}, pss::FixedShardsPartitioner(2), optimizer);
    auto resumed = make_model(s3);
    resumed.compile(optimizer, "mse");
    std::ostringstream out;
    const auto h = resumed.fit(d.x, d.y, 4, 5, pss::BackupAndRestore{dir / "backup"}, true, true, out);
    CHECK(out.str().rfind("Restored the backup of epoch 2 from " + dir / "backup" + "\nEpoch 3/4\n", 0) == 0);
    CHECK(h.epoch == std::vector<int>{2, 3});
    CHECK(h.loss[0] == full.loss[2]);
    CHECK(h.loss[1] == full.loss[3]);
    CHECK(same_weights(straight.get_weights(), resumed.get_weights()));
    CHECK_FALSE(fs::exists(dir / "backup"));  // delete_checkpoint: the fit completed
}

}  // namespace

TEST_SUITE("coordinator.hpp") {
    /// Two variables, "a" on ps 0 and "b" on ps 1, a coordinator of 2 workers recovering from `manager`,
    /// and a closure adding 1 to both.
    struct Recovery {
        TempDir dir;
        Strat<pss::SGD, 2, pss::Asynchronous, 2> strategy{{}, pss::FixedShardsPartitioner(1), pss::SGD(0.1)};
        pss::Checkpoint<decltype(strategy)> checkpoint{strategy};
        pss::CheckpointManager<decltype(strategy)> manager{checkpoint, dir / "ckpt"};
        pss::ClusterCoordinator coordinator{strategy};
        pss::Variable a = make("a"), b = make("b");

        Recovery() { coordinator.recover_ps_from(manager); }
        pss::Variable make(const std::string& name) {
            auto scope = strategy.scope();
            return pss::Variable(xt::xarray<float>{0}, name);
        }
        void add_both(int times) {
            for (int i = 0; i < times; ++i)
                (void)coordinator.schedule([this] {
                    a.assign_add(xt::xarray<float>{1});
                    b.assign_add(xt::xarray<float>{1});
                });
            coordinator.join();
        }
        /// ps 1 forgets b's shard, as a ps task started again after a loss holds nothing.
        void lose_ps1_shards() {
            pss::Request destroy;
            destroy.op = pss::Op::destroy;
            destroy.key = {b.info_ptr()->id, 0};
            REQUIRE(b.info_ptr()->channel->send(1, std::move(destroy)).get().ok());
        }
        /// A closure that finds ps 1 lost on its first run (as a worker's request to a killed ps does).
        pss::RemoteValue<float> lost_once(std::atomic<int>& runs) {
            return coordinator.schedule([this, &runs] {
                if (runs++ == 0) throw pss::UnavailableError("pss: /job:ps/replica:0/task:1 was lost (test)");
                a.assign_add(xt::xarray<float>{1});
                b.assign_add(xt::xarray<float>{1});
                return b.read<float>()(0);
            });
        }
    };

    TEST_CASE_FIXTURE(Recovery, "recover_ps_from: a lost ps that lost its shards gets them back from the latest "
                                "checkpoint, every variable is restored, and the failed closure runs again") {
        CHECK(b.device() == "/job:ps/replica:0/task:1/device:CPU:0");
        add_both(5);
        (void)manager.save();
        add_both(3);  // lost with the ps: the model goes back to the checkpoint's whole
        lose_ps1_shards();
        std::atomic<int> runs{0};
        auto value = lost_once(runs);
        coordinator.join();
        CHECK(runs == 2);
        CHECK(value.fetch() == 6.0f);
        CHECK(a.read<float>()(0) == 6.0f);  // ps 0's newer value went back to the checkpoint's too
        CHECK(b.read<float>()(0) == 6.0f);
        add_both(2);
        CHECK(a.read<float>()(0) == 8.0f);
        CHECK(b.read<float>()(0) == 8.0f);
    }

    TEST_CASE_FIXTURE(Recovery, "recover_ps_from: a ps that answers again holding its shards is not restored; "
                                "the failed closure runs again") {
        add_both(5);
        (void)manager.save();
        add_both(3);
        std::atomic<int> runs{0};
        auto value = lost_once(runs);
        coordinator.join();
        CHECK(runs == 2);
        CHECK(value.fetch() == 9.0f);
        CHECK(a.read<float>()(0) == 9.0f);
    }

    TEST_CASE_FIXTURE(Recovery, "recover_ps_from: without a checkpoint the loss is raised by join, naming the task") {
        add_both(2);
        lose_ps1_shards();
        std::atomic<int> runs{0};
        auto value = lost_once(runs);
        CHECK_THROWS_WITH_AS(coordinator.join(),
                             ("pss: /job:ps/replica:0/task:1 started again without its shards, and " + (dir / "ckpt") +
                              " holds no checkpoint to restore them from (CheckpointManager::save one before a loss)")
                                 .c_str(),
                             pss::UnavailableError);
        CHECK(runs == 1);
        CHECK_THROWS_AS((void)value.fetch(), pss::CancelledError);
        coordinator.join();  // raised once; scheduling works again
        add_both(1);
        CHECK(a.read<float>()(0) == 3.0f);
        CHECK(b.read<float>()(0) == 1.0f);  // created again as zeros
    }

    TEST_CASE("recover_ps_from: a manager of another strategy is refused") {
        TempDir dir;
        Strat<pss::SGD, 2, pss::Asynchronous, 2> one({}, pss::FixedShardsPartitioner(1), pss::SGD(0.1));
        Strat<pss::SGD, 2, pss::Asynchronous, 2> other({}, pss::FixedShardsPartitioner(1), pss::SGD(0.1));
        pss::Checkpoint checkpoint(other);
        pss::CheckpointManager manager(checkpoint, dir / "ckpt");
        pss::ClusterCoordinator coordinator(one);
        CHECK_THROWS_WITH_AS(coordinator.recover_ps_from(manager),
                             "pss: ClusterCoordinator::recover_ps_from: the checkpoint manager's strategy is not this "
                             "coordinator's",
                             pss::InvalidArgumentError);
    }
}

TEST_SUITE("keras/model.hpp") {
    TEST_CASE("Sequential::save_weights on 2 ps, load_weights into 3 ps: the same weights, and the next epoch gives the same bits") {
        TempDir dir;
        const Data d;
        KerasStrategy2 two({}, pss::FixedShardsPartitioner(2), pss::Adam(0.05));
        auto a = make_model(two);
        a.compile(pss::Adam(0.05), "mse");
        (void)a.fit(d.x, d.y, 2, 4, false, false);
        a.save_weights(dir / "weights");
        const auto index = pss::detail::read_index(dir / "weights");
        CHECK(index.variables.size() == 5);
        CHECK(index.variables[0].name == "embedding/embeddings");
        CHECK(index.metadata.at("model").at("name") == "sequential");
        CHECK(index.step == 6);  // 2 epochs of 3 steps: load_weights goes on from there

        KerasStrategy3 three({}, pss::FixedShardsPartitioner(3), pss::Adam(0.05));
        auto b = make_model(three);
        b.compile(pss::Adam(0.05), "mse");
        CHECK_THROWS_WITH_AS(b.load_weights(dir / "weights"), contains("Sequential::load_weights: the model is not built"),
                             pss::FailedPreconditionError);
        b.build({3});
        b.load_weights(dir / "weights");
        CHECK(b.weights()[0].num_shards() == 3);
        CHECK(same_weights(a.get_weights(), b.get_weights()));
        (void)a.fit(d.x, d.y, 1, 4, false, false);
        (void)b.fit(d.x, d.y, 1, 4, false, false);
        CHECK(same_weights(a.get_weights(), b.get_weights()));  // Adam's moments and step counts came along
    }

    TEST_CASE("Sequential::fit with BackupAndRestore: 2 epochs, then a fresh process resumes at epoch 3 of 4 and ends with the "
              "bits of 4 epochs straight") {
        check_resume_after_two_of_four(pss::Adam(0.05));
    }

    TEST_CASE("Sequential::fit with BackupAndRestore, synchronous, the rate an ExponentialDecay: the resumed fit goes on "
              "at step 7, so its schedule too, and ends with the bits of 4 epochs straight") {
        // A rate halved every 2 steps: a resumed fit that numbered its steps from 1 again would apply the
        // rates of steps 1 to 6 a second time and end elsewhere.
        check_resume_after_two_of_four(pss::Adam(pss::ExponentialDecay(0.05, 2, 0.5)));
    }

    TEST_CASE("Sequential::fit with BackupAndRestore and recover_lost_ps, synchronous: ps 1 crashed as epoch 3 begins is "
              "started again, every variable restored from the backup of epoch 2, and the fit ends with the losses and "
              "bits of 4 epochs never stopped") {
        TempDir dir;
        const Data d;
        const pss::Adam optimizer(0.05);
        KerasStrategy2 s1({}, pss::FixedShardsPartitioner(2), optimizer);
        auto straight = make_model(s1);
        straight.compile(optimizer, "mse");
        const auto full = straight.fit(d.x, d.y, 4, 5, true, false);

        using SimulatedSync = pss::ParameterServerStrategy<pss::SimulatedTransport, pss::FixedShardsPartitioner, pss::Adam,
                                                           pss::LocalClusterResolver<2, 2>, pss::Synchronous>;
        pss::SimulatedNetwork network({.seed = 1, .restart_after = 3});
        pss::BackupAndRestore backup(dir / "backup");
        pss::LambdaCallback crash;
        int epochs_begun = 0;
        crash.on_epoch_begin_fn = [&](int epoch, const pss::Logs&) {
            ++epochs_begun;
            if (epoch == 2 && epochs_begun == 3) network.crash({"ps", 1});
        };
        const pss::FitOptions options{.batch_size = 5, .epochs = 4, .verbose = 1, .callbacks = {backup, crash}};
        // Without recover_lost_ps the loss is raised, naming the task.
        std::ostringstream ignored;
        {
            SimulatedSync s2({}, pss::FixedShardsPartitioner(2), optimizer);
            auto model = make_model(s2);
            model.compile(optimizer, "mse");
            pss::FitOptions raising = options;
            raising.out = &ignored;
            CHECK_THROWS_WITH_AS((void)model.fit(d.x, d.y, raising), doctest::Contains("/job:ps/replica:0/task:1"),
                                 pss::UnavailableError);
        }
        fs::remove_all(dir / "backup");
        SimulatedSync s3({}, pss::FixedShardsPartitioner(2), optimizer);
        auto recovered = make_model(s3);
        recovered.compile(optimizer, "mse");
        backup.recover_lost_ps = true;
        epochs_begun = 0;
        std::ostringstream out;
        pss::FitOptions recovering = options;
        recovering.out = &out;
        const auto h = recovered.fit(d.x, d.y, recovering);
        CHECK(epochs_begun == 5);  // epoch 3 began twice
        CHECK(out.str().find("Restored the backup of epoch 2 from " + dir / "backup" + "\nEpoch 3/4\n") != std::string::npos);
        CHECK(h.epoch == std::vector<int>{2, 3});
        CHECK(h.loss[0] == full.loss[2]);
        CHECK(h.loss[1] == full.loss[3]);
        CHECK(same_weights(straight.get_weights(), recovered.get_weights()));
        std::vector<std::string> events;
        for (const auto& e : network.events()) events.push_back(e.what);
        CHECK(events.front() == "crashed");
        CHECK(std::count(events.begin(), events.end(), "crashed") == 2);  // once per fit
    }

    TEST_CASE("Sequential::fit with BackupAndRestore every 4 batches: a process that dies after the backup at epoch 2 "
              "batch 2 is resumed there and ends with the bits and losses of a fit that never stopped") {
        TempDir dir;
        const Data d;  // 12 examples in batches of 2: 6 batches an epoch
        KerasStrategy2 s1({}, pss::FixedShardsPartitioner(2), pss::Adam(0.05));
        auto straight = make_model(s1);
        straight.compile(pss::Adam(0.05), "mse");
        const auto full = straight.fit(d.x, d.y, 3, 2, true, false);

        // Backups after batches 4, 8 (epoch 1, batch 2), 12 (the end of epoch 1) and 16; the process "dies"
        // when the second is committed.
        static std::atomic<int> backups_committed;
        struct Died {};
        backups_committed = 0;
        pss::detail::checkpoint_save_point_hook = [](const char* point) {
            if (std::string_view(point) == "latest synced" && ++backups_committed == 2) throw Died{};
        };
        {
            KerasStrategy2 s2({}, pss::FixedShardsPartitioner(2), pss::Adam(0.05));
            auto first = make_model(s2);
            first.compile(pss::Adam(0.05), "mse");
            CHECK_THROWS_AS((void)first.fit(d.x, d.y, 3, 2, pss::BackupAndRestore{dir / "backup", true, 4}, true, false),
                            Died);
        }
        pss::detail::checkpoint_save_point_hook = nullptr;
        const auto meta = pss::detail::read_index(dir / "backup/ckpt-2").metadata;
        CHECK(meta.at("epoch") == 1);
        CHECK(meta.at("batch") == 2);

        KerasStrategy2 s3({}, pss::FixedShardsPartitioner(2), pss::Adam(0.05));
        auto resumed = make_model(s3);
        resumed.compile(pss::Adam(0.05), "mse");
        std::ostringstream out;
        const auto h = resumed.fit(d.x, d.y, 3, 2, pss::BackupAndRestore{dir / "backup", true, 4}, true, true, out);
        CHECK(out.str().rfind("Restored the backup of epoch 2, batch 2 from " + dir / "backup" + "\nEpoch 2/3\n", 0) == 0);
        CHECK(h.epoch == std::vector<int>{1, 2});
        CHECK(h.loss[0] == full.loss[1]);  // the batches before the backup are counted too
        CHECK(h.loss[1] == full.loss[2]);
        CHECK(same_weights(straight.get_weights(), resumed.get_weights()));
        CHECK_FALSE(fs::exists(dir / "backup"));

        // A backup of another batch size does not fit: refused before any step.
        {
            KerasStrategy2 s4({}, pss::FixedShardsPartitioner(2), pss::Adam(0.05));
            auto other = make_model(s4);
            other.compile(pss::Adam(0.05), "mse");
            (void)other.fit(d.x, d.y, 1, 1, pss::BackupAndRestore{dir / "b2", false, 10}, true, false);
        }
        KerasStrategy2 s5({}, pss::FixedShardsPartitioner(2), pss::Adam(0.05));
        auto wrong = make_model(s5);
        wrong.compile(pss::Adam(0.05), "mse");
        CHECK_THROWS_WITH_AS((void)wrong.fit(d.x, d.y, 2, 4, pss::BackupAndRestore{dir / "b2"}, true, false),
                             "pss: Sequential::fit: the backup resumes at batch 10 of an epoch, but an epoch of this "
                             "data has 3 batches; it was made with other data or another batch_size",
                             pss::InvalidArgumentError);
    }
}

TEST_SUITE("simulated") {
    using Simulated = pss::ParameterServerStrategy<pss::SimulatedTransport, pss::FixedShardsPartitioner, pss::SGD,
                                                   pss::LocalClusterResolver<2, 2>>;

    /// A SimulatedTransport of one ps task whose handler counts the requests it runs.
    struct OneTask {
        pss::ClusterSpec spec{{{"ps", {"sim:0"}}}};
        pss::SimulatedTransport transport{spec};
        std::atomic<int> runs{0}, crashes{0};
        const pss::TaskId ps{"ps", 0};
        OneTask() {
            transport.serve(ps, pss::answer_at_once([this](pss::Request&&) {
                ++runs;
                return pss::Reply{};
            }));
            transport.on_crash(ps, [this] { ++crashes; });
        }
        pss::Reply send() { return transport.send(ps, pss::Request{}).get(); }
    };

    TEST_CASE("SimulatedTransport: each fault does what a real network or process does to a request") {
        const std::string task = "pss: task /job:ps/replica:0/task:0 ";
        SUBCASE("no network: every request runs once and is answered") {
            OneTask t;
            CHECK(t.send().ok());
            CHECK(t.runs == 1);
        }
        SUBCASE("a lost request never runs") {
            pss::SimulatedNetwork network({.seed = 1, .drop_request = 1});
            OneTask t;
            const pss::Reply r = t.send();
            CHECK(r.code == pss::ErrorCode::unavailable);
            CHECK(r.message == task + "did not get this request: it was lost (simulated)");
            CHECK(t.runs == 0);
            REQUIRE(network.events().size() == 1);
            CHECK(network.events()[0].to_string() == "/job:ps/replica:0/task:0 #0 request lost (read)");
        }
        SUBCASE("a lost reply: the request ran") {
            pss::SimulatedNetwork network({.seed = 1, .drop_reply = 1});
            OneTask t;
            CHECK(t.send().message == task + "ran this request, but its reply was lost (simulated)");
            CHECK(t.runs == 1);
        }
        SUBCASE("a request run twice, answered once") {
            pss::SimulatedNetwork network({.seed = 1, .duplicate = 1});
            OneTask t;
            CHECK(t.send().ok());  // answered by the first run: the second runs right after it
            network.inject(false);
            CHECK(t.send().ok());  // runs after both, on the task's one thread
            CHECK(t.runs == 3);
            CHECK(network.events()[0].what == "run twice");
        }
        SUBCASE("a request run twice that points at its sender's memory runs twice on what was sent") {
            pss::SimulatedNetwork network({.seed = 1, .duplicate = 1});
            pss::ParameterServerStrategy<pss::SimulatedTransport, pss::FixedShardsPartitioner, pss::SGD,
                                         pss::LocalClusterResolver<3, 1>>
                strategy({}, pss::FixedShardsPartitioner(3), pss::SGD(0.5));
            auto scope = strategy.scope();
            xt::xarray<float> initial = xt::xarray<float>::from_shape({10, 2});
            std::iota(initial.begin(), initial.end(), 0.0f);  // row r is (2r, 2r + 1)
            pss::Variable v(initial, "table");
            // Rows 0-3, 4-6, 7-9 on 3 ps tasks: each shard applies its rows twice, repeats summed each time
            // from the rows as sent (not from the sums the first run left in the sender's tensor).
            pss::Tensor spent = v.apply_sparse_gradient(std::vector<std::int64_t>{1, 8, 1},
                                                        xt::xarray<float>{{2, 2}, {4, 4}, {6, 6}});
            spent.get<float>().fill(100.0f);  // the sender reuses its buffer at once
            const auto w = v.read<float>();
            CHECK((w(1, 0) == -6 && w(1, 1) == -5));  // (2, 3) - 2 * 0.5 * (2 + 6)
            CHECK((w(8, 0) == 12 && w(8, 1) == 13));  // (16, 17) - 2 * 0.5 * 4
            // A gather written straight into the result: its second run writes elsewhere.
            pss::Tensor rows = v.sparse_read(std::vector<std::int64_t>{8, 1, 5});
            CHECK(rows.get<float>() == xt::xarray<float>{{12, 13}, {-6, -5}, {10, 11}});
        }
        SUBCASE("a delayed request runs after its delay") {
            pss::SimulatedNetwork network({.seed = 1, .delay = 1, .max_delay = std::chrono::microseconds(2000)});
            OneTask t;
            CHECK(t.send().ok());
            CHECK(t.runs == 1);
            CHECK(network.events()[0].what.starts_with("delayed "));
        }
        SUBCASE("restart_after 0: a crashed task never starts again") {
            pss::SimulatedNetwork network({.seed = 1, .restart_after = 0});
            OneTask t;
            network.crash(t.ps);
            for (int i = 0; i < 3; ++i)
                CHECK(t.send().message ==
                      task + "is down (a simulated crash; it never starts again: SimulatedFaults::restart_after is 0)");
            CHECK(t.runs == 0);
        }
        SUBCASE("a crash: the state is lost, the task is down for restart_after requests, then starts again") {
            pss::SimulatedNetwork network({.seed = 1, .restart_after = 2});
            OneTask t;
            CHECK(t.send().ok());
            network.crash(t.ps);
            CHECK(t.send().message == task + "is down (a simulated crash; it starts again after 2 more requests)");
            CHECK(t.send().message == task + "is down (a simulated crash; it starts again after 1 more request)");
            CHECK(t.send().ok());
            CHECK(t.runs == 2);
            CHECK(t.crashes == 1);
            std::vector<std::string> events;
            for (const auto& e : network.events()) events.push_back(e.to_string());
            CHECK(events == std::vector<std::string>{"/job:ps/replica:0/task:0 #1 crashed (crash())",
                                                     "/job:ps/replica:0/task:0 #2 started again (read)"});
            CHECK_THROWS_WITH_AS(network.crash({"ps", 3}),
                                 "pss: SimulatedNetwork::crash: no SimulatedTransport serves task /job:ps/replica:0/task:3 "
                                 "on this network",
                                 pss::InvalidArgumentError);
        }
        SUBCASE("faults off: nothing is injected") {
            pss::SimulatedNetwork network({.seed = 1, .drop_request = 1});
            network.inject(false);
            OneTask t;
            CHECK(t.send().ok());
            CHECK(network.events().empty());
        }
        SUBCASE("refusals") {
            CHECK_THROWS_WITH_AS(pss::SimulatedNetwork({.drop_reply = 1.5}),
                                 "pss: SimulatedFaults::drop_reply is 1.500000; a probability is in [0, 1]",
                                 pss::InvalidArgumentError);
            pss::SimulatedNetwork network;
            CHECK_THROWS_WITH_AS(pss::SimulatedNetwork(), "pss: SimulatedNetwork: another one is installed; one network at a time",
                                 pss::FailedPreconditionError);
        }
    }

    /// The seeds a many-seed test runs: 1 to 200, or PSS_SIMULATED_SEED's: `<n>` runs one seed alone (a
    /// failing seed is printed), `<first>-<last>` a range.
    std::pair<std::uint64_t, std::uint64_t> seeds() {
        const char* chosen = std::getenv("PSS_SIMULATED_SEED");
        if (chosen == nullptr) return {1, 200};
        const std::string text = chosen;
        const auto dash = text.find('-');
        const std::uint64_t first = std::stoull(text.substr(0, dash));
        return {first, dash == std::string::npos ? first : std::stoull(text.substr(dash + 1))};
    }

    /// The outcome of one training run on a SimulatedNetwork (see train_with_faults).
    struct Run {
        std::vector<pss::SimulatedEvent> events;
        std::optional<std::string> error;  // the UnavailableError that ended it
        xt::xarray<float> table;
    };

    constexpr std::size_t rows = 32, epochs = 4, per_epoch = 4;  // closures write rows r and r + 16, r < 16

    /// Trains with recover_ps_from on a 32 x 2 table split over 2 ps tasks: each closure k of epoch e
    /// writes row 4e + k (ps 0) and row 16 + 4e + k (ps 1) as their number + 1, idempotent, so a closure
    /// run twice leaves what it leaves once; faults are injected while closures run; after each epoch the
    /// rows a recovery took back to the last checkpoint are written again (the steps since the
    /// checkpoint), and a checkpoint is saved. Returns the faults and the table, or the error.
    Run train_with_faults(pss::SimulatedFaults faults, int workers_used, std::optional<std::int64_t> crash_ps1_at = {},
                          bool recover = true) {
        Run run;
        TempDir dir;
        pss::SimulatedNetwork network(faults);
        network.inject(false);
        pss::Timeouts timeouts = pss::Timeouts::from_environment();
        timeouts.startup = std::chrono::milliseconds(300);
        Simulated strategy({}, pss::FixedShardsPartitioner(2), pss::SGD(0.1), timeouts);
        pss::Checkpoint checkpoint(strategy);
        pss::CheckpointManager manager(checkpoint, dir / "ckpt");
        pss::ClusterCoordinator coordinator(strategy);
        if (recover) coordinator.recover_ps_from(manager);
        pss::Variable table = [&] {
            auto scope = strategy.scope();
            return pss::Variable(xt::xarray<float>(xt::zeros<float>({rows, std::size_t{2}})), "table");
        }();
        (void)manager.save();
        auto write = [&](std::int64_t row) {
            auto step = [table, row, crash = crash_ps1_at == row, &network]() mutable {
                if (std::exchange(crash, false)) network.crash({"ps", 1});  // a chosen point, once: before this update
                const float v = static_cast<float>(row + 1);
                table.scatter_update(std::vector<std::int64_t>{row, row + 16}, xt::xarray<float>{{v, v}, {v + 16, v + 16}});
                return row;
            };
            return workers_used == 1 ? coordinator.schedule_on(0, step) : coordinator.schedule(step);
        };
        try {
            for (std::size_t e = 0; e < epochs; ++e) {
                std::vector<std::int64_t> epoch;
                for (std::size_t k = 0; k < per_epoch; ++k) epoch.push_back(static_cast<std::int64_t>(e * per_epoch + k));
                auto todo = epoch;
                for (int round = 0; !todo.empty(); ++round) {
                    REQUIRE(round < 10);
                    network.inject(true);
                    std::vector<pss::RemoteValue<std::int64_t>> values;
                    for (std::int64_t row : todo) values.push_back(write(row));
                    try {
                        coordinator.join();
                    } catch (const pss::UnavailableError& e) {
                        network.inject(false);
                        // TensorFlow's error model: raised once no closure runs, so every RemoteValue is set:
                        // its value, its closure's own error (the one raised is among them), or
                        // CancelledError; raised once, after which nothing is pending and join returns.
                        int raised = 0;
                        for (std::size_t i = 0; i < todo.size(); ++i) {
                            try {
                                const std::int64_t value = values[i].fetch();  // outside CHECK, which catches
                                CHECK(value == todo[i]);
                            } catch (const pss::CancelledError&) {
                            } catch (const pss::UnavailableError& own) {
                                raised += std::string_view(own.what()) == e.what();
                            }
                        }
                        // A recovery's own failure (the task never started again) is no closure's: the
                        // closures put back were cancelled.
                        if (!recover) CHECK(raised >= 1);
                        CHECK(coordinator.done());
                        coordinator.join();
                        throw;
                    }
                    network.inject(false);
                    for (std::size_t i = 0; i < todo.size(); ++i) CHECK(values[i].fetch() == todo[i]);
                    const auto now = table.read<float>();
                    std::vector<std::int64_t> lost;  // taken back to the checkpoint by a recovery (in any round)
                    for (std::int64_t row : epoch)
                        if (now(row, 0) != static_cast<float>(row + 1) || now(row + 16, 1) != static_cast<float>(row + 17))
                            lost.push_back(row);
                    todo = std::move(lost);
                }
                (void)manager.save();
            }
        } catch (const pss::UnavailableError& e) {
            run.error = e.what();
        }
        network.inject(false);
        run.events = network.events();
        if (!run.error) run.table = table.read<float>();
        return run;
    }

    /// The table every complete run ends with: row r holds r + 1, as its closure wrote it.
    xt::xarray<float> trained_table() {
        xt::xarray<float> t = xt::zeros<float>({rows, std::size_t{2}});
        for (std::size_t r = 0; r < rows; ++r) t(r, 0) = t(r, 1) = static_cast<float>(r + 1);
        return t;
    }

    pss::SimulatedFaults random_faults(std::uint64_t seed) {
        return {.seed = seed, .drop_request = 0.02, .drop_reply = 0.02, .duplicate = 0.03, .delay = 0.1,
                .max_delay = std::chrono::microseconds(300), .crash = 0.01,
                .restart_after = seed % 10 == 3 ? 0 : static_cast<int>(1 + seed % 3)};
    }

    /// The ps task that crashed and never started again, by the events.
    std::optional<int> never_restarted(const std::vector<pss::SimulatedEvent>& events) {
        std::map<int, bool> down;
        for (const auto& e : events) {
            if (e.what == "crashed") down[e.task.index] = true;
            if (e.what == "started again") down[e.task.index] = false;
        }
        for (const auto& [task, is_down] : down)
            if (is_down) return task;
        return std::nullopt;
    }

    TEST_CASE("SimulatedTransport: a ps crashed at a chosen point is recovered from the checkpoint, and the "
              "steps since it run again") {
        const Run run = train_with_faults({.restart_after = 2}, 1, 6);  // in epoch 1, after ckpt-2
        CHECK_FALSE(run.error);
        CHECK(run.table == trained_table());
        std::vector<std::string> events;
        for (const auto& e : run.events) events.push_back(e.to_string());
        // ps 1's messages: create, save, 4 updates, read, save, 2 updates; then 2 heartbeats find it down
        CHECK(events == std::vector<std::string>{"/job:ps/replica:0/task:1 #10 crashed (crash())",
                                                 "/job:ps/replica:0/task:1 #11 started again (heartbeat)"});
    }

    TEST_CASE("SimulatedTransport: a seed reproduces its run, event for event, with one worker sending") {
        const auto faults = random_faults(11);
        const Run a = train_with_faults(faults, 1), b = train_with_faults(faults, 1);
        CHECK(a.events.size() >= 3);
        CHECK(a.events == b.events);
        CHECK(a.error == b.error);
        CHECK(train_with_faults(random_faults(12), 1).events != a.events);
    }

    TEST_CASE("SimulatedTransport: without recover_ps_from, 200 seeds of lost messages each finish with every step "
              "or raise the third failure of one ps task (TensorFlow's transient ps failures)") {
        int completed = 0, failed = 0;
        const auto [first, last] = seeds();
        for (std::uint64_t seed = first; seed <= last; ++seed) {
            CAPTURE(seed);
            const Run run =
                train_with_faults({.seed = seed, .drop_request = 0.03, .drop_reply = 0.03, .delay = 0.1}, 2, {}, false);
            std::map<int, int> losses;
            for (const auto& e : run.events)
                if (e.what == "request lost" || e.what == "reply lost") ++losses[e.task.index];
            if (!run.error) {
                ++completed;
                CHECK(run.table == trained_table());
                continue;
            }
            ++failed;
            CAPTURE(*run.error);
            const bool named = run.error->starts_with("pss: task /job:ps/replica:0/task:");
            REQUIRE(named);
            const int task = run.error->at(std::string_view("pss: task /job:ps/replica:0/task:").size()) - '0';
            CHECK(losses[task] >= 3);  // the first two were taken for transient: their closures ran again
        }
        MESSAGE(completed << " runs completed, " << failed << " raised a ps task's third failure");
        if (last - first > 100) {
            CHECK(completed > 20);
            CHECK(failed > 20);
        }
    }

    /// Synchronous training of a (4,) float64 variable split over 2 ps tasks by 2 workers for 12 steps,
    /// each closure pulling its step and pushing a gradient of the weights it pulled. The final weights,
    /// or the UnavailableError that ended the run.
    std::variant<xt::xarray<double>, std::string> train_synchronously(pss::SimulatedFaults faults) {
        using Sync = pss::ParameterServerStrategy<pss::SimulatedTransport, pss::FixedShardsPartitioner, pss::SGD,
                                                  pss::LocalClusterResolver<2, 2>, pss::Synchronous>;
        pss::SimulatedNetwork network(faults);
        network.inject(false);
        Sync strategy({}, pss::FixedShardsPartitioner(2), pss::SGD(0.1));
        pss::ClusterCoordinator coordinator(strategy);
        pss::Variable w = [&] {
            auto scope = strategy.scope();
            return pss::Variable(xt::xarray<double>{1.0, -2.0, 0.5, 3.0}, "w");
        }();
        network.inject(true);
        try {
            for (std::uint64_t step = 1; step <= 12; ++step)
                for (int worker = 0; worker < 2; ++worker)
                    (void)coordinator.schedule_on(worker, [w, step, worker]() mutable {
                        const xt::xarray<double> weights = w.read<double>(step);
                        const double scale = 0.3 * (worker + 1) + 0.01 * static_cast<double>(step);
                        w.apply_gradient(xt::xarray<double>(weights * scale + 0.1 * worker), step);
                    });
            coordinator.join();
        } catch (const pss::UnavailableError& e) {
            return std::string(e.what());
        }
        network.inject(false);
        return w.read<double>();
    }

    TEST_CASE("SimulatedTransport: synchronous training through 200 seeds of lost, repeated and delayed messages "
              "ends with the bits of a run without faults, or raises a ps task's third failure") {
        const auto clean = train_synchronously({});
        REQUIRE(std::holds_alternative<xt::xarray<double>>(clean));
        int exact = 0, failed = 0;
        const auto [first, last] = seeds();
        for (std::uint64_t seed = first; seed <= last; ++seed) {
            CAPTURE(seed);
            const auto run = train_synchronously(
                {.seed = seed, .drop_request = 0.01, .drop_reply = 0.01, .duplicate = 0.02, .delay = 0.1});
            if (const auto* error = std::get_if<std::string>(&run)) {
                ++failed;
                CAPTURE(*error);
                CHECK(error->starts_with("pss: task /job:ps/replica:0/task:"));
                continue;
            }
            ++exact;
            CHECK(std::get<xt::xarray<double>>(run) == std::get<xt::xarray<double>>(clean));
        }
        MESSAGE(exact << " runs ended with the bits of the run without faults, " << failed << " raised");
        if (last - first > 100) CHECK(exact > 100);
    }

    TEST_CASE("SimulatedTransport: 200 seeds of training with random faults each finish with every step or "
              "fail naming the ps task that never started again") {
        const auto [first, last] = seeds();
        int completed = 0, failed = 0, faults_seen = 0;
        for (std::uint64_t seed = first; seed <= last; ++seed) {
            CAPTURE(seed);
            const Run run = train_with_faults(random_faults(seed), 2);
            std::string events;
            for (const auto& e : run.events) events += e.to_string() + "\n";
            CAPTURE(events);
            faults_seen += static_cast<int>(run.events.size());
            const auto lost = never_restarted(run.events);
            if (run.error) {
                ++failed;
                CAPTURE(*run.error);
                REQUIRE(lost);
                CAPTURE(*run.error);
                CHECK(run.error->starts_with("pss: /job:ps/replica:0/task:" + std::to_string(*lost) +
                                             " was lost and did not start again within 0.3 s (PSS_STARTUP_TIMEOUT)"));
            } else {
                ++completed;
                std::ostringstream table;
                table << run.table;
                CAPTURE(table.str());
                CHECK(run.table == trained_table());
            }
        }
        MESSAGE(completed << " runs completed, " << failed << " failed as expected, " << faults_seen << " faults injected");
        if (last - first > 100) {
            CHECK(completed > 150);
            CHECK(faults_seen > 1000);
        }
    }

    /// Trains the table of train_with_faults (each closure writes its two rows, idempotent; a checkpoint
    /// after each epoch, its epoch in the metadata) on a network that loses the chief as it sends one of
    /// its own requests (creating the table, restoring, saving, reading). Each time, a chief is started
    /// again (a new strategy, whose ps tasks hold nothing: as ps tasks that dropped the last run's shards
    /// when a new chief reached them), restores the latest checkpoint and goes on from its epoch. Returns
    /// the final table and the losses.
    std::pair<xt::xarray<float>, std::vector<pss::SimulatedEvent>> train_with_chief_losses(std::uint64_t seed) {
        TempDir dir;
        pss::SimulatedNetwork network({.seed = seed, .lose_chief = 0.1});
        for (int incarnation = 0;; ++incarnation) {
            REQUIRE(incarnation < 60);
            try {
                Simulated strategy({}, pss::FixedShardsPartitioner(2), pss::SGD(0.1));
                pss::Checkpoint checkpoint(strategy);
                pss::CheckpointManager manager(checkpoint, dir / "ckpt");
                pss::ClusterCoordinator coordinator(strategy);
                pss::Variable table = [&] {
                    auto scope = strategy.scope();
                    return pss::Variable(xt::xarray<float>(xt::zeros<float>({rows, std::size_t{2}})), "table");
                }();
                std::size_t first_epoch = 0;
                if (manager.restore_or_initialize()) first_epoch = checkpoint.metadata().at("epoch").get<std::size_t>();
                for (std::size_t e = first_epoch; e < epochs; ++e) {
                    for (std::size_t k = 0; k < per_epoch; ++k) {
                        const auto row = static_cast<std::int64_t>(e * per_epoch + k);
                        coordinator.schedule([table, row]() mutable {
                            const float v = static_cast<float>(row + 1);
                            table.scatter_update(std::vector<std::int64_t>{row, row + 16},
                                                 xt::xarray<float>{{v, v}, {v + 16, v + 16}});
                        });
                    }
                    coordinator.join();
                    checkpoint.set_metadata({{"epoch", e + 1}});
                    (void)manager.save();
                }
                network.inject(false);
                return {table.read<float>(), network.events()};
            } catch (const pss::SimulatedChiefCrash& crash) {
                CHECK(std::string_view(crash.what()).starts_with("pss: the chief was lost (simulated) as it sent "));
            }
        }
    }

    TEST_CASE("SimulatedTransport: 200 seeds of training whose chief is lost as it creates, restores, saves or reads, "
              "and started again from the latest checkpoint, each end with every step") {
        const auto [first, last] = seeds();
        int runs_with_losses = 0;
        std::map<std::string, int> lost_sending;  // losses by the request the chief was sending
        for (std::uint64_t seed = first; seed <= last; ++seed) {
            CAPTURE(seed);
            const auto [table, losses] = train_with_chief_losses(seed);
            std::ostringstream text;
            text << table;
            CAPTURE(text.str());
            CHECK(table == trained_table());
            for (const auto& e : losses) ++lost_sending[e.request];
            runs_with_losses += !losses.empty();
        }
        std::string by_request;
        for (const auto& [request, n] : lost_sending) by_request += " " + request + " " + std::to_string(n);
        MESSAGE(runs_with_losses << " runs lost the chief; as it sent:" << by_request);
        if (last - first > 100) {
            CHECK(runs_with_losses > 100);
            CHECK(lost_sending["save_shard"] > 10);  // mid-save: the checkpoint before it is the one restored
            CHECK(lost_sending["restore_shard"] > 10);
            CHECK(lost_sending["commit_restore"] > 10);  // mid-restore: some shards restored, others not
        }
    }

    TEST_CASE("SimulatedTransport: 200 seeds of training whose lost workers start again 0.2 ms later and take "
              "closures again each finish with every step") {
        const auto [first, last] = seeds();
        int lost_again = 0, workers_lost = 0;
        for (std::uint64_t seed = first; seed <= last; ++seed) {
            CAPTURE(seed);
            const Run run = train_with_faults({.seed = seed, .drop_request = 0.01, .drop_reply = 0.01, .lose_worker = 0.03,
                                               .worker_back_after = std::chrono::microseconds(200)},
                                              2);
            std::string events;
            std::map<int, int> losses;
            for (const auto& e : run.events) {
                events += e.to_string() + "\n";
                if (e.task.type == "worker") ++losses[e.task.index];
            }
            CAPTURE(events);
            REQUIRE_FALSE(run.error);
            CHECK(run.table == trained_table());
            for (const auto& [worker, n] : losses) {
                workers_lost += n;
                lost_again += n > 1;  // lost, back, and lost again
            }
        }
        MESSAGE(workers_lost << " workers lost, " << lost_again << " of them lost again after they came back");
        if (last - first > 100) CHECK(lost_again > 10);
    }

    TEST_CASE("SimulatedTransport: 200 seeds of training that loses workers mid-closure (and messages) each finish "
              "with every step, the lost workers' closures run on the others, or raise that every worker is lost") {
        const auto [first, last] = seeds();
        int completed = 0, all_lost = 0, workers_lost = 0;
        for (std::uint64_t seed = first; seed <= last; ++seed) {
            CAPTURE(seed);
            const Run run = train_with_faults(
                {.seed = seed, .drop_request = 0.01, .drop_reply = 0.01, .lose_worker = 0.02}, 2);
            std::string events;
            std::set<int> lost;
            for (const auto& e : run.events) {
                events += e.to_string() + "\n";
                if (e.task.type == "worker") lost.insert(e.task.index);
            }
            CAPTURE(events);
            workers_lost += static_cast<int>(lost.size());
            if (run.error) {
                ++all_lost;
                CAPTURE(*run.error);
                CHECK(lost == std::set<int>{0, 1});
                CHECK(run.error->starts_with("pss: ClusterCoordinator: every worker is lost and "));
            } else {
                ++completed;
                CHECK(lost.size() <= 1);
                std::ostringstream table;
                table << run.table;
                CAPTURE(table.str());
                CHECK(run.table == trained_table());
            }
        }
        MESSAGE(completed << " runs completed, " << all_lost << " lost every worker, " << workers_lost << " workers lost");
        if (last - first > 100) {
            CHECK(completed > 100);
            CHECK(all_lost > 0);
            CHECK(workers_lost > completed / 2);  // most runs that completed lost a worker on the way
        }
    }
}
