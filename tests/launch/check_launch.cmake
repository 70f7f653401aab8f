# tests/launch/check_launch.cmake: runs pss-launch on echo_task and checks one behaviour (cmake -P).
#   -DLAUNCH=<pss-launch> -DECHO_TASK=<echo_task> -DWORK_DIR=<scratch dir> -DSCENARIO=<name>
# Scenarios:
#   output_and_exit_status  2 ps + 2 workers: every line prefixed, TF_CONFIG right, the chief's status 3 is the
#                           launcher's, every task and every task's child ended
#   task_failure            worker:1 exits 4 and ps:1 exits 5: the others run on; the chief's 0 is the launcher's 0
#   restart_failed          --restart-failed=2: a worker failing every time is started twice more and then
#                           left, a ps failing once is started once more; both say hello again
#   clean_exit              a ps exiting 0 is no failure; the chief's 0 is the launcher's 0
#   sigterm                 SIGTERM to the launcher ends every task, a task ignoring SIGTERM by SIGKILL; status 143
#   bad_program             a PROGRAM that cannot be run: status 127 and a message from the task
#   arguments               --help, and each command-line error's message and status 2
# Every wait is bounded: each run has a TIMEOUT, each poll a deadline.
cmake_minimum_required(VERSION 3.21)

foreach(var LAUNCH ECHO_TASK WORK_DIR SCENARIO)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "check_launch.cmake: -D${var}=... is required")
  endif()
endforeach()

file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
set(PIDS "${WORK_DIR}/pids")
file(MAKE_DIRECTORY "${PIDS}")

set(failures "")
# Each records a failure in `failures` and goes on, so that one run reports every problem. Both take the
# NAME of the variable to check.
function(expect_equal var expected what)
  if(NOT "${${var}}" STREQUAL "${expected}")
    set(failures "${failures}  - ${what}\n" PARENT_SCOPE)
  endif()
endfunction()
function(expect_match var regex what)
  if(NOT "${${var}}" MATCHES "${regex}")
    set(failures "${failures}  - ${what}\n" PARENT_SCOPE)
  endif()
endfunction()
function(expect_no_match var regex what)
  if("${${var}}" MATCHES "${regex}")
    set(failures "${failures}  - ${what}\n" PARENT_SCOPE)
  endif()
endfunction()

# Runs pss-launch with the given arguments; sets rc, out, err.
function(run_launch)
  execute_process(COMMAND "${LAUNCH}" ${ARGN}
    RESULT_VARIABLE result OUTPUT_VARIABLE stdout ERROR_VARIABLE stderr TIMEOUT 60)
  set(rc "${result}" PARENT_SCOPE)
  set(out "${stdout}" PARENT_SCOPE)
  set(err "${stderr}" PARENT_SCOPE)
  file(WRITE "${WORK_DIR}/stdout.txt" "${stdout}")
  file(WRITE "${WORK_DIR}/stderr.txt" "${stderr}")
endfunction()

# True (in alive_var) when the process exists and is not a zombie.
function(pid_alive pid alive_var)
  execute_process(COMMAND kill -0 ${pid} RESULT_VARIABLE kill_rc OUTPUT_QUIET ERROR_QUIET)
  set(alive FALSE)
  if(kill_rc EQUAL 0)
    set(alive TRUE)
    if(EXISTS "/proc/${pid}/stat")
      file(READ "/proc/${pid}/stat" stat)
      if(stat MATCHES "\\) Z ")  # a zombie has ended; only its parent (maybe init) has not reaped it yet
        set(alive FALSE)
      endif()
    endif()
  endif()
  set(${alive_var} ${alive} PARENT_SCOPE)
endfunction()

# Checks that every pid file under PIDS names a process that is gone (giving SIGKILL up to 10 s in all to
# land), and that there are at least `expected` of them.
function(check_no_process_left expected)
  file(GLOB pid_files "${PIDS}/*.pid")
  list(LENGTH pid_files count)
  if(count LESS expected)
    string(APPEND failures "  - ${count} pid files, not ${expected}: some task did not start\n")
  endif()
  set(left "${pid_files}")
  foreach(attempt RANGE 100)
    set(still "")
    foreach(pid_file IN LISTS left)
      file(STRINGS "${pid_file}" pid LIMIT_COUNT 1)
      pid_alive(${pid} alive)
      if(alive)
        list(APPEND still "${pid_file}")
      endif()
    endforeach()
    set(left "${still}")
    if(NOT left)
      break()
    endif()
    execute_process(COMMAND "${CMAKE_COMMAND}" -E sleep 0.1)
  endforeach()
  foreach(pid_file IN LISTS left)
    file(STRINGS "${pid_file}" pid LIMIT_COUNT 1)
    get_filename_component(name "${pid_file}" NAME)
    string(APPEND failures "  - ${name} (pid ${pid}) is still running after pss-launch returned\n")
    execute_process(COMMAND kill -9 ${pid} OUTPUT_QUIET ERROR_QUIET)  # leave nothing behind ourselves
  endforeach()
  set(failures "${failures}" PARENT_SCOPE)
endfunction()

if(SCENARIO STREQUAL "output_and_exit_status")
  run_launch(--ps 2 --workers 2 -- "${ECHO_TASK}" --pid-dir "${PIDS}" --grandchild chief=exit:3 "*=sleep")
  expect_equal(rc "3" "exit status is '${rc}', not the chief's 3")
  foreach(task chief ps:0 ps:1 worker:0 worker:1)
    expect_match(out "(^|\n)\\[${task}\\] hello from ${task}\n"
           "stdout has no line '[${task}] hello from ${task}'")
    expect_match(out "(^|\n)\\[${task}\\] ${task} of 1 chief, 2 ps, 2 workers at 127\\.0\\.0\\.1:[0-9]+\n"
           "stdout has no line '[${task}] ${task} of 1 chief, 2 ps, 2 workers at 127.0.0.1:<port>'")
    expect_match(err "(^|\n)\\[${task}\\] note from ${task}\n" "stderr has no line '[${task}] note from ${task}'")
  endforeach()
  expect_match(out "(^|\n)\\[chief\\] last words from chief\n"
         "the chief's last line, written without a newline, is not '[chief] last words from chief' ended by the launcher")
  # Every stdout line carries a prefix; the launcher's own lines are on stderr only.
  string(REGEX REPLACE "\n$" "" trimmed "${out}")
  string(REPLACE "\n" ";" lines "${trimmed}")
  foreach(line IN LISTS lines)
    expect_match(line "^\\[(chief|ps:[01]|worker:[01])\\] " "stdout line without a task prefix: '${line}'")
  endforeach()
  expect_match(err "pss-launch: the chief exited with status 3; ending every task"
         "stderr does not say the chief exited with status 3")
  # The five tasks used distinct ports.
  string(REGEX MATCHALL "at 127\\.0\\.0\\.1:[0-9]+" addresses "${out}")
  list(REMOVE_DUPLICATES addresses)
  list(LENGTH addresses distinct)
  expect_equal(distinct "5" "the tasks have ${distinct} distinct addresses, not 5")
  check_no_process_left(10)  # 5 tasks and the 5 children they forked

elseif(SCENARIO STREQUAL "task_failure")
  run_launch(--ps 2 --workers 2 --grace-period 3 -- "${ECHO_TASK}" --pid-dir "${PIDS}" worker:1=exit:4 ps:1=exit:5
             chief=sleep:3 "*=sleep")
  expect_equal(rc "0" "exit status is '${rc}', not the chief's 0 (a failed ps or worker does not end the run)")
  foreach(failure "worker:1 exited with status 4" "ps:1 exited with status 5")
    expect_match(err "pss-launch: ${failure}; the other tasks run on \\(the chief decides what its loss means\\)"
           "stderr does not say ${failure} and the others run on")
  endforeach()
  expect_no_match(err "exited with status [45]; ending" "a failed task ended the run")
  expect_match(err "pss-launch: the chief exited with status 0; ending every task" "the chief's exit did not end the run")
  expect_match(out "(^|\n)\\[worker:1\\] last words from worker:1\n" "stdout lacks worker:1's last words")
  check_no_process_left(5)

elseif(SCENARIO STREQUAL "restart_failed")
  run_launch(--ps 2 --workers 2 --restart-failed=2 -- "${ECHO_TASK}" --pid-dir "${PIDS}" worker:1=exit:4
             ps:0=exit-once:5 chief=sleep:4 "*=sleep")
  expect_equal(rc "0" "exit status is '${rc}', not the chief's 0")
  foreach(restart 1 2)
    expect_match(err "pss-launch: worker:1 exited with status 4; starting it again \\(${restart} of 2 restarts\\)"
           "stderr does not say worker:1 is started again (${restart} of 2)")
  endforeach()
  expect_match(err "pss-launch: worker:1 exited with status 4; the other tasks run on"
         "stderr does not say worker:1 is left after its 2 restarts")
  expect_match(err "pss-launch: ps:0 exited with status 5; starting it again \\(1 of 2 restarts\\)"
         "stderr does not say ps:0 is started again")
  expect_match(err "pss-launch: the chief exited with status 0; ending every task" "the run ended before the chief did")
  string(REGEX MATCHALL "\\[worker:1\\] hello from worker:1\n" worker_hellos "${out}")
  list(LENGTH worker_hellos worker_count)
  expect_equal(worker_count "3" "worker:1 said hello ${worker_count} times, not 3 (started, and started again twice)")
  string(REGEX MATCHALL "\\[ps:0\\] hello from ps:0\n" ps_hellos "${out}")
  list(LENGTH ps_hellos ps_count)
  expect_equal(ps_count "2" "ps:0 said hello ${ps_count} times, not 2")
  check_no_process_left(5)

elseif(SCENARIO STREQUAL "clean_exit")
  run_launch(--ps 1 --workers 1 -- "${ECHO_TASK}" --pid-dir "${PIDS}" ps=exit:0 chief=exit:0 worker=sleep)
  expect_equal(rc "0" "exit status is '${rc}', not the chief's 0")
  expect_no_match(err "ps:0 exited with status 0; ending" "a ps exiting with status 0 was taken for a failure")
  check_no_process_left(3)

elseif(SCENARIO STREQUAL "sigterm")
  find_program(TIMEOUT_PROGRAM timeout)
  if(NOT TIMEOUT_PROGRAM)
    message(FATAL_ERROR "check_launch.cmake: the sigterm scenario needs coreutils' timeout")
  endif()
  string(TIMESTAMP start "%s")
  execute_process(COMMAND "${TIMEOUT_PROGRAM}" --preserve-status -s TERM 5
                          "${LAUNCH}" --ps 2 --workers 2 --grace-period 1 --
                          "${ECHO_TASK}" --pid-dir "${PIDS}" ps:1=stubborn "*=sleep"
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 60)
  string(TIMESTAMP end "%s")
  math(EXPR elapsed "${end} - ${start}")
  file(WRITE "${WORK_DIR}/stdout.txt" "${out}")
  file(WRITE "${WORK_DIR}/stderr.txt" "${err}")
  expect_equal(rc "143" "exit status is '${rc}', not 128 + SIGTERM")
  expect_match(err "pss-launch: got signal 15 [^\n]*; ending every task" "stderr does not say SIGTERM arrived")
  expect_match(err "after the grace period get SIGKILL" "the task ignoring SIGTERM was not escalated to SIGKILL")
  if(NOT elapsed LESS 20)
    set(failures "${failures}  - pss-launch took ${elapsed} s to end after SIGTERM\n")
  endif()
  check_no_process_left(5)

elseif(SCENARIO STREQUAL "bad_program")
  run_launch(--ps 1 --workers 1 -- "${WORK_DIR}/no-such-program")
  expect_equal(rc "127" "exit status is '${rc}', not 127")
  expect_match(err "\\[(chief|ps:0|worker:0)\\] pss-launch: cannot run [^\n]*no-such-program: "
         "no task said it cannot run the program")

elseif(SCENARIO STREQUAL "arguments")
  run_launch(--help)
  expect_equal(rc "0" "--help exits with '${rc}', not 0")
  expect_match(out "^usage: pss-launch \\[--ps N\\] \\[--workers M\\]" "--help does not start with the usage line")
  # Each command-line error: status 2, the message on stderr, then the pointer to --help.
  function(expect_usage_error message)
    run_launch(${ARGN})
    if(NOT rc EQUAL 2 OR NOT err STREQUAL "${message}\nRun pss-launch --help for the options.\n")
      set(failures "${failures}  - '${ARGN}' exits with '${rc}' and says '${err}', not 2 and '${message}'\n" PARENT_SCOPE)
    endif()
  endfunction()
  expect_usage_error("pss: pss-launch: --ps is \"x\" but must be a whole number from 1 to 1000 (the number of ps tasks)"
                     --ps x -- prog)
  expect_usage_error("pss: pss-launch: --workers is \"0\" but must be a whole number from 1 to 1000 (the number of worker tasks)"
                     --workers=0 prog)
  expect_usage_error("pss: pss-launch: no PROGRAM given; write it after the options, e.g. pss-launch --ps 1 --workers 2 -- ./train"
                     --ps 2)
  expect_usage_error("pss: pss-launch: --workers needs a value" --workers)
  expect_usage_error("pss: pss-launch: unknown option \"--frobnicate\"" --frobnicate prog)
  expect_usage_error("pss: pss-launch: --base-port 65534 leaves no room for 3 tasks; their ports must stay within 1 to 65535"
                     --base-port 65534 prog)
  expect_usage_error("pss: pss-launch: --grace-period is \"-1\" but must be a number of seconds from 0 to 3600 (how long a task has after SIGTERM)"
                     --grace-period -1 prog)
  expect_usage_error("pss: pss-launch: --restart-failed is \"0\" but must be a whole number from 1 to 1000 (how often a failed task is started again)"
                     --restart-failed=0 prog)

else()
  message(FATAL_ERROR "check_launch.cmake: unknown SCENARIO '${SCENARIO}'")
endif()

if(failures)
  message(FATAL_ERROR "pss-launch scenario ${SCENARIO} failed (output in ${WORK_DIR}):\n${failures}")
endif()
message(STATUS "pss-launch scenario ${SCENARIO}: ok")
