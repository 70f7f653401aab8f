// pss/timeouts.hpp: how long a task waits for another, and how it tells a dead or frozen peer from a busy one.
#pragma once

#include <charconv>
#include <chrono>
#include <cmath>
#include <string>
#include <string_view>
#include <system_error>

#include <pss/config.hpp>
#include <pss/detail/environment.hpp>
#include <pss/errors.hpp>

PSS_NAMESPACE_BEGIN

/// @brief The waits of a cluster whose tasks are other processes. No wait in pss is unbounded unless a
/// bound is set to 0 here; liveness comes from heartbeats, not from request deadlines, so a step may run
/// for an hour while a dead or frozen peer is still found within `heartbeat_timeout`.
///
/// | member | environment | default | what it bounds |
/// |---|---|---|---|
/// | `startup` | `PSS_STARTUP_TIMEOUT` | 60 s | connecting to a task that is not up yet; every 5 s of it prints `pss: waiting for <task> at <address> (attempt n, t s)`; a coordinator whose every worker is lost waits as long for one to come back |
/// | `heartbeat_interval` | `PSS_HEARTBEAT_INTERVAL` | 1 s | how often a connection asks its peer whether it is alive |
/// | `heartbeat_timeout` | `PSS_HEARTBEAT_TIMEOUT` | 10 s (TensorFlow's coordination service) | a peer that sent nothing for this long since it was asked is lost: every request waiting for it is answered UnavailableError naming it; a lost peer has as long again to come back (requests wait for it), after which a request connects once and fails at once when it is not up; 0 turns heartbeats off (a lost peer then has the start-up timeout) |
/// | `request` | `PSS_REQUEST_TIMEOUT` | 0 (none) | one request's answer, once the link is up |
/// | `chief` | `PSS_CHIEF_TIMEOUT` | 600 s | how long a ps or worker task serves on once no chief is heard from (its heartbeats count): a chief started again within it takes the task over; after it, the task's `join()` raises UnavailableError. The clock starts when a chief first reaches the task; over plaintext links (`PSS_TLS=off`) a task cannot tell the chief from other tasks, and any task's frames count. Needs heartbeats (0 heartbeat timeout: the task serves until it is ended) |
///
/// The environment gives seconds as a decimal number (`"10"`, `"2.5"`, `"0"`).
struct Timeouts {
    std::chrono::milliseconds startup{60'000};
    std::chrono::milliseconds heartbeat_interval{1'000};
    std::chrono::milliseconds heartbeat_timeout{10'000};
    std::chrono::milliseconds request{0};
    std::chrono::milliseconds chief{600'000};

    /// @brief The defaults, changed by `PSS_STARTUP_TIMEOUT`, `PSS_HEARTBEAT_INTERVAL`,
    /// `PSS_HEARTBEAT_TIMEOUT`, `PSS_REQUEST_TIMEOUT` and `PSS_CHIEF_TIMEOUT` where they are set (what a
    /// strategy runs with).
    /// @throws InvalidArgumentError `pss: PSS_HEARTBEAT_TIMEOUT is "ten"; give seconds as a number from 0 to 86400, such as "10" or "2.5"`
    /// @throws InvalidArgumentError when heartbeats are on and the interval is 0 or not below the timeout
    [[nodiscard]] static Timeouts from_environment(
        const detail::EnvironmentLookup& lookup = detail::process_environment) {
        Timeouts t;
        read(lookup, "PSS_STARTUP_TIMEOUT", t.startup);
        read(lookup, "PSS_HEARTBEAT_INTERVAL", t.heartbeat_interval);
        read(lookup, "PSS_HEARTBEAT_TIMEOUT", t.heartbeat_timeout);
        read(lookup, "PSS_REQUEST_TIMEOUT", t.request);
        read(lookup, "PSS_CHIEF_TIMEOUT", t.chief);
        t.validate();
        return t;
    }

    /// @brief True when connections ask their peers whether they are alive.
    [[nodiscard]] bool heartbeats() const noexcept { return heartbeat_timeout.count() > 0; }

    /// @brief True when a ps or worker task stops serving once no chief was heard from for `chief`.
    [[nodiscard]] bool chief_bounded() const noexcept { return heartbeats() && chief.count() > 0; }

    /// @throws InvalidArgumentError when heartbeats are on and the interval is 0 or not below the timeout,
    /// or a bound is negative
    void validate() const {
        if (startup.count() < 0 || heartbeat_interval.count() < 0 || heartbeat_timeout.count() < 0 ||
            request.count() < 0 || chief.count() < 0)
            throw InvalidArgumentError("pss: Timeouts: a timeout is negative; give 0 (none) or more");
        if (heartbeats() && (heartbeat_interval.count() == 0 || heartbeat_interval >= heartbeat_timeout))
            throw InvalidArgumentError("pss: Timeouts: the heartbeat interval (" + std::to_string(heartbeat_interval.count()) +
                                       " ms) must be above 0 and below the heartbeat timeout (" +
                                       std::to_string(heartbeat_timeout.count()) + " ms)");
    }

private:
    static void read(const detail::EnvironmentLookup& lookup, std::string_view name, std::chrono::milliseconds& out) {
        const auto text = lookup(name);
        if (!text) return;
        double seconds = -1;
        const char* first = text->data();
        const char* last = first + text->size();
        const auto [end, error] = std::from_chars(first, last, seconds);
        if (text->empty() || error != std::errc{} || end != last || !std::isfinite(seconds) || seconds < 0 ||
            seconds > 86'400)
            throw InvalidArgumentError("pss: " + std::string(name) + " is \"" + *text +
                                       "\"; give seconds as a number from 0 to 86400, such as \"10\" or \"2.5\"");
        out = std::chrono::milliseconds(static_cast<std::chrono::milliseconds::rep>(std::llround(seconds * 1000)));
    }
};

namespace detail {

/// "30 s", "0.25 s": a duration as the messages print it.
inline std::string format_seconds(std::chrono::milliseconds ms) {
    const auto count = ms.count();
    std::string out = std::to_string(count / 1000);
    if (count % 1000 != 0) {
        std::string frac = std::to_string(1000 + count % 1000).substr(1);
        while (frac.back() == '0') frac.pop_back();
        out += "." + frac;
    }
    return out + " s";
}

}  // namespace detail

PSS_NAMESPACE_END
