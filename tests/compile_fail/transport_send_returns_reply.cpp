// expect-error: transport_has_send_returning_future_reply
// A transport whose send answers a Reply at once (not a std::future<Reply>) is not a Transport: the
// strategy issues one request per shard in parallel and needs to wait for them later.
#include <pss/pss.hpp>

struct BlockingTransport {
    explicit BlockingTransport(const pss::ClusterSpec&) {}
    void serve(const pss::TaskId&, pss::RequestHandler) {}
    pss::Reply send(const pss::TaskId&, pss::Request) { return {}; }
    void shutdown() {}
};

pss::ParameterServerStrategy<BlockingTransport> strategy;
