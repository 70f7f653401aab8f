// tests/mutated_texts.hpp: seeded mutations of valid texts, for the tests that feed a parser what a
// hostile or broken peer could send (metric and layer configs a worker receives).
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace pss_test {

/// Calls `attempt(text)` on 16000 mutations of the valid texts (1 to 3 edits each: a byte replaced, 1 to
/// 4 bytes erased, or 1 to 20 copies of a byte inserted), then on 4000 random texts of up to 47 bytes. A byte is from `alphabet` three times in four, else any byte. The same `seed` gives the
/// same texts, so a failure reproduces.
template <class F>
void for_each_mutated_text(const std::vector<std::string>& valid, std::string_view alphabet, std::uint32_t seed,
                           F&& attempt) {
    std::mt19937 rng(seed);
    auto pick = [&](std::size_t n) { return static_cast<std::size_t>(rng() % n); };
    auto random_byte = [&] { return pick(4) == 0 ? static_cast<char>(pick(256)) : alphabet[pick(alphabet.size())]; };
    for (std::size_t i = 0; i < 16000; ++i) {
        std::string text = valid[i % valid.size()];
        for (std::size_t m = 0, edits = 1 + pick(3); m < edits; ++m) {
            const std::size_t at = pick(text.size() + 1);
            switch (pick(3)) {
                case 0: if (at < text.size()) text[at] = random_byte(); break;
                case 1: if (at < text.size()) text.erase(at, 1 + pick(4)); break;
                default: text.insert(at, 1 + pick(20), random_byte()); break;
            }
        }
        attempt(text);
    }
    for (int i = 0; i < 4000; ++i) {
        std::string text(pick(48), ' ');
        for (char& c : text) c = random_byte();
        attempt(text);
    }
}

}  // namespace pss_test
