// pss/transport/tcp/buffer_sequence.hpp: what is left of a buffer sequence after some bytes went.
#pragma once

#include <cstddef>
#include <vector>

#include <asio/buffer.hpp>

#include <pss/config.hpp>

PSS_NAMESPACE_BEGIN

namespace detail {

/// The non-empty buffers of the sequence `buffers` past its first `skip` bytes.
template <class Buffer, class Buffers>
std::vector<Buffer> buffers_after(const Buffers& buffers, std::size_t skip) {
    std::vector<Buffer> rest;
    for (auto it = asio::buffer_sequence_begin(buffers); it != asio::buffer_sequence_end(buffers); ++it) {
        Buffer b = *it;
        if (skip >= b.size()) {
            skip -= b.size();
            continue;
        }
        rest.push_back(b + skip);
        skip = 0;
    }
    return rest;
}

}  // namespace detail

PSS_NAMESPACE_END
