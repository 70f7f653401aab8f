// tests/launch/echo_task.cpp: a task for the pss-launch tests: says who TF_CONFIG says it is, then acts as told.
//
// echo_task [--pid-dir DIR] [--grandchild] [ROLE=ACTION...]
//   ROLE    chief, ps, worker, ps:1, worker:0 or * (every task); the first rule that matches applies
//   ACTION  exit:N    print "last words from <task>" without a newline, exit with status N (the default: exit:0)
//           exit-once:N  exit:N the first time (needs --pid-dir: DIR/<type>_<index>.exited marks it),
//                     sleep when started again
//           sleep     sleep until ended (at most 60 s, then exit 0)
//           sleep:S   sleep S seconds, then exit 0
//           stubborn  ignore SIGTERM and sleep (at most 60 s): only SIGKILL ends it
//           wait-seen print "<task> waits to be seen" without flushing, then wait (at most 30 s) for
//                     DIR/<type>_<index>.seen (needs --pid-dir), made by whoever read the line; exit 3
//                     if it never comes
//   --pid-dir DIR   write DIR/<type>_<index>.pid, then wait (at most 20 s) until every task of the cluster
//                   has written its own, so that every task is running before any acts
//   --grandchild    fork a child that sleeps 60 s (pid in DIR/<type>_<index>.child.pid): it must be ended too
//
// Output: stdout "hello from <task>" and "<task> of 1 chief, N ps, M workers at <address>"; stderr
// "note from <task>". <task> is "chief", "ps:0", "worker:1".
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <sys/types.h>
#include <unistd.h>

#include <pss/cluster/tf_config.hpp>

namespace {

void write_pid_file(const std::filesystem::path& path, pid_t pid) {
    const auto temporary = path.string() + ".tmp";
    {
        std::ofstream out(temporary);
        out << pid << "\n";
    }
    std::filesystem::rename(temporary, path);  // atomic: a reader sees the whole pid or no file
}

void sleep_at_most(std::chrono::seconds limit) {
    const auto end = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(std::chrono::milliseconds(50));
}

}  // namespace

int main(int argc, char** argv) {
    std::string pid_dir;
    bool grandchild = false;
    std::vector<std::string> rules;
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        if (arg == "--pid-dir" && i + 1 < argc) {
            pid_dir = argv[++i];
        } else if (arg == "--grandchild") {
            grandchild = true;
        } else {
            rules.push_back(arg);
        }
    }

    const pss::TFConfigClusterResolver resolver;  // throws, and so fails the task, on a bad TF_CONFIG
    const std::string type = resolver.task_type();
    const int index = resolver.task_id();
    const std::string name = type == "chief" ? type : type + ":" + std::to_string(index);
    const std::string file_stem = type + "_" + std::to_string(index);
    const auto& spec = resolver.cluster_spec();

    std::cout << "hello from " << name << "\n"
              << name << " of " << spec.num_tasks("chief") << " chief, " << spec.num_tasks("ps") << " ps, "
              << spec.num_tasks("worker") << " workers at " << spec.task_address(type, index) << "\n"
              << std::flush;
    std::cerr << "note from " << name << "\n" << std::flush;

    std::string action = "exit:0";
    for (const auto& rule : rules) {
        const auto equals = rule.find('=');
        const std::string role = rule.substr(0, equals);
        if (equals == std::string::npos) {
            std::cerr << "echo_task: rule \"" << rule << "\" is not ROLE=ACTION\n";
            return 64;
        }
        if (role == "*" || role == type || role == name) {
            action = rule.substr(equals + 1);
            break;
        }
    }

    if (grandchild) {
        const pid_t child = ::fork();
        if (child == 0) {
            sleep_at_most(std::chrono::seconds(60));
            std::_Exit(0);
        }
        if (!pid_dir.empty()) write_pid_file(std::filesystem::path(pid_dir) / (file_stem + ".child.pid"), child);
    }
    if (action == "stubborn") std::signal(SIGTERM, SIG_IGN);  // before the pid file: the test relies on it
    if (!pid_dir.empty()) {
        write_pid_file(std::filesystem::path(pid_dir) / (file_stem + ".pid"), ::getpid());
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
        for (const auto& task : spec.tasks()) {
            const auto path = std::filesystem::path(pid_dir) / (task.type + "_" + std::to_string(task.index) + ".pid");
            while (!std::filesystem::exists(path) && std::chrono::steady_clock::now() < deadline) {
                std::this_thread::sleep_for(std::chrono::milliseconds(20));
            }
        }
    }

    if (action.rfind("exit-once:", 0) == 0) {
        const auto marker = std::filesystem::path(pid_dir) / (file_stem + ".exited");
        if (pid_dir.empty() || std::filesystem::exists(marker)) {
            action = "sleep";
        } else {
            std::ofstream(marker) << "1\n";
            action = "exit:" + action.substr(10);
        }
    }
    if (action.rfind("exit:", 0) == 0) {
        std::cout << "last words from " << name << std::flush;  // no newline: the launcher must end the line
        return std::atoi(action.c_str() + 5);
    }
    if (action == "wait-seen") {
        std::cout << name << " waits to be seen\n";  // no flush: only a line-buffered stdout sends it now
        const auto seen = std::filesystem::path(pid_dir) / (file_stem + ".seen");
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
        while (!std::filesystem::exists(seen) && std::chrono::steady_clock::now() < deadline)
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        if (!std::filesystem::exists(seen)) {
            std::cerr << "echo_task: no one saw the line in 30 s: stdout is not line-buffered\n";
            return 3;
        }
        std::cout << name << " was seen\n";
        return 0;
    }
    if (action == "sleep" || action == "stubborn") {
        sleep_at_most(std::chrono::seconds(60));
        return 0;
    }
    if (action.rfind("sleep:", 0) == 0) {
        sleep_at_most(std::chrono::seconds(std::atoi(action.c_str() + 6)));
        return 0;
    }
    std::cerr << "echo_task: unknown action \"" << action << "\"\n";
    return 64;
}
