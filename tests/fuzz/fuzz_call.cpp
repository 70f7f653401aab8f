// tests/fuzz/fuzz_call.cpp: libFuzzer target for the decoding of a call's arguments (pss/function.hpp), what a
// worker process runs on the values of every call it receives: any bytes, never a crash.
//
// The bytes are the CBOR values of a call (the wire decoder has checked its tensors already: two come
// with every input) of a registered function whose parameters cover every Transferable kind (numbers, a
// string, vectors, arrays, a Tensor, a Variable handle). run_call must answer, whatever
// the bytes, with the function's result or an error inside the answer; decode_result then gives the
// result or throws a pss::Error. Built and run by tools/fuzz.sh. Built with -DPSS_FUZZ_WRITE_SEEDS, it is
// instead a program that writes the seed corpus (tests/fuzz/corpus_call/) from encodings the library makes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <future>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <xtensor/xarray.hpp>

#include <pss/function.hpp>

namespace {

/// A cluster that is never reached: the fuzzed function only looks at the handle.
class NoChannel final : public pss::detail::Channel {
public:
    std::future<pss::Reply> send(int, pss::Request) override {
        std::promise<pss::Reply> p;
        p.set_value(pss::Reply::error(pss::ErrorCode::unavailable, "fuzz: no cluster"));
        return p.get_future();
    }
    [[nodiscard]] std::string device(int) const override { return "fuzz"; }
};

double everything(std::int32_t a, double b, bool c, std::string s, std::vector<std::int64_t> ids,
                  xt::xarray<float> x, pss::Tensor t, std::vector<std::string> names, pss::Variable v) {
    double sum = a + b + (c ? 1 : 0) + static_cast<double>(s.size() + ids.size() + x.size() + names.size());
    for (float f : x) sum += static_cast<double>(f);
    sum += static_cast<double>(t.nbytes() + v.num_shards() + v.shape().size());
    return sum;
}
const auto function = pss::register_function("fuzz.everything", &everything);

void require(bool condition) {
    if (!condition) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    static const auto channel = std::make_shared<NoChannel>();
    pss::Values arguments{std::vector<std::uint8_t>(data, data + size),
                          {pss::Tensor(xt::xarray<float>{{1, 2}, {3, 4}}), pss::Tensor(xt::xarray<double>{1.5})}};
    pss::Values answer = pss::detail::run_call(function.name(), std::move(arguments), pss::detail::CallContext{channel, 0});
    try {
        (void)pss::detail::decode_result<double>(std::move(answer), function.name());
    } catch (const pss::InvalidArgumentError&) {
    } catch (const pss::Error&) {
        require(false);  // the only error malformed arguments may give is InvalidArgumentError
    }
    return 0;
}

#ifdef PSS_FUZZ_WRITE_SEEDS
#include <fstream>
#include <iostream>

namespace {
std::shared_ptr<pss::detail::VariableInfo> variable_info() {
    auto info = std::make_shared<pss::detail::VariableInfo>();
    info->name = "table";
    info->shape = {4, 2};
    info->id = 7;
    info->shards = {{0, 0, {2, 2}, 0, 7}, {1, 1, {2, 2}, 2, 7}};
    info->channel = std::make_shared<NoChannel>();
    info->borrowed = true;
    return info;
}
}  // namespace

int main(int argc, char** argv) {
    const std::string dir = argc > 1 ? argv[1] : "tests/fuzz/corpus_call";
    auto write = [&](const std::string& name, const pss::Values& values) {
        const auto& b = values.cbor;
        std::ofstream(dir + "/" + name, std::ios::binary).write(reinterpret_cast<const char*>(b.data()),
                                                                static_cast<std::streamsize>(b.size()));
        std::cout << dir << "/" << name << ": " << b.size() << " bytes\n";
    };
    const pss::Variable v(variable_info());
    write("call_full", pss::detail::encode_values(std::int32_t{3}, 2.5, true, std::string("abc"),
                                                  std::vector<std::int64_t>{1, 2, 3}, xt::xarray<float>{{1, 2}, {3, 4}},
                                                  pss::Tensor(xt::xarray<double>{1.5}),
                                                  std::vector<std::string>{"x", "yz"}, v));
    write("call_empty_values", pss::detail::encode_values(std::int32_t{0}, 0.0, false, std::string(),
                                                          std::vector<std::int64_t>{}, xt::xarray<float>(),
                                                          pss::Tensor(), std::vector<std::string>{}, v));
    return 0;
}
#endif
