# cmake/script_args.cmake: the -D arguments a `cmake -P` script of ours requires, checked in one place.
function(pss_require_script_args script)
  foreach(var IN LISTS ARGN)
    if(NOT DEFINED ${var})
      message(FATAL_ERROR "${script}: -D${var}=... is required")
    endif()
  endforeach()
endfunction()
