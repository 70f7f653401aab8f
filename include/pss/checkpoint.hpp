// pss/checkpoint.hpp: Checkpoint and CheckpointManager: save every variable and optimizer slot as .npy files
// written by the ps tasks themselves, and restore them into any shard layout.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <pss/config.hpp>
#include <pss/detail/checkpoint_format.hpp>
#include <pss/dtype.hpp>
#include <pss/errors.hpp>
#include <pss/message.hpp>
#include <pss/partitioner/fixed_shards.hpp>
#include <pss/partitioner/max_size.hpp>
#include <pss/partitioner/min_size.hpp>
#include <pss/partitioner/no_partition.hpp>
#include <pss/tensor.hpp>
#include <pss/variable.hpp>

PSS_NAMESPACE_BEGIN

/// @brief How Checkpoint::restore treats the variables of the model and of the checkpoint.
struct RestoreOptions {
    /// Restore the variables the checkpoint has and leave the others as they are (TensorFlow's
    /// `expect_partial()`); without it, a variable missing from the checkpoint is an error.
    bool partial = false;
};

namespace detail {

/// What a checkpoint needs of a strategy: its variables, the optimizer it trains with, its partitioner.
template <class S>
concept checkpointable_strategy = requires(S& s, std::function<void(const Variable&)> hook) {
    typename S::optimizer_type;
    { s.variables() } -> std::convertible_to<std::vector<Variable>>;
    { s.optimizer() } -> std::convertible_to<const typename S::optimizer_type&>;
    s.variable_partitioner();
    s.set_variable_created_hook(hook);
    { s.num_ps() } -> std::convertible_to<int>;
};

/// The partitioner as the index records it: its name and parameters where pss knows them.
template <class P>
nlohmann::json describe_partitioner(const P& p) {
    if constexpr (std::same_as<P, NoPartitioner>)
        return {{"name", "NoPartitioner"}};
    else if constexpr (std::same_as<P, FixedShardsPartitioner>)
        return {{"name", "FixedShardsPartitioner"}, {"num_shards", p.num_shards()}};
    else if constexpr (std::same_as<P, MinSizePartitioner>)
        return {{"name", "MinSizePartitioner"},
                {"min_shard_bytes", p.min_shard_bytes()},
                {"max_shards", p.max_shards()},
                {"bytes_per_string", p.bytes_per_string()}};
    else if constexpr (std::same_as<P, MaxSizePartitioner>)
        return {{"name", "MaxSizePartitioner"},
                {"max_shard_bytes", p.max_shard_bytes()},
                {"max_shards", p.max_shards()},
                {"bytes_per_string", p.bytes_per_string()}};
    else
        return {{"name", "custom"}};
}

/// Sends one request per (task, request) and waits for every reply (none is left running).
inline std::vector<Reply> send_all(const VariableInfo& info, std::vector<std::pair<int, Request>> outgoing) {
    std::vector<std::future<Reply>> futures;
    futures.reserve(outgoing.size());
    for (auto& [task, request] : outgoing) futures.push_back(info.channel->send(task, std::move(request)));
    std::vector<Reply> replies;
    replies.reserve(futures.size());
    for (auto& f : futures) replies.push_back(f.get());
    return replies;
}

/// `path` made absolute (from this process's working directory) and without a trailing slash: the ps
/// tasks, other processes maybe, are sent it.
inline std::string absolute_path(const std::string& path) {
    if (path.empty()) throw InvalidArgumentError("pss: checkpoint: the path is empty");
    std::error_code ec;
    std::string out = std::filesystem::absolute(path, ec).lexically_normal().string();
    if (ec) throw FailedPreconditionError("pss: checkpoint: cannot make " + path + " absolute: " + ec.message());
    while (out.size() > 1 && out.back() == '/') out.pop_back();
    return out;
}

/// Removes a directory tree, ignoring errors (cleaning up after a failed save).
inline void remove_tree_quietly(const std::string& path) noexcept {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
}

/// A name no other save uses: `.tmp-<pid>-<counter>-<random>`.
inline std::string temporary_suffix() {
    static std::atomic<std::uint64_t> counter{0};
    std::random_device rd;
    return std::string(temporary_marker) + std::to_string(::getpid()) + "-" + std::to_string(counter.fetch_add(1)) + "-" +
           std::to_string(rd() % 1000000u);
}

/// Stages and commits one checkpoint's rows into a set of variables: every shard reads its rows first
/// (restore_shard); only when every shard of every variable has them does any shard take them
/// (commit_restore, with the checkpoint's `step`: a synchronous ps counts the shard's steps on from it);
/// otherwise every staged copy is dropped and the first error is thrown.
inline void restore_variables(const std::string& dir, const std::vector<Variable>& variables, std::uint64_t step) {
    struct Target {
        const VariableInfo* info;
        int task;
        ShardKey key;
    };
    std::vector<Target> targets;
    std::vector<std::future<Reply>> staging;
    for (const auto& v : variables) {
        const auto& info = *v.info_ptr();
        for (const auto& s : info.shards) {
            Request r;
            r.op = Op::restore_shard;
            r.key = {s.variable, s.index};
            r.name = dir + "\n" + info.name;
            const std::size_t rows = s.shape.empty() ? 0 : s.shape[0];
            r.ids = {static_cast<std::int64_t>(s.row_offset), static_cast<std::int64_t>(s.row_offset + rows)};
            targets.push_back({&info, s.task, r.key});
            staging.push_back(info.channel->send(s.task, std::move(r)));
        }
    }
    std::optional<Reply> failed;
    for (auto& f : staging) {
        Reply reply = f.get();
        if (!reply.ok() && !failed) failed = std::move(reply);
    }
    const Op finish = failed ? Op::abort_restore : Op::commit_restore;
    std::vector<std::future<Reply>> finishing;
    for (const auto& t : targets) {
        Request r;
        r.op = finish;
        r.key = t.key;
        r.step = step;
        finishing.push_back(t.info->channel->send(t.task, std::move(r)));
    }
    std::optional<Reply> commit_failed;
    for (auto& f : finishing) {
        Reply reply = f.get();
        if (!reply.ok() && !commit_failed) commit_failed = std::move(reply);
    }
    if (failed) throw_error(failed->code, failed->message);
    if (commit_failed) throw_error(commit_failed->code, commit_failed->message);
}

/// Checks that `v` may take the saved variable `saved` (same shape and dtype).
inline void check_compatible(const std::string& index_path, const Variable& v, const SavedVariable& saved) {
    const auto& info = *v.info_ptr();
    if (saved.shape != info.shape || saved.dtype != info.dtype)
        throw InvalidArgumentError("pss: checkpoint: " + index_path + ": variable '" + info.name + "' was saved with shape " +
                                   format_shape(saved.shape) + " dtype " + std::string(dtype_name(saved.dtype)) +
                                   " but the model's has shape " + format_shape(info.shape) + " dtype " +
                                   std::string(dtype_name(info.dtype)));
}

/// What a restore before the variables exist keeps until they are created.
struct DeferredRestore {
    std::string dir;
    CheckpointIndex index;
    RestoreOptions options;
    std::set<std::string> pending;  // saved variables not restored yet
    std::mutex mutex;
};

}  // namespace detail

/// @brief The variables and optimizer slots of a strategy, saved to and restored from a directory
/// (TensorFlow's `tf.train.Checkpoint`).
///
/// `write(path)` asks every ps task to write its shards (value and optimizer slots, one .npy file each,
/// straight from its memory, fsync'd), in parallel, into a temporary directory beside `path`; the chief
/// then writes `index.json`, fsyncs it and the directory, and renames the directory to `path`. A crash
/// at any instant leaves `path` absent or complete. `restore(path)` has each ps read, from whichever
/// saved shards hold them, only the rows it owns now, so a checkpoint restores into any number of
/// shards and ps tasks, slots included.
///
/// In synchronous training, save between steps: `coordinator.join()` first, so that every step
/// scheduled is applied on every shard; and `set_step` the steps applied. A restore sets each restored
/// shard's count of applied steps to the checkpoint's `step()` (as Keras restores `iterations`), so the
/// next step pushed is `step() + 1`, whether the ps tasks counted fewer steps (a restarted chief) or more;
/// a variable that a partial restore leaves as it is keeps its own count.
///
/// @tparam StrategyType a ParameterServerStrategy (its variables(), optimizer(), partitioner)
/// @par Example
/// @code
/// pss::Checkpoint checkpoint(strategy);
/// checkpoint.set_step(100);
/// checkpoint.write("/shared/run1/step-100");
/// // later, in another process, with any number of ps tasks:
/// pss::Checkpoint restored(other_strategy);
/// restored.restore("/shared/run1/step-100");  // before or after the model's variables exist
/// @endcode
template <class StrategyType>
class Checkpoint {
    static_assert(detail::checkpointable_strategy<StrategyType>,
                  "pss: Checkpoint<StrategyType>: StrategyType must be a ParameterServerStrategy (variables(), "
                  "optimizer(), variable_partitioner(), set_variable_created_hook(), num_ps())");

public:
    using optimizer_type = typename StrategyType::optimizer_type;

    /// @brief A checkpoint of every variable the strategy holds when it saves; a restore also applies to
    /// the variables created after it (deferred restoration).
    explicit Checkpoint(StrategyType& strategy) : strategy_(&strategy) {}

    /// @brief A checkpoint of these variables only (a model's weights).
    Checkpoint(StrategyType& strategy, std::vector<Variable> variables)
        : strategy_(&strategy), variables_(std::move(variables)) {}

    Checkpoint(const Checkpoint&) = delete;
    Checkpoint& operator=(const Checkpoint&) = delete;

    /// @brief The strategy whose variables this checkpoint saves.
    [[nodiscard]] StrategyType& strategy() const noexcept { return *strategy_; }

    /// @brief The step counter saved with the variables (restored by restore()).
    [[nodiscard]] std::uint64_t step() const noexcept { return step_; }
    void set_step(std::uint64_t step) noexcept { step_ = step; }

    /// @brief The caller's JSON saved in the index ("metadata"), and read back by restore() (Keras
    /// keeps its epoch here).
    [[nodiscard]] const nlohmann::json& metadata() const noexcept { return metadata_; }
    void set_metadata(nlohmann::json metadata) { metadata_ = std::move(metadata); }

    /// @brief The variables a save writes: the given ones, or every variable of the strategy.
    [[nodiscard]] std::vector<Variable> variables() const {
        return variables_ ? *variables_ : strategy_->variables();
    }

    /// @brief Writes the checkpoint to the directory `path`, atomically: `path` exists afterwards
    /// complete, or not at all.
    /// @throws AlreadyExistsError when `path` exists; InvalidArgumentError when two variables share a
    /// name; FailedPreconditionError naming the file and the system's reason when a file cannot be
    /// written (read-only directory, disk full). Nothing is left behind on failure.
    void write(const std::string& path) const;

    /// @brief Restores the variables from the checkpoint directory `path`.
    ///
    /// Every variable of the model (the strategy's, or the given ones) must be in the checkpoint with
    /// its shape and dtype (unless `options.partial`), and the optimizer's slots must be the saved ones.
    /// Saved variables the model does not have yet are restored when the strategy creates them (for a
    /// Checkpoint of the whole strategy); see assert_consumed().
    /// @throws NotFoundError (a missing file or variable), InvalidArgumentError (truncated or corrupt
    /// file, checksum mismatch, newer format, shape, dtype or slots that differ), each naming the file
    /// and the problem; then no variable has changed.
    void restore(const std::string& path, RestoreOptions options = {});

    /// @brief Throws FailedPreconditionError listing the saved variables that no variable of the model
    /// has taken yet (TensorFlow's `assert_consumed()`).
    void assert_consumed() const {
        if (!deferred_) return;
        std::lock_guard lock(deferred_->mutex);
        if (deferred_->pending.empty()) return;
        std::string names;
        for (const auto& n : deferred_->pending) names += (names.empty() ? "'" : ", '") + n + "'";
        throw FailedPreconditionError("pss: checkpoint: " + deferred_->dir + ": saved variables " + names +
                                      " were not restored: the model has not created them");
    }

private:
    StrategyType* strategy_;
    std::optional<std::vector<Variable>> variables_;
    std::uint64_t step_ = 0;
    nlohmann::json metadata_ = nlohmann::json::object();
    std::shared_ptr<detail::DeferredRestore> deferred_;
};

/// @brief Keeps the last `max_to_keep` checkpoints of a Checkpoint in a directory (TensorFlow's
/// `tf.train.CheckpointManager`).
///
/// Layout: `directory/ckpt-N/` (one per save: index.json and the .npy files) and `directory/latest`, a
/// small JSON file naming the newest complete checkpoint. A save writes `ckpt-N` atomically (see
/// Checkpoint::write), then replaces `latest` by writing a temporary file and renaming it, then fsyncs
/// the directory; only then are checkpoints beyond `max_to_keep` removed. A crash at any instant
/// leaves `latest()` naming a complete checkpoint, the previous one or the new one.
template <class StrategyType>
class CheckpointManager {
public:
    /// @param checkpoint what is saved and restored; it must outlive the manager
    /// @param directory created when missing; a shared filesystem when the ps tasks are other processes
    /// @param max_to_keep how many checkpoints stay (0: all)
    /// @throws FailedPreconditionError when the directory cannot be created
    CheckpointManager(Checkpoint<StrategyType>& checkpoint, std::string directory, std::size_t max_to_keep = 5)
        : checkpoint_(&checkpoint), directory_(std::move(directory)), max_to_keep_(max_to_keep) {
        std::error_code ec;
        std::filesystem::create_directories(directory_, ec);
        if (ec)
            throw FailedPreconditionError("pss: CheckpointManager: cannot create directory " + directory_ + ": " +
                                          ec.message());
        // What a crash during an earlier save left: temporary directories and files, never committed.
        for (const auto& entry : std::filesystem::directory_iterator(directory_, ec)) {
            const std::string name = entry.path().filename().string();
            if ((name.rfind("ckpt-", 0) == 0 || name.rfind("latest", 0) == 0) && name.find(detail::temporary_marker) != std::string::npos)
                detail::remove_tree_quietly(entry.path().string());
            else if (name.rfind("ckpt-", 0) == 0 && name.find(".removing") != std::string::npos)
                detail::remove_tree_quietly(entry.path().string());
        }
    }

    [[nodiscard]] const std::string& directory() const noexcept { return directory_; }

    /// @brief What this manager saves and restores.
    [[nodiscard]] Checkpoint<StrategyType>& checkpoint() const noexcept { return *checkpoint_; }
    /// @brief The newest complete checkpoint's directory, as `latest` names it; nullopt before the first
    /// save (TensorFlow's `latest_checkpoint`).
    [[nodiscard]] std::optional<std::string> latest() const {
        const std::string path = directory_ + "/latest";
        if (::access(path.c_str(), F_OK) != 0) return std::nullopt;
        nlohmann::json j;
        try {
            j = nlohmann::json::parse(detail::read_small_file(path));
        } catch (const Error&) {
            throw;
        } catch (const std::exception& e) {
            throw InvalidArgumentError("pss: CheckpointManager: " + path + " is not JSON (" + e.what() + ")");
        }
        return directory_ + "/" + j.at("latest").get<std::string>();
    }

    /// @brief The committed checkpoints' directories, oldest first.
    [[nodiscard]] std::vector<std::string> checkpoints() const {
        std::vector<std::string> out;
        for (auto n : numbers()) out.push_back(directory_ + "/ckpt-" + std::to_string(n));
        return out;
    }

    /// @brief Saves `ckpt-N` (N one more than the newest, or `checkpoint_number`), moves `latest` to
    /// it, then removes the oldest beyond max_to_keep. Returns the new checkpoint's directory.
    /// @throws what Checkpoint::write throws; `latest` and the previous checkpoints are then as before.
    std::string save(std::optional<std::uint64_t> checkpoint_number = std::nullopt) {
        const auto existing = numbers();
        const std::uint64_t n = checkpoint_number ? *checkpoint_number : (existing.empty() ? 1 : existing.back() + 1);
        const std::string name = "ckpt-" + std::to_string(n);
        const std::string path = directory_ + "/" + name;
        checkpoint_->write(path);
        const std::string temporary = directory_ + "/latest" + detail::temporary_suffix();
        try {
            detail::write_small_file(temporary, nlohmann::json{{"latest", name}, {"step", checkpoint_->step()}}.dump() + "\n");
            detail::checkpoint_save_point("latest written");
            detail::rename_path(temporary, directory_ + "/latest");
            detail::checkpoint_save_point("latest renamed");
            detail::fsync_directory(directory_);
            detail::checkpoint_save_point("latest synced");
        } catch (...) {
            ::unlink(temporary.c_str());
            throw;
        }
        if (max_to_keep_ > 0) {
            auto all = numbers();
            while (all.size() > max_to_keep_) {
                if (all.front() != n) {
                    // Renamed first, so that a crash during the removal leaves no half checkpoint named ckpt-N.
                    const std::string old = directory_ + "/ckpt-" + std::to_string(all.front());
                    const std::string doomed = old + ".removing" + detail::temporary_suffix();
                    if (::rename(old.c_str(), doomed.c_str()) == 0) detail::remove_tree_quietly(doomed);
                }
                detail::checkpoint_save_point("old checkpoint removed");
                all.erase(all.begin());
            }
        }
        return path;
    }

    /// @brief Restores the latest checkpoint when there is one and returns its directory; nullopt (and
    /// nothing changed) when there is none (TensorFlow's `restore_or_initialize`).
    std::optional<std::string> restore_or_initialize(RestoreOptions options = {}) {
        auto path = latest();
        if (path) checkpoint_->restore(*path, options);
        return path;
    }

private:
    /// The N of every committed `ckpt-N` directory, ascending (temporary ones are not committed).
    [[nodiscard]] std::vector<std::uint64_t> numbers() const {
        std::vector<std::uint64_t> out;
        std::error_code ec;
        for (const auto& entry : std::filesystem::directory_iterator(directory_, ec)) {
            const std::string name = entry.path().filename().string();
            if (name.rfind("ckpt-", 0) != 0 || name.size() == 5) continue;
            const std::string digits = name.substr(5);
            if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) continue;
            out.push_back(std::stoull(digits));
        }
        std::sort(out.begin(), out.end());
        return out;
    }

    Checkpoint<StrategyType>* checkpoint_;
    std::string directory_;
    std::size_t max_to_keep_;
};

// ---------------------------------------------------------------------------------------------------
// Implementation
// ---------------------------------------------------------------------------------------------------

template <class StrategyType>
void Checkpoint<StrategyType>::write(const std::string& where) const {
    const std::string path = detail::absolute_path(where);
    const auto vars = variables();
    std::set<std::string> names;
    for (const auto& v : vars) {
        if (!v) throw InvalidArgumentError("pss: checkpoint: an empty Variable handle cannot be saved");
        if (!names.insert(v.info_ptr()->name).second)
            throw InvalidArgumentError("pss: checkpoint: two variables are named '" + v.info_ptr()->name +
                                       "'; a checkpoint finds variables by name, so names must be unique");
    }
    if (::access(path.c_str(), F_OK) == 0)
        throw AlreadyExistsError("pss: checkpoint: " + path + " exists already; a checkpoint is never overwritten");
    const std::string temporary = path + detail::temporary_suffix();
    if (::mkdir(temporary.c_str(), 0755) != 0) detail::throw_file_error("creating directory", temporary, errno);
    detail::checkpoint_save_point("directory created");
    try {
        // Every shard of every variable at once: each ps task writes its own files, the tasks in parallel.
        detail::CheckpointIndex index;
        index.step = step_;
        index.metadata = metadata_;
        const auto& optimizer = strategy_->optimizer();
        nlohmann::json slot_names = nlohmann::json::array();
        for (std::string_view s : optimizer_type::slot_names()) slot_names.push_back(std::string(s));
        index.optimizer = {{"name", std::string(optimizer_type::name())},
                           {"config", optimizer.get_config()},
                           {"slot_names", std::move(slot_names)}};
        index.partitioner = detail::describe_partitioner(strategy_->variable_partitioner());
        index.partitioner["num_ps"] = strategy_->num_ps();
        std::set<std::string> stems;
        std::vector<std::vector<std::future<Reply>>> replies;
        for (std::size_t i = 0; i < vars.size(); ++i) {
            const auto& info = *vars[i].info_ptr();
            std::string stem = detail::file_stem(info.name);
            if (!stems.insert(stem).second) stems.insert(stem += "-" + std::to_string(i));
            detail::SavedVariable saved{info.name, info.shape, info.dtype, {}};
            replies.emplace_back();
            for (std::size_t k = 0; k < info.shards.size(); ++k) {
                const auto& s = info.shards[k];
                Request r;
                r.op = Op::save_shard;
                r.key = {s.variable, s.index};
                r.name = temporary + "/" + stem + (info.shards.size() > 1 ? ".part_" + std::to_string(k) : "");
                replies.back().push_back(info.channel->send(s.task, std::move(r)));
                detail::SavedShard shard;
                shard.row_offset = s.row_offset;
                shard.shape = s.shape;
                saved.shards.push_back(std::move(shard));
            }
            index.variables.push_back(std::move(saved));
        }
        std::optional<Reply> failed;
        for (std::size_t i = 0; i < replies.size(); ++i)
            for (std::size_t k = 0; k < replies[i].size(); ++k) {
                Reply reply = replies[i][k].get();
                if (!reply.ok()) {
                    if (!failed) failed = std::move(reply);
                    continue;
                }
                const auto j = nlohmann::json::parse(reply.message);
                auto& shard = index.variables[i].shards[k];
                shard.value = j.at("value").get<detail::FileRecord>();
                for (const auto& [name, record] : j.at("slots").items()) shard.slots[name] = record.template get<detail::FileRecord>();
                shard.counters = detail::json_counters(j.at("counters"));
            }
        if (failed) throw_error(failed->code, failed->message);
        detail::write_small_file(temporary + "/index.json", detail::index_to_json(index).dump(1) + "\n");
        detail::checkpoint_save_point("index written");
        detail::fsync_directory(temporary);
        detail::checkpoint_save_point("directory synced");
        if (::rename(temporary.c_str(), path.c_str()) != 0) {
            const int e = errno;
            if (e == EEXIST || e == ENOTEMPTY)
                throw AlreadyExistsError("pss: checkpoint: " + path + " appeared during the save; it is left as it is");
            detail::throw_file_error("renaming " + temporary + " to", path, e);
        }
    } catch (...) {
        detail::remove_tree_quietly(temporary);
        throw;
    }
    detail::checkpoint_save_point("renamed");
    detail::fsync_directory(detail::parent_directory(path));
    detail::checkpoint_save_point("committed");
}

template <class StrategyType>
void Checkpoint<StrategyType>::restore(const std::string& where, RestoreOptions options) {
    const std::string path = detail::absolute_path(where);
    const std::string index_path = path + "/index.json";
    auto state = std::make_shared<detail::DeferredRestore>();
    state->dir = path;
    state->index = detail::read_index(path);
    state->options = options;
    const auto& index = state->index;

    // The optimizer's slots must be the saved ones: restoring Adam's moments into Momentum means nothing.
    std::vector<std::string> ours;
    for (std::string_view s : optimizer_type::slot_names()) ours.emplace_back(s);
    const auto theirs = index.slot_names();
    const bool any_float = std::any_of(index.variables.begin(), index.variables.end(),
                                       [](const auto& v) { return is_floating(v.dtype); });
    if (any_float && ours != theirs) {
        auto list = [](const std::vector<std::string>& names) {
            std::string out;
            for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
            return names.empty() ? std::string("none") : out;
        };
        throw InvalidArgumentError("pss: checkpoint: " + index_path + ": the optimizer's slots do not match: saved by " +
                                   index.optimizer.value("name", std::string("?")) + " with slots " + list(theirs) +
                                   ", restored into " + std::string(optimizer_type::name()) + " with slots " + list(ours));
    }

    const auto vars = variables();
    std::vector<Variable> restoring;
    std::set<std::string> present;
    for (const auto& v : vars) {
        const auto& name = v.info_ptr()->name;
        present.insert(name);
        const auto* saved = index.find(name);
        if (saved == nullptr) {
            if (options.partial) continue;
            std::string have;
            for (const auto& s : index.variables) have += (have.empty() ? "'" : ", '") + s.name + "'";
            throw NotFoundError("pss: checkpoint: " + index_path + " has no variable '" + name + "' (it has " +
                                (have.empty() ? std::string("none") : have) +
                                "); restore with RestoreOptions{.partial = true} to leave it as it is");
        }
        detail::check_compatible(index_path, v, *saved);
        restoring.push_back(v);
    }
    detail::restore_variables(path, restoring, index.step);
    step_ = index.step;
    metadata_ = index.metadata;

    // Deferred restoration: the saved variables the model does not have yet take their values when the
    // strategy creates them.
    if (variables_) return;
    for (const auto& s : index.variables)
        if (!present.contains(s.name)) state->pending.insert(s.name);
    deferred_ = state;
    if (state->pending.empty()) {
        strategy_->set_variable_created_hook({});
        return;
    }
    std::weak_ptr<detail::DeferredRestore> weak = state;
    StrategyType* strategy = strategy_;
    strategy_->set_variable_created_hook([weak, strategy](const Variable& v) {
        auto deferred = weak.lock();
        if (!deferred) return;
        std::unique_lock lock(deferred->mutex);
        const auto& name = v.info_ptr()->name;
        const auto* saved = deferred->index.find(name);
        const std::string index_path = deferred->dir + "/index.json";
        if (saved == nullptr || !deferred->pending.contains(name)) {
            if (deferred->options.partial || saved != nullptr) return;
            throw NotFoundError("pss: checkpoint: " + index_path + " has no variable '" + name +
                                "', created after a restore from it; restore with RestoreOptions{.partial = true} "
                                "to leave such variables as they are");
        }
        detail::check_compatible(index_path, v, *saved);
        detail::restore_variables(deferred->dir, {v}, deferred->index.step);
        deferred->pending.erase(name);
        if (deferred->pending.empty()) {
            lock.unlock();
            strategy->set_variable_created_hook({});  // the hook (and this lambda) goes: touch nothing after
        }
    });
}

PSS_NAMESPACE_END
