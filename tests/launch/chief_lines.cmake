# tests/launch/chief_lines.cmake: pss_chief_lines(<var> <text>) sets <var> to the chief's lines of pss-launch's
# output <text>, in order, without their "[chief] " prefix, each ending in a newline.

function(pss_chief_lines var text)
  set(chief "")
  string(REPLACE ";" "\\;" escaped "${text}")
  string(REPLACE "\n" ";" lines "${escaped}")
  foreach(line IN LISTS lines)
    if(line MATCHES "^\\[chief\\] (.*)$")
      string(APPEND chief "${CMAKE_MATCH_1}\n")
    endif()
  endforeach()
  set(${var} "${chief}" PARENT_SCOPE)
endfunction()
