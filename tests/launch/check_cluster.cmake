# tests/launch/check_cluster.cmake: runs a cluster program embedded (MODE=embedded) or under pss-launch with
# 2 ps and 2 workers as separate processes (MODE=launched), and compares the chief's stdout (its lines
# without the "[chief] " prefix) with EXPECTED, byte for byte. The launched run must exit 0.
#   -DLAUNCH=<pss-launch> -DPROGRAM=<program> -DEXPECTED=<golden file> -DWORK_DIR=<scratch dir> -DMODE=<mode>
#   [-DARGS=<program arguments, ;-separated>] [-DEXPECT_LOST_WORKER=ON: the chief announces one lost worker]
#   [-DLAUNCH_ARGS=<more pss-launch options>] [-DEXPECT_REJOIN=ON: worker:1 is killed, started again by the
#   launcher, and announced back on the chief] [-DEXPECT_PS_RECOVERY=ON: ps:1 is killed, started again by the
#   launcher, and restored by the chief from its checkpoint ckpt-1] [-DEXPECT_SYNC_PS_RECOVERY=ON: the same,
#   restored from a fit's backup] [-DEXPECT_NO_LOSS=ON: no task is lost]
#   [-DRUN_TIMEOUT=<seconds the launched run may take; 150>]
cmake_minimum_required(VERSION 3.21)
include("${CMAKE_CURRENT_LIST_DIR}/chief_lines.cmake")

if(NOT RUN_TIMEOUT)
  set(RUN_TIMEOUT 150)
endif()
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
if(MODE STREQUAL "embedded")
  execute_process(COMMAND "${PROGRAM}" ${ARGS}
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 150)
  set(chief "${out}")
else()
  execute_process(COMMAND "${LAUNCH}" --ps 2 --workers 2 --report-memory ${LAUNCH_ARGS} -- "${PROGRAM}" ${ARGS}
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT ${RUN_TIMEOUT})
  pss_chief_lines(chief "${out}")
endif()
file(WRITE "${WORK_DIR}/stdout.txt" "${out}")
file(WRITE "${WORK_DIR}/stderr.txt" "${err}")
file(WRITE "${WORK_DIR}/chief.txt" "${chief}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${MODE} run exited with ${rc}\nstdout:\n${out}\nstderr:\n${err}")
endif()
if(MODE STREQUAL "launched" AND NOT err MATCHES "pss-launch: peak RSS: ps:0 [0-9]+\\.[0-9] MiB, ps:1 [0-9]+\\.[0-9] MiB, worker:0 [0-9]+\\.[0-9] MiB, worker:1 [0-9]+\\.[0-9] MiB, chief [0-9]+\\.[0-9] MiB\n")
  message(FATAL_ERROR "launched run: no peak RSS report (--report-memory) on stderr:\n${err}")
endif()
# A worker the program loses on purpose (the process ends in a call) is announced on the chief, once; no ps is.
if(MODE STREQUAL "launched" AND EXPECT_LOST_WORKER)
  string(REGEX MATCHALL "\\[chief\\] pss: lost [^\n]*" lost_lines "${err}")
  list(LENGTH lost_lines lost_count)
  if(NOT lost_count EQUAL 1 OR NOT lost_lines MATCHES "^\\[chief\\] pss: lost /job:worker/replica:0/task:[01] at 127\\.0\\.0\\.1:[0-9]+ \\(")
    message(FATAL_ERROR "launched run: the chief should print one \"pss: lost /job:worker/...\" line; it printed:\n${lost_lines}\nstderr:\n${err}")
  endif()
endif()
if(MODE STREQUAL "launched" AND EXPECT_REJOIN)
  foreach(line "pss-launch: worker:1 was killed by signal 9 \\(Killed\\); starting it again \\(1 of [0-9]+ restarts\\)"
               "\\[chief\\] pss: /job:worker/replica:0/task:1 at 127\\.0\\.0\\.1:[0-9]+ is back")
    if(NOT err MATCHES "${line}")
      message(FATAL_ERROR "launched run: stderr has no line matching ${line}\nstderr:\n${err}")
    endif()
  endforeach()
endif()
if(MODE STREQUAL "launched" AND EXPECT_NO_LOSS AND err MATCHES "pss: lost ")
  message(FATAL_ERROR "launched run: a task was lost:\n${err}")
endif()
# ps:1 killed and started again by the launcher, restored by the chief: from its checkpoint ckpt-1 (a
# coordinator's recover_ps_from), or from a fit's latest backup (BackupAndRestore's recover_lost_ps).
if(MODE STREQUAL "launched" AND (EXPECT_PS_RECOVERY OR EXPECT_SYNC_PS_RECOVERY))
  if(EXPECT_SYNC_PS_RECOVERY)
    set(directory "backup")
    set(restored "[0-9]+ shards? created again, every variable restored from [^\n]*/backup/ckpt-[23]")
  else()
    set(directory "ckpt")
    set(restored "1 shard created again, every variable restored from [^\n]*/ckpt/ckpt-1")
  endif()
  foreach(line "pss-launch: ps:1 was killed by signal 9 \\(Killed\\); starting it again \\(1 of [0-9]+ restarts\\)"
               "\\[chief\\] pss: /job:ps/replica:0/task:1 was lost; waiting for it to start again, then restoring every variable from the latest checkpoint in [^\n]*/${directory}\n"
               "\\[chief\\] pss: /job:ps/replica:0/task:1 is back: ${restored}; training goes on\n")
    if(NOT err MATCHES "${line}")
      message(FATAL_ERROR "launched run: stderr has no line matching ${line}\nstderr:\n${err}")
    endif()
  endforeach()
endif()
file(READ "${EXPECTED}" expected)
if(NOT chief STREQUAL expected)
  message(FATAL_ERROR "${MODE} run: the chief's output differs from ${EXPECTED}\n--- expected\n${expected}\n--- got\n${chief}\nstderr:\n${err}")
endif()
message(STATUS "${MODE}: the chief's output matches ${EXPECTED}")
