// expect-error: transport_has_serve_with_responder
// A transport whose handler must return the Reply (the shape before replies could wait) is not a
// Transport: a ps holds a synchronous pull and answers it later, through the Responder it is given.
#include <future>

#include <pss/pss.hpp>

struct ReplyNowTransport {
    explicit ReplyNowTransport(const pss::ClusterSpec&) {}
    void serve(const pss::TaskId&, std::function<pss::Reply(pss::Request&&)>) {}
    std::future<pss::Reply> send(const pss::TaskId&, pss::Request) { return {}; }
    void shutdown() {}
};

pss::ParameterServerStrategy<ReplyNowTransport> strategy;
