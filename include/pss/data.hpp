// pss/data.hpp: datasets read from files by each worker: CSV and .npy files, TensorFlow's FILE
// auto-sharding, a shuffle buffer, batching, repeat, and prefetch on a background thread; DatasetCreator,
// which makes each worker's dataset for Model::fit.
#pragma once

#include <algorithm>
#include <charconv>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <xtensor/xarray.hpp>

#include <pss/config.hpp>
#include <pss/detail/checkpoint_format.hpp>
#include <pss/errors.hpp>
#include <pss/tensor.hpp>

PSS_NAMESPACE_BEGIN

namespace data {

/// @brief The files in `directory` whose names end in `extension` (".csv", ".npy"), sorted by name, so
/// that every worker lists the same files in the same order.
/// @throws NotFoundError naming the directory when it does not exist, or holds no such file.
[[nodiscard]] inline std::vector<std::string> list_files(const std::string& directory, std::string_view extension) {
    std::error_code ec;
    std::vector<std::string> files;
    for (std::filesystem::directory_iterator it(directory, ec), end; !ec && it != end; it.increment(ec))
        if (it->is_regular_file(ec) && it->path().string().ends_with(extension)) files.push_back(it->path().string());
    if (ec) throw NotFoundError("pss: data: cannot list " + directory + ": " + ec.message());
    if (files.empty())
        throw NotFoundError("pss: data: " + directory + " holds no file ending in \"" + std::string(extension) + "\"");
    std::sort(files.begin(), files.end());
    return files;
}

/// @brief Worker `index`'s share of `files`, as TensorFlow's FILE auto-sharding gives it: the files at
/// positions index, index + workers, index + 2 * workers, ... so that no two workers read one file.
/// @throws InvalidArgumentError when there are fewer files than workers (a worker would read nothing;
/// TensorFlow refuses the same), or index is not in [0, workers).
[[nodiscard]] inline std::vector<std::string> shard_files(const std::vector<std::string>& files, int workers, int index) {
    if (workers < 1 || index < 0 || index >= workers)
        throw InvalidArgumentError("pss: data: worker index " + std::to_string(index) + " is not in [0, " +
                                   std::to_string(workers) + ")");
    if (files.size() < static_cast<std::size_t>(workers))
        throw InvalidArgumentError("pss: data: " + std::to_string(files.size()) + " files cannot be shared by " +
                                   std::to_string(workers) + " workers, each reading its own files; give at least one "
                                   "file per worker");
    std::vector<std::string> share;
    for (std::size_t i = static_cast<std::size_t>(index); i < files.size(); i += static_cast<std::size_t>(workers))
        share.push_back(files[i]);
    return share;
}

/// @brief How to read the rows of a file: which column is the label (the others are the features).
struct Columns {
    int label = -1;           ///< the label's column: -1 for the last, -2 for none (y is empty)
    bool header = true;       ///< CSV: the first line names the columns, and is skipped
    char delimiter = ',';     ///< CSV: the column separator
};

/// @brief Examples as Keras takes them: `x` of shape (n, features), `y` of shape (n, 1), float32.
struct Batch {
    xt::xarray<float> x;
    xt::xarray<float> y;
};

namespace detail {

/// One example: its features and its label.
struct Row {
    std::vector<float> features;
    float label = 0;
};

/// Splits a row of numbers into features and label, after checking its column count.
inline Row split_row(std::vector<float>&& values, const Columns& columns, std::size_t expected,
                     const std::string& where) {
    if (values.size() != expected)
        throw InvalidArgumentError("pss: data: " + where + ": " + std::to_string(values.size()) + " columns where " +
                                   std::to_string(expected) + " were expected");
    Row row;
    if (columns.label == -2) {
        row.features = std::move(values);
        return row;
    }
    const auto label = static_cast<std::size_t>(columns.label < 0 ? static_cast<int>(expected) - 1 : columns.label);
    if (label >= expected)
        throw InvalidArgumentError("pss: data: " + where + ": the label column " + std::to_string(columns.label) +
                                   " is beyond its " + std::to_string(expected) + " columns");
    row.label = values[label];
    values.erase(values.begin() + static_cast<std::ptrdiff_t>(label));
    row.features = std::move(values);
    return row;
}

/// The rows of one CSV file, each checked: a bad row is an error naming the file and the line.
inline void read_csv(const std::string& path, const Columns& columns, std::vector<Row>& out) {
    std::ifstream in(path);
    if (!in) throw NotFoundError("pss: data: cannot open " + path + ": " + std::strerror(errno));
    std::string line;
    std::size_t number = 0, expected = 0;
    std::vector<float> values;
    while (std::getline(in, line)) {
        ++number;
        if (!line.empty() && line.back() == '\r') line.pop_back();  // a file written on Windows
        if (line.empty()) continue;
        const std::string where = path + " line " + std::to_string(number);
        std::size_t fields = 1 + static_cast<std::size_t>(std::count(line.begin(), line.end(), columns.delimiter));
        if (columns.header && expected == 0) {  // the header: it fixes the number of columns
            expected = fields;
            continue;
        }
        values.clear();
        std::size_t begin = 0;
        for (std::size_t column = 0; column < fields; ++column) {
            std::size_t end = line.find(columns.delimiter, begin);
            if (end == std::string::npos) end = line.size();
            std::size_t a = begin, b = end;
            while (a < b && (line[a] == ' ' || line[a] == '\t')) ++a;
            while (b > a && (line[b - 1] == ' ' || line[b - 1] == '\t')) --b;
            const std::size_t sign = a < b && line[a] == '+' && b - a > 1 ? 1 : 0;  // from_chars takes no '+'
            float value = 0;
            const auto [stop, error] = std::from_chars(line.data() + a + sign, line.data() + b, value);
            if (a == b || error != std::errc() || stop != line.data() + b)
                throw InvalidArgumentError("pss: data: " + where + ": column " + std::to_string(column) + " is \"" +
                                           line.substr(a, b - a) + "\", not a number");
            values.push_back(value);
            begin = end + 1;
        }
        if (expected == 0) expected = fields;  // no header: the first row fixes it
        out.push_back(split_row(std::move(values), columns, expected, where));
    }
}

/// The rows of one .npy file: a 2-D array (rows, columns) of float32, float64, int32 or int64.
inline void read_npy(const std::string& path, const Columns& columns, std::vector<Row>& out) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw NotFoundError("pss: data: cannot open " + path + ": " + std::strerror(errno));
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const pss::detail::NpyHeader h = pss::detail::parse_npy_header(bytes, path);
    if (h.shape.size() != 2 || h.dtype == DType::string)
        throw InvalidArgumentError("pss: data: " + path + " holds a " + std::string(dtype_name(h.dtype)) + " array of shape " +
                                   format_shape(h.shape) + "; a dataset reads 2-D arrays of numbers (rows, columns)");
    const std::size_t rows = h.shape[0], width = h.shape[1];
    if (rows != 0 && width > (bytes.size() - h.header_bytes) / h.element_size / rows)
        throw InvalidArgumentError("pss: data: " + path + " is truncated: its header describes shape " +
                                   format_shape(h.shape) + " but " + std::to_string(bytes.size() - h.header_bytes) +
                                   " bytes follow it");
    const char* data = bytes.data() + h.header_bytes;
    for (std::size_t r = 0; r < rows; ++r) {
        std::vector<float> values(width);
        for (std::size_t c = 0; c < width; ++c) {
            const char* element = data + (r * width + c) * h.element_size;
            visit_dtype(h.dtype, [&]<class T>(std::type_identity<T>) {
                T v;
                std::memcpy(&v, element, sizeof v);
                values[c] = static_cast<float>(v);
            });
        }
        out.push_back(split_row(std::move(values), columns, width, path + " row " + std::to_string(r)));
    }
}

}  // namespace detail

/// @brief Examples read from files, shuffled, batched and repeated, with batches made ahead on a
/// background thread (TensorFlow's `tf.data` for the common input pipeline of a worker).
///
/// The stages apply in this order, whatever order they were set in: the files' rows (file by file, in
/// the order given), a shuffle buffer, batches, repeats (each pass reshuffled: the seed of pass k is
/// `seed + k`), prefetch. That is TensorFlow's recommended
/// `files.shuffle(n).batch(b).repeat().prefetch(p)`. A file is read when its rows are needed, so an
/// error in a file (a bad row names the file and the line) surfaces from `next()`, in order.
///
/// @par Example
/// @code
/// auto datasets = coordinator.create_per_worker_dataset([&](int worker) {
///     auto files = pss::data::shard_files(pss::data::list_files("train", ".csv"), coordinator.num_workers(), worker);
///     return pss::data::Dataset::csv(files).shuffle(1024, 7).batch(32).repeat().prefetch(2);
/// });
/// @endcode
class Dataset {
public:
    /// @brief The rows of CSV files: numbers separated by `columns.delimiter`, the first line a header.
    [[nodiscard]] static Dataset csv(std::vector<std::string> files, Columns columns = {}) {
        return Dataset(std::move(files), columns, false);
    }
    /// @brief The rows of .npy files, each a 2-D array (rows, columns) of float32, float64, int32 or int64
    /// (`columns.header` and `delimiter` do not apply).
    [[nodiscard]] static Dataset npy(std::vector<std::string> files, Columns columns = {}) {
        return Dataset(std::move(files), columns, true);
    }

    // Each setting has two forms: on a dataset held in a variable (returns it), and on a temporary, as
    // in the example (returns the dataset moved, so that `auto ds = Dataset::csv(f).batch(32);` works).

    /// @brief Draws each example at random from a buffer of the next `buffer_size` (TensorFlow's
    /// `shuffle`): 1 keeps the files' order; the rows of all files when it is as large as they are.
    Dataset& shuffle(std::size_t buffer_size, std::uint64_t seed) & {
        if (buffer_size == 0) throw InvalidArgumentError("pss: data: shuffle buffer_size is 0; it must be at least 1");
        plan_->shuffle = buffer_size;
        plan_->seed = seed;
        return *this;
    }
    Dataset shuffle(std::size_t buffer_size, std::uint64_t seed) && { return std::move(shuffle(buffer_size, seed)); }
    /// @brief Batches of `batch_size` examples; the last of a pass is smaller unless `drop_remainder`.
    Dataset& batch(std::size_t batch_size, bool drop_remainder = false) & {
        if (batch_size == 0) throw InvalidArgumentError("pss: data: batch_size is 0; it must be at least 1");
        plan_->batch = batch_size;
        plan_->drop_remainder = drop_remainder;
        return *this;
    }
    Dataset batch(std::size_t batch_size, bool drop_remainder = false) && {
        return std::move(batch(batch_size, drop_remainder));
    }
    /// @brief `count` passes over the files; -1 (the default) for ever. A pass that finds no row ends
    /// the dataset, even for ever.
    Dataset& repeat(std::int64_t count = -1) & {
        if (count < -1 || count == 0)
            throw InvalidArgumentError("pss: data: repeat count is " + std::to_string(count) +
                                       "; give a number of passes (1 or more), or -1 for ever");
        plan_->passes = count;
        return *this;
    }
    Dataset repeat(std::int64_t count = -1) && { return std::move(repeat(count)); }
    /// @brief Makes up to `batches` batches ahead on a background thread (0: none, batches are made
    /// by `next()` itself).
    Dataset& prefetch(std::size_t batches) & {
        plan_->prefetch = batches;
        return *this;
    }
    Dataset prefetch(std::size_t batches) && { return std::move(prefetch(batches)); }

    /// @brief The next batch, or nothing once every pass is over.
    /// @throws what reading a file threw (NotFoundError, InvalidArgumentError naming the file and line):
    /// once; the dataset then ends.
    [[nodiscard]] std::optional<Batch> next() { return plan_->next(); }

private:
    struct Plan {
        std::vector<std::string> files;
        Columns columns;
        bool npy = false;
        std::size_t shuffle = 1, batch = 1, prefetch = 0;
        std::uint64_t seed = 0;
        bool drop_remainder = false;
        std::int64_t passes = 1;

        // The reader's state (made on the first next()).
        std::size_t pass = 0, file = 0;
        std::vector<detail::Row> rows;  // the current file's rows not yet taken
        std::size_t taken = 0, pass_rows = 0;
        std::vector<detail::Row> buffer;
        std::mt19937_64 rng;
        bool started = false, ended = false;

        // Prefetch: a thread filling `ready`; the first error ends the dataset after the batches before it.
        std::mutex mutex;
        std::condition_variable changed;
        std::deque<std::optional<Batch>> ready;  // nullopt: the end
        std::exception_ptr error;
        bool stop = false;
        std::thread worker;

        ~Plan() {
            {
                const std::lock_guard lock(mutex);
                stop = true;
            }
            changed.notify_all();
            if (worker.joinable()) worker.join();
        }

        /// The next example of this pass, or nothing when the pass is over.
        std::optional<detail::Row> next_row() {
            for (;;) {
                if (taken < rows.size()) return std::move(rows[taken++]);
                if (file == files.size()) return std::nullopt;
                rows.clear();
                taken = 0;
                if (npy)
                    detail::read_npy(files[file++], columns, rows);
                else
                    detail::read_csv(files[file++], columns, rows);
            }
        }

        /// The next example out of the shuffle buffer, or nothing when the pass is over.
        std::optional<detail::Row> next_shuffled() {
            while (buffer.size() < shuffle) {
                auto row = next_row();
                if (!row) break;
                buffer.push_back(std::move(*row));
            }
            if (buffer.empty()) return std::nullopt;
            // A pick at random; the last element fills its place (without a shuffle, the buffer holds one).
            const std::size_t pick = static_cast<std::size_t>(rng() % buffer.size());
            ++pass_rows;
            detail::Row out = std::move(buffer[pick]);
            buffer[pick] = std::move(buffer.back());
            buffer.pop_back();
            return out;
        }

        void start_pass() {
            pass_rows = 0;
            file = 0;
            rows.clear();
            taken = 0;
            buffer.clear();
            rng.seed(seed + pass);
        }

        /// The next batch made on the calling thread, or nothing once every pass is over.
        std::optional<Batch> make_batch() {
            if (!started) {
                started = true;
                start_pass();
            }
            std::vector<detail::Row> picked;
            while (!ended && picked.size() < batch) {
                auto row = next_shuffled();
                if (row) {
                    picked.push_back(std::move(*row));
                    continue;
                }
                // The pass is over: a partial batch ends it (unless dropped), then the next pass starts.
                const bool last = pass_rows == 0 || (passes != -1 && pass + 1 >= static_cast<std::size_t>(passes));
                ++pass;
                if (last) ended = true;
                else start_pass();
                if (!picked.empty() && !drop_remainder) break;
                picked.clear();
            }
            if (picked.empty()) return std::nullopt;
            const std::size_t width = picked.front().features.size();
            Batch out{xt::xarray<float>::from_shape({picked.size(), width}), xt::xarray<float>::from_shape({picked.size(), 1})};
            if (columns.label == -2) out.y = xt::xarray<float>::from_shape({picked.size(), 0});
            for (std::size_t i = 0; i < picked.size(); ++i) {
                if (picked[i].features.size() != width)
                    throw InvalidArgumentError("pss: data: the files' rows differ in width: " + std::to_string(width) +
                                               " and " + std::to_string(picked[i].features.size()) + " features");
                std::copy(picked[i].features.begin(), picked[i].features.end(), out.x.data() + i * width);
                if (columns.label != -2) out.y(i, 0) = picked[i].label;
            }
            return out;
        }

        std::optional<Batch> next() {
            if (prefetch == 0) {
                try {
                    return make_batch();
                } catch (...) {
                    ended = true;  // raised once; the dataset has ended
                    throw;
                }
            }
            std::unique_lock lock(mutex);
            if (!worker.joinable()) worker = std::thread([this] { produce(); });
            changed.wait(lock, [&] { return !ready.empty() || error != nullptr; });
            if (ready.empty()) {  // the error, once; then the end
                auto e = std::exchange(error, nullptr);
                ready.emplace_back(std::nullopt);
                std::rethrow_exception(e);
            }
            std::optional<Batch> out = std::move(ready.front());
            if (out) ready.pop_front();  // the end stays, for every later call
            changed.notify_all();
            return out;
        }

        void produce() {
            for (;;) {
                {
                    std::unique_lock lock(mutex);
                    changed.wait(lock, [&] { return stop || ready.size() < prefetch; });
                    if (stop) return;
                }
                std::optional<Batch> batch_made;
                std::exception_ptr failure;
                try {
                    batch_made = make_batch();
                } catch (...) {
                    failure = std::current_exception();
                }
                // Handed over only once the catch has let go of the exception: the reader then holds its
                // last reference, so the exception dies on the reader's thread, after the reader used it.
                if (failure) {
                    const std::lock_guard lock(mutex);
                    error = std::move(failure);
                    changed.notify_all();
                    return;
                }
                const std::lock_guard lock(mutex);
                const bool end = !batch_made;
                ready.push_back(std::move(batch_made));
                changed.notify_all();
                if (end) return;
            }
        }
    };

    Dataset(std::vector<std::string> files, Columns columns, bool npy) : plan_(std::make_unique<Plan>()) {
        if (files.empty()) throw InvalidArgumentError("pss: data: a dataset needs at least one file");
        if (columns.label < -2)
            throw InvalidArgumentError("pss: data: label column " + std::to_string(columns.label) +
                                       " is not a column; give its index, -1 for the last, or -2 for none");
        plan_->files = std::move(files);
        plan_->columns = columns;
        plan_->npy = npy;
    }

    std::unique_ptr<Plan> plan_;
};

}  // namespace data

/// @brief What a DatasetCreator's function is told about the input pipeline it makes (TensorFlow's
/// `tf.distribute.InputContext`): fit makes one pipeline per worker, and this one is worker
/// `input_pipeline_id`'s, so `data::shard_files(files, num_input_pipelines, input_pipeline_id)` is its
/// share of the files.
struct InputContext {
    int num_input_pipelines = 1;
    int input_pipeline_id = 0;
};

/// @brief A function making each worker's dataset, for Model::fit (Keras'
/// `tf.keras.utils.experimental.DatasetCreator`): fit calls it once per worker and fit call, and each
/// training step takes the next batch of the dataset of the worker that runs it.
///
/// @par Example
/// @code
/// pss::DatasetCreator creator([](const pss::InputContext& context) {
///     auto files = pss::data::shard_files(pss::data::list_files("train", ".npy"), context.num_input_pipelines,
///                                         context.input_pipeline_id);
///     return pss::data::Dataset::npy(files).shuffle(1024, 7).batch(128).repeat().prefetch(2);
/// });
/// model.fit(creator, {.epochs = 5, .steps_per_epoch = 100});
/// @endcode
class DatasetCreator {
public:
    using Function = std::function<data::Dataset(const InputContext&)>;
    /// @throws InvalidArgumentError for an empty function.
    explicit DatasetCreator(Function dataset_fn) : dataset_fn_(std::move(dataset_fn)) {
        if (!dataset_fn_) throw InvalidArgumentError("pss: DatasetCreator: the dataset function is empty");
    }
    /// @brief The dataset of the input pipeline `context` describes.
    [[nodiscard]] data::Dataset operator()(const InputContext& context) const { return dataset_fn_(context); }

private:
    Function dataset_fn_;
};

PSS_NAMESPACE_END
