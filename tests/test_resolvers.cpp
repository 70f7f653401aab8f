// test_resolvers.cpp: the launcher-aware ClusterResolvers: SlurmClusterResolver, MpiClusterResolver, AutoClusterResolver.
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <doctest/doctest.h>

#include <pss/cluster/auto.hpp>
#include <pss/cluster/cluster_spec.hpp>
#include <pss/cluster/local.hpp>
#include <pss/cluster/mpi.hpp>
#include <pss/cluster/slurm.hpp>
#include <pss/concepts/cluster_resolver.hpp>
#include <pss/detail/environment.hpp>
#include <pss/errors.hpp>

static_assert(pss::ClusterResolver<pss::SlurmClusterResolver>);
static_assert(pss::ClusterResolver<pss::MpiClusterResolver>);
static_assert(pss::ClusterResolver<pss::AutoClusterResolver>);

namespace {

using pss::ClusterSpec;
using pss::TaskId;
using Strings = std::vector<std::string>;

/// A fake environment: these variables and no others.
pss::detail::EnvironmentLookup environment(std::map<std::string, std::string, std::less<>> variables) {
    return [variables = std::move(variables)](std::string_view name) -> std::optional<std::string> {
        const auto it = variables.find(name);
        if (it == variables.end()) return std::nullopt;
        return it->second;
    };
}

/// The message of the `Error` that `f` throws; "<no exception>" when it throws nothing. An exception of
/// another type escapes and fails the test case.
template <class Error, class F>
std::string error_of(F&& f) {
    try {
        f();
    } catch (const Error& error) {
        return error.what();
    }
    return "<no exception>";
}

/// TensorFlow's three-node step of slurm_cluster_resolver_test.py, one task per node.
std::map<std::string, std::string, std::less<>> three_nodes(std::string_view rank) {
    return {{"SLURM_PROCID", std::string(rank)},
            {"SLURM_STEP_NUM_TASKS", "3"},
            {"SLURM_STEP_TASKS_PER_NODE", "1(x3)"},
            {"SLURM_STEP_NODELIST", "t02n13,t02n41,t02n43"}};
}

/// TensorFlow's five-task step: two tasks on each of the first two nodes, one on the third.
std::map<std::string, std::string, std::less<>> five_tasks(std::string_view rank) {
    return {{"SLURM_PROCID", std::string(rank)},
            {"SLURM_STEP_NUM_TASKS", "5"},
            {"SLURM_STEP_TASKS_PER_NODE", "2(x2),1"},
            {"SLURM_STEP_NODELIST", "t02n13,t02n41,t02n43"}};
}

std::string slurm_error(std::map<std::string, std::string, std::less<>> variables,
                        pss::SlurmClusterResolver::Jobs jobs = {}, std::optional<int> tasks_per_node = std::nullopt,
                        int port_base = 8888, std::optional<int> gpus_per_node = std::nullopt,
                        std::optional<int> gpus_per_task = std::nullopt) {
    return error_of<pss::Error>([&] {
        (void)pss::SlurmClusterResolver(environment(std::move(variables)), std::move(jobs), port_base, gpus_per_node,
                                        gpus_per_task, tasks_per_node);
    });
}

std::string hostlist_error(std::string_view hostlist) {
    return error_of<pss::InvalidArgumentError>([&] { (void)pss::SlurmClusterResolver::expand_hostlist(hostlist); });
}

std::string tasks_per_node_error(std::string_view text) {
    return error_of<pss::InvalidArgumentError>([&] { (void)pss::SlurmClusterResolver::expand_tasks_per_node(text); });
}

std::string mpi_error(std::map<std::string, std::string, std::less<>> variables, int num_ps = 1, Strings hosts = {},
                      int port_base = 8888) {
    return error_of<pss::Error>(
        [&] { (void)pss::MpiClusterResolver(environment(std::move(variables)), num_ps, std::move(hosts), port_base); });
}

std::string hosts_error(std::string_view hostlist, std::string_view reason) {
    return "pss: SlurmClusterResolver: hostlist \"" + std::string(hostlist) + "\" is not a valid Slurm hostlist: " +
           std::string(reason) + "; write it as Slurm does, e.g. \"n[1-2],m5,o[3-4,6,7-9]\"";
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------

TEST_SUITE("SlurmClusterResolver") {
    TEST_CASE("SlurmClusterResolver::expand_hostlist: TensorFlow's cases, n[1-2],m5,o[3-4,6,7-9] gives 9 hosts in order") {
        using pss::SlurmClusterResolver;
        CHECK(SlurmClusterResolver::expand_hostlist("n1") == Strings{"n1"});
        CHECK(SlurmClusterResolver::expand_hostlist("n[1,3]") == Strings{"n1", "n3"});
        CHECK(SlurmClusterResolver::expand_hostlist("n[1-3]") == Strings{"n1", "n2", "n3"});
        CHECK(SlurmClusterResolver::expand_hostlist("n[1-2],m5,o[3-4,6,7-9]") ==
              Strings{"n1", "n2", "m5", "o3", "o4", "o6", "o7", "o8", "o9"});
    }

    TEST_CASE("SlurmClusterResolver::expand_hostlist: leading zeros are kept, node[001-003] gives node001 to node003") {
        using pss::SlurmClusterResolver;
        CHECK(SlurmClusterResolver::expand_hostlist("node[001-003]") == Strings{"node001", "node002", "node003"});
        CHECK(SlurmClusterResolver::expand_hostlist("n[08-10]") == Strings{"n08", "n09", "n10"});
        CHECK(SlurmClusterResolver::expand_hostlist("n[9-10]") == Strings{"n9", "n10"});
        CHECK(SlurmClusterResolver::expand_hostlist("n[0]") == Strings{"n0"});
        CHECK(SlurmClusterResolver::expand_hostlist("gpu[007,010-011]") == Strings{"gpu007", "gpu010", "gpu011"});
    }

    TEST_CASE("SlurmClusterResolver::expand_hostlist: text after a range, several ranges, a bare range, repeats kept, \"\" empty") {
        using pss::SlurmClusterResolver;
        CHECK(SlurmClusterResolver::expand_hostlist("n[1-2]-ib") == Strings{"n1-ib", "n2-ib"});
        CHECK(SlurmClusterResolver::expand_hostlist("r[1-2]n[1-2]") == Strings{"r1n1", "r1n2", "r2n1", "r2n2"});
        CHECK(SlurmClusterResolver::expand_hostlist("[3-4]") == Strings{"3", "4"});
        CHECK(SlurmClusterResolver::expand_hostlist("a.example.org,b-1") == Strings{"a.example.org", "b-1"});
        CHECK(SlurmClusterResolver::expand_hostlist("n1,n1") == Strings{"n1", "n1"});
        CHECK(SlurmClusterResolver::expand_hostlist("n[1,1]") == Strings{"n1", "n1"});
        CHECK(SlurmClusterResolver::expand_hostlist("").empty());
        CHECK(SlurmClusterResolver::expand_hostlist("n[1-1000]").size() == 1000);
        CHECK(SlurmClusterResolver::expand_hostlist("n[1-1000]").back() == "n1000");
    }

    TEST_CASE("SlurmClusterResolver::expand_hostlist: each malformed list throws InvalidArgumentError naming the text") {
        CHECK(hostlist_error("n[1-") == hosts_error("n[1-", "'[' at position 1 is never closed"));
        CHECK(hostlist_error("n1]") == hosts_error("n1]", "']' at position 2 has no '['"));
        CHECK(hostlist_error("n[1[2]]") == hosts_error("n[1[2]]", "'[' at position 3 is inside a range"));
        CHECK(hostlist_error("n[]") == hosts_error("n[]", "the range at position 1 is empty"));
        CHECK(hostlist_error("n[a-b]") ==
              hosts_error("n[a-b]", "the range at position 1 has \"a-b\", which is not N or N-M with N and M numbers"));
        CHECK(hostlist_error("n[1-2-3]") ==
              hosts_error("n[1-2-3]", "the range at position 1 has \"1-2-3\", which is not N or N-M with N and M numbers"));
        CHECK(hostlist_error("n[1,,2]") ==
              hosts_error("n[1,,2]", "the range at position 1 has \"\", which is not N or N-M with N and M numbers"));
        CHECK(hostlist_error("n[-3]") ==
              hosts_error("n[-3]", "the range at position 1 has \"-3\", which is not N or N-M with N and M numbers"));
        CHECK(hostlist_error("n[5-3]") == hosts_error("n[5-3]", "the range at position 1 has \"5-3\", which goes down"));
        CHECK(hostlist_error("a,,b") ==
              hosts_error("a,,b", "the host name at position 2 is empty (two commas in a row, or a comma at an end)"));
        CHECK(hostlist_error(",a") ==
              hosts_error(",a", "the host name at position 0 is empty (two commas in a row, or a comma at an end)"));
        CHECK(hostlist_error("a,") ==
              hosts_error("a,", "the host name at position 2 is empty (two commas in a row, or a comma at an end)"));
        CHECK(hostlist_error("n[0-99999999]") == hosts_error("n[0-99999999]", "it has more than 1048576 hosts"));
        CHECK(hostlist_error("r[1-2000]n[1-2000]") == hosts_error("r[1-2000]n[1-2000]", "it has more than 1048576 hosts"));
        CHECK(hostlist_error("n[1-9999999999999999999]") ==
              hosts_error("n[1-9999999999999999999]",
                          "the range at position 1 has \"1-9999999999999999999\", which is not N or N-M with N and M "
                          "numbers"));
    }

    TEST_CASE("SlurmClusterResolver::expand_tasks_per_node: TensorFlow's cases, 3(x2),2,1 gives 3 3 2 1") {
        using pss::SlurmClusterResolver;
        using Ints = std::vector<int>;
        CHECK(SlurmClusterResolver::expand_tasks_per_node("2") == Ints{2});
        CHECK(SlurmClusterResolver::expand_tasks_per_node("2,1,3") == Ints{2, 1, 3});
        CHECK(SlurmClusterResolver::expand_tasks_per_node("3(x2),2,1") == Ints{3, 3, 2, 1});
        CHECK(SlurmClusterResolver::expand_tasks_per_node("3(x2),2,11(x4)") == Ints{3, 3, 2, 11, 11, 11, 11});
        CHECK(SlurmClusterResolver::expand_tasks_per_node("13(x10)") == Ints(10, 13));
    }

    TEST_CASE("SlurmClusterResolver::expand_tasks_per_node: each malformed list throws InvalidArgumentError naming the text") {
        const auto bad = [](std::string_view text, std::string_view reason) {
            return "pss: SlurmClusterResolver: tasks-per-node list \"" + std::string(text) + "\" is not valid: " +
                   std::string(reason) + "; write it as Slurm does, e.g. \"3(x2),2,1\"";
        };
        CHECK(tasks_per_node_error("") == bad("", R"m("" is not N or N(xR))m"));
        CHECK(tasks_per_node_error("3(2)") == bad("3(2)", R"m("3(2)" is not N or N(xR))m"));
        CHECK(tasks_per_node_error("3(x)") == bad("3(x)", R"m("3(x)" is not N or N(xR))m"));
        CHECK(tasks_per_node_error("2,,1") == bad("2,,1", R"m("" is not N or N(xR))m"));
        CHECK(tasks_per_node_error("2,") == bad("2,", R"m("" is not N or N(xR))m"));
        CHECK(tasks_per_node_error("-1") == bad("-1", R"m("-1" is not N or N(xR))m"));
        CHECK(tasks_per_node_error("x2") == bad("x2", R"m("x2" is not N or N(xR))m"));
        CHECK(tasks_per_node_error("99999999999") == bad("99999999999", R"m("99999999999" is not N or N(xR))m"));
        CHECK(tasks_per_node_error("1(x2000000)") == bad("1(x2000000)", "it has more than 1048576 nodes"));
    }

    TEST_CASE("SlurmClusterResolver: TensorFlow's testSimpleRetrievalFromEnv: no jobs gives 3 workers at port 8888") {
        auto variables = three_nodes("0");
        variables["CUDA_VISIBLE_DEVICES"] = "0";
        const pss::SlurmClusterResolver resolver(environment(variables));
        CHECK(resolver.cluster_spec() == ClusterSpec{{"worker", {"t02n13:8888", "t02n41:8888", "t02n43:8888"}}});
        CHECK(resolver.task_type() == "worker");
        CHECK(resolver.task_id() == 0);
        CHECK(resolver.rpc_layer() == "grpc");
        CHECK(resolver.jobs() == pss::SlurmClusterResolver::Jobs{{"worker", 3}});
        CHECK(resolver.gpus_per_node() == 1);  // counted from CUDA_VISIBLE_DEVICES
        CHECK(resolver.gpus_per_task() == 1);  // TensorFlow's num_accelerators() == {'GPU': 1}
        CHECK(resolver.cuda_visible_devices() == "0");
        CHECK(resolver.auto_set_gpu());
    }

    TEST_CASE("SlurmClusterResolver: TensorFlow's testSimpleSuccessfulRetrieval: ps 1, worker 2, one task per node") {
        auto variables = three_nodes("0");
        variables.erase("SLURM_STEP_TASKS_PER_NODE");  // tasks_per_node=1 is given instead
        const pss::SlurmClusterResolver resolver(environment(variables), {{"ps", 1}, {"worker", 2}}, 8888, 1, 1, 1, false);
        CHECK(resolver.cluster_spec() == ClusterSpec{{"ps", {"t02n13:8888"}}, {"worker", {"t02n41:8888", "t02n43:8888"}}});
        CHECK(resolver.task() == TaskId{"ps", 0});
        CHECK(resolver.tasks_per_node() == std::vector<int>{1, 1, 1});
        CHECK_FALSE(resolver.auto_set_gpu());
    }

    TEST_CASE("SlurmClusterResolver: TensorFlow's testSimpleMasterRetrieval: rank 2 is worker 1 at t02n43:8888") {
        auto variables = three_nodes("2");
        variables.erase("SLURM_STEP_TASKS_PER_NODE");
        const pss::SlurmClusterResolver resolver(environment(variables), {{"ps", 1}, {"worker", 2}}, 8888, 1, 1, 1, false);
        CHECK(resolver.task() == TaskId{"worker", 1});
        CHECK(resolver.cluster_spec().task_address(resolver.task()) == "t02n43:8888");
        CHECK(resolver.cluster_spec().task_address("ps", 0) == "t02n13:8888");
        CHECK(resolver.rank() == 2);
    }

    TEST_CASE("SlurmClusterResolver: TensorFlow's testTaskPerNodeNotSetRetrieval: 1(x3) from the environment") {
        const pss::SlurmClusterResolver resolver(environment(three_nodes("0")), {{"ps", 1}, {"worker", 2}}, 8888, 1, 1,
                                                 std::nullopt, false);
        CHECK(resolver.cluster_spec() == ClusterSpec{{"ps", {"t02n13:8888"}}, {"worker", {"t02n41:8888", "t02n43:8888"}}});
        CHECK(resolver.task() == TaskId{"ps", 0});
    }

    TEST_CASE("SlurmClusterResolver: TensorFlow's testMultiTaskPerNodeRetrieval: 2(x2),1 gives ports 8888 and 8889, rank 1 GPU 1") {
        auto variables = five_tasks("1");
        variables["CUDA_VISIBLE_DEVICES"] = "";
        const pss::SlurmClusterResolver resolver(environment(variables), {{"ps", 1}, {"worker", 4}}, 8888, 2, 1);
        CHECK(resolver.cluster_spec() ==
              ClusterSpec{{"ps", {"t02n13:8888"}},
                          {"worker", {"t02n13:8889", "t02n41:8888", "t02n41:8889", "t02n43:8888"}}});
        CHECK(resolver.task() == TaskId{"worker", 0});
        CHECK(resolver.cuda_visible_devices() == "1");
        CHECK(resolver.hosts() == Strings{"t02n13", "t02n41", "t02n43"});
        CHECK(resolver.tasks_per_node() == std::vector<int>{2, 2, 1});
    }

    TEST_CASE("SlurmClusterResolver: TensorFlow's testMultipleGpusPerTaskRetrieval: 4 GPUs, 2 per task, rank 1 gets 2,3") {
        const pss::SlurmClusterResolver resolver(environment(five_tasks("1")), {{"ps", 1}, {"worker", 4}}, 8888, 4, 2);
        CHECK(resolver.cluster_spec() ==
              ClusterSpec{{"ps", {"t02n13:8888"}},
                          {"worker", {"t02n13:8889", "t02n41:8888", "t02n41:8889", "t02n43:8888"}}});
        CHECK(resolver.cuda_visible_devices() == "2,3");
        CHECK(resolver.gpus_per_task() == 2);
    }

    TEST_CASE("SlurmClusterResolver: chief 1, ps 2, worker 3 take ranks 0, 1-2, 3-5 in job-name order") {
        const std::map<std::string, std::string, std::less<>> base{{"SLURM_STEP_NUM_TASKS", "6"},
                                                                   {"SLURM_STEP_TASKS_PER_NODE", "3,2,1"},
                                                                   {"SLURM_STEP_NODELIST", "node[001-003]"}};
        const ClusterSpec expected{{"chief", {"node001:9000"}},
                                   {"ps", {"node001:9001", "node001:9002"}},
                                   {"worker", {"node002:9000", "node002:9001", "node003:9000"}}};
        const std::vector<TaskId> by_rank{{"chief", 0}, {"ps", 0}, {"ps", 1}, {"worker", 0}, {"worker", 1}, {"worker", 2}};
        for (int rank = 0; rank < 6; ++rank) {
            CAPTURE(rank);
            auto variables = base;
            variables["SLURM_PROCID"] = std::to_string(rank);
            // Given out of order: jobs are laid out by name all the same.
            const pss::SlurmClusterResolver resolver(environment(variables), {{"worker", 3}, {"ps", 2}, {"chief", 1}}, 9000);
            CHECK(resolver.cluster_spec() == expected);
            CHECK(resolver.task() == by_rank[static_cast<std::size_t>(rank)]);
            CHECK(resolver.rank() == rank);
            CHECK(resolver.port_base() == 9000);
            CHECK_NOTHROW(pss::detail::check_parameter_server_cluster(resolver.cluster_spec(), "test", "the spec"));
        }
    }

    TEST_CASE("SlurmClusterResolver: nodes keep Slurm's order, so n[9-10] puts n9's tasks first (TensorFlow sorts as strings)") {
        const pss::SlurmClusterResolver resolver(environment({{"SLURM_PROCID", "1"},
                                                              {"SLURM_STEP_NUM_TASKS", "2"},
                                                              {"SLURM_STEP_TASKS_PER_NODE", "1(x2)"},
                                                              {"SLURM_STEP_NODELIST", "n[9-10]"}}),
                                                 {{"ps", 1}, {"worker", 1}});
        CHECK(resolver.cluster_spec() == ClusterSpec{{"ps", {"n9:8888"}}, {"worker", {"n10:8888"}}});
        CHECK(resolver.task() == TaskId{"worker", 0});
    }

    TEST_CASE("SlurmClusterResolver: tasks_per_node 2 overrides SLURM_STEP_TASKS_PER_NODE; no GPUs gives 0, 0 and \"\"") {
        auto variables = three_nodes("5");
        variables["SLURM_STEP_NUM_TASKS"] = "6";
        variables["SLURM_STEP_TASKS_PER_NODE"] = "not read";
        const pss::SlurmClusterResolver resolver(environment(variables), {{"chief", 1}, {"ps", 1}, {"worker", 4}}, 8888,
                                                 std::nullopt, std::nullopt, 2, true, "inproc");
        CHECK(resolver.cluster_spec() ==
              ClusterSpec{{"chief", {"t02n13:8888"}},
                          {"ps", {"t02n13:8889"}},
                          {"worker", {"t02n41:8888", "t02n41:8889", "t02n43:8888", "t02n43:8889"}}});
        CHECK(resolver.task() == TaskId{"worker", 3});
        CHECK(resolver.rpc_layer() == "inproc");
        CHECK(resolver.gpus_per_node() == 0);
        CHECK(resolver.gpus_per_task() == 0);
        CHECK(resolver.cuda_visible_devices().empty());
    }

    TEST_CASE("SlurmClusterResolver: a job of 0 tasks is kept as an empty job, as in TensorFlow") {
        const pss::SlurmClusterResolver resolver(environment(three_nodes("0")), {{"evaluator", 0}, {"ps", 1}, {"worker", 2}});
        CHECK(resolver.cluster_spec().has_job("evaluator"));
        CHECK(resolver.cluster_spec().num_tasks("evaluator") == 0);
        CHECK(resolver.task() == TaskId{"ps", 0});
    }

    TEST_CASE("SlurmClusterResolver: each missing variable is a NotFoundError saying this is not a Slurm step") {
        const auto missing = [](std::string_view name) {
            return "pss: SlurmClusterResolver: " + std::string(name) +
                   " is not set; this process is not running inside a Slurm step (srun)";
        };
        for (const std::string name : {"SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE"}) {
            CAPTURE(name);
            auto variables = three_nodes("0");
            variables.erase(name);
            CHECK(error_of<pss::NotFoundError>([&] { (void)pss::SlurmClusterResolver(environment(variables)); }) ==
                  missing(name));
        }
        CHECK(error_of<pss::NotFoundError>([] { (void)pss::SlurmClusterResolver(environment({})); }) ==
              missing("SLURM_PROCID"));
    }

    TEST_CASE("SlurmClusterResolver: jobs asking for 4 tasks of a 3-task step throw, naming both numbers") {
        CHECK(slurm_error(three_nodes("0"), {{"ps", 1}, {"worker", 3}}) ==
              "pss: SlurmClusterResolver: the jobs ask for 4 tasks (ps 1, worker 3) but the Slurm step has 3 "
              "(SLURM_STEP_NUM_TASKS); the task counts must add up to the step's tasks: run srun -n 4, or ask for 3");
        CHECK(slurm_error(three_nodes("0"), {{"worker", 2}}) ==
              "pss: SlurmClusterResolver: the jobs ask for 2 tasks (worker 2) but the Slurm step has 3 "
              "(SLURM_STEP_NUM_TASKS); the task counts must add up to the step's tasks: run srun -n 2, or ask for 3");
    }

    TEST_CASE("SlurmClusterResolver: malformed variables and arguments throw InvalidArgumentError naming them") {
        const std::string at = "pss: SlurmClusterResolver: ";
        auto variables = three_nodes("x");
        CHECK(slurm_error(variables) == at + "SLURM_PROCID is \"x\" but must be a whole number (this task's rank in the step)");
        variables = three_nodes("-1");
        CHECK(slurm_error(variables) == at + "SLURM_PROCID is \"-1\" but must be a whole number (this task's rank in the step)");
        variables = three_nodes("3");
        CHECK(slurm_error(variables) == at + "SLURM_PROCID is 3 but the step has 3 tasks, 0 to 2");
        variables = three_nodes("0");
        variables["SLURM_STEP_NUM_TASKS"] = "3 ";
        CHECK(slurm_error(variables) ==
              at + "SLURM_STEP_NUM_TASKS is \"3 \" but must be a whole number (the number of tasks of the step)");
        variables["SLURM_STEP_NUM_TASKS"] = "0";
        CHECK(slurm_error(variables) == at + "SLURM_STEP_NUM_TASKS is 0; a Slurm step has at least one task");
        CHECK(slurm_error(three_nodes("0"), {{"ps", -1}, {"worker", 4}}) ==
              at + "job \"ps\" asks for -1 tasks; give each job 0 tasks or more");
        CHECK(slurm_error(three_nodes("0"), {{"1ps", 1}, {"worker", 2}}) ==
              "pss: SlurmClusterResolver: jobs: job name \"1ps\" is not valid; a job name starts with a letter and has "
              "only letters, digits and '_' (as in \"/job:worker\")");

        variables = three_nodes("0");
        variables["SLURM_STEP_NODELIST"] = "t02n[13,41";
        CHECK(slurm_error(variables) ==
              at + "SLURM_STEP_NODELIST \"t02n[13,41\" is not a valid Slurm hostlist: '[' at position 4 is never closed; "
                   "write it as Slurm does, e.g. \"n[1-2],m5,o[3-4,6,7-9]\"");
        variables["SLURM_STEP_NODELIST"] = "";
        CHECK(slurm_error(variables) == at + "SLURM_STEP_NODELIST is empty; a Slurm step has at least one node");
        variables["SLURM_STEP_NODELIST"] = "a,b,a";
        CHECK(slurm_error(variables) ==
              at + "SLURM_STEP_NODELIST \"a,b,a\" lists node \"a\" twice; each node must appear once");
        variables["SLURM_STEP_NODELIST"] = "n[1-3]";
        variables["SLURM_STEP_TASKS_PER_NODE"] = "1(x2)";
        CHECK(slurm_error(variables) ==
              at + "SLURM_STEP_TASKS_PER_NODE \"1(x2)\" gives 2 nodes but SLURM_STEP_NODELIST \"n[1-3]\" has 3");
        variables["SLURM_STEP_TASKS_PER_NODE"] = "2,1,1";
        CHECK(slurm_error(variables) == at + "SLURM_STEP_TASKS_PER_NODE \"2,1,1\" places 4 tasks but SLURM_STEP_NUM_TASKS is 3");
        variables["SLURM_STEP_TASKS_PER_NODE"] = "1(x3";
        CHECK(slurm_error(variables) ==
              at + "SLURM_STEP_TASKS_PER_NODE \"1(x3\" is not valid: \"1(x3\" is not N or N(xR); write it as Slurm does, "
                   "e.g. \"3(x2),2,1\"");

        CHECK(slurm_error(three_nodes("0"), {}, 2) ==
              at + "tasks_per_node 2 on 3 nodes places 6 tasks but SLURM_STEP_NUM_TASKS is 3");
        CHECK(slurm_error(three_nodes("0"), {}, 0) == at + "tasks_per_node is 0 but must be at least 1");
        CHECK(slurm_error(five_tasks("0"), {}, std::nullopt, 65535) ==
              at + "port_base is 65535 but with 2 tasks on a node the ports must stay within 1 to 65535");
        CHECK(slurm_error(five_tasks("0"), {}, std::nullopt, 0) ==
              at + "port_base is 0 but with 2 tasks on a node the ports must stay within 1 to 65535");
        CHECK(slurm_error(five_tasks("0"), {}, std::nullopt, 8888, 2, 2) ==
              at + "2 tasks on a node with 2 GPUs each need 4 GPUs but gpus_per_node is 2");
        CHECK(slurm_error(five_tasks("0"), {}, std::nullopt, 8888, -1) ==
              at + "gpus_per_node is -1 but must not be negative");
        CHECK(slurm_error(five_tasks("0"), {}, std::nullopt, 8888, 2, -1) ==
              at + "gpus_per_task is -1 but must not be negative");
    }

    TEST_CASE("SlurmClusterResolver: the default constructor reads the process environment") {
        // The process environment of a test is not ours to set up; only its first requirement is checked.
        if (!std::getenv("SLURM_PROCID")) {
            CHECK(error_of<pss::NotFoundError>([] { (void)pss::SlurmClusterResolver(); }) ==
                  "pss: SlurmClusterResolver: SLURM_PROCID is not set; this process is not running inside a Slurm step (srun)");
        }
        ::setenv("PSS_TEST_RESOLVERS_PROBE", "value 1", 1);
        CHECK(pss::detail::process_environment("PSS_TEST_RESOLVERS_PROBE") == std::optional<std::string>("value 1"));
        ::unsetenv("PSS_TEST_RESOLVERS_PROBE");
        CHECK_FALSE(pss::detail::process_environment("PSS_TEST_RESOLVERS_PROBE").has_value());
    }
}

// ---------------------------------------------------------------------------------------------------------------

TEST_SUITE("MpiClusterResolver") {
    TEST_CASE("MpiClusterResolver: Open MPI rank 2 of 5 with 2 ps is ps 1; ports 8888 + rank on 127.0.0.1") {
        const pss::MpiClusterResolver resolver(
            environment({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "5"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}}),
            2);
        CHECK(resolver.cluster_spec() == ClusterSpec{{"chief", {"127.0.0.1:8888"}},
                                                     {"ps", {"127.0.0.1:8889", "127.0.0.1:8890"}},
                                                     {"worker", {"127.0.0.1:8891", "127.0.0.1:8892"}}});
        CHECK(resolver.task() == TaskId{"ps", 1});
        CHECK(resolver.rank() == 2);
        CHECK(resolver.size() == 5);
        CHECK(resolver.local_rank() == std::optional<int>(1));
        CHECK(resolver.launcher() == "openmpi");
        CHECK(resolver.rpc_layer() == "grpc");
        CHECK(resolver.num_ps() == 2);
        CHECK_NOTHROW(pss::detail::check_parameter_server_cluster(resolver.cluster_spec(), "test", "the spec"));
    }

    TEST_CASE("MpiClusterResolver: each rank of 4 with 1 ps: chief 0, ps 0, worker 0, worker 1") {
        const std::vector<TaskId> by_rank{{"chief", 0}, {"ps", 0}, {"worker", 0}, {"worker", 1}};
        for (int rank = 0; rank < 4; ++rank) {
            CAPTURE(rank);
            const pss::MpiClusterResolver resolver(
                environment({{"PMI_RANK", std::to_string(rank)}, {"PMI_SIZE", "4"}, {"PSS_MPI_HOSTS", "a,a,b,b"}}));
            CHECK(resolver.cluster_spec() ==
                  ClusterSpec{{"chief", {"a:8888"}}, {"ps", {"a:8889"}}, {"worker", {"b:8890", "b:8891"}}});
            CHECK(resolver.task() == by_rank[static_cast<std::size_t>(rank)]);
            CHECK(resolver.launcher() == "pmi");
            CHECK_FALSE(resolver.local_rank().has_value());
            CHECK(resolver.hosts() == Strings{"a", "a", "b", "b"});
        }
    }

    TEST_CASE("MpiClusterResolver: PMIx rank with OMPI_COMM_WORLD_SIZE; one host in PSS_MPI_HOSTS serves every rank") {
        const pss::MpiClusterResolver resolver(
            environment({{"PMIX_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "3"}, {"PSS_MPI_HOSTS", "node7"}}), 1, {}, 7000, "");
        CHECK(resolver.cluster_spec() ==
              ClusterSpec{{"chief", {"node7:7000"}}, {"ps", {"node7:7001"}}, {"worker", {"node7:7002"}}});
        CHECK(resolver.task() == TaskId{"worker", 0});
        CHECK(resolver.launcher() == "pmix");
        CHECK(resolver.rpc_layer().empty());
        CHECK(resolver.port_base() == 7000);
    }

    TEST_CASE("MpiClusterResolver: Open MPI is checked before PMI, PMI before PMIx; hosts given override PSS_MPI_HOSTS") {
        const pss::MpiClusterResolver resolver(environment({{"OMPI_COMM_WORLD_RANK", "0"},
                                                            {"OMPI_COMM_WORLD_SIZE", "3"},
                                                            {"PMI_RANK", "2"},
                                                            {"PMI_SIZE", "9"},
                                                            {"PMIX_RANK", "1"},
                                                            {"PSS_MPI_HOSTS", "x,y,z"}}),
                                               1, {"h0", "h1", "h2"});
        CHECK(resolver.launcher() == "openmpi");
        CHECK(resolver.task() == TaskId{"chief", 0});
        CHECK(resolver.size() == 3);
        CHECK(resolver.cluster_spec() == ClusterSpec{{"chief", {"h0:8888"}}, {"ps", {"h1:8889"}}, {"worker", {"h2:8890"}}});

        const pss::MpiClusterResolver pmi(environment({{"PMI_RANK", "2"}, {"PMI_SIZE", "3"}, {"PMIX_RANK", "0"}}));
        CHECK(pmi.launcher() == "pmi");
        CHECK(pmi.task() == TaskId{"worker", 0});
    }

    TEST_CASE("MpiClusterResolver: no launcher variables is a NotFoundError naming them") {
        CHECK(error_of<pss::NotFoundError>([] { (void)pss::MpiClusterResolver(environment({{"PMI_SIZE", "3"}})); }) ==
              "pss: MpiClusterResolver: no MPI launcher variables were found (OMPI_COMM_WORLD_RANK, PMI_RANK, PMIX_RANK); "
              "start this program with mpirun or mpiexec");
        CHECK_FALSE(pss::MpiClusterResolver::launched_by_mpi(environment({{"PMI_SIZE", "3"}})));
        CHECK(pss::MpiClusterResolver::launched_by_mpi(environment({{"PMIX_RANK", "0"}})));
    }

    TEST_CASE("MpiClusterResolver: a rank without its size, a bad number, a rank beyond the size throw, naming the variables") {
        const std::string at = "pss: MpiClusterResolver: ";
        CHECK(mpi_error({{"OMPI_COMM_WORLD_RANK", "0"}}) ==
              at + "OMPI_COMM_WORLD_RANK is set but OMPI_COMM_WORLD_SIZE is not; the MPI launcher must set both (the "
                   "rank and the number of processes)");
        CHECK(mpi_error({{"PMIX_RANK", "0"}, {"PMI_SIZE", "3"}}) ==
              at + "PMIX_RANK is set but OMPI_COMM_WORLD_SIZE is not; the MPI launcher must set both (the rank and the "
                   "number of processes)");
        CHECK(mpi_error({{"PMI_RANK", "one"}, {"PMI_SIZE", "3"}}) ==
              at + "PMI_RANK is \"one\" but must be a whole number (this process's rank)");
        CHECK(mpi_error({{"PMI_RANK", "1"}, {"PMI_SIZE", "3.0"}}) ==
              at + "PMI_SIZE is \"3.0\" but must be a whole number (the number of processes)");
        CHECK(mpi_error({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "3"}, {"OMPI_COMM_WORLD_LOCAL_RANK", ""}}) ==
              at + "OMPI_COMM_WORLD_LOCAL_RANK is \"\" but must be a whole number (this process's rank on its node)");
        CHECK(mpi_error({{"PMI_RANK", "3"}, {"PMI_SIZE", "3"}}) ==
              at + "PMI_RANK is 3 but PMI_SIZE is 3; a rank is less than the number of processes");
    }

    TEST_CASE("MpiClusterResolver: a world of 3 with 2 ps, num_ps 0, host lists of the wrong length, bad ports throw") {
        const std::string at = "pss: MpiClusterResolver: ";
        const std::map<std::string, std::string, std::less<>> three{{"PMI_RANK", "0"}, {"PMI_SIZE", "3"}};
        CHECK(mpi_error(three, 2) ==
              at + "the MPI world has 3 processes but 1 chief, 2 ps and at least 1 worker need 4; start more (mpirun -n "
                   "4) or give fewer ps tasks");
        CHECK(mpi_error({{"PMI_RANK", "0"}, {"PMI_SIZE", "1"}}) ==
              at + "the MPI world has 1 processes but 1 chief, 1 ps and at least 1 worker need 3; start more (mpirun -n "
                   "3) or give fewer ps tasks");
        CHECK(mpi_error(three, 0) == at + "num_ps is 0 but a ParameterServerStrategy needs at least 1 ps task");
        CHECK(mpi_error(three, 1, {"a", "b"}) ==
              at + "hosts has 2 hosts but the MPI world has 3 processes; give one host per rank, or one host for all");
        CHECK(mpi_error(three, 1, {"a", "", "c"}) ==
              at + "hosts has an empty host at position 1; give host names separated by commas, e.g. \"node1,node2\"");
        auto with_hosts = three;
        with_hosts["PSS_MPI_HOSTS"] = "a,b,c,d";
        CHECK(mpi_error(with_hosts) ==
              at + "PSS_MPI_HOSTS has 4 hosts but the MPI world has 3 processes; give one host per rank, or one host for all");
        with_hosts["PSS_MPI_HOSTS"] = "a,b,";
        CHECK(mpi_error(with_hosts) ==
              at + "PSS_MPI_HOSTS has an empty host at position 2; give host names separated by commas, e.g. \"node1,node2\"");
        CHECK(mpi_error(three, 1, {}, 65534) ==
              at + "port_base is 65534 but with 3 ranks the ports must stay within 1 to 65535");
        CHECK(mpi_error(three, 1, {}, 65533) == "<no exception>");
    }
}

// ---------------------------------------------------------------------------------------------------------------

TEST_SUITE("AutoClusterResolver") {
    TEST_CASE("AutoClusterResolver: TF_CONFIG comes first, even under Slurm and MPI; source() is tf_config") {
        const pss::AutoClusterResolver resolver(environment(
            {{"TF_CONFIG",
              R"({"cluster":{"chief":["c:1"],"ps":["p:1"],"worker":["w:1","w:2"]},"task":{"type":"worker","index":1},"rpc_layer":"grpc"})"},
             {"SLURM_PROCID", "0"},
             {"PMI_RANK", "0"}}));
        CHECK(resolver.source() == "tf_config");
        CHECK(resolver.cluster_spec() == ClusterSpec{{"chief", {"c:1"}}, {"ps", {"p:1"}}, {"worker", {"w:1", "w:2"}}});
        CHECK(resolver.task() == TaskId{"worker", 1});
        CHECK(resolver.rpc_layer() == "grpc");
    }

    TEST_CASE("AutoClusterResolver: Slurm, when SLURM_PROCID is set, lays out chief 1, ps num_ps, worker the rest") {
        auto variables = five_tasks("2");
        variables["TF_CONFIG"] = "{}";  // TensorFlow's reading of no TF_CONFIG: not set
        variables["PMI_RANK"] = "2";     // srun --mpi=pmi2 sets it too: Slurm wins
        variables["PMI_SIZE"] = "5";
        const pss::AutoClusterResolver resolver(environment(variables), 2);
        CHECK(resolver.source() == "slurm");
        CHECK(resolver.cluster_spec() == ClusterSpec{{"chief", {"t02n13:8888"}},
                                                     {"ps", {"t02n13:8889", "t02n41:8888"}},
                                                     {"worker", {"t02n41:8889", "t02n43:8888"}}});
        CHECK(resolver.task() == TaskId{"ps", 1});
        CHECK(resolver.rpc_layer() == "grpc");
    }

    TEST_CASE("AutoClusterResolver: PSS_NUM_PS and PSS_PORT_BASE lay out Slurm's and MPI's clusters; an argument wins") {
        auto variables = five_tasks("2");
        variables["PSS_NUM_PS"] = "2";
        variables["PSS_PORT_BASE"] = "20000";
        const pss::AutoClusterResolver slurm(environment(variables));
        CHECK(slurm.cluster_spec() == ClusterSpec{{"chief", {"t02n13:20000"}},
                                                  {"ps", {"t02n13:20001", "t02n41:20000"}},
                                                  {"worker", {"t02n41:20001", "t02n43:20000"}}});
        CHECK(slurm.task() == TaskId{"ps", 1});
        const pss::AutoClusterResolver argument(environment(variables), 1);
        CHECK(argument.cluster_spec() == ClusterSpec{{"chief", {"t02n13:20000"}},
                                                     {"ps", {"t02n13:20001"}},
                                                     {"worker", {"t02n41:20000", "t02n41:20001", "t02n43:20000"}}});
        const pss::AutoClusterResolver mpi(environment(
            {{"OMPI_COMM_WORLD_RANK", "4"}, {"OMPI_COMM_WORLD_SIZE", "5"}, {"PSS_NUM_PS", "2"}, {"PSS_PORT_BASE", "3000"}}));
        CHECK(mpi.cluster_spec() == ClusterSpec{{"chief", {"127.0.0.1:3000"}},
                                                {"ps", {"127.0.0.1:3001", "127.0.0.1:3002"}},
                                                {"worker", {"127.0.0.1:3003", "127.0.0.1:3004"}}});
        CHECK(mpi.task() == TaskId{"worker", 1});
        // The local cluster and TF_CONFIG say their own: the variables are not read there.
        CHECK(pss::AutoClusterResolver(environment({{"PSS_NUM_PS", "3"}})).cluster_spec() ==
              pss::LocalClusterResolver<2, 2>{}.cluster_spec());
        const auto error = [](std::map<std::string, std::string, std::less<>> variables) {
            return error_of<pss::InvalidArgumentError>([&] { (void)pss::AutoClusterResolver(environment(variables)); });
        };
        CHECK(error({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "5"}, {"PSS_NUM_PS", "two"}}) ==
              R"(pss: AutoClusterResolver: PSS_NUM_PS is "two" but must be a whole number from 1 to 1000000 (the number of ps tasks under Slurm or MPI))");
        CHECK(error({{"SLURM_PROCID", "0"}, {"PSS_PORT_BASE", "0"}}) ==
              R"(pss: AutoClusterResolver: PSS_PORT_BASE is "0" but must be a whole number from 1 to 65535 (the port of the first task on each node under Slurm or MPI))");
        CHECK(error({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "3"}, {"PSS_NUM_PS", "2"}}) ==
              "pss: MpiClusterResolver: the MPI world has 3 processes but 1 chief, 2 ps and at least 1 worker need 4; start "
              "more (mpirun -n 4) or give fewer ps tasks");
    }

    TEST_CASE("AutoClusterResolver: MPI, when only MPI rank variables are set, as MpiClusterResolver(num_ps)") {
        const pss::AutoClusterResolver resolver(
            environment({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"TF_CONFIG", ""}}));
        CHECK(resolver.source() == "mpi");
        CHECK(resolver.cluster_spec() == ClusterSpec{{"chief", {"127.0.0.1:8888"}},
                                                     {"ps", {"127.0.0.1:8889"}},
                                                     {"worker", {"127.0.0.1:8890", "127.0.0.1:8891"}}});
        CHECK(resolver.task() == TaskId{"worker", 1});
        CHECK(resolver.rpc_layer() == "grpc");
    }

    TEST_CASE("AutoClusterResolver: no launcher gives the local cluster of LocalClusterResolver<2, 2>, this task its chief") {
        const pss::AutoClusterResolver resolver(environment({{"PMI_SIZE", "4"}, {"SLURM_NTASKS", "4"}}));
        CHECK(resolver.source() == "local");
        CHECK(resolver.cluster_spec() == pss::LocalClusterResolver<2, 2>{}.cluster_spec());
        CHECK(resolver.cluster_spec() == ClusterSpec{{"chief", {"inproc:chief:0"}},
                                                     {"ps", {"inproc:ps:0", "inproc:ps:1"}},
                                                     {"worker", {"inproc:worker:0", "inproc:worker:1"}}});
        CHECK(resolver.task() == TaskId{"chief", 0});
        CHECK(resolver.rpc_layer() == "inproc");
    }

    TEST_CASE("AutoClusterResolver: a TF_CONFIG without \"task\" is an error at start-up, not a process waiting for "
              "tasks that never come") {
        CHECK(error_of<pss::InvalidArgumentError>([] {
                  (void)pss::AutoClusterResolver(environment({{"TF_CONFIG", R"({"cluster":{"ps":["p0:2222"],"worker":["w0:2222"]}})"}}));
              }) == R"(pss: TF_CONFIG has no "task": every process of a cluster must say which task it is, as in )"
                     R"({"cluster": {...}, "task": {"type": "worker", "index": 0}}; a program that runs the whole )"
                     "cluster in one process needs no TF_CONFIG");
    }

    TEST_CASE("AutoClusterResolver: the chosen resolver's errors are thrown as they are, not hidden by a fallback") {
        CHECK(error_of<pss::InvalidArgumentError>(
                  [] { (void)pss::AutoClusterResolver(environment({{"TF_CONFIG", "{"}})); })
                  .rfind("pss: TF_CONFIG is not valid JSON: ", 0) == 0);
        CHECK(error_of<pss::NotFoundError>([] { (void)pss::AutoClusterResolver(environment({{"SLURM_PROCID", "0"}})); }) ==
              "pss: SlurmClusterResolver: SLURM_STEP_NUM_TASKS is not set; this process is not running inside a Slurm "
              "step (srun)");
        CHECK(error_of<pss::NotFoundError>([] { (void)pss::AutoClusterResolver(environment({{"PMI_RANK", "0"}})); }) ==
              "pss: MpiClusterResolver: PMI_RANK is set but PMI_SIZE is not; the MPI launcher must set both (the rank "
              "and the number of processes)");
        auto variables = three_nodes("0");
        CHECK(error_of<pss::InvalidArgumentError>([&] { (void)pss::AutoClusterResolver(environment(variables), 2); }) ==
              "pss: AutoClusterResolver: the Slurm step has 3 tasks but 1 chief, 2 ps and at least 1 worker need 4; run "
              "srun -n 4 or more, or give fewer ps tasks");
        CHECK(error_of<pss::InvalidArgumentError>([] { (void)pss::AutoClusterResolver(environment({}), 0); }) ==
              "pss: AutoClusterResolver: num_ps is 0 but a ParameterServerStrategy needs at least 1 ps task");
    }
}
