// archetypes/transport.hpp: TransportArchetype, the least type that meets pss::Transport.
#pragma once

#include <future>
#include <utility>

#include <pss/cluster/cluster_spec.hpp>
#include <pss/concepts/transport.hpp>
#include <pss/config.hpp>
#include <pss/message.hpp>

PSS_NAMESPACE_BEGIN

namespace archetypes {

/// @brief The least type that meets Transport: constructible from a ClusterSpec, serve, send, shutdown.
/// It hands every request to the one handler it was given, on the caller's thread, with a Responder
/// that fills the returned future whenever the handler answers (requests to one task are then handled
/// one at a time only if the caller sends from one thread, which is all the archetype promises). Not
/// copyable or movable: the concept requires neither.
class TransportArchetype {
public:
    explicit TransportArchetype(const ClusterSpec&) {}
    TransportArchetype(const TransportArchetype&) = delete;
    TransportArchetype& operator=(const TransportArchetype&) = delete;

    void serve(const TaskId&, RequestHandler handler) { handler_ = std::move(handler); }
    std::future<Reply> send(const TaskId&, Request request) {
        std::promise<Reply> reply;
        auto future = reply.get_future();
        Responder respond([reply = std::move(reply)](Reply&& r) mutable { reply.set_value(std::move(r)); });
        if (handler_)
            handler_(std::move(request), std::move(respond));
        else
            respond(Reply::error(ErrorCode::unavailable, "pss: archetype: no task is served"));
        return future;
    }
    void shutdown() { handler_ = nullptr; }

private:
    RequestHandler handler_;
};

}  // namespace archetypes

PSS_NAMESPACE_END
