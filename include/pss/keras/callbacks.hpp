// pss/keras/callbacks.hpp: Keras' callbacks for Sequential::fit (Callback, EarlyStopping, ModelCheckpoint, CSVLogger, TerminateOnNaN, BackupAndRestore) and the logs they read.
#pragma once

#include <algorithm>
#include <charconv>
#include <cerrno>
#include <cmath>
#include <concepts>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include <pss/config.hpp>
#include <pss/errors.hpp>
#include <pss/optimizer/schedules.hpp>
#include <pss/tensor.hpp>

PSS_NAMESPACE_BEGIN

/// @brief Keras' `logs`: metric names and their values, in the order Keras prints them (`loss`, the
/// compiled metrics, then the `val_` ones).
class Logs {
public:
    Logs() = default;
    Logs(std::initializer_list<std::pair<std::string, double>> items) {
        for (const auto& [name, value] : items) set(name, value);
    }

    /// @brief Sets `name` to `value`, appending a name not present.
    void set(std::string_view name, double value) {
        for (auto& item : items_)
            if (item.first == name) {
                item.second = value;
                return;
            }
        items_.emplace_back(std::string(name), value);
    }
    /// @brief The value of `name`, or nullptr.
    [[nodiscard]] const double* find(std::string_view name) const noexcept {
        for (const auto& item : items_)
            if (item.first == name) return &item.second;
        return nullptr;
    }
    [[nodiscard]] bool contains(std::string_view name) const noexcept { return find(name) != nullptr; }
    /// @brief The value of `name`. @throws NotFoundError naming the names there are.
    [[nodiscard]] double at(std::string_view name) const {
        if (const double* value = find(name)) return *value;
        throw NotFoundError("pss: logs have no '" + std::string(name) + "'; they have: " + names());
    }
    /// @brief The names, comma-separated, in order: `loss, auc, val_loss, val_auc`.
    [[nodiscard]] std::string names() const {
        std::string out;
        for (const auto& item : items_) out += (out.empty() ? "" : ", ") + item.first;
        return out.empty() ? "(none)" : out;
    }
    [[nodiscard]] const std::vector<std::pair<std::string, double>>& items() const noexcept { return items_; }
    [[nodiscard]] bool empty() const noexcept { return items_.empty(); }
    [[nodiscard]] std::size_t size() const noexcept { return items_.size(); }
    [[nodiscard]] auto begin() const noexcept { return items_.begin(); }
    [[nodiscard]] auto end() const noexcept { return items_.end(); }

    friend bool operator==(const Logs&, const Logs&) = default;

private:
    std::vector<std::pair<std::string, double>> items_;
};

/// @brief What a callback may do with the model it is attached to (Keras' `self.model` in a
/// callback): read and assign its weights, save them, and stop training.
class ModelBase {
public:
    virtual ~ModelBase() = default;
    /// @brief Every weight's value, in the order of the model's weights.
    [[nodiscard]] virtual std::vector<Tensor> get_weights() const = 0;
    /// @brief Assigns every weight (what get_weights() returned). @throws InvalidArgumentError on a mismatch.
    virtual void set_weights(const std::vector<Tensor>& values) = 0;
    /// @brief Saves every weight with its optimizer slots as a checkpoint directory.
    virtual void save_weights(const std::string& path) const = 0;
    /// @brief The learning rate the ps tasks apply (Keras' `model.optimizer.learning_rate`): a constant,
    /// or the optimizer's schedule.
    [[nodiscard]] virtual LearningRate learning_rate() const = 0;
    /// @brief Sets the learning rate every ps task applies from now on (Keras' `model.optimizer.learning_rate
    /// = rate`). @throws FailedPreconditionError when the optimizer's rate is a schedule
    virtual void set_learning_rate(double rate) = 0;

    /// @brief Keras' `model.stop_training`: set by a callback, fit stops after the current batch (the
    /// epoch still ends: validation runs and on_epoch_end is called). fit clears it when it begins.
    bool stop_training = false;

protected:
    ModelBase() = default;
    ModelBase(const ModelBase&) = default;
    ModelBase& operator=(const ModelBase&) = default;
};

/// @brief What fit tells its callbacks before training (Keras' `self.params`).
struct CallbackParams {
    int epochs = 0;         ///< the `epochs` of fit
    std::size_t steps = 0;  ///< batches per epoch
    int verbose = 0;        ///< the `verbose` of fit
};

/// @brief Keras' `tf.keras.callbacks.Callback`: hooks that fit calls on the chief, in order, on the
/// thread that called fit. Override the ones needed; each does nothing by default. Epochs and batches
/// count from 0, as in Keras.
///
/// Logs hold `loss` and the compiled metrics, as running means over the epoch's batches so far in the
/// batch hooks; at an epoch's end, its values and the `val_` ones when fit validates.
class Callback {
public:
    virtual ~Callback() = default;

    virtual void on_train_begin(const Logs& /*logs*/) {}
    virtual void on_train_end(const Logs& /*logs*/) {}
    virtual void on_epoch_begin(int /*epoch*/, const Logs& /*logs*/) {}
    virtual void on_epoch_end(int /*epoch*/, const Logs& /*logs*/) {}
    virtual void on_train_batch_begin(std::size_t /*batch*/, const Logs& /*logs*/) {}
    virtual void on_train_batch_end(std::size_t /*batch*/, const Logs& /*logs*/) {}

    /// @brief Attaches the callback to a model (fit does, before on_train_begin).
    void set_model(ModelBase& model) noexcept { model_ = &model; }
    void set_params(const CallbackParams& params) noexcept { params_ = params; }

    /// @brief The model being trained (Keras' `self.model`).
    /// @throws FailedPreconditionError before fit attached it.
    [[nodiscard]] ModelBase& model() const {
        if (model_ == nullptr)
            throw FailedPreconditionError("pss: Callback::model: the callback is not attached to a model; fit "
                                          "attaches it before on_train_begin");
        return *model_;
    }
    [[nodiscard]] const CallbackParams& params() const noexcept { return params_; }

protected:
    Callback() = default;
    Callback(const Callback&) = default;
    Callback& operator=(const Callback&) = default;

private:
    ModelBase* model_ = nullptr;
    CallbackParams params_;
};

/// @brief One entry of fit's `callbacks`: a callback given by reference is used in place (read its
/// state after fit, as `early_stopping.stopped_epoch`; it must outlive fit), a temporary or a const
/// one is copied in, and a shared_ptr is shared.
///
/// @code
/// pss::EarlyStopping early{"val_loss", 0, 2};
/// model.fit(x, y, {.epochs = 20, .callbacks = {early, pss::TerminateOnNaN()}, .validation_split = 0.2});
/// @endcode
class CallbackHandle {
public:
    template <class C>
        requires std::derived_from<std::remove_cvref_t<C>, Callback>
    CallbackHandle(C&& callback) {  // NOLINT: implicit by design, as Keras' list of callbacks
        if constexpr (std::is_lvalue_reference_v<C> && !std::is_const_v<std::remove_reference_t<C>>) {
            callback_ = &callback;
        } else {
            owned_ = std::make_shared<std::remove_cvref_t<C>>(std::forward<C>(callback));
            callback_ = owned_.get();
        }
    }
    CallbackHandle(std::shared_ptr<Callback> callback) : owned_(std::move(callback)), callback_(owned_.get()) {  // NOLINT
        if (callback_ == nullptr) throw InvalidArgumentError("pss: fit: a callback is a null shared_ptr");
    }

    [[nodiscard]] Callback& operator*() const noexcept { return *callback_; }
    [[nodiscard]] Callback* operator->() const noexcept { return callback_; }
    [[nodiscard]] Callback* get() const noexcept { return callback_; }

private:
    std::shared_ptr<Callback> owned_;
    Callback* callback_ = nullptr;
};

namespace detail {

/// Keras' `mode="auto"`: larger is better for accuracies, AUC, precision and recall; smaller otherwise.
inline bool monitor_larger_is_better(std::string_view monitor, std::string_view mode, const char* who) {
    if (mode == "max") return true;
    if (mode == "min") return false;
    if (mode != "auto")
        throw InvalidArgumentError(std::string("pss: ") + who + ": mode is \"" + std::string(mode) +
                                   "\"; it is \"auto\", \"min\" or \"max\"");
    for (std::string_view larger : {"acc", "auc", "precision", "recall"})
        if (monitor.find(larger) != std::string_view::npos) return true;
    return false;
}

/// The monitored value in `logs`. @throws InvalidArgumentError naming the values there are (a
/// misspelled name, or `val_loss` without validation, would otherwise do nothing for the whole fit).
inline double monitored(const Logs& logs, const std::string& monitor, const char* who) {
    if (const double* value = logs.find(monitor)) return *value;
    throw InvalidArgumentError(std::string("pss: ") + who + ": it monitors '" + monitor +
                               "', which the epoch's logs do not have; they have: " + logs.names() +
                               (monitor.starts_with("val_") ? " (val_ values need validation_split or validation_data)"
                                                            : ""));
}

/// Python's repr of a double (`0.1`, `1.0`, `1e-05`, `1e+16`, `nan`), as Keras' CSVLogger writes values:
/// the shortest digits that read back exactly, in positional notation for exponents from -4 to 15.
inline std::string python_repr(double value) {
    if (std::isnan(value)) return "nan";
    if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
    char text[40];
    const auto result = std::to_chars(text, text + sizeof text, value, std::chars_format::scientific);
    const std::string scientific(text, result.ptr);  // -d.ddde+XX
    const std::size_t e = scientific.find('e');
    const int exponent = std::stoi(scientific.substr(e + 1));
    const bool negative = scientific.front() == '-';
    std::string digits;
    for (char c : scientific.substr(0, e))
        if (c >= '0' && c <= '9') digits += c;
    std::string out = negative ? "-" : "";
    if (exponent < -4 || exponent >= 16) {
        out += digits.substr(0, 1);
        if (digits.size() > 1) out += "." + digits.substr(1);
        char exp[16];
        std::snprintf(exp, sizeof exp, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
        return out + exp;
    }
    if (exponent < 0) return out + "0." + std::string(static_cast<std::size_t>(-exponent - 1), '0') + digits;
    const auto whole = static_cast<std::size_t>(exponent) + 1;
    if (digits.size() <= whole) return out + digits + std::string(whole - digits.size(), '0') + ".0";
    return out + digits.substr(0, whole) + "." + digits.substr(whole);
}

/// Python's `filepath.format(epoch=..., **logs)` for the fields ModelCheckpoint paths use: `{epoch}`,
/// `{epoch:02d}`, `{val_loss:.2f}`, `{loss:.4e}`; `{{` and `}}` are braces.
/// @throws InvalidArgumentError for a field that is neither `epoch` nor in the logs, or a format it does not know.
inline std::string format_path(const std::string& path, int epoch, const Logs& logs) {
    std::string out;
    for (std::size_t i = 0; i < path.size(); ++i) {
        const char c = path[i];
        if ((c == '{' || c == '}') && i + 1 < path.size() && path[i + 1] == c) {
            out += c;
            ++i;
            continue;
        }
        if (c != '{') {
            out += c;
            continue;
        }
        const std::size_t close = path.find('}', i);
        if (close == std::string::npos)
            throw InvalidArgumentError("pss: ModelCheckpoint: the filepath \"" + path + "\" opens a '{' it does not close");
        const std::string field = path.substr(i + 1, close - i - 1);
        const std::size_t colon = field.find(':');
        const std::string name = field.substr(0, colon);
        const std::string spec = colon == std::string::npos ? "" : field.substr(colon + 1);
        double value;
        if (name == "epoch") value = epoch;
        else if (const double* v = logs.find(name)) value = *v;
        else
            throw InvalidArgumentError("pss: ModelCheckpoint: the filepath \"" + path + "\" names {" + name +
                                       "}, which is neither epoch nor in the logs: " + logs.names());
        char text[64];
        int written = -1;
        const bool integer_spec = !spec.empty() && spec.back() == 'd';
        const bool float_spec = !spec.empty() && (spec.back() == 'f' || spec.back() == 'e' || spec.back() == 'g');
        if (spec.empty()) {
            const std::string repr = name == "epoch" ? std::to_string(epoch) : python_repr(value);
            written = std::snprintf(text, sizeof text, "%s", repr.c_str());
        } else if ((integer_spec || float_spec) &&
                   spec.find_first_not_of("0123456789.", 0) == spec.size() - 1 && spec.size() < 16) {
            const std::string format = "%" + spec;
            if (integer_spec) written = std::snprintf(text, sizeof text, format.c_str(), static_cast<long long>(value));
            else written = std::snprintf(text, sizeof text, format.c_str(), value);
        }
        if (written < 0 || static_cast<std::size_t>(written) >= sizeof text)
            throw InvalidArgumentError("pss: ModelCheckpoint: the filepath \"" + path + "\" formats {" + field +
                                       "} as \"" + spec + "\"; the formats are d (02d), f (.2f), e and g");
        out.append(text, static_cast<std::size_t>(written));
        i = close;
    }
    return out;
}

}  // namespace detail

/// @brief EarlyStopping's arguments, Keras' names and defaults in Keras' order:
/// `pss::EarlyStopping early({.monitor = "val_auc", .patience = 2, .restore_best_weights = true})`.
struct EarlyStoppingOptions {
    std::string monitor = "val_loss";
    double min_delta = 0;  ///< an improvement is a change of more than this
    int patience = 0;      ///< epochs without improvement before stopping
    int verbose = 0;       ///< 1: print Keras' lines when it stops and restores
    std::string mode = "auto";  ///< "min", "max", or "auto": max for accuracies, AUC, precision and recall
    std::optional<double> baseline = std::nullopt;  ///< stop unless the monitored value beats it
    bool restore_best_weights = false;
    int start_from_epoch = 0;  ///< epochs before it are not looked at
};

/// @brief Keras' `EarlyStopping`: stops fit when `monitor` has not improved (by more than `min_delta`)
/// for `patience` epochs; with `restore_best_weights`, the model then gets back the weights of its
/// best epoch (read from the ps at every improvement). Keras 2's rules exactly, including `baseline`
/// and `start_from_epoch`; a `monitor` absent from the logs is an InvalidArgumentError, not a warning.
class EarlyStopping : public Callback {
public:
    explicit EarlyStopping(EarlyStoppingOptions options = {})
        : options_(std::move(options)),
          min_delta_(std::abs(options_.min_delta)),
          larger_is_better_(detail::monitor_larger_is_better(options_.monitor, options_.mode, "EarlyStopping")) {
        if (options_.patience < 0)
            throw InvalidArgumentError("pss: EarlyStopping: patience is " + std::to_string(options_.patience) +
                                       "; it must be 0 or more");
    }

    void on_train_begin(const Logs& /*logs*/) override {
        wait = 0;
        stopped_epoch = 0;
        best = larger_is_better_ ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
        best_epoch = 0;
        best_weights_.reset();
    }

    void on_epoch_end(int epoch, const Logs& logs) override {
        if (epoch < options_.start_from_epoch) return;
        const double current = detail::monitored(logs, options_.monitor, "EarlyStopping");
        if (options_.restore_best_weights && !best_weights_) best_weights_ = model().get_weights();
        ++wait;
        if (improves(current, best)) {
            best = current;
            best_epoch = epoch;
            if (options_.restore_best_weights) best_weights_ = model().get_weights();
            if (!options_.baseline || improves(current, *options_.baseline)) wait = 0;
            return;
        }
        if (wait >= options_.patience && epoch > 0) {
            stopped_epoch = epoch;
            model().stop_training = true;
            if (options_.restore_best_weights && best_weights_) {
                if (options_.verbose > 0)
                    std::cout << "Restoring model weights from the end of the best epoch: " << best_epoch + 1 << ".\n";
                model().set_weights(*best_weights_);
            }
        }
    }

    void on_train_end(const Logs& /*logs*/) override {
        if (stopped_epoch > 0 && options_.verbose > 0) std::cout << "Epoch " << stopped_epoch + 1 << ": early stopping\n";
    }

    int wait = 0;           ///< epochs since the last improvement
    int stopped_epoch = 0;  ///< the epoch at which training stopped (0: it did not)
    double best = 0;        ///< the best value monitored
    int best_epoch = 0;     ///< the epoch of `best`

private:
    [[nodiscard]] bool improves(double value, double reference) const {
        return larger_is_better_ ? value - min_delta_ > reference : value + min_delta_ < reference;
    }

    EarlyStoppingOptions options_;
    double min_delta_;
    bool larger_is_better_;
    std::optional<std::vector<Tensor>> best_weights_;
};

/// @brief ModelCheckpoint's arguments after the filepath, Keras' names and defaults in Keras' order.
struct ModelCheckpointOptions {
    std::string monitor = "val_loss";
    int verbose = 0;              ///< 1: print Keras' line at each save
    bool save_best_only = false;  ///< save only when `monitor` improved on the best so far
    std::string mode = "auto";    ///< "min", "max", or "auto": max for accuracies, AUC, precision and recall
    std::size_t save_freq = 0;    ///< 0: at each epoch's end (Keras' "epoch"); N: every N batches
};

/// @brief Keras' `ModelCheckpoint` (weights only, as `save_weights_only=True`): saves the model's
/// weights and their optimizer slots with save_weights at the end of every epoch (or every `save_freq`
/// batches), to `filepath` formatted as Python's `str.format` with `epoch` (from 1) and the logs:
/// `"ckpt/weights.{epoch:02d}-{val_loss:.2f}"` (directories are made as needed). With `save_best_only`,
/// only when `monitor` improved on the best so far (and a filepath without fields is overwritten).
class ModelCheckpoint : public Callback {
public:
    explicit ModelCheckpoint(std::string filepath, ModelCheckpointOptions options = {})
        : filepath_(std::move(filepath)),
          monitor_(std::move(options.monitor)),
          verbose_(options.verbose),
          save_best_only_(options.save_best_only),
          larger_is_better_(detail::monitor_larger_is_better(monitor_, options.mode, "ModelCheckpoint")),
          save_freq_(options.save_freq) {
        if (filepath_.empty()) throw InvalidArgumentError("pss: ModelCheckpoint: the filepath is empty");
        best = larger_is_better_ ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
    }

    void on_train_batch_end(std::size_t /*batch*/, const Logs& logs) override {
        if (save_freq_ > 0 && ++batches_ % save_freq_ == 0) save(epoch_, logs);
    }
    void on_epoch_begin(int epoch, const Logs& /*logs*/) override { epoch_ = epoch; }
    void on_epoch_end(int epoch, const Logs& logs) override {
        if (save_freq_ == 0) save(epoch, logs);
    }

    double best;                     ///< the best value monitored (with save_best_only)
    std::vector<std::string> saved;  ///< the paths written, in order

private:
    void save(int epoch, const Logs& logs) {
        const std::string path = detail::format_path(filepath_, epoch + 1, logs);
        if (save_best_only_) {
            const double current = detail::monitored(logs, monitor_, "ModelCheckpoint");
            if (!(larger_is_better_ ? current > best : current < best)) {
                if (verbose_ > 0)
                    std::cout << "\nEpoch " << epoch + 1 << ": " << monitor_ << " did not improve from " << best << "\n";
                return;
            }
            if (verbose_ > 0)
                std::cout << "\nEpoch " << epoch + 1 << ": " << monitor_ << " improved from " << best << " to "
                          << current << ", saving model to " << path << "\n";
            best = current;
        } else if (verbose_ > 0) {
            std::cout << "\nEpoch " << epoch + 1 << ": saving model to " << path << "\n";
        }
        const std::filesystem::path parent = std::filesystem::path(path).parent_path();
        if (!parent.empty()) std::filesystem::create_directories(parent);  // as Keras makes the filepath's directories
        model().save_weights(path);
        saved.push_back(path);
    }

    std::string filepath_;
    std::string monitor_;
    int verbose_;
    bool save_best_only_;
    bool larger_is_better_;
    std::size_t save_freq_;
    std::size_t batches_ = 0;
    int epoch_ = 0;
};

/// @brief Keras' `CSVLogger`: one row per epoch, `epoch` then the logs' names sorted, as Keras
/// writes them (values as Python prints floats). With `append`, rows are added to an existing file
/// (its header is kept).
class CSVLogger : public Callback {
public:
    explicit CSVLogger(std::string filename, char separator = ',', bool append = false)
        : filename_(std::move(filename)), separator_(separator), append_(append) {}

    void on_train_begin(const Logs& /*logs*/) override {
        const bool had_rows = append_ && std::filesystem::exists(filename_) && std::filesystem::file_size(filename_) > 0;
        file_.open(filename_, append_ ? std::ios::app : std::ios::trunc);
        if (!file_)
            throw InvalidArgumentError("pss: CSVLogger: cannot open " + filename_ + " for writing: " +
                                       std::error_code(errno, std::generic_category()).message());
        header_written_ = had_rows;
        keys_.clear();
    }
    void on_epoch_end(int epoch, const Logs& logs) override {
        if (keys_.empty()) {
            for (const auto& [name, value] : logs) keys_.push_back(name);
            std::sort(keys_.begin(), keys_.end());
        }
        if (!header_written_) {
            file_ << "epoch";
            for (const auto& key : keys_) file_ << separator_ << key;
            file_ << "\n";
            header_written_ = true;
        }
        file_ << epoch;
        for (const auto& key : keys_) {
            const double* value = logs.find(key);
            file_ << separator_ << (value != nullptr ? detail::python_repr(*value) : "NA");
        }
        file_ << "\n" << std::flush;
    }
    void on_train_end(const Logs& /*logs*/) override { file_.close(); }

private:
    std::string filename_;
    char separator_;
    bool append_;
    std::ofstream file_;
    bool header_written_ = false;
    std::vector<std::string> keys_;
};

/// @brief Keras' `TerminateOnNaN`: stops fit when a batch's loss is NaN or infinite, printing
/// `Batch 3: Invalid loss, terminating training`. The ps tasks refuse non-finite gradients by default
/// (ServerOptions::refuse_non_finite_gradients), so a NaN loss with a NaN gradient usually ends fit with
/// that InvalidArgumentError first, the weights unchanged; this callback is for a loss that is not
/// finite while its gradient is, or a ps run with `PSS_NON_FINITE_GRADIENTS=apply`.
class TerminateOnNaN : public Callback {
public:
    void on_train_batch_end(std::size_t batch, const Logs& logs) override {
        const double* loss = logs.find("loss");
        if (loss != nullptr && !std::isfinite(*loss)) {
            std::cout << "Batch " << batch << ": Invalid loss, terminating training\n";
            model().stop_training = true;
        }
    }
};

/// @brief Keras' `LearningRateScheduler(schedule, verbose=0)`: at each epoch's start the learning rate
/// becomes `schedule(epoch, current_rate)`, set on every ps task (the pushes of that epoch apply it).
/// For a rate that follows the step within an epoch, give the optimizer a LearningRateSchedule instead;
/// the two do not mix (the rate of an optimizer with a schedule cannot be set, as in Keras).
/// @par Example
/// @code
/// pss::LearningRateScheduler halve([](int epoch, double rate) { return epoch < 2 ? rate : rate / 2; });
/// model.fit(x, y, {.epochs = 5, .callbacks = {halve}});
/// @endcode
class LearningRateScheduler : public Callback {
public:
    /// @param verbose 1 prints `Epoch 3: LearningRateScheduler setting learning rate to 0.05.` (Keras' line)
    explicit LearningRateScheduler(std::function<double(int epoch, double rate)> schedule, int verbose = 0,
                                   std::ostream* out = nullptr)
        : schedule_(std::move(schedule)), verbose_(verbose), out_(out) {
        if (!schedule_) throw InvalidArgumentError("pss: LearningRateScheduler: the schedule is an empty function");
    }

    /// @throws FailedPreconditionError when the optimizer's rate is a schedule
    /// @throws InvalidArgumentError when the schedule gives a negative or non-finite rate, naming the epoch
    void on_epoch_begin(int epoch, const Logs& /*logs*/) override {
        const LearningRate current = model().learning_rate();
        if (current.is_schedule())
            throw FailedPreconditionError("pss: LearningRateScheduler: the optimizer's learning rate is a schedule (" +
                                          current.schedule()->class_name() +
                                          "), which sets the rate of each step; give the optimizer a constant rate to "
                                          "schedule it per epoch (Keras refuses this too)");
        const double rate = schedule_(epoch, current(0));
        if (!(rate >= 0) || !std::isfinite(rate))
            throw InvalidArgumentError("pss: LearningRateScheduler: the schedule gave " + detail::format_number(rate) +
                                       " for epoch " + std::to_string(epoch) +
                                       "; a learning rate must be a finite number >= 0");
        model().set_learning_rate(rate);
        if (verbose_ > 0)
            (out_ != nullptr ? *out_ : std::cout) << "\nEpoch " << epoch + 1
                                                  << ": LearningRateScheduler setting learning rate to "
                                                  << detail::format_number(rate) << ".\n";
    }

private:
    std::function<double(int, double)> schedule_;
    int verbose_;
    std::ostream* out_;
};

/// @brief Keras' `LambdaCallback`: a callback from functions, each optional.
class LambdaCallback : public Callback {
public:
    std::function<void(int, const Logs&)> on_epoch_begin_fn, on_epoch_end_fn;
    std::function<void(std::size_t, const Logs&)> on_batch_begin_fn, on_batch_end_fn;
    std::function<void(const Logs&)> on_train_begin_fn, on_train_end_fn;

    void on_train_begin(const Logs& logs) override { call(on_train_begin_fn, logs); }
    void on_train_end(const Logs& logs) override { call(on_train_end_fn, logs); }
    void on_epoch_begin(int epoch, const Logs& logs) override { call(on_epoch_begin_fn, epoch, logs); }
    void on_epoch_end(int epoch, const Logs& logs) override { call(on_epoch_end_fn, epoch, logs); }
    void on_train_batch_begin(std::size_t batch, const Logs& logs) override { call(on_batch_begin_fn, batch, logs); }
    void on_train_batch_end(std::size_t batch, const Logs& logs) override { call(on_batch_end_fn, batch, logs); }

private:
    template <class F, class... A>
    static void call(const F& f, A&&... args) {
        if (f) f(std::forward<A>(args)...);
    }
};

/// @brief Keras' `BackupAndRestore` callback for Sequential::fit: the model's weights, their optimizer
/// slots and where the fit stands (epoch, batch, shuffling) are saved in `backup_dir` at the end of every
/// epoch, or every `save_freq` batches, and a fit that starts where a backup exists (the process was
/// killed, the machine lost) resumes right after it, with the same shuffling from there on. fit does the
/// work (it knows where it stands); at most one is given to a fit.
class BackupAndRestore : public Callback {
public:
    explicit BackupAndRestore(std::string backup_dir, bool delete_checkpoint = true, std::size_t save_freq = 0)
        : backup_dir(std::move(backup_dir)), delete_checkpoint(delete_checkpoint), save_freq(save_freq) {
        if (this->backup_dir.empty()) throw InvalidArgumentError("pss: BackupAndRestore: backup_dir is empty");
    }

    std::string backup_dir;         ///< a CheckpointManager's directory (created when missing)
    bool delete_checkpoint = true;  ///< remove the backup when the fit completes (Keras' default)
    /// 0: back up at the end of every epoch (Keras' `save_freq="epoch"`); N: after every N batches, counted
    /// across epochs (Keras' integer `save_freq`). A backup waits for the batches in flight to finish.
    std::size_t save_freq = 0;
    /// Beyond Keras (whose job is started again): a ps task lost during the fit is waited for (the
    /// start-up timeout: started again by `pss-launch --restart-failed`, Kubernetes or Slurm), made to
    /// serve again, every variable is restored from the latest backup and the fit goes on from it, in
    /// synchronous training too: the steps since the backup run again, so the fit ends with the weights
    /// of one never stopped. The History returned holds the epochs run after the last recovery. Off:
    /// the fit raises the loss (UnavailableError naming the task).
    bool recover_lost_ps = false;
};

PSS_NAMESPACE_END
