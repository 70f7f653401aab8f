// pss/concepts/transport.hpp: the Transport concept, how a request reaches a task and its reply comes back.
#pragma once

#include <concepts>
#include <future>
#include <utility>

#include <pss/cluster/cluster_spec.hpp>
#include <pss/config.hpp>
#include <pss/message.hpp>

PSS_NAMESPACE_BEGIN

namespace detail {

template <class T>
concept transport_is_constructible_from_cluster_spec = std::constructible_from<T, const ClusterSpec&>;

template <class T>
concept transport_has_serve_with_responder = requires(T& t, const TaskId& task, RequestHandler handler) {
    t.serve(task, std::move(handler));
};

template <class T>
concept transport_has_send_returning_future_reply = requires(T& t, const TaskId& task, Request request) {
    { t.send(task, std::move(request)) } -> std::same_as<std::future<Reply>>;
};

template <class T>
concept transport_has_shutdown = requires(T& t) { t.shutdown(); };

/// @brief The optional member of Transport: `T::crosses_processes`, a constant true when the tasks it
/// reaches may be other processes. Absent means false (InProcessTransport).
template <class T>
concept transport_crosses_processes = requires {
    requires static_cast<bool>(T::crosses_processes);
};

}  // namespace detail

/// @brief Transport: how a request reaches a task and its reply comes back.
///
/// A Transport is the policy a ParameterServerStrategy sends every variable operation through. The
/// strategy never touches another task's memory: each operation is a Request to the task that owns the
/// shard, answered by a Reply.
///
/// @par Requirements
/// `T` is a Transport when, for `t` an lvalue of `T`, `spec` a `const ClusterSpec&`, `task` a
/// `const TaskId&`, `h` a `RequestHandler` (`std::function<void(Request&&, Responder)>`) and `r` a
/// `Request` rvalue:
///
/// | expression | type | semantics |
/// | --- | --- | --- |
/// | `T(spec)` | | a transport for the tasks of `spec` (fragment `transport_is_constructible_from_cluster_spec`) |
/// | `t.serve(task, h)` | | `task` calls `h(request, respond)` for each request that reaches it; the Reply the handler gives `respond`, before `h` returns or later from any thread, is the request's reply (fragment `transport_has_serve_with_responder`) |
/// | `t.send(task, r)` | `std::future<Reply>` | delivers `r` to `task`; the future holds its Reply (fragment `transport_has_send_returning_future_reply`) |
/// | `t.shutdown()` | | stops serving; idempotent (fragment `transport_has_shutdown`) |
///
/// Optional: `T::crosses_processes`, a `static constexpr bool`, true when the tasks may be other
/// processes (TcpTransport, AutoTransport). With it, a strategy whose resolver names this process's task
/// (and whose rpc_layer is not "inproc") serves that one task here and reaches the others through `T`;
/// without it (or false), the whole cluster runs in this process (fragment `transport_crosses_processes`).
///
/// @par Rules the compiler cannot check
/// - Requests to one task are handled one at a time, in the order `send` was called from one thread:
///   a shard is never updated by two requests at once, so an optimizer step is atomic. A handler that
///   keeps its Responder has finished handling: the task goes on to its next request, and replies may
///   come back in another order than their requests went.
/// - A reply can wait: the transport delivers a Responder's Reply whenever it comes (a ParameterServer
///   holds a synchronous pull until its step is applied), and a Responder destroyed unanswered answers
///   `ErrorCode::unavailable`, so a future from `send` always completes, also across `shutdown()`.
/// - `send` never throws for a remote failure: an unreachable task, or one that has shut down, gives a
///   Reply with `ErrorCode::unavailable`; a handler's error comes back as its Reply.
/// - Payload tensors are moved, never copied, where the transport can (in-process always).
/// - A request may name a slot of a batch its reply should go to (`request.in_process.reply_to`: the
///   shards of one Variable operation, or a Group's writes, waited for as one). A transport that
///   delivers there (through detail::ReplyTarget, as InProcessTransport and TcpTransport do) returns an
///   invalid future; one that ignores the slot returns a valid future as always, and pss waits on it.
///   Either is a Transport; filling slots saves the sender a wake-up per reply.
/// - After `shutdown()`, `send` answers with `ErrorCode::unavailable` and no handler runs again.
///
/// @par Models
/// InProcessTransport (threads in one process), TcpTransport (processes, over TCP), AutoTransport (either,
/// by the kind of address), SimulatedTransport (threads in one process, on a seeded network that loses,
/// repeats and delays messages and crashes tasks).
///
/// Optional: `t.on_crash(task, f)`, for a transport whose tasks can lose their state (SimulatedTransport):
/// `f` runs on the task's thread when it crashed, and the embedded cluster then drops that ps task's
/// shards and answers its operations `unavailable` until ClusterCoordinator::recover_ps_from recovers it.
template <class T>
concept Transport = detail::transport_is_constructible_from_cluster_spec<T> && detail::transport_has_serve_with_responder<T> &&
                    detail::transport_has_send_returning_future_reply<T> && detail::transport_has_shutdown<T>;

PSS_NAMESPACE_END
