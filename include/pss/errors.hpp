// pss/errors.hpp: the exception types pss throws, mirroring TensorFlow's tf.errors.
#pragma once

#include <chrono>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include <pss/config.hpp>

PSS_NAMESPACE_BEGIN

/// @brief Which kind of failure an Error reports; travels inside replies so that the caller rethrows
/// the same type the parameter server raised.
enum class ErrorCode : int {
    ok = 0,
    invalid_argument = 1,  ///< a wrong shape, dtype, id or configuration value
    not_found = 2,         ///< a variable or task that does not exist
    already_exists = 3,    ///< a variable name used twice on one task
    out_of_range = 4,      ///< a task index outside its job (a row id out of range is invalid_argument, as in TensorFlow)
    failed_precondition = 5,  ///< an operation that does not fit the variable (a gradient to an int variable)
    unavailable = 6,       ///< a task that has shut down or cannot be reached
    cancelled = 7,         ///< work cancelled before it ran
    internal = 8,          ///< a broken invariant inside pss: a bug, please report it
    not_ready = 9,         ///< a synchronous pull asked for a step not applied yet: the caller retries
    permission_denied = 10,  ///< a request its sender's role may not make (a worker assigning a variable)
};

/// @brief The base of every exception pss throws. Messages start with "pss: " and name the input.
class Error : public std::runtime_error {
public:
    Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
    [[nodiscard]] ErrorCode code() const noexcept { return code_; }

private:
    ErrorCode code_;
};

#define PSS_DEFINE_ERROR(Name, code_value)                                                   \
    class Name : public Error {                                                              \
    public:                                                                                  \
        explicit Name(const std::string& message) : Error(ErrorCode::code_value, message) {} \
    };

PSS_DEFINE_ERROR(InvalidArgumentError, invalid_argument)
PSS_DEFINE_ERROR(NotFoundError, not_found)
PSS_DEFINE_ERROR(AlreadyExistsError, already_exists)
PSS_DEFINE_ERROR(OutOfRangeError, out_of_range)
PSS_DEFINE_ERROR(FailedPreconditionError, failed_precondition)
PSS_DEFINE_ERROR(UnavailableError, unavailable)
PSS_DEFINE_ERROR(CancelledError, cancelled)
PSS_DEFINE_ERROR(PermissionDeniedError, permission_denied)
PSS_DEFINE_ERROR(InternalError, internal)

#undef PSS_DEFINE_ERROR

/// @brief The worker running a closure is gone (its process died, it was cut off, or a simulated network
/// lost it; ClusterCoordinator::testing_lose_current_worker() throws it inside a closure): the closure is
/// put back to run on another worker (at-least-once execution).
class WorkerLostError : public UnavailableError {
public:
    using UnavailableError::UnavailableError;
    /// @brief A worker of this process that starts again after `back_after` (a simulated network's):
    /// its thread takes closures again then.
    WorkerLostError(const std::string& message, std::chrono::microseconds back_after)
        : UnavailableError(message), back_after_(back_after) {}
    /// @brief When a worker of this process starts again; none: it does not (a worker process's rejoin is
    /// its own: ClusterCoordinator probes for it).
    [[nodiscard]] std::optional<std::chrono::microseconds> back_after() const noexcept { return back_after_; }

private:
    std::optional<std::chrono::microseconds> back_after_;
};

/// @brief Throws the Error subclass that matches `code`; `message` is used as it is.
[[noreturn]] inline void throw_error(ErrorCode code, const std::string& message) {
    switch (code) {
        case ErrorCode::invalid_argument: throw InvalidArgumentError(message);
        case ErrorCode::not_found: throw NotFoundError(message);
        case ErrorCode::already_exists: throw AlreadyExistsError(message);
        case ErrorCode::out_of_range: throw OutOfRangeError(message);
        case ErrorCode::failed_precondition: throw FailedPreconditionError(message);
        case ErrorCode::unavailable: throw UnavailableError(message);
        case ErrorCode::cancelled: throw CancelledError(message);
        case ErrorCode::permission_denied: throw PermissionDeniedError(message);
        case ErrorCode::ok:
        case ErrorCode::not_ready:
        case ErrorCode::internal: break;
    }
    throw InternalError(message);
}

PSS_NAMESPACE_END
