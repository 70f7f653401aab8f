// pss/tensor.hpp: Tensor, the dtype-erased value that crosses a transport, and its numpy-like printing.
#pragma once

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include <xtensor/xarray.hpp>
#include <xtensor/xbuilder.hpp>
#include <xtensor/xexpression.hpp>

#include <pss/config.hpp>
#include <pss/dtype.hpp>
#include <pss/errors.hpp>

PSS_NAMESPACE_BEGIN

/// @brief A tensor's shape: one extent per axis, outermost first. `{}` is a scalar.
using Shape = std::vector<std::size_t>;

/// @brief Number of elements of a shape (1 for a scalar).
[[nodiscard]] inline std::size_t num_elements(const Shape& shape) noexcept {
    std::size_t n = 1;
    for (std::size_t d : shape) n *= d;
    return n;
}

namespace detail {
/// The element count of an untrusted shape, or -1 when it exceeds `max_elements`. An empty axis makes
/// the count 0, but the other axes must still fit: an array's strides are their products, so a shape
/// (0, 2^62, 2^62) would overflow them.
[[nodiscard]] inline std::int64_t bounded_elements(const Shape& shape, std::uint64_t max_elements) noexcept {
    std::uint64_t elements = 1;
    bool empty = false;
    for (std::uint64_t d : shape) {
        if (d == 0) empty = true;
        else if (elements > max_elements / d) return -1;
        else elements *= d;
    }
    return empty ? 0 : static_cast<std::int64_t>(elements);
}

/// Row-major stride of axis 0: the elements of one row.
inline std::size_t row_elements(const Shape& shape) {
    std::size_t n = 1;
    for (std::size_t a = 1; a < shape.size(); ++a) n *= shape[a];
    return n;
}

/// The shape of `count` rows of a value of `shape` (a Shape, or an xtensor shape).
template <class S>
Shape rows_shape(const S& shape, std::size_t count) {
    Shape out(shape.begin(), shape.end());
    out[0] = count;
    return out;
}
}  // namespace detail

/// @brief Python's tuple spelling of a shape, as TensorFlow prints it: `()`, `(5,)`, `(1024, 1024)`.
/// Takes any sequence of extents (a Shape, an xtensor shape).
template <class S>
[[nodiscard]] std::string format_shape(const S& shape) {
    std::string out = "(";
    std::size_t rank = 0;
    for (auto extent : shape) out += (rank++ == 0 ? "" : ", ") + std::to_string(extent);
    return out + (rank == 1 ? ",)" : ")");
}
/// @brief The same for a Shape, or a braced list: `format_shape({2, 3})` is "(2, 3)".
[[nodiscard]] inline std::string format_shape(const Shape& shape) { return format_shape<Shape>(shape); }

namespace detail {
/// A string tensor as the wire carries it (see wire.hpp), between a transport's read and the decode that
/// turns it into an `xt::xarray<std::string>`; no Tensor in a Request or Reply holds one.
struct EncodedStrings {
    Shape shape;
    std::vector<std::byte> bytes;
};
}  // namespace detail

/// @brief A dense value of one of the five dtypes, owning its elements in an `xt::xarray<T>`
/// (`xt::xarray<std::string>` for DType::string).
///
/// Tensors are what requests and replies carry. Moving one moves its buffer (no element is copied),
/// which is how the in-process transport hands payloads between tasks without copying them.
/// A default-constructed Tensor is empty (`has_value()` is false).
class Tensor {
public:
    using Storage = std::variant<std::monostate, xt::xarray<float>, xt::xarray<double>, xt::xarray<std::int32_t>,
                                 xt::xarray<std::int64_t>, xt::xarray<std::string>, detail::EncodedStrings>;

    Tensor() = default;

    /// @brief Takes `array` (move it in to avoid a copy).
    template <TensorElement T>
    Tensor(xt::xarray<T> array) : storage_(std::move(array)) {}  // NOLINT: implicit by design

    /// @brief Evaluates any xtensor expression of a TensorElement type into a new Tensor.
    template <class E>
        requires(!std::same_as<std::remove_cvref_t<E>, xt::xarray<typename std::remove_cvref_t<E>::value_type>> &&
                 TensorElement<typename std::remove_cvref_t<E>::value_type>)
    Tensor(const xt::xexpression<E>& expression)  // NOLINT: implicit by design
        : storage_(xt::xarray<typename E::value_type>(expression)) {}

    /// @brief Used by the wire: a string tensor in its encoded form (decoded by the wire before use).
    explicit Tensor(detail::EncodedStrings encoded) : storage_(std::move(encoded)) {}

    /// @brief A tensor of `shape` filled with zeros (empty strings for DType::string).
    [[nodiscard]] static Tensor zeros(DType dtype, const Shape& shape) {
        return visit_any_dtype(dtype, [&]<class T>(std::type_identity<T>) {
            auto zero = xt::xarray<T>::from_shape(shape);
            zero.fill(T{});
            return Tensor(std::move(zero));
        });
    }

    /// @brief A tensor of `shape` whose elements are not initialised (to be overwritten; strings start empty).
    [[nodiscard]] static Tensor uninitialized(DType dtype, const Shape& shape) {
        return visit_any_dtype(dtype, [&]<class T>(std::type_identity<T>) {
            return Tensor(xt::xarray<T>::from_shape(shape));
        });
    }

    [[nodiscard]] bool has_value() const noexcept { return storage_.index() != 0; }

    /// @pre has_value()
    [[nodiscard]] DType dtype() const noexcept {
        switch (storage_.index()) {
            case 2: return DType::float64;
            case 3: return DType::int32;
            case 4: return DType::int64;
            case 5:
            case 6: return DType::string;
            default: return DType::float32;
        }
    }

    [[nodiscard]] Shape shape() const {
        if (const auto* e = std::get_if<detail::EncodedStrings>(&storage_)) return e->shape;
        return visit_any([](const auto& a) { return Shape(a.shape().begin(), a.shape().end()); }, Shape{});
    }
    [[nodiscard]] std::size_t rank() const {
        if (const auto* e = std::get_if<detail::EncodedStrings>(&storage_)) return e->shape.size();
        return visit_any([](const auto& a) { return a.dimension(); }, std::size_t{0});
    }
    [[nodiscard]] std::size_t size() const {
        if (const auto* e = std::get_if<detail::EncodedStrings>(&storage_)) return num_elements(e->shape);
        return visit_any([](const auto& a) { return a.size(); }, std::size_t{0});
    }
    /// @brief Bytes of the elements where they are one block (what `bytes()` points at): 0 for a
    /// string tensor, whose elements each hold their own bytes.
    [[nodiscard]] std::size_t nbytes() const {
        if (const auto* e = std::get_if<detail::EncodedStrings>(&storage_)) return e->bytes.size();
        return has_value() ? size() * dtype_size(dtype()) : 0;
    }

    /// @brief The elements as `xt::xarray<T>`.
    /// @throws InvalidArgumentError "pss: tensor holds dtype float32, not int32" when T is not the dtype.
    template <TensorElement T>
    [[nodiscard]] xt::xarray<T>& get() {
        if (auto* p = std::get_if<xt::xarray<T>>(&storage_)) return *p;
        throw_wrong_dtype(dtype_of<T>);
    }
    template <TensorElement T>
    [[nodiscard]] const xt::xarray<T>& get() const {
        if (const auto* p = std::get_if<xt::xarray<T>>(&storage_)) return *p;
        throw_wrong_dtype(dtype_of<T>);
    }

    /// @brief Raw bytes of the elements, contiguous in row-major order (what the wire sends); null for
    /// a string tensor (the wire encodes its elements).
    [[nodiscard]] const std::byte* bytes() const {
        if (const auto* e = std::get_if<detail::EncodedStrings>(&storage_)) return e->bytes.data();
        if (storage_.index() == 5) return nullptr;
        return visit([](const auto& a) { return reinterpret_cast<const std::byte*>(a.data()); },
                     static_cast<const std::byte*>(nullptr));
    }
    [[nodiscard]] std::byte* bytes() {
        return const_cast<std::byte*>(std::as_const(*this).bytes());
    }

    /// @brief Calls `f(xt::xarray<T>&)` with the held numeric array; returns `empty` when there is none.
    /// @throws InvalidArgumentError for a string tensor (see `visit_any`).
    template <class F, class R>
    R visit(F&& f, R empty) const {
        return visit_any(
            [&](const auto& a) -> R {
                if constexpr (std::is_same_v<typename std::decay_t<decltype(a)>::value_type, std::string>)
                    detail::throw_not_numeric();
                else
                    return f(a);
            },
            std::move(empty));
    }
    /// @brief Calls `f(xt::xarray<T>&)` with the held numeric array.
    /// @throws InternalError when the tensor is empty, InvalidArgumentError for a string tensor.
    template <class F>
    decltype(auto) visit_mut(F&& f) {
        if (!has_value()) throw InternalError("pss: an empty tensor was used where a value was needed");
        return visit_dtype(dtype(), [&]<class T>(std::type_identity<T>) -> decltype(auto) {
            return f(std::get<xt::xarray<T>>(storage_));
        });
    }
    /// @brief As `visit`, for every dtype: `f` also takes `xt::xarray<std::string>`.
    template <class F, class R>
    R visit_any(F&& f, R empty) const {
        return std::visit(
            [&](const auto& a) -> R {
                using A = std::decay_t<decltype(a)>;
                if constexpr (std::is_same_v<A, std::monostate>)
                    return empty;
                else if constexpr (std::is_same_v<A, detail::EncodedStrings>)
                    throw InternalError("pss: a string tensor was used before the wire decoded it");
                else
                    return f(a);
            },
            storage_);
    }
    /// @brief As `visit_mut`, for every dtype.
    template <class F>
    decltype(auto) visit_any_mut(F&& f) {
        if (!has_value()) throw InternalError("pss: an empty tensor was used where a value was needed");
        if (storage_.index() == 6) throw InternalError("pss: a string tensor was used before the wire decoded it");
        return visit_any_dtype(dtype(), [&]<class T>(std::type_identity<T>) -> decltype(auto) {
            return f(std::get<xt::xarray<T>>(storage_));
        });
    }
    /// @brief The encoded form the wire read a string tensor into, or null.
    [[nodiscard]] detail::EncodedStrings* encoded_strings() noexcept {
        return std::get_if<detail::EncodedStrings>(&storage_);
    }

private:
    [[noreturn]] void throw_wrong_dtype(DType wanted) const {
        throw InvalidArgumentError("pss: tensor holds dtype " +
                                   std::string(has_value() ? dtype_name(dtype()) : "none (empty tensor)") +
                                   ", not " + std::string(dtype_name(wanted)));
    }

    Storage storage_;
};

namespace detail {

/// Copies `bytes` bytes: in 32-byte pieces the compiler inlines, the rest by memcpy. A memcpy call per
/// short row (an embedding row is 128 bytes) costs as much as the row's cache miss.
inline void copy_bytes(std::byte* to, const std::byte* from, std::size_t bytes) noexcept {
    std::size_t b = 0;
    for (; b + 32 <= bytes; b += 32) std::memcpy(to + b, from + b, 32);
    if (b < bytes) std::memcpy(to + b, from + b, bytes - b);
}

/// Calls `loop(copy)` once, with `copy(to, from)` copying `bytes` bytes: for the usual row sizes (powers
/// of two from 4 to 1024 bytes) a memcpy of that constant size, which compiles to a few vector moves
/// with no loop or branch (a gather of random 128-byte rows ran 1.3x as long through copy_bytes); for
/// other sizes copy_bytes. Chosen once per loop, not per row.
template <class Loop>
void with_row_copy(std::size_t bytes, Loop&& loop) {
    const auto fixed = [&]<std::size_t B>() {
        loop([](std::byte* to, const std::byte* from) { std::memcpy(to, from, B); });
    };
    switch (bytes) {
        case 4: return fixed.template operator()<4>();
        case 8: return fixed.template operator()<8>();
        case 16: return fixed.template operator()<16>();
        case 32: return fixed.template operator()<32>();
        case 64: return fixed.template operator()<64>();
        case 128: return fixed.template operator()<128>();
        case 256: return fixed.template operator()<256>();
        case 512: return fixed.template operator()<512>();
        case 1024: return fixed.template operator()<1024>();
        default: loop([bytes](std::byte* to, const std::byte* from) { copy_bytes(to, from, bytes); });
    }
}

/// Copies whole rows between two tensors of one dtype and row width (the elements past axis 0): bytes
/// for numbers, element by element for strings. Made once per operation, applied per row, or to many
/// rows by `rows`.
class RowCopy {
public:
    RowCopy(Tensor& to, const Tensor& from) {
        const std::size_t width = row_elements(from.shape());
        if (from.dtype() == DType::string) {
            to_strings_ = to.get<std::string>().data();
            from_strings_ = from.get<std::string>().data();
            width_ = width;
        } else {
            to_bytes_ = to.bytes();
            from_bytes_ = from.bytes();
            width_ = width * dtype_size(from.dtype());
        }
    }
    /// Rows [from_row, from_row + rows) of `from` to rows [to_row, to_row + rows) of `to`.
    void operator()(std::size_t to_row, std::size_t from_row, std::size_t rows = 1) const {
        if (rows * width_ == 0) return;
        if (to_strings_ != nullptr)
            std::copy_n(from_strings_ + from_row * width_, rows * width_, to_strings_ + to_row * width_);
        else if (rows == 1)
            copy_bytes(to_bytes_ + to_row * width_, from_bytes_ + from_row * width_, width_);
        else
            std::memcpy(to_bytes_ + to_row * width_, from_bytes_ + from_row * width_, rows * width_);
    }
    /// Row `from_row(j)` of `from` to row `to_row(j)` of `to`, for j in [0, n).
    template <class ToRow, class FromRow>
    void rows(std::size_t n, ToRow&& to_row, FromRow&& from_row) const {
        if (width_ == 0) return;
        if (to_strings_ != nullptr) {
            for (std::size_t j = 0; j < n; ++j)
                std::copy_n(from_strings_ + from_row(j) * width_, width_, to_strings_ + to_row(j) * width_);
            return;
        }
        with_row_copy(width_, [&](auto copy) {
            for (std::size_t j = 0; j < n; ++j) copy(to_bytes_ + to_row(j) * width_, from_bytes_ + from_row(j) * width_);
        });
    }

private:
    std::byte* to_bytes_ = nullptr;
    const std::byte* from_bytes_ = nullptr;
    std::string* to_strings_ = nullptr;
    const std::string* from_strings_ = nullptr;
    std::size_t width_ = 0;  // bytes of a row for numbers, elements for strings
};

/// Rows `positions` of `from`, in that order, as a new tensor of its dtype and row width.
/// @pre every position is a row of `from`
inline Tensor take_rows(const Tensor& from, std::span<const std::size_t> positions) {
    Tensor out = Tensor::uninitialized(from.dtype(), rows_shape(from.shape(), positions.size()));
    RowCopy(out, from).rows(positions.size(), [](std::size_t j) { return j; }, [&](std::size_t j) { return positions[j]; });
    return out;
}

/// Python's repr of bytes, as TensorFlow prints a string element: b'abc', b'it\'s', b'\x00'.
inline void format_element(std::string& out, const std::string& value) {
    static constexpr char hex[] = "0123456789abcdef";
    out += "b'";
    for (const char c : value) {
        const auto u = static_cast<unsigned char>(c);
        if (c == '\\' || c == '\'') {
            out += '\\';
            out += c;
        } else if (c == '\n') {
            out += "\\n";
        } else if (c == '\t') {
            out += "\\t";
        } else if (c == '\r') {
            out += "\\r";
        } else if (u < 0x20 || u >= 0x7f) {
            out += "\\x";
            out += hex[u >> 4];
            out += hex[u & 0xFu];
        } else {
            out += c;
        }
    }
    out += '\'';
}

template <class T>
void format_element(std::string& out, T value) {
    char buffer[32];
    auto [end, ec] = std::to_chars(buffer, buffer + sizeof(buffer), value);
    (void)ec;
    std::string text(buffer, end);
    if constexpr (std::is_floating_point_v<T>) {
        // numpy prints integral floats as "1." and keeps "nan", "inf" and exponents as they are.
        if (std::isfinite(value) && text.find_first_of(".e") == std::string::npos) text += '.';
    }
    out += text;
}

template <class T>
void format_block(std::string& out, const T* data, const Shape& shape, std::size_t axis, std::size_t& offset) {
    // Like numpy, an axis longer than 1000 elements in total is summarised with its first and last 3.
    constexpr std::size_t edge = 3;
    const bool summarise = num_elements(shape) > 1000 && shape[axis] > 2 * edge;
    const std::size_t inner = [&] {
        std::size_t n = 1;
        for (std::size_t a = axis + 1; a < shape.size(); ++a) n *= shape[a];
        return n;
    }();
    out += '[';
    for (std::size_t i = 0; i < shape[axis]; ++i) {
        if (summarise && i == edge) {
            out += "..., ";
            offset += (shape[axis] - 2 * edge) * inner;
            i = shape[axis] - edge - 1;
            continue;
        }
        if (axis + 1 == shape.size())
            format_element(out, data[offset++]);
        else
            format_block(out, data, shape, axis + 1, offset);
        if (i + 1 < shape[axis]) out += ", ";
    }
    out += ']';
}

}  // namespace detail

/// @brief numpy-like text of a tensor's values: `[1, 2, 3]`, `[[1., 2.5], [3., 4.]]`, `7` for a scalar,
/// `[b'the', b'a']` for strings (Python's bytes, as TensorFlow prints them).
[[nodiscard]] inline std::string format_values(const Tensor& tensor) {
    return tensor.visit_any(
        [](const auto& a) {
            std::string out;
            const Shape shape(a.shape().begin(), a.shape().end());
            if (shape.empty()) {
                detail::format_element(out, a.data()[0]);
                return out;
            }
            std::size_t offset = 0;
            detail::format_block(out, a.data(), shape, 0, offset);
            return out;
        },
        std::string("<empty>"));
}

PSS_NAMESPACE_END
