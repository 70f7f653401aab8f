// pss/message.hpp: Request and Reply, the messages every transport carries between tasks.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <type_traits>
#include <string>
#include <string_view>
#include <vector>

#include <pss/cluster/cluster_spec.hpp>
#include <pss/compression.hpp>
#include <pss/config.hpp>
#include <pss/errors.hpp>
#include <pss/initializer.hpp>
#include <pss/tensor.hpp>

PSS_NAMESPACE_BEGIN

/// @brief What a request asks a parameter server to do with one shard. Values are part of the wire format.
enum class Op : std::uint8_t {
    /// store `payload` as a new shard (its first value), or without a payload, draw it from `initializer`
    /// on this task; `name` names it in errors
    create = 1,
    read = 2,            ///< reply with the shard's value; a `payload` of the right shape is reused as the buffer
    assign = 3,          ///< value = payload
    assign_add = 4,      ///< value += payload
    assign_sub = 5,      ///< value -= payload
    scatter_add = 6,     ///< value[ids[i]] += payload[i]
    scatter_sub = 7,     ///< value[ids[i]] -= payload[i]
    scatter_update = 8,  ///< value[ids[i]] = payload[i], in order (a repeated id keeps its last row)
    gather = 9,          ///< reply with value[ids[i]] for each i
    apply_dense = 10,    ///< the optimizer applies the gradient `payload` to the whole shard
    apply_sparse = 11,   ///< the optimizer applies gradient rows `payload` to rows `ids` (repeated ids summed)
    destroy = 12,        ///< forget the shard
    // 13 and 14 are the frame kinds of a call and a shutdown (RequestKind), not shard operations.
    // Checkpoints (checkpoint.hpp): the ps reads and writes its shards' files itself.
    save_shard = 15,      ///< write the shard and its slots as .npy files at path prefix `name`; the reply's message lists them (JSON)
    restore_shard = 16,   ///< stage rows [ids[0], ids[1]) of the saved variable in `name` ("directory\nvariable")
    commit_restore = 17,  ///< replace the shard's value and slots by the staged ones
    abort_restore = 18,   ///< forget the staged value and slots
    scatter_mul = 19,     ///< value[ids[i]] *= payload[i]
    scatter_div = 20,     ///< value[ids[i]] /= payload[i] (an integer divisor of 0 is refused before anything changes)
    scatter_min = 21,     ///< value[ids[i]] = min(value[ids[i]], payload[i])
    scatter_max = 22,     ///< value[ids[i]] = max(value[ids[i]], payload[i])
    /// every push to this task applies at rate `payload` (a float64 scalar) from now on, or at the
    /// optimizer's own again (no payload); the key is not read (Keras' `optimizer.learning_rate = r`)
    set_learning_rate = 23,
};

/// @brief What a request asks of a task: an operation on one shard of a ps, a function call on a
/// worker, the end of the cluster, or a sign of life.
enum class RequestKind : std::uint8_t {
    operation = 0,  ///< `op` on the shard `key` of a parameter server
    call = 1,       ///< a worker runs the registered function `name` on the arguments `values`
    shutdown = 2,   ///< the coordinator ends the cluster: the task stops serving once it has answered
    heartbeat = 3,  ///< is the task alive? Its transport answers at once; the handler never sees it
};

/// @brief True when a successful reply to `op` carries a value (not the spent request payload).
[[nodiscard]] constexpr bool reply_carries_value(Op op) noexcept { return op == Op::read || op == Op::gather; }

/// @brief True for the operations that combine rows `payload` into rows `ids`, one by one in order
/// (TensorFlow's scatter family).
[[nodiscard]] constexpr bool is_scatter(Op op) noexcept {
    return op == Op::scatter_add || op == Op::scatter_sub || op == Op::scatter_update || op == Op::scatter_mul ||
           op == Op::scatter_div || op == Op::scatter_min || op == Op::scatter_max;
}

/// @brief True for a pull: an operation that reads values (read, gather).
[[nodiscard]] constexpr bool is_pull(Op op) noexcept { return op == Op::read || op == Op::gather; }

/// @brief True for a push: an operation that changes values from its payload (assign, assign_add,
/// assign_sub, the scatters, apply_gradient, apply_sparse_gradient).
[[nodiscard]] constexpr bool is_push(Op op) noexcept {
    return op == Op::assign || op == Op::assign_add || op == Op::assign_sub || op == Op::apply_dense ||
           op == Op::apply_sparse || is_scatter(op);
}

/// @brief The name of an operation as the public API spells it, for error messages.
[[nodiscard]] constexpr std::string_view op_name(Op op) noexcept {
    switch (op) {
        case Op::create: return "create";
        case Op::read: return "read";
        case Op::assign: return "assign";
        case Op::assign_add: return "assign_add";
        case Op::assign_sub: return "assign_sub";
        case Op::scatter_add: return "scatter_add";
        case Op::scatter_sub: return "scatter_sub";
        case Op::scatter_update: return "scatter_update";
        case Op::gather: return "sparse_read";
        case Op::apply_dense: return "apply_gradient";
        case Op::apply_sparse: return "apply_sparse_gradient";
        case Op::destroy: return "destroy";
        case Op::save_shard: return "save_shard";
        case Op::restore_shard: return "restore_shard";
        case Op::commit_restore: return "commit_restore";
        case Op::abort_restore: return "abort_restore";
        case Op::scatter_mul: return "scatter_mul";
        case Op::scatter_div: return "scatter_div";
        case Op::scatter_min: return "scatter_min";
        case Op::scatter_max: return "scatter_max";
        case Op::set_learning_rate: return "set_learning_rate";
    }
    return "unknown operation";
}

/// @brief Which shard a request is about: the strategy numbers variables, a variable numbers its shards.
struct ShardKey {
    std::uint64_t variable = 0;
    std::uint32_t shard = 0;
    friend bool operator==(const ShardKey&, const ShardKey&) = default;
};

/// @brief The arguments or the result of a function call: the values in CBOR (nlohmann/json's), in
/// which a tensor is a reference to one of `tensors`; the tensors travel as wire sections of their own,
/// so that their bytes are never copied into the CBOR.
struct Values {
    std::vector<std::uint8_t> cbor;
    std::vector<Tensor> tensors;
};

namespace detail {
class ReplyBatch;

/// A slot of a ReplyBatch, where a request's reply goes instead of a future (Request::in_process.reply_to).
struct ReplySlot {
    std::shared_ptr<ReplyBatch> batch;
    std::size_t index = 0;
    [[nodiscard]] explicit operator bool() const noexcept { return batch != nullptr; }
};
}  // namespace detail

/// @brief A request to one task. Moving a Request moves its tensors; nothing in it is copied in transit.
struct Request {
    RequestKind kind = RequestKind::operation;
    Op op = Op::read;  ///< the shard operation (kind `operation` only)
    ShardKey key;
    std::string name;               ///< the shard's display name, sent with `create`; a call's function
    Tensor payload;                 ///< value, delta, gradient, rows, or a buffer to read into
    std::vector<std::int64_t> ids;  ///< row ids of the scatter, gather and sparse operations
    /// The training step a synchronous push belongs to, or a synchronous pull is for (1, 2, ...);
    /// 0 outside synchronous training. A commit_restore's is the checkpoint's step, from which a
    /// synchronous ps counts the shard's applied steps on.
    std::uint64_t step = 0;
    /// A push's float32 payload holds 16-bit numbers of this kind (its sender rounded them), and a pull
    /// asks for its value in them; across a wire they travel as 16 bits (see Compression).
    Compression compression = Compression::none;
    Values values;  ///< a call's arguments (kind `call` only)
    /// What a create without a payload draws its shard from, on the ps task (the coordinator never holds
    /// the value); on the wire, the words of the ids section (see wire.hpp).
    std::optional<ShardInitializer> initializer;
    /// The task that sent it, when its link proved which (TcpTransport over TLS sets it from the peer's
    /// certificate); never sent on the wire. A synchronous ps takes one push per sender and step.
    std::optional<TaskId> sender;
    /// What only a ps sharing this process's memory acts on (Channel::shares_memory); never sent on
    /// the wire, so a frame is always checked and answered with its value.
    struct InProcess {
        /// Where a gather writes its rows: id i's row goes to row `into_rows[i]` of `*into`, the
        /// caller's result, and the reply carries no value (no reply buffer, no copy back). Shared, so
        /// that a pull held at the ps and given up on by its caller still writes into memory that exists.
        std::shared_ptr<Tensor> into;
        std::vector<std::size_t> into_rows;
        /// Where a scatter's or an apply_sparse's rows lie, in this process: id i's row is row
        /// `from_rows[i]` of `*from`, the caller's rows, and the request carries no payload (no copy a
        /// shard). The ps reads only its ids' rows there; an apply_sparse may sum a repeated id's rows
        /// into the first of them.
        std::shared_ptr<Tensor> from;
        std::vector<std::size_t> from_rows;
        /// Its sender validated it against the whole variable: the ps does not again.
        bool checked = false;
        /// Its sender waits for the reply at once, and sends nothing on this thread meanwhile: a
        /// transport may make the exchange on the sender's thread (TcpTransport does, on an idle
        /// plaintext link), so that the reply costs no hand-off between threads.
        bool waited_at_once = false;
        /// Where the reply goes, when the sender waits on a batch of requests: a transport that delivers
        /// it there (detail::ReplyTarget) returns an invalid future from `send`; one that returns a
        /// valid future leaves the reply to it.
        detail::ReplySlot reply_to;
    };
    InProcess in_process;
};

/// @brief A task's answer: `code` is ok, or the error the task raised with its message.
struct Reply {
    ErrorCode code = ErrorCode::ok;
    std::string message;
    Tensor payload;  ///< a read or gathered value; for updates, the spent request payload handed back
    Values values;   ///< what a call answered (its result, or the error the function raised)
    /// A float32 payload crosses a wire as 16-bit numbers of this kind, rounded to nearest (a transport
    /// sets it from the pull's Request::compression).
    Compression compression = Compression::none;

    [[nodiscard]] bool ok() const noexcept { return code == ErrorCode::ok; }

    /// @brief The payload when ok; otherwise throws the Error subclass of `code` with `message`.
    Tensor take() {
        if (!ok()) throw_error(code, message);
        return std::move(payload);
    }

    /// @brief A call's answer when ok; otherwise throws the Error subclass of `code` with `message`.
    Values take_values() {
        if (!ok()) throw_error(code, message);
        return std::move(values);
    }

    [[nodiscard]] static Reply error(ErrorCode code, std::string message) {
        return Reply{code, std::move(message), {}, {}};
    }

    /// @brief The error reply of the exception being handled (call it in a catch block): an Error keeps
    /// its code and message; anything else is `internal`, its message after `internal_prefix`.
    [[nodiscard]] static Reply of_current_exception(std::string_view internal_prefix = "pss: internal error: ") {
        try {
            throw;
        } catch (const Error& e) {
            return error(e.code(), e.what());
        } catch (const std::exception& e) {
            return error(ErrorCode::internal, std::string(internal_prefix) + e.what());
        } catch (...) {
            return error(ErrorCode::internal, std::string(internal_prefix) + "an exception of an unknown type");
        }
    }
};

namespace detail {

/// The call with which a chief or worker checks, as it starts, that every ps runs its configuration
/// (strategy.hpp); the one call a worker or evaluator may make.
inline constexpr std::string_view handshake_call = "pss.handshake";

/// Where a Responder delivers its one Reply (a promise, a connection's write queue).
class ReplySink {
public:
    virtual ~ReplySink() = default;
    virtual void deliver(Reply&& reply) noexcept = 0;
};

template <class Deliver>
class ReplySinkOf final : public ReplySink {
public:
    explicit ReplySinkOf(Deliver deliver) : deliver_(std::move(deliver)) {}
    void deliver(Reply&& reply) noexcept override { deliver_(std::move(reply)); }

private:
    Deliver deliver_;
};

}  // namespace detail

/// @brief The one-shot answer to one request: a handler calls it with the Reply, at once or later, from
/// any thread.
///
/// A handler that cannot answer yet (a synchronous pull for a step not applied) keeps its Responder and
/// calls it when it can; the handler returns at once, so the task handles its next request meanwhile. A
/// Responder destroyed without having answered answers `ErrorCode::unavailable` ("the task dropped the
/// request"): a sender's future always completes. Move-only.
class Responder {
public:
    /// @brief An empty responder: answering it does nothing.
    Responder() = default;

    /// @brief A responder that hands its Reply to `deliver(Reply&&)`, which must not throw.
    template <class Deliver>
        requires std::invocable<Deliver&, Reply&&> && (!std::same_as<std::decay_t<Deliver>, Responder>)
    explicit Responder(Deliver deliver)
        : sink_(std::make_unique<detail::ReplySinkOf<std::decay_t<Deliver>>>(std::move(deliver))) {}

    Responder(Responder&&) noexcept = default;
    Responder& operator=(Responder&& other) noexcept {
        if (this != &other) {
            drop();
            sink_ = std::move(other.sink_);
        }
        return *this;
    }
    Responder(const Responder&) = delete;
    Responder& operator=(const Responder&) = delete;
    ~Responder() { drop(); }

    /// @brief Answers the request with `reply`. A second call does nothing.
    void operator()(Reply reply) noexcept {
        if (auto sink = std::move(sink_)) sink->deliver(std::move(reply));
    }

    /// @brief True until the responder has answered (false for an empty one).
    [[nodiscard]] explicit operator bool() const noexcept { return sink_ != nullptr; }

private:
    void drop() noexcept {
        if (!sink_) return;
        (*this)(Reply::error(ErrorCode::unavailable,
                             "pss: the task dropped the request without answering it (it shut down, or its handler "
                             "lost the responder)"));
    }

    std::unique_ptr<detail::ReplySink> sink_;
};

/// @brief What a serving task runs for each request that reaches it: it answers through the Responder,
/// before it returns or later. Must not throw: errors are replies.
using RequestHandler = std::function<void(Request&&, Responder)>;

/// @brief A RequestHandler from a function that answers every request at once: `f(request)` is the
/// Reply; an exception it throws becomes the error reply (an Error its code, anything else `internal`).
/// @par Example
/// `transport.serve(task, pss::answer_at_once([](pss::Request&&) { return pss::Reply{}; }));`
template <class Handler>
    requires std::is_invocable_r_v<Reply, Handler&, Request&&>
[[nodiscard]] RequestHandler answer_at_once(Handler handler) {
    return [handler = std::move(handler)](Request&& request, Responder respond) mutable {
        try {
            respond(handler(std::move(request)));
        } catch (...) {
            respond(Reply::of_current_exception("pss: internal error in a request handler: "));
        }
    };
}

PSS_NAMESPACE_END
