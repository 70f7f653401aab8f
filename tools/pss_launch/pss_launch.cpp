// tools/pss_launch/pss_launch.cpp: pss-launch, which runs one program as a local parameter-server cluster.
//
// pss-launch --ps N --workers M [--base-port P] [--grace-period S] [--restart-failed[=R]] -- PROGRAM [ARGS...]
//
// Starts one chief, N ps and M workers, each a copy of PROGRAM in its own process group, with TF_CONFIG
// telling each its place; prefixes each task's output lines with its name; ends every task when the chief
// exits or when the launcher gets SIGINT, SIGTERM or SIGHUP. A failed ps or worker leaves the others
// running (the chief decides what its loss means); with --restart-failed it is started again with the
// same identity. POSIX only.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/prctl.h>
#endif

#include <nlohmann/json.hpp>

#include <pss/transport/tcp/tls.hpp>

extern char** environ;

namespace {

constexpr std::string_view usage_text = R"(usage: pss-launch [--ps N] [--workers M] [--base-port P] [--grace-period S] [--restart-failed[=R]] [--report-memory] [--plaintext] [--] PROGRAM [ARGS...]
       pss-launch [--ps N] [--workers M] --write-certificates DIR

Runs PROGRAM as a parameter-server cluster on this machine: one chief, N ps tasks and M worker tasks,
each a separate process, as TensorFlow's ParameterServerStrategy expects them. Each task finds its
place in the TF_CONFIG environment variable (pss::TFConfigClusterResolver, pss::AutoClusterResolver):

  {"cluster":{"chief":["127.0.0.1:P"],"ps":[...],"worker":[...]},"task":{"type":"ps","index":0}}

Options:
  --ps N             the number of ps tasks, 1 to 1000 (default 1)
  --workers M        the number of worker tasks, 1 to 1000 (default 1)
  --base-port P      task ports P, P+1, ... in the order chief, ps 0.., worker 0..; by default each task
                     gets a free port the system picks (bound on 127.0.0.1 and released just before start)
  --grace-period S   seconds a task has to exit after SIGTERM before it gets SIGKILL (default 5)
  --restart-failed[=R]
                     start a ps or worker that failed again, with the same TF_CONFIG, port and
                     certificate, at most R times per task (default 3); a worker started again rejoins
                     the chief's coordinator and takes closures
  --report-memory    when every task has ended, print each task's peak resident memory (ru_maxrss) to
                     stderr: "pss-launch: peak RSS: chief 21.3 MiB, ps:0 80.1 MiB, ..."
  --plaintext        links without TLS (PSS_TLS=off in every task): for trusted networks only
  --write-certificates DIR
                     write a new cluster CA and each task's certificate and key into DIR (ca.crt,
                     chief-0.crt, chief-0.key, ps-0.crt, ...: what PSS_TLS_DIR names) and exit; for
                     clusters started by Slurm or by hand
  --help, -h         this text

Output: each line a task writes to stdout or stderr is written to the launcher's stdout or stderr with
the task's name in front: "[chief] ", "[ps:0] ", "[worker:1] ". Each task gets PSS_LINE_BUFFERED=1,
which makes a pss program's stdout line-buffered before main, so its lines arrive as they are printed.
The launcher's own messages start with "pss-launch: " and go to stderr.

TLS: every run gets a throwaway cluster CA and a certificate per task, written to a new private
directory that PSS_TLS_DIR names in each task and that is removed when the launcher ends. When
PSS_TLS_DIR or PSS_TLS_CERT is set already, the tasks use those certificates instead.

Ending: every task runs in its own process group. When the chief exits, or when the launcher gets
SIGINT, SIGTERM or SIGHUP, every task still running gets SIGTERM, and SIGKILL after the grace period;
the launcher returns once all of them are gone. A ps or worker that fails (exits with a non-zero
status or is killed by a signal) does not end the run: the chief decides what its loss means (its
coordinator runs a lost worker's closures on the others, and raises UnavailableError naming a lost
ps within the heartbeat timeout), and with --restart-failed the task is started again. On Linux a
task also gets SIGKILL if the launcher itself dies.

Exit status: the chief's exit status (128 + the signal if it was killed); 128 + the signal when the
launcher was interrupted; 2 for a wrong command line; 1 when a task could not be started. A PROGRAM
that cannot be run gives each task status 127.

Example:
  pss-launch --ps 2 --workers 4 -- ./train --steps 1000
)";

constexpr int exit_usage = 2;

// ---- command line -----------------------------------------------------------------------------------

struct Options {
    int num_ps = 1;
    int num_workers = 1;
    std::optional<int> base_port;
    double grace_seconds = 5.0;
    int restarts = 0;  // how often a failed ps or worker is started again (--restart-failed)
    bool report_memory = false;
    bool plaintext = false;
    std::optional<std::string> write_certificates;
    std::vector<std::string> command;
};

[[noreturn]] void usage_error(const std::string& message) {
    std::cerr << "pss: pss-launch: " << message << "\nRun pss-launch --help for the options.\n";
    std::exit(exit_usage);
}

int parse_count(std::string_view option, const std::string& text, int low, int high, std::string_view meaning) {
    char* end = nullptr;
    errno = 0;
    const long value = text.empty() ? 0 : std::strtol(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0' || errno == ERANGE || text.find_first_of(" \t+") != std::string::npos ||
        value < low || value > high) {
        usage_error(std::string(option) + " is \"" + text + "\" but must be a whole number from " +
                    std::to_string(low) + " to " + std::to_string(high) + " (" + std::string(meaning) + ")");
    }
    return static_cast<int>(value);
}

Options parse_options(int argc, char** argv) {
    Options options;
    int i = 1;
    for (; i < argc; ++i) {
        std::string arg = argv[i];
        if (arg == "--") {
            ++i;
            break;
        }
        if (arg == "--help" || arg == "-h") {
            std::cout << usage_text;
            std::exit(0);
        }
        if (arg.size() < 2 || arg[0] != '-') break;  // PROGRAM, without "--"
        std::string value;
        bool has_value = false;
        if (const auto equals = arg.find('='); arg.rfind("--", 0) == 0 && equals != std::string::npos) {
            value = arg.substr(equals + 1);
            arg = arg.substr(0, equals);
            has_value = true;
        }
        const auto take_value = [&]() -> std::string {
            if (has_value) return value;
            if (i + 1 >= argc) usage_error(arg + " needs a value");
            return argv[++i];
        };
        if (arg == "--ps") {
            options.num_ps = parse_count("--ps", take_value(), 1, 1000, "the number of ps tasks");
        } else if (arg == "--workers") {
            options.num_workers = parse_count("--workers", take_value(), 1, 1000, "the number of worker tasks");
        } else if (arg == "--base-port") {
            options.base_port = parse_count("--base-port", take_value(), 1, 65535, "the port of the chief");
        } else if (arg == "--restart-failed") {
            options.restarts = has_value ? parse_count("--restart-failed", value, 1, 1000,
                                                       "how often a failed task is started again")
                                         : 3;
        } else if (arg == "--plaintext") {
            if (has_value) usage_error("--plaintext takes no value");
            options.plaintext = true;
        } else if (arg == "--write-certificates") {
            options.write_certificates = take_value();
        } else if (arg == "--report-memory") {
            if (has_value) usage_error("--report-memory takes no value");
            options.report_memory = true;
        } else if (arg == "--grace-period") {
            const std::string text = take_value();
            char* end = nullptr;
            const double seconds = text.empty() ? -1 : std::strtod(text.c_str(), &end);
            if (text.empty() || *end != '\0' || !(seconds >= 0 && seconds <= 3600)) {
                usage_error("--grace-period is \"" + text +
                            "\" but must be a number of seconds from 0 to 3600 (how long a task has after SIGTERM)");
            }
            options.grace_seconds = seconds;
        } else {
            usage_error("unknown option \"" + arg + "\"");
        }
    }
    for (; i < argc; ++i) options.command.emplace_back(argv[i]);
    if (options.write_certificates) {
        if (!options.command.empty()) usage_error("--write-certificates writes certificates and runs no PROGRAM");
        return options;
    }
    if (options.command.empty()) usage_error("no PROGRAM given; write it after the options, e.g. pss-launch --ps 1 --workers 2 -- ./train");
    const int total = 1 + options.num_ps + options.num_workers;
    if (options.base_port && *options.base_port + total - 1 > 65535) {
        usage_error("--base-port " + std::to_string(*options.base_port) + " leaves no room for " + std::to_string(total) +
                    " tasks; their ports must stay within 1 to 65535");
    }
    return options;
}

// ---- ports --------------------------------------------------------------------------------------------

/// `count` ports the system reports free on 127.0.0.1: all sockets stay bound until every port is picked, so
/// no port is given twice. Another program may still take one before the task binds it.
std::vector<int> free_ports(int count) {
    std::vector<int> sockets;
    std::vector<int> ports;
    for (int i = 0; i < count; ++i) {
        const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            std::cerr << "pss-launch: cannot make a socket to find a free port: " << std::strerror(errno) << "\n";
            std::exit(1);
        }
        sockets.push_back(fd);
        sockaddr_in address{};
        address.sin_family = AF_INET;
        address.sin_port = 0;
        address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t length = sizeof address;
        if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
            ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
            std::cerr << "pss-launch: cannot bind 127.0.0.1:0 to find a free port: " << std::strerror(errno) << "\n";
            std::exit(1);
        }
        ports.push_back(ntohs(address.sin_port));
    }
    for (const int fd : sockets) ::close(fd);
    return ports;
}

// ---- signals ------------------------------------------------------------------------------------------

int signal_pipe[2] = {-1, -1};

extern "C" void on_signal(int signal_number) {
    const int saved = errno;
    const unsigned char byte = static_cast<unsigned char>(signal_number);
    [[maybe_unused]] const auto written = ::write(signal_pipe[1], &byte, 1);
    errno = saved;
}

void install_handlers() {
    if (::pipe2(signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
        std::cerr << "pss-launch: cannot make a pipe: " << std::strerror(errno) << "\n";
        std::exit(1);
    }
    struct sigaction action{};
    action.sa_handler = on_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    for (const int signal_number : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) ::sigaction(signal_number, &action, nullptr);
    std::signal(SIGPIPE, SIG_IGN);  // a closed stdout must not kill the launcher before it ends the tasks
}

// ---- tasks --------------------------------------------------------------------------------------------

struct Stream {
    int fd = -1;      // the read end of the task's pipe; -1 once closed
    int out = 1;      // where its lines go: 1 (stdout) or 2 (stderr)
    std::string pending;  // a line not yet ended by '\n'
};

struct Task {
    std::string type;
    int index = 0;
    std::string name;    // "chief", "ps:0", "worker:1"
    std::string prefix;  // "[chief] "
    pid_t pid = -1;      // also the process group id
    std::vector<pid_t> earlier_pids;  // the groups of its processes before a restart: ended with the rest
    bool running = false;
    int status = 0;
    int restarts = 0;
    long peak_rss_kib = 0;  // ru_maxrss of the task's process, once it has ended
    std::string tf_config;
    std::vector<Stream> streams;  // stdout and stderr of each of its processes (a restart adds two)
};

void write_all(int fd, std::string_view text) {
    while (!text.empty()) {
        const ssize_t written = ::write(fd, text.data(), text.size());
        if (written < 0) {
            if (errno == EINTR) continue;
            return;  // stdout closed (EPIPE): the output is lost, the tasks still get ended
        }
        text.remove_prefix(static_cast<std::size_t>(written));
    }
}

/// Writes every complete line of `stream.pending` with the prefix; at end of file, the rest too, ended by '\n'.
void flush_lines(Stream& stream, const std::string& prefix, bool at_end) {
    std::string out;
    std::size_t start = 0;
    for (std::size_t newline; (newline = stream.pending.find('\n', start)) != std::string::npos; start = newline + 1) {
        out += prefix;
        out.append(stream.pending, start, newline - start + 1);
    }
    stream.pending.erase(0, start);
    if (at_end && !stream.pending.empty()) {
        out += prefix + stream.pending + "\n";
        stream.pending.clear();
    }
    if (!out.empty()) write_all(stream.out, out);
}

std::string describe(int status) {
    if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
    if (WIFSIGNALED(status)) {
        const int signal_number = WTERMSIG(status);
        const char* name = ::strsignal(signal_number);
        return "was killed by signal " + std::to_string(signal_number) + (name ? " (" + std::string(name) + ")" : "");
    }
    return "ended with wait status " + std::to_string(status);
}

int exit_code_of(int status) {
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return 1;
}

/// Writes ca.crt and each task's <job>-<index>.crt and .key (mode 0600) into `dir`; false on failure.
bool write_certificates(const std::filesystem::path& dir, const std::vector<Task>& tasks) {
#if PSS_HAS_TLS
    try {
        std::vector<pss::TaskId> ids;
        for (const auto& task : tasks) ids.push_back(pss::TaskId{task.type, task.index});
        pss::TlsAuthority("pss-launch cluster CA").write_directory(dir, ids);
        return true;
    } catch (const std::exception& e) {
        std::cerr << "pss-launch: cannot make the certificates: " << e.what() << "\n";
        return false;
    }
#else
    (void)dir;
    (void)tasks;
    std::cerr << "pss-launch: built without TLS (PSS_NO_TLS): no certificates; the tasks run plaintext\n";
    return true;
#endif
}

bool failed(int status) { return !(WIFEXITED(status) && WEXITSTATUS(status) == 0); }

/// Starts `task` running `command` with TF_CONFIG and `extra` (NAME=value) set; false when fork or pipe fails.
bool start(Task& task, const std::vector<std::string>& command, const std::string& tf_config,
           const std::vector<std::string>& extra) {
    int out_pipe[2];
    int err_pipe[2];
    if (::pipe2(out_pipe, O_CLOEXEC) != 0) return false;
    if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
        ::close(out_pipe[0]);
        ::close(out_pipe[1]);
        return false;
    }
    // Everything the child needs is made before fork: after it only async-signal-safe calls are made.
    std::vector<std::string> environment_strings;
    for (char** entry = environ; *entry != nullptr; ++entry) {
        if (std::strncmp(*entry, "TF_CONFIG=", 10) != 0) environment_strings.emplace_back(*entry);
    }
    environment_strings.push_back("TF_CONFIG=" + tf_config);
    environment_strings.insert(environment_strings.end(), extra.begin(), extra.end());
    std::vector<char*> child_environment;
    for (auto& entry : environment_strings) child_environment.push_back(entry.data());
    child_environment.push_back(nullptr);
    std::vector<std::string> arguments = command;
    std::vector<char*> child_arguments;
    for (auto& argument : arguments) child_arguments.push_back(argument.data());
    child_arguments.push_back(nullptr);
    const std::string exec_error = "pss-launch: cannot run " + command.front() + ": ";
    const pid_t launcher = ::getpid();

    // Signals stay blocked from before fork until the child has put back the default handlers: the
    // launcher's handler, run in the child, would write to the launcher's signal pipe.
    sigset_t all;
    sigset_t previous;
    sigfillset(&all);
    ::sigprocmask(SIG_SETMASK, &all, &previous);
    const pid_t pid = ::fork();
    if (pid < 0) {
        ::sigprocmask(SIG_SETMASK, &previous, nullptr);
        for (const int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) ::close(fd);
        return false;
    }
    if (pid == 0) {
        for (const int signal_number : {SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGCHLD}) ::signal(signal_number, SIG_DFL);
        ::close(signal_pipe[0]);
        ::close(signal_pipe[1]);
        ::setpgid(0, 0);
#if defined(__linux__)
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (::getppid() != launcher) ::_exit(1);  // the launcher died before prctl took effect
#endif
        sigset_t none;
        sigemptyset(&none);
        ::sigprocmask(SIG_SETMASK, &none, nullptr);
        const int null_fd = ::open("/dev/null", O_RDONLY);
        if (null_fd >= 0) ::dup2(null_fd, 0);
        ::dup2(out_pipe[1], 1);
        ::dup2(err_pipe[1], 2);
        environ = child_environment.data();
        ::execvp(child_arguments[0], child_arguments.data());
        const int error = errno;
        [[maybe_unused]] auto w1 = ::write(2, exec_error.data(), exec_error.size());
        const char* reason = ::strerror(error);
        [[maybe_unused]] auto w2 = ::write(2, reason, std::strlen(reason));
        [[maybe_unused]] auto w3 = ::write(2, "\n", 1);
        ::_exit(127);
    }
    ::setpgid(pid, pid);  // also in the parent, so the group exists before anyone signals it
    ::sigprocmask(SIG_SETMASK, &previous, nullptr);
    ::close(out_pipe[1]);
    ::close(err_pipe[1]);
    if (task.pid > 0) task.earlier_pids.push_back(task.pid);
    task.pid = pid;
    task.running = true;
    std::erase_if(task.streams, [](const Stream& s) { return s.fd < 0; });  // read to the end already
    task.streams.push_back(Stream{out_pipe[0], 1, {}});
    task.streams.push_back(Stream{err_pipe[0], 2, {}});
    return true;
}

void signal_groups(const std::vector<Task>& tasks, int signal_number, bool only_running) {
    for (const auto& task : tasks) {
        if (task.pid > 0 && (task.running || !only_running)) ::kill(-task.pid, signal_number);
        if (!only_running)
            for (const pid_t earlier : task.earlier_pids) ::kill(-earlier, signal_number);
    }
}

}  // namespace

int main(int argc, char** argv) {
    const Options options = parse_options(argc, argv);
    install_handlers();

    // The cluster: chief, ps 0.., worker 0.., each on its own port.
    std::vector<Task> tasks;
    const auto add_task = [&tasks](const std::string& type, int index) {
        Task task;
        task.type = type;
        task.index = index;
        task.name = type == "chief" ? type : type + ":" + std::to_string(index);
        task.prefix = "[" + task.name + "] ";
        tasks.push_back(std::move(task));
    };
    add_task("chief", 0);
    for (int i = 0; i < options.num_ps; ++i) add_task("ps", i);
    for (int i = 0; i < options.num_workers; ++i) add_task("worker", i);
    if (options.write_certificates) {
        std::error_code ec;
        std::filesystem::create_directories(*options.write_certificates, ec);
        if (!ec) std::filesystem::permissions(*options.write_certificates, std::filesystem::perms::owner_all, ec);
        if (ec || !write_certificates(*options.write_certificates, tasks)) {
            std::cerr << "pss-launch: cannot write the certificates into " << *options.write_certificates << "\n";
            return 1;
        }
        std::cout << "pss-launch: wrote ca.crt and the certificates and keys of " << tasks.size() << " tasks to "
                  << *options.write_certificates << "\n";
        return 0;
    }
    std::vector<int> ports;
    if (options.base_port) {
        for (std::size_t i = 0; i < tasks.size(); ++i) ports.push_back(*options.base_port + static_cast<int>(i));
    } else {
        ports = free_ports(static_cast<int>(tasks.size()));
    }
    nlohmann::json cluster = {{"chief", nlohmann::json::array()}, {"ps", nlohmann::json::array()},
                              {"worker", nlohmann::json::array()}};
    for (std::size_t i = 0; i < tasks.size(); ++i) {
        cluster[tasks[i].type].push_back("127.0.0.1:" + std::to_string(ports[i]));
    }

    // Their TLS identities: a new CA and a certificate per task, unless the user gave their own.
    // Each task's stdout is a pipe to us, which C's stdio buffers fully: pss programs read this before
    // main and make stdout line-buffered, so a task's lines arrive as they are printed, not at its exit.
    std::vector<std::string> task_environment{"PSS_LINE_BUFFERED=1"};
    std::optional<std::filesystem::path> tls_dir;
    if (options.plaintext) {
        task_environment.push_back("PSS_TLS=off");
    } else if (std::getenv("PSS_TLS_DIR") == nullptr && std::getenv("PSS_TLS_CERT") == nullptr) {
        std::string pattern = (std::filesystem::temp_directory_path() / "pss-launch-tls-XXXXXX").string();
        if (::mkdtemp(pattern.data()) == nullptr) {  // mode 0700: the keys are this user's only
            std::cerr << "pss-launch: cannot make a directory for the certificates: " << std::strerror(errno) << "\n";
            return 1;
        }
        tls_dir = pattern;
        if (!write_certificates(*tls_dir, tasks)) return 1;
        task_environment.push_back("PSS_TLS_DIR=" + pattern);
    }
    struct RemoveDirectory {
        std::optional<std::filesystem::path>& path;
        ~RemoveDirectory() {
            std::error_code ignored;
            if (path) std::filesystem::remove_all(*path, ignored);
        }
    } remove_tls_dir{tls_dir};

    // Start them all, the ps tasks and workers first so the chief finds them starting.
    bool stopping = false;
    int exit_code = 0;
    const auto grace = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(options.grace_seconds));
    std::optional<std::chrono::steady_clock::time_point> kill_at;
    const auto stop = [&](int code, const std::string& why) {
        if (stopping) return;
        stopping = true;
        exit_code = code;
        std::cerr << "pss-launch: " << why << "; ending every task\n" << std::flush;
        signal_groups(tasks, SIGTERM, false);  // exited leaders too: their groups may hold leftovers
        kill_at = std::chrono::steady_clock::now() + grace;
    };
    std::rotate(tasks.begin(), tasks.begin() + 1, tasks.end());  // chief last
    for (auto& task : tasks) {
        task.tf_config = nlohmann::json{{"cluster", cluster}, {"task", {{"type", task.type}, {"index", task.index}}}}.dump();
        if (!start(task, options.command, task.tf_config, task_environment)) {
            stop(1, "cannot start task " + task.name + ": " + std::strerror(errno));
            break;
        }
    }

    // Copy output and watch the tasks until all are gone and their output is read.
    const auto anything_left = [&] {
        for (const auto& task : tasks) {
            if (task.running) return true;
            for (const auto& stream : task.streams)
                if (stream.fd >= 0) return true;
        }
        return false;
    };
    std::optional<std::chrono::steady_clock::time_point> drain_until;   // once every task has exited
    std::optional<std::chrono::steady_clock::time_point> first_signal;  // the first SIGINT, SIGTERM or SIGHUP
    while (anything_left()) {
        std::vector<pollfd> fds{{signal_pipe[0], POLLIN, 0}};
        std::vector<Stream*> owners{nullptr};
        for (auto& task : tasks) {
            for (auto& stream : task.streams) {
                if (stream.fd >= 0) {
                    fds.push_back({stream.fd, POLLIN, 0});
                    owners.push_back(&stream);
                }
            }
        }
        int timeout_ms = -1;
        const auto now = std::chrono::steady_clock::now();
        for (const auto& deadline : {kill_at, drain_until}) {
            if (!deadline) continue;
            const auto left = std::chrono::ceil<std::chrono::milliseconds>(*deadline - now).count();
            const int ms = static_cast<int>(std::clamp<long long>(left, 0, 60000));
            timeout_ms = timeout_ms < 0 ? ms : std::min(timeout_ms, ms);
        }
        const int ready = ::poll(fds.data(), fds.size(), timeout_ms);
        if (ready < 0 && errno != EINTR) {
            std::cerr << "pss-launch: poll failed: " << std::strerror(errno) << "\n";
            stop(1, "an internal error");
        }

        // Signals: children to reap, or a request to stop.
        if (ready > 0 && (fds[0].revents & POLLIN)) {
            unsigned char signals[64];
            ssize_t count;
            while ((count = ::read(signal_pipe[0], signals, sizeof signals)) > 0) {
                for (ssize_t i = 0; i < count; ++i) {
                    if (signals[i] == SIGCHLD) continue;
                    const auto now_signal = std::chrono::steady_clock::now();
                    // A second request, a second after the first, means no more grace. (One signal often
                    // arrives twice at once: to the launcher and to its process group, as timeout(1) sends.)
                    if (first_signal && now_signal - *first_signal < std::chrono::seconds(1)) continue;
                    if (!first_signal) first_signal = now_signal;
                    if (stopping && now_signal > *first_signal) {
                        std::cerr << "pss-launch: got signal " << int{signals[i]} << " again; killing every task\n";
                        signal_groups(tasks, SIGKILL, false);
                    } else {
                        stop(128 + signals[i],
                             std::string("got signal ") + std::to_string(signals[i]) + " (" + ::strsignal(signals[i]) + ")");
                    }
                }
            }
        }
        int status = 0;
        struct rusage usage {};
        std::vector<Task*> to_restart;
        for (pid_t pid; (pid = ::wait4(-1, &status, WNOHANG, &usage)) > 0;) {
            for (auto& task : tasks) {
                if (task.pid != pid) continue;
                task.running = false;
                task.peak_rss_kib = usage.ru_maxrss;
                task.status = status;
                const bool is_chief = task.type == "chief";
                if (stopping) continue;
                if (is_chief) {
                    stop(exit_code_of(status), "the chief " + describe(status));
                } else if (failed(status) && task.restarts < options.restarts) {
                    ++task.restarts;
                    std::cerr << "pss-launch: " << task.name << " " << describe(status) << "; starting it again ("
                              << task.restarts << " of " << options.restarts << " restarts)\n" << std::flush;
                    to_restart.push_back(&task);  // after its output is read: `owners` points into its streams
                } else if (failed(status)) {
                    std::cerr << "pss-launch: " << task.name << " " << describe(status)
                              << "; the other tasks run on (the chief decides what its loss means)\n" << std::flush;
                } else {
                    std::cerr << "pss-launch: " << task.name << " " << describe(status) << "\n" << std::flush;
                }
            }
        }

        // Output.
        for (std::size_t i = 1; i < fds.size(); ++i) {
            if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            Stream& stream = *owners[i];
            const Task* owner = nullptr;
            for (const auto& task : tasks)
                for (const auto& s : task.streams)
                    if (&s == &stream) owner = &task;
            char buffer[65536];
            const ssize_t count = ::read(stream.fd, buffer, sizeof buffer);
            if (count > 0) {
                stream.pending.append(buffer, static_cast<std::size_t>(count));
                flush_lines(stream, owner->prefix, false);
            } else if (count == 0 || errno != EINTR) {
                flush_lines(stream, owner->prefix, true);
                ::close(stream.fd);
                stream.fd = -1;
            }
        }

        for (Task* task : to_restart) {
            if (!stopping && !start(*task, options.command, task->tf_config, task_environment))
                stop(1, "cannot start task " + task->name + " again: " + std::strerror(errno));
        }

        // Escalate, and stop waiting for output that processes outside the tasks' groups keep open.
        const auto later = std::chrono::steady_clock::now();
        if (kill_at && later >= *kill_at) {
            bool any = false;
            for (const auto& task : tasks) any = any || task.running;
            if (any) std::cerr << "pss-launch: tasks still running after the grace period get SIGKILL\n" << std::flush;
            signal_groups(tasks, SIGKILL, false);
            kill_at.reset();
        }
        bool all_exited = true;
        for (const auto& task : tasks) all_exited = all_exited && !task.running;
        if (all_exited && !drain_until) drain_until = later + std::chrono::seconds(2);
        if (drain_until && later >= *drain_until) {
            for (auto& task : tasks) {
                for (auto& stream : task.streams) {
                    if (stream.fd < 0) continue;
                    flush_lines(stream, task.prefix, true);
                    ::close(stream.fd);
                    stream.fd = -1;
                }
            }
        }
    }
    // Whatever a task left behind in its process group goes too.
    signal_groups(tasks, SIGKILL, false);
    if (options.report_memory) {
        std::string report = "pss-launch: peak RSS:";
        for (const auto& task : tasks) {
            char figure[32];
            std::snprintf(figure, sizeof figure, "%.1f MiB", static_cast<double>(task.peak_rss_kib) / 1024.0);
            report += (&task == &tasks.front() ? " " : ", ") + task.name + " " + figure;
        }
        std::cerr << report << "\n" << std::flush;
    }
    return exit_code;
}
