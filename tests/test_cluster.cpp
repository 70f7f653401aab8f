// test_cluster.cpp: ClusterSpec, TaskId, the ClusterResolver concept and its models (Simple, Local, TFConfig).
#include <cstddef>
#include <cstdlib>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <archetypes/cluster_resolver.hpp>
#include <pss/cluster/cluster_spec.hpp>
#include <pss/cluster/local.hpp>
#include <pss/cluster/simple.hpp>
#include <pss/cluster/tf_config.hpp>
#include <pss/concepts/cluster_resolver.hpp>
#include <pss/errors.hpp>

namespace {

using pss::ClusterSpec;
using pss::TaskId;

/// The message of the `Error` that `f` throws; "<no exception>" when it throws nothing. An exception of
/// another type escapes and fails the test case.
template <class Error, class F>
std::string message_of(F&& f) {
    try {
        f();
    } catch (const Error& error) {
        return error.what();
    }
    return "<no exception>";
}

std::string tf_config_error(std::string_view tf_config) {
    return message_of<pss::InvalidArgumentError>([&] { (void)pss::TFConfigClusterResolver(tf_config); });
}

constexpr std::string_view kubeflow_worker_1 =
    R"({"cluster":{"chief":["tfjob-chief-0.ns.svc:2222"],"ps":["tfjob-ps-0.ns.svc:2222"],)"
    R"("worker":["tfjob-worker-0.ns.svc:2222","tfjob-worker-1.ns.svc:2222"]},)"
    R"("task":{"type":"worker","index":1},"environment":"cloud"})";

/// TF_CONFIG with a valid cluster (one chief, two ps, two workers) and the given "task" JSON.
std::string with_task(std::string_view task) {
    return R"({"cluster":{"chief":["c0:2222"],"ps":["p0:2222","p1:2222"],"worker":["w0:2222","w1:2222"]},"task":)" +
           std::string(task) + "}";
}

/// TF_CONFIG with the given "cluster" JSON and task worker 0.
std::string with_cluster(std::string_view cluster) {
    return R"({"cluster":)" + std::string(cluster) + R"(,"task":{"type":"worker","index":0}})";
}

/// Sets or unsets an environment variable for one scope, then puts back what was there.
class ScopedEnv {
public:
    ScopedEnv(const char* name, const char* value) : name_(name) {
        if (const char* old = std::getenv(name)) old_ = old;
        if (value == nullptr) {
            ::unsetenv(name);
        } else {
            ::setenv(name, value, 1);
        }
    }
    ~ScopedEnv() {
        if (old_) {
            ::setenv(name_, old_->c_str(), 1);
        } else {
            ::unsetenv(name_);
        }
    }
    ScopedEnv(const ScopedEnv&) = delete;
    ScopedEnv& operator=(const ScopedEnv&) = delete;

private:
    const char* name_;
    std::optional<std::string> old_;
};

// Near misses of ClusterResolver, one requirement broken each.
struct MissingRpcLayer {
    ClusterSpec cluster_spec() const { return {}; }
    std::string task_type() const { return ""; }
    int task_id() const { return 0; }
};
struct StringTaskId {
    ClusterSpec cluster_spec() const { return {}; }
    std::string task_type() const { return ""; }
    std::string task_id() const { return "0"; }
    std::string rpc_layer() const { return ""; }
};
struct StringViewTaskType {  // std::string_view converts to std::string only explicitly
    ClusterSpec cluster_spec() const { return {}; }
    std::string_view task_type() const { return ""; }
    int task_id() const { return 0; }
    std::string rpc_layer() const { return ""; }
};
struct MapClusterSpec {  // ClusterSpec's map constructor is explicit
    ClusterSpec::JobMap cluster_spec() const { return {}; }
    std::string task_type() const { return ""; }
    int task_id() const { return 0; }
    std::string rpc_layer() const { return ""; }
};
struct NonConstMembers {
    ClusterSpec cluster_spec() { return {}; }
    std::string task_type() { return ""; }
    int task_id() { return 0; }
    std::string rpc_layer() { return ""; }
};
struct MissingClusterSpec {
    std::string task_type() const { return ""; }
    int task_id() const { return 0; }
    std::string rpc_layer() const { return ""; }
};

/// The ClusterResolver rules the compiler cannot check (1 to 3), through the concept's interface only.
template <pss::ClusterResolver ClusterResolverPolicy>
void check_cluster_resolver_rules(const ClusterResolverPolicy& resolver) {
    const ClusterSpec spec = resolver.cluster_spec();
    const std::string type = resolver.task_type();
    const int id = resolver.task_id();
    const std::string rpc_layer = resolver.rpc_layer();
    // 1. Stable answers.
    CHECK(ClusterSpec(resolver.cluster_spec()) == spec);
    CHECK(std::string(resolver.task_type()) == type);
    CHECK(static_cast<int>(resolver.task_id()) == id);
    CHECK(std::string(resolver.rpc_layer()) == rpc_layer);
    // 2. The task type is empty, "evaluator", or a job of the spec.
    CHECK((type.empty() || type == "evaluator" || spec.has_job(type)));
    // 3. The id is not negative and within its job.
    CHECK(id >= 0);
    if (spec.has_job(type)) CHECK(id < spec.num_tasks(type));
    if (type.empty()) CHECK(id == 0);
    // ParameterServerStrategy's shape.
    CHECK_NOTHROW(pss::detail::check_parameter_server_cluster(spec, "test", "the cluster spec"));
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------

TEST_SUITE("ClusterSpec") {
    TEST_CASE("ClusterSpec: a default ClusterSpec has no jobs and 0 tasks of any job") {
        const ClusterSpec spec;
        CHECK(spec.empty());
        CHECK(spec.jobs().empty());
        CHECK(spec.as_dict().empty());
        CHECK(spec.num_tasks("ps") == 0);
        CHECK_FALSE(spec.has_job("ps"));
        CHECK(spec.tasks().empty());
        CHECK(spec.to_json().dump() == "{}");
    }

    TEST_CASE("ClusterSpec: {ps: 2 tasks, worker: 3 tasks} lists jobs sorted and addresses in task order") {
        const ClusterSpec spec{{"worker", {"w0:2222", "w1:2222", "w2:2222"}}, {"ps", {"p0:2222", "p1:2222"}}};
        CHECK_FALSE(spec.empty());
        CHECK(spec.jobs() == std::vector<std::string>{"ps", "worker"});
        CHECK(spec.has_job("ps"));
        CHECK(spec.has_job("worker"));
        CHECK_FALSE(spec.has_job("chief"));
        CHECK(spec.num_tasks("ps") == 2);
        CHECK(spec.num_tasks("worker") == 3);
        CHECK(spec.num_tasks("chief") == 0);
        CHECK(spec.task_address("ps", 0) == "p0:2222");
        CHECK(spec.task_address("ps", 1) == "p1:2222");
        CHECK(spec.task_address("worker", 2) == "w2:2222");
        CHECK(spec.task_address(TaskId{"worker", 1}) == "w1:2222");
        CHECK(spec.job_tasks("worker") == std::vector<std::string>{"w0:2222", "w1:2222", "w2:2222"});
        CHECK(spec.as_dict() == ClusterSpec::JobMap{{"ps", {"p0:2222", "p1:2222"}},
                                                    {"worker", {"w0:2222", "w1:2222", "w2:2222"}}});
        CHECK(spec.tasks() == std::vector<TaskId>{{"ps", 0}, {"ps", 1}, {"worker", 0}, {"worker", 1}, {"worker", 2}});
    }

    TEST_CASE("ClusterSpec: a job with an empty task list exists and has 0 tasks") {
        const ClusterSpec spec{{"ps", {}}};
        CHECK(spec.has_job("ps"));
        CHECK(spec.num_tasks("ps") == 0);
        CHECK(spec.jobs() == std::vector<std::string>{"ps"});
        CHECK(message_of<pss::OutOfRangeError>([&] { (void)spec.task_address("ps", 0); }) ==
              R"(pss: ClusterSpec: job "ps" has no task 0; it has 0 tasks)");
    }

    TEST_CASE("ClusterSpec: task_address of an absent job throws NotFoundError listing the jobs") {
        const ClusterSpec spec{{"ps", {"p0:2222"}}, {"worker", {"w0:2222"}}};
        CHECK(message_of<pss::NotFoundError>([&] { (void)spec.task_address("chief", 0); }) ==
              R"(pss: ClusterSpec has no job "chief"; its jobs are ps, worker)");
        CHECK(message_of<pss::NotFoundError>([&] { (void)spec.job_tasks("evaluator"); }) ==
              R"(pss: ClusterSpec has no job "evaluator"; its jobs are ps, worker)");
        CHECK(message_of<pss::NotFoundError>([] { (void)ClusterSpec().task_address("ps", 0); }) ==
              R"(pss: ClusterSpec has no job "ps"; it has no jobs)");
    }

    TEST_CASE("ClusterSpec: task_address index 2 and -1 of a 2-task job throw OutOfRangeError") {
        const ClusterSpec spec{{"worker", {"w0:2222", "w1:2222"}}};
        CHECK(message_of<pss::OutOfRangeError>([&] { (void)spec.task_address("worker", 2); }) ==
              R"(pss: ClusterSpec: job "worker" has no task 2; it has 2 tasks, 0 to 1)");
        CHECK(message_of<pss::OutOfRangeError>([&] { (void)spec.task_address("worker", -1); }) ==
              R"(pss: ClusterSpec: job "worker" has no task -1; it has 2 tasks, 0 to 1)");
        CHECK(message_of<pss::OutOfRangeError>([&] { (void)spec.task_address(TaskId{"worker", 5}); }) ==
              R"(pss: ClusterSpec: job "worker" has no task 5; it has 2 tasks, 0 to 1)");
    }

    TEST_CASE("ClusterSpec: equal job maps compare equal whichever constructor made them") {
        const ClusterSpec a{{"ps", {"p0:1"}}, {"worker", {"w0:1", "w1:1"}}};
        const ClusterSpec b(ClusterSpec::JobMap{{"worker", {"w0:1", "w1:1"}}, {"ps", {"p0:1"}}});
        const ClusterSpec c = ClusterSpec::from_json(nlohmann::json::parse(R"({"worker":["w0:1","w1:1"],"ps":["p0:1"]})"));
        CHECK(a == b);
        CHECK(a == c);
        CHECK_FALSE(a == ClusterSpec{{"ps", {"p0:1"}}, {"worker", {"w1:1", "w0:1"}}});  // task order matters
        CHECK_FALSE(a == ClusterSpec{{"ps", {"p0:1"}}, {"worker", {"w0:1", "w1:1"}}, {"chief", {}}});
        CHECK(a != ClusterSpec{});
    }

    TEST_CASE("ClusterSpec: a job given twice in an initializer list throws InvalidArgumentError") {
        CHECK(message_of<pss::InvalidArgumentError>([] { (void)ClusterSpec{{"ps", {"a:1"}}, {"ps", {"b:1"}}}; }) ==
              R"(pss: ClusterSpec: job "ps" is given twice)");
    }

    TEST_CASE("ClusterSpec: job names \"1worker\", \"\" and \"job:x\" are rejected; \"worker_2\" is accepted") {
        const std::string rule =
            "\" is not valid; a job name starts with a letter and has only letters, digits and '_' (as in "
            "\"/job:worker\")";
        CHECK(message_of<pss::InvalidArgumentError>([] { (void)ClusterSpec{{"1worker", {"a:1"}}}; }) ==
              "pss: ClusterSpec: job name \"1worker" + rule);
        CHECK(message_of<pss::InvalidArgumentError>([] { (void)ClusterSpec{{"", {"a:1"}}}; }) ==
              "pss: ClusterSpec: job name \"" + rule);
        CHECK(message_of<pss::InvalidArgumentError>([] { (void)ClusterSpec(ClusterSpec::JobMap{{"job:x", {"a:1"}}}); }) ==
              "pss: ClusterSpec: job name \"job:x" + rule);
        CHECK(ClusterSpec{{"worker_2", {"a:1"}}}.num_tasks("worker_2") == 1);
    }

    TEST_CASE("ClusterSpec: an empty address throws InvalidArgumentError naming the job and task") {
        CHECK(message_of<pss::InvalidArgumentError>([] { (void)ClusterSpec{{"worker", {"w0:1", ""}}}; }) ==
              R"(pss: ClusterSpec: job "worker" task 1 has an empty address; give it as "host:port")");
    }

    TEST_CASE("ClusterSpec: from_json and to_json round-trip {ps: [p0:2222], worker: [w0:2222, w1:2222]}") {
        const auto json = nlohmann::json::parse(R"({"worker":["w0:2222","w1:2222"],"ps":["p0:2222"]})");
        const ClusterSpec spec = ClusterSpec::from_json(json);
        CHECK(spec == ClusterSpec{{"ps", {"p0:2222"}}, {"worker", {"w0:2222", "w1:2222"}}});
        CHECK(spec.to_json().dump() == R"({"ps":["p0:2222"],"worker":["w0:2222","w1:2222"]})");
        CHECK(ClusterSpec::from_json(spec.to_json()) == spec);
        // nlohmann/json's own conversions.
        const nlohmann::json converted = spec;
        CHECK(converted == json);
        CHECK(converted.get<ClusterSpec>() == spec);
        // Printing, as doctest does on a failed CHECK.
        std::ostringstream out;
        out << spec;
        CHECK(out.str() == R"({"ps":["p0:2222"],"worker":["w0:2222","w1:2222"]})");
    }

    TEST_CASE("ClusterSpec: from_json rejects a non-object, a non-list job, a non-string task and an empty address") {
        const auto error = [](std::string_view text) {
            return message_of<pss::InvalidArgumentError>(
                [&] { (void)ClusterSpec::from_json(nlohmann::json::parse(text), "my cluster"); });
        };
        CHECK(error(R"(["w0:1"])") ==
              R"(pss: my cluster must be an object of job name to list of "host:port" strings, got array)");
        CHECK(error(R"({"worker":"w0:1"})") ==
              R"(pss: my cluster: job "worker" must be a list of "host:port" strings, got string)");
        CHECK(error(R"({"worker":["w0:1",7]})") ==
              R"(pss: my cluster: job "worker" task 1 must be a "host:port" string, got number)");
        CHECK(error(R"({"ps":[""]})") ==
              R"(pss: my cluster: job "ps" task 0 has an empty address; give it as "host:port")");
        CHECK(message_of<pss::InvalidArgumentError>([] { (void)ClusterSpec::from_json(nlohmann::json(3)); }) ==
              R"(pss: ClusterSpec JSON must be an object of job name to list of "host:port" strings, got number)");
    }

    TEST_CASE("TaskId: {ps, 1} is /job:ps/replica:0/task:1 and orders by job, then index") {
        CHECK(TaskId{"ps", 1}.to_string() == "/job:ps/replica:0/task:1");
        CHECK(TaskId{"worker", 12}.to_string() == "/job:worker/replica:0/task:12");
        CHECK(TaskId{"ps", 1} == TaskId{"ps", 1});
        CHECK(TaskId{"ps", 1} != TaskId{"ps", 0});
        CHECK(TaskId{"ps", 0} < TaskId{"ps", 1});
        CHECK(TaskId{"ps", 9} < TaskId{"worker", 0});
        CHECK(TaskId{"chief", 0} < TaskId{"ps", 0});
        std::ostringstream out;
        out << TaskId{"chief", 0};
        CHECK(out.str() == "/job:chief/replica:0/task:0");
    }
}

// ---------------------------------------------------------------------------------------------------------------

TEST_SUITE("SimpleClusterResolver") {
    TEST_CASE("SimpleClusterResolver: returns the spec, worker, 1 and grpc it was given") {
        const ClusterSpec spec{{"ps", {"p0:2222"}}, {"worker", {"w0:2222", "w1:2222"}}};
        const pss::SimpleClusterResolver resolver(spec, "worker", 1, "grpc");
        CHECK(resolver.cluster_spec() == spec);
        CHECK(resolver.task_type() == "worker");
        CHECK(resolver.task_id() == 1);
        CHECK(resolver.rpc_layer() == "grpc");
        check_cluster_resolver_rules(resolver);
    }

    TEST_CASE("SimpleClusterResolver: task_type, task_id and rpc_layer default to \"\", 0 and \"\"") {
        const pss::SimpleClusterResolver resolver(ClusterSpec{{"ps", {"p0:1"}}, {"worker", {"w0:1"}}});
        CHECK(resolver.task_type().empty());
        CHECK(resolver.task_id() == 0);
        CHECK(resolver.rpc_layer().empty());
        check_cluster_resolver_rules(resolver);
    }

    TEST_CASE("SimpleClusterResolver: an evaluator need not be a job of the spec, as in TensorFlow") {
        const pss::SimpleClusterResolver resolver(ClusterSpec{{"ps", {"p0:1"}}, {"worker", {"w0:1"}}}, "evaluator", 0);
        CHECK(resolver.task_type() == "evaluator");
        CHECK(resolver.task_id() == 0);
    }

    TEST_CASE("SimpleClusterResolver: a negative id, an absent job, id 2 of 2 tasks and an id without a type throw") {
        const ClusterSpec spec{{"ps", {"p0:1"}}, {"worker", {"w0:1", "w1:1"}}};
        CHECK(message_of<pss::InvalidArgumentError>([&] { (void)pss::SimpleClusterResolver(spec, "worker", -1); }) ==
              "pss: SimpleClusterResolver: task_id is -1 but must not be negative");
        CHECK(message_of<pss::InvalidArgumentError>([&] { (void)pss::SimpleClusterResolver(spec, "chief", 0); }) ==
              R"(pss: SimpleClusterResolver: task_type "chief" is not a job of the cluster spec; its jobs are ps, worker)");
        CHECK(message_of<pss::InvalidArgumentError>([] { (void)pss::SimpleClusterResolver(ClusterSpec{}, "ps", 0); }) ==
              R"(pss: SimpleClusterResolver: task_type "ps" is not a job of the cluster spec; the spec has no jobs)");
        CHECK(message_of<pss::InvalidArgumentError>([&] { (void)pss::SimpleClusterResolver(spec, "worker", 2); }) ==
              R"(pss: SimpleClusterResolver: task_id is 2 but job "worker" has 2 tasks)");
        CHECK(message_of<pss::InvalidArgumentError>([&] { (void)pss::SimpleClusterResolver(spec, "", 1); }) ==
              "pss: SimpleClusterResolver: task_id is 1 but task_type is empty; a task without a type has id 0");
    }
}

// ---------------------------------------------------------------------------------------------------------------

TEST_SUITE("LocalClusterResolver") {
    using Local24 = pss::LocalClusterResolver<2, 4>;

    // Everything about the shape is a compile-time constant.
    static_assert(Local24::num_ps == 2);
    static_assert(Local24::num_workers == 4);
    static_assert(Local24::num_chiefs == 1);
    static_assert(Local24::num_tasks_total == 7);
    static_assert(Local24::num_tasks("ps") == 2);
    static_assert(Local24::num_tasks("worker") == 4);
    static_assert(Local24::num_tasks("chief") == 1);
    static_assert(Local24::num_tasks("evaluator") == 0);
    static_assert(Local24{}.task_id() == 0);
#if defined(__GNUC__) && !defined(__clang__)
    // The strings too, where the compiler can: clang 14 with libstdc++ 12 cannot build a short (SSO)
    // std::string in a constant expression. The test cases below check the same values at run time.
    static_assert(Local24{}.task_type() == "chief");
    static_assert(Local24{}.rpc_layer() == "inproc");
    static_assert(Local24::address("ps", 1) == "inproc:ps:1");
    static_assert(Local24::address("worker", 3) == "inproc:worker:3");
    static_assert(Local24::address("chief", 0) == "inproc:chief:0");
    static_assert(pss::LocalClusterResolver<1, 12>::address("worker", 11) == "inproc:worker:11");
#endif
    static_assert(pss::LocalClusterResolver<>::num_ps == 2 && pss::LocalClusterResolver<>::num_workers == 2);

    TEST_CASE("LocalClusterResolver<2, 4>: one chief, ps inproc:ps:0..1, workers inproc:worker:0..3") {
        const Local24 resolver;
        const ClusterSpec expected{{"chief", {"inproc:chief:0"}},
                                   {"ps", {"inproc:ps:0", "inproc:ps:1"}},
                                   {"worker", {"inproc:worker:0", "inproc:worker:1", "inproc:worker:2", "inproc:worker:3"}}};
        CHECK(resolver.cluster_spec() == expected);
        CHECK(resolver.task_type() == "chief");
        CHECK(resolver.task_id() == 0);
        CHECK(resolver.rpc_layer() == "inproc");
        CHECK(resolver.task() == TaskId{"chief", 0});
        CHECK(Local24::address("ps", 1) == "inproc:ps:1");
        CHECK(Local24::address("worker", 3) == "inproc:worker:3");
        CHECK(Local24::address("chief", 0) == "inproc:chief:0");
        CHECK(pss::LocalClusterResolver<1, 12>::address("worker", 11) == "inproc:worker:11");
        CHECK(resolver.cluster_spec().tasks().size() == static_cast<std::size_t>(Local24::num_tasks_total));
        check_cluster_resolver_rules(resolver);
    }

    TEST_CASE("LocalClusterResolver: cluster_spec() is one object for every call and every instance") {
        const Local24 a;
        const Local24 b;
        CHECK(&a.cluster_spec() == &a.cluster_spec());
        CHECK(&a.cluster_spec() == &b.cluster_spec());
        CHECK(pss::LocalClusterResolver<>{}.cluster_spec() ==
              ClusterSpec{{"chief", {"inproc:chief:0"}},
                          {"ps", {"inproc:ps:0", "inproc:ps:1"}},
                          {"worker", {"inproc:worker:0", "inproc:worker:1"}}});
        CHECK(pss::LocalClusterResolver<1, 1>{}.cluster_spec().num_tasks("ps") == 1);
    }

    TEST_CASE("LocalClusterResolver<2, 4>: address of job evaluator or ps task 2 throws") {
        CHECK(message_of<pss::NotFoundError>([] { (void)Local24::address("evaluator", 0); }) ==
              R"(pss: LocalClusterResolver has no job "evaluator"; its jobs are chief, ps, worker)");
        CHECK(message_of<pss::OutOfRangeError>([] { (void)Local24::address("ps", 2); }) ==
              R"(pss: LocalClusterResolver: job "ps" has no task 2; it has 2 tasks, 0 to 1)");
        CHECK(message_of<pss::OutOfRangeError>([] { (void)Local24::address("worker", -1); }) ==
              R"(pss: LocalClusterResolver: job "worker" has no task -1; it has 4 tasks, 0 to 3)");
    }
}

// ---------------------------------------------------------------------------------------------------------------

TEST_SUITE("TFConfigClusterResolver") {
    TEST_CASE("TFConfigClusterResolver: Kubeflow TFJob worker 1 of 2 with one chief and one ps") {
        const pss::TFConfigClusterResolver resolver(kubeflow_worker_1);
        CHECK(resolver.cluster_spec() == ClusterSpec{{"chief", {"tfjob-chief-0.ns.svc:2222"}},
                                                     {"ps", {"tfjob-ps-0.ns.svc:2222"}},
                                                     {"worker", {"tfjob-worker-0.ns.svc:2222", "tfjob-worker-1.ns.svc:2222"}}});
        CHECK(resolver.task_type() == "worker");
        CHECK(resolver.task_id() == 1);
        CHECK(resolver.rpc_layer().empty());
        CHECK(resolver.environment() == "cloud");
        CHECK(resolver.task().to_string() == "/job:worker/replica:0/task:1");
        CHECK(resolver.cluster_spec().task_address(resolver.task()) == "tfjob-worker-1.ns.svc:2222");
        check_cluster_resolver_rules(resolver);
    }

    TEST_CASE("TFConfigClusterResolver: default constructor reads TF_CONFIG from the environment") {
        const ScopedEnv env("TF_CONFIG", std::string(kubeflow_worker_1).c_str());
        const pss::TFConfigClusterResolver resolver;
        CHECK(resolver.task_type() == "worker");
        CHECK(resolver.task_id() == 1);
        CHECK(resolver.cluster_spec().num_tasks("worker") == 2);
        CHECK(resolver.environment() == "cloud");
    }

    TEST_CASE("TFConfigClusterResolver: unset, empty or blank TF_CONFIG throws NotFoundError") {
        const std::string fix =
            R"(; set it to JSON such as {"cluster": {"ps": ["ps0:2222"], "worker": ["worker0:2222"]}, )"
            R"("task": {"type": "worker", "index": 0}}, or use LocalClusterResolver for an in-process cluster)";
        SUBCASE("unset") {
            const ScopedEnv env("TF_CONFIG", nullptr);
            CHECK(message_of<pss::NotFoundError>([] { (void)pss::TFConfigClusterResolver(); }) ==
                  "pss: TF_CONFIG is not set" + fix);
        }
        SUBCASE("empty") {
            const ScopedEnv env("TF_CONFIG", "");
            CHECK(message_of<pss::NotFoundError>([] { (void)pss::TFConfigClusterResolver(); }) ==
                  "pss: TF_CONFIG is empty" + fix);
        }
        SUBCASE("blank text") {
            CHECK(message_of<pss::NotFoundError>([] { (void)pss::TFConfigClusterResolver::from_json_string(" \n\t"); }) ==
                  "pss: TF_CONFIG is empty" + fix);
        }
    }

    TEST_CASE("TFConfigClusterResolver: task.index given as the string \"1\" is 1, and 1.0 is 1") {
        CHECK(pss::TFConfigClusterResolver(with_task(R"({"type":"worker","index":"1"})")).task_id() == 1);
        CHECK(pss::TFConfigClusterResolver(with_task(R"({"type":"ps","index":1.0})")).task_id() == 1);
        CHECK(pss::TFConfigClusterResolver(with_task(R"({"type":"ps","index":"0"})")).task_id() == 0);
    }

    TEST_CASE("TFConfigClusterResolver: chief 0, ps 1 and rpc_layer grpc are read as given") {
        const pss::TFConfigClusterResolver chief(with_task(R"({"type":"chief","index":0})"));
        CHECK(chief.task_type() == "chief");
        CHECK(chief.task_id() == 0);
        const auto ps = pss::TFConfigClusterResolver::from_json_string(
            R"({"cluster":{"ps":["p0:1","p1:1"],"worker":["w0:1"]},"task":{"type":"ps","index":1},"rpc_layer":"grpc"})");
        CHECK(ps.task_type() == "ps");
        CHECK(ps.task_id() == 1);
        CHECK(ps.rpc_layer() == "grpc");
        CHECK(ps.environment().empty());
        CHECK_FALSE(ps.cluster_spec().has_job("chief"));
        check_cluster_resolver_rules(ps);
    }

    TEST_CASE("TFConfigClusterResolver: an evaluator outside the cluster is accepted, as in TensorFlow") {
        const pss::TFConfigClusterResolver outside(with_task(R"({"type":"evaluator","index":0})"));
        CHECK(outside.task_type() == "evaluator");
        CHECK(outside.task_id() == 0);
        CHECK_FALSE(outside.cluster_spec().has_job("evaluator"));
        const pss::TFConfigClusterResolver inside(
            R"({"cluster":{"ps":["p0:1"],"worker":["w0:1"],"evaluator":["e0:1"]},"task":{"type":"evaluator","index":0}})");
        CHECK(inside.cluster_spec().num_tasks("evaluator") == 1);
        CHECK(tf_config_error(
                  R"({"cluster":{"ps":["p0:1"],"worker":["w0:1"],"evaluator":["e0:1"]},"task":{"type":"evaluator","index":1}})") ==
              R"(pss: TF_CONFIG: "task.index" is 1 but job "evaluator" has 1 task)");
    }

    TEST_CASE("TFConfigClusterResolver: without \"task\" the task type is \"\" and the id 0; other fields are ignored") {
        const pss::TFConfigClusterResolver resolver(R"({"cluster":{"ps":["p0:1"],"worker":["w0:1"]},"future_field":[1,2]})");
        CHECK(resolver.task_type().empty());
        CHECK(resolver.task_id() == 0);
        check_cluster_resolver_rules(resolver);
    }

    TEST_CASE("TFConfigClusterResolver: an evaluator's TF_CONFIG needs no ps or worker, as TensorFlow reads it") {
        const pss::TFConfigClusterResolver alone(
            R"({"cluster":{"evaluator":["e0:2222"]},"task":{"type":"evaluator","index":0}})");
        CHECK(alone.task() == TaskId{"evaluator", 0});
        CHECK(alone.cluster_spec() == ClusterSpec{{"evaluator", {"e0:2222"}}});
        CHECK(tf_config_error(R"({"cluster":{"evaluator":["e0:2222"]},"task":{"type":"worker","index":0}})") ==
              R"(pss: TF_CONFIG: "cluster" has no "ps" job; ParameterServerStrategy needs at least one ps task)");
        CHECK(tf_config_error(R"({"cluster":{"chief":["c:1"],"worker":["w:1"]},"task":{"type":"chief","index":0}})") ==
              R"(pss: TF_CONFIG: "cluster" has no "ps" job; ParameterServerStrategy needs at least one ps task)");
    }

    TEST_CASE("TFConfigClusterResolver: an address whose port is not a number from 1 to 65535 is an error, naming it") {
        for (const std::string bad : {"p1:99999", "p1:0", "p1", "p1:", "p1:22x", ":2222"})
            CHECK(tf_config_error(R"({"cluster":{"ps":["p0:1",")" + bad + R"("],"worker":["w0:1"]},"task":{"type":"ps","index":0}})") ==
                  R"(pss: TF_CONFIG: "cluster.ps[1]" is ")" + bad + R"("; give it as "host:port" with a port from 1 to 65535)");
        CHECK(pss::TFConfigClusterResolver(
                  R"({"cluster":{"ps":["[::1]:65535"],"worker":["w0:1"]},"task":{"type":"ps","index":0}})")
                  .cluster_spec()
                  .task_address("ps", 0) == "[::1]:65535");
    }

    TEST_CASE("TFConfigClusterResolver: from_json takes a parsed object") {
        const auto resolver = pss::TFConfigClusterResolver::from_json(nlohmann::json::parse(kubeflow_worker_1));
        CHECK(resolver.task() == TaskId{"worker", 1});
        CHECK(resolver.cluster_spec() == pss::TFConfigClusterResolver(kubeflow_worker_1).cluster_spec());
    }

    TEST_CASE("TFConfigClusterResolver: master() is this task's or any task's address with the protocol, as "
              "TensorFlow's; the setters override the task and the protocol") {
        pss::TFConfigClusterResolver resolver(kubeflow_worker_1);  // no rpc_layer
        CHECK(resolver.master() == "tfjob-worker-1.ns.svc:2222");
        CHECK(resolver.master("ps", 0) == "tfjob-ps-0.ns.svc:2222");
        CHECK(resolver.master("ps", 0, "grpc") == "grpc://tfjob-ps-0.ns.svc:2222");
        const pss::TFConfigClusterResolver grpc(
            R"({"cluster":{"chief":["c0:2222"],"ps":["p0:2222","p1:2222"],"worker":["w0:2222"]},)"
            R"("task":{"type":"ps","index":1},"rpc_layer":"grpc"})");
        CHECK(grpc.master() == "grpc://p1:2222");
        CHECK(grpc.master("chief", 0) == "grpc://c0:2222");
        CHECK(grpc.master("worker", 0, "grpc+loas") == "grpc+loas://w0:2222");
        CHECK(message_of<pss::OutOfRangeError>([&] { (void)grpc.master("worker", 1); }) ==
              R"(pss: ClusterSpec: job "worker" has no task 1; it has 1 tasks, 0 to 0)");
        CHECK(message_of<pss::NotFoundError>([&] { (void)grpc.master("evaluator", 0); }).starts_with(
            R"(pss: ClusterSpec has no job "evaluator")"));
        resolver.set_task_type("ps");
        resolver.set_task_id(0);
        resolver.set_rpc_layer("grpc");
        CHECK(resolver.task() == TaskId{"ps", 0});
        CHECK(resolver.rpc_layer() == "grpc");
        CHECK(resolver.master() == "grpc://tfjob-ps-0.ns.svc:2222");
    }

    TEST_CASE("TFConfigClusterResolver: {} is TensorFlow's empty cluster: no jobs, no task, no master") {
        for (const std::string_view empty : {R"({})", R"({"cluster":{}})", R"({"rpc_layer":"grpc"})"}) {
            CAPTURE(empty);
            const pss::TFConfigClusterResolver resolver(empty);
            CHECK(resolver.cluster_spec().as_dict().empty());
            CHECK(resolver.task_type().empty());
            CHECK(resolver.task_id() == 0);
            CHECK(resolver.master().empty());
        }
        CHECK(pss::TFConfigClusterResolver(R"({"rpc_layer":"grpc"})").rpc_layer() == "grpc");
        // (A strategy refuses it: test_core.cpp.) With a task, a cluster is required as before.
        CHECK(tf_config_error(R"({"cluster":{},"task":{"type":"worker","index":0}})") ==
              R"(pss: TF_CONFIG: "cluster" has no "ps" job; ParameterServerStrategy needs at least one ps task)");
    }

    TEST_CASE("TFConfigClusterResolver: text that is not JSON, or not an object, is rejected") {
        const std::string not_json = tf_config_error(R"({"cluster": )");
        CHECK(not_json.starts_with("pss: TF_CONFIG is not valid JSON: [json.exception.parse_error.101]"));
        CHECK(tf_config_error(R"(["worker"])") == R"(pss: TF_CONFIG must be a JSON object with "cluster" and "task", got array)");
        CHECK(tf_config_error("3") == R"(pss: TF_CONFIG must be a JSON object with "cluster" and "task", got number)");
    }

    TEST_CASE("TFConfigClusterResolver: a missing or malformed \"cluster\" is rejected, naming the job") {
        CHECK(tf_config_error(R"({"task":{"type":"worker","index":0}})") ==
              R"(pss: TF_CONFIG has no "cluster"; ParameterServerStrategy needs one with at least one ps and one worker )"
              R"(task, as in {"cluster": {"ps": ["ps0:2222"], "worker": ["worker0:2222"]}, "task": {"type": "worker", "index": 0}})");
        CHECK(tf_config_error(with_cluster(R"(["w0:1"])")) ==
              R"(pss: TF_CONFIG: "cluster" must be an object of job name to list of "host:port" strings, got array)");
        CHECK(tf_config_error(with_cluster("null")) ==
              R"(pss: TF_CONFIG: "cluster" must be an object of job name to list of "host:port" strings, got null)");
        CHECK(tf_config_error(with_cluster(R"({"ps":["p0:1"],"worker":"w0:1"})")) ==
              R"(pss: TF_CONFIG: "cluster": job "worker" must be a list of "host:port" strings, got string)");
        CHECK(tf_config_error(with_cluster(R"({"ps":["p0:1"],"worker":[2222]})")) ==
              R"(pss: TF_CONFIG: "cluster": job "worker" task 0 must be a "host:port" string, got number)");
        CHECK(tf_config_error(with_cluster(R"({"ps":["p0:1"],"worker":["w0:1",""]})")) ==
              R"(pss: TF_CONFIG: "cluster": job "worker" task 1 has an empty address; give it as "host:port")");
    }

    TEST_CASE("TFConfigClusterResolver: job foo, two chiefs, two evaluators, no ps and no worker are rejected") {
        CHECK(tf_config_error(with_cluster(R"({"ps":["p0:1"],"worker":["w0:1"],"foo":["f0:1"]})")) ==
              R"(pss: TF_CONFIG: job "foo" is not one of chief, worker, ps, evaluator)");
        CHECK(tf_config_error(with_cluster(R"({"ps":["p0:1"],"worker":["w0:1"],"master":["m0:1"]})")) ==
              R"(pss: TF_CONFIG: job "master" is not one of chief, worker, ps, evaluator)");
        CHECK(tf_config_error(with_cluster(R"({"chief":["c0:1","c1:1"],"ps":["p0:1"],"worker":["w0:1"]})")) ==
              R"(pss: TF_CONFIG: job "chief" has 2 tasks but there may be at most one chief)");
        CHECK(tf_config_error(with_cluster(R"({"evaluator":["e0:1","e1:1"],"ps":["p0:1"],"worker":["w0:1"]})")) ==
              R"(pss: TF_CONFIG: job "evaluator" has 2 tasks but there may be at most one evaluator)");
        CHECK(tf_config_error(with_cluster(R"({"chief":["c0:1"],"worker":["w0:1"]})")) ==
              R"(pss: TF_CONFIG: "cluster" has no "ps" job; ParameterServerStrategy needs at least one ps task)");
        CHECK(tf_config_error(with_cluster(R"({"ps":[],"worker":["w0:1"]})")) ==
              R"(pss: TF_CONFIG: job "ps" has no tasks; ParameterServerStrategy needs at least one ps task)");
        CHECK(tf_config_error(with_cluster(R"({"chief":["c0:1"],"ps":["p0:1"]})")) ==
              R"(pss: TF_CONFIG: "cluster" has no "worker" job; ParameterServerStrategy needs at least one worker task)");
        CHECK(tf_config_error(with_cluster(R"({"ps":["p0:1"],"worker":[]})")) ==
              R"(pss: TF_CONFIG: job "worker" has no tasks; ParameterServerStrategy needs at least one worker task)");
        CHECK(tf_config_error(with_cluster("{}")) ==
              R"(pss: TF_CONFIG: "cluster" has no "ps" job; ParameterServerStrategy needs at least one ps task)");
    }

    TEST_CASE("TFConfigClusterResolver: a malformed \"task\" or \"task.type\" is rejected") {
        CHECK(tf_config_error(with_task(R"("worker")")) ==
              R"(pss: TF_CONFIG: "task" must be an object such as {"type": "worker", "index": 0}, got string)");
        CHECK(tf_config_error(with_task(R"({"index":0})")) ==
              R"(pss: TF_CONFIG: "task" has no "type"; give this task's job, one of chief, worker, ps, evaluator, )"
              R"(as in {"type": "worker", "index": 0})");
        CHECK(tf_config_error(with_task(R"({"type":1,"index":0})")) ==
              R"(pss: TF_CONFIG: "task.type" must be a string, one of chief, worker, ps, evaluator; got number)");
        CHECK(tf_config_error(with_task(R"({"type":"foo","index":0})")) ==
              R"(pss: TF_CONFIG: "task.type" is "foo" but must be one of chief, worker, ps, evaluator)");
        CHECK(tf_config_error(with_task(R"({"type":"","index":0})")) ==
              R"(pss: TF_CONFIG: "task.type" is "" but must be one of chief, worker, ps, evaluator)");
        CHECK(tf_config_error(R"({"cluster":{"ps":["p0:1"],"worker":["w0:1"]},"task":{"type":"chief","index":0}})") ==
              R"(pss: TF_CONFIG: "task.type" is "chief" but "cluster" has no "chief" job)");
    }

    TEST_CASE("TFConfigClusterResolver: task.index 3 of 2 workers, -1, 1.5, \"abc\" and true are rejected") {
        CHECK(tf_config_error(with_task(R"({"type":"worker","index":3})")) ==
              R"(pss: TF_CONFIG: "task.index" is 3 but job "worker" has 2 tasks)");
        CHECK(tf_config_error(with_task(R"({"type":"worker","index":"3"})")) ==
              R"(pss: TF_CONFIG: "task.index" is 3 but job "worker" has 2 tasks)");
        CHECK(tf_config_error(with_task(R"({"type":"worker","index":2})")) ==
              R"(pss: TF_CONFIG: "task.index" is 2 but job "worker" has 2 tasks)");
        CHECK(tf_config_error(with_task(R"({"type":"chief","index":1})")) ==
              R"(pss: TF_CONFIG: "task.index" is 1 but job "chief" has 1 task)");
        CHECK(tf_config_error(with_task(R"({"type":"worker","index":99999999999})")) ==
              R"(pss: TF_CONFIG: "task.index" is 99999999999 but job "worker" has 2 tasks)");
        CHECK(tf_config_error(with_task(R"({"type":"worker","index":"99999999999999999999999"})")) ==
              R"(pss: TF_CONFIG: "task.index" is 99999999999999999999999 but job "worker" has 2 tasks)");
        CHECK(tf_config_error(with_task(R"({"type":"evaluator","index":99999999999})")) ==
              R"(pss: TF_CONFIG: "task.index" is 99999999999, too large for a task index)");
        CHECK(tf_config_error(with_task(R"({"type":"worker","index":-1})")) ==
              R"(pss: TF_CONFIG: "task.index" is -1 but must not be negative)");
        CHECK(tf_config_error(with_task(R"({"type":"worker","index":"-1"})")) ==
              R"(pss: TF_CONFIG: "task.index" is -1 but must not be negative)");
        CHECK(tf_config_error(with_task(R"({"type":"evaluator","index":-2})")) ==
              R"(pss: TF_CONFIG: "task.index" is -2 but must not be negative)");
        const std::string not_integer =
            R"(pss: TF_CONFIG: "task.index" must be a non-negative integer or a string of one, such as 1 or "1"; got )";
        CHECK(tf_config_error(with_task(R"({"type":"worker","index":1.5})")) == not_integer + "1.5");
        CHECK(tf_config_error(with_task(R"({"type":"worker","index":"1.5"})")) == not_integer + R"("1.5")");
        CHECK(tf_config_error(with_task(R"({"type":"worker","index":"abc"})")) == not_integer + R"("abc")");
        CHECK(tf_config_error(with_task(R"({"type":"worker","index":""})")) == not_integer + R"("")");
        CHECK(tf_config_error(with_task(R"({"type":"worker","index":" 1"})")) == not_integer + R"(" 1")");
        CHECK(tf_config_error(with_task(R"({"type":"worker","index":true})")) == not_integer + "true");
        CHECK(tf_config_error(with_task(R"({"type":"worker","index":null})")) == not_integer + "null");
        CHECK(tf_config_error(with_task(R"({"type":"worker"})")) ==
              R"(pss: TF_CONFIG: "task" has no "index"; give this task's position in job "worker", from 0, )"
              R"(as in {"type": "worker", "index": 0})");
    }

    TEST_CASE("TFConfigClusterResolver: a non-string rpc_layer or environment is rejected") {
        CHECK(tf_config_error(R"({"cluster":{"ps":["p0:1"],"worker":["w0:1"]},"rpc_layer":1})") ==
              R"(pss: TF_CONFIG: "rpc_layer" must be a string such as "grpc", got number)");
        CHECK(tf_config_error(R"({"cluster":{"ps":["p0:1"],"worker":["w0:1"]},"environment":{}})") ==
              R"(pss: TF_CONFIG: "environment" must be a string such as "cloud", got object)");
    }
}

// ---------------------------------------------------------------------------------------------------------------

TEST_SUITE("ClusterResolver concept") {
    // Models.
    static_assert(pss::ClusterResolver<pss::LocalClusterResolver<2, 4>>);
    static_assert(pss::ClusterResolver<pss::LocalClusterResolver<>>);
    static_assert(pss::ClusterResolver<pss::SimpleClusterResolver>);
    static_assert(pss::ClusterResolver<pss::TFConfigClusterResolver>);
    static_assert(pss::ClusterResolver<pss::archetypes::ClusterResolverArchetype>);
    // The archetype's results are only convertible, not the named types themselves.
    static_assert(!std::is_same_v<decltype(pss::archetypes::ClusterResolverArchetype{}.task_id()), int>);
    static_assert(!std::is_same_v<decltype(pss::archetypes::ClusterResolverArchetype{}.cluster_spec()), ClusterSpec>);

    // Near misses, and the fragment each one fails.
    static_assert(!pss::ClusterResolver<MissingRpcLayer>);
    static_assert(!pss::detail::cluster_resolver_has_rpc_layer<MissingRpcLayer>);
    static_assert(pss::detail::cluster_resolver_has_task_id<MissingRpcLayer>);

    static_assert(!pss::ClusterResolver<StringTaskId>);
    static_assert(!pss::detail::cluster_resolver_has_task_id<StringTaskId>);
    static_assert(pss::detail::cluster_resolver_has_task_type<StringTaskId>);

    static_assert(!pss::ClusterResolver<StringViewTaskType>);
    static_assert(!pss::detail::cluster_resolver_has_task_type<StringViewTaskType>);

    static_assert(!pss::ClusterResolver<MapClusterSpec>);
    static_assert(!pss::detail::cluster_resolver_has_cluster_spec<MapClusterSpec>);

    static_assert(!pss::ClusterResolver<MissingClusterSpec>);
    static_assert(!pss::detail::cluster_resolver_has_cluster_spec<MissingClusterSpec>);

    static_assert(!pss::ClusterResolver<NonConstMembers>);
    static_assert(!pss::detail::cluster_resolver_has_cluster_spec<NonConstMembers>);
    static_assert(!pss::detail::cluster_resolver_has_task_type<NonConstMembers>);
    static_assert(!pss::detail::cluster_resolver_has_task_id<NonConstMembers>);
    static_assert(!pss::detail::cluster_resolver_has_rpc_layer<NonConstMembers>);

    static_assert(!pss::ClusterResolver<int>);

    TEST_CASE("ClusterResolver concept: the archetype answers chief 0 of a cluster of one chief, ps and worker") {
        const pss::archetypes::ClusterResolverArchetype resolver;
        const ClusterSpec spec = resolver.cluster_spec();
        CHECK(spec == ClusterSpec{{"chief", {"archetype-chief-0:2222"}},
                                  {"ps", {"archetype-ps-0:2222"}},
                                  {"worker", {"archetype-worker-0:2222"}}});
        CHECK(std::string(resolver.task_type()) == "chief");
        CHECK(static_cast<int>(resolver.task_id()) == 0);
        CHECK(std::string(resolver.rpc_layer()).empty());
        check_cluster_resolver_rules(resolver);
    }

    TEST_CASE("ClusterResolver concept: every model follows the rules the compiler cannot check") {
        SUBCASE("LocalClusterResolver<2, 4>") { check_cluster_resolver_rules(pss::LocalClusterResolver<2, 4>{}); }
        SUBCASE("LocalClusterResolver<1, 1>") { check_cluster_resolver_rules(pss::LocalClusterResolver<1, 1>{}); }
        SUBCASE("SimpleClusterResolver worker 1") {
            check_cluster_resolver_rules(pss::SimpleClusterResolver(
                ClusterSpec{{"ps", {"p0:1"}}, {"worker", {"w0:1", "w1:1"}}}, "worker", 1, "grpc"));
        }
        SUBCASE("TFConfigClusterResolver Kubeflow worker 1") {
            check_cluster_resolver_rules(pss::TFConfigClusterResolver(kubeflow_worker_1));
        }
        SUBCASE("ClusterResolverArchetype") { check_cluster_resolver_rules(pss::archetypes::ClusterResolverArchetype{}); }
    }
}
