# tests/launch/chief_lines.cmake: pss_chief_lines(<var> <text>) sets <var> to the chief's lines of pss-launch's
# output <text>, in order, without their "[chief] " prefix, each ending in a newline.

function(pss_chief_lines var text)
  set(chief "")
  # In CMake's list syntax a ';' inside unbalanced square brackets separates nothing, so a line such as
  # Keras' "['dense[0][0]'," would swallow the next: brackets are stood in for while the text is a list.
  string(REPLACE "[" "<pss-lb>" escaped "${text}")
  string(REPLACE "]" "<pss-rb>" escaped "${escaped}")
  string(REPLACE ";" "\\;" escaped "${escaped}")
  string(REPLACE "\n" ";" lines "${escaped}")
  foreach(line IN LISTS lines)
    if(line MATCHES "^<pss-lb>chief<pss-rb> (.*)$")
      set(kept "${CMAKE_MATCH_1}")
      string(REPLACE "<pss-lb>" "[" kept "${kept}")
      string(REPLACE "<pss-rb>" "]" kept "${kept}")
      string(APPEND chief "${kept}\n")
    endif()
  endforeach()
  set(${var} "${chief}" PARENT_SCOPE)
endfunction()
