# The layout rule counts real lines: writes a 700-line file full of unbalanced brackets,
# semicolons and trailing backslashes (which CMake's list splitting would merge into fewer
# lines) under OUT and expects cmake/check_layout.cmake to refuse it as 700 lines long.
#   cmake -DOUT=<scratch dir> -DCHECK=<source>/cmake/check_layout.cmake -P tests/layout_long_file.cmake
set(root ${OUT}/layout_long)
file(REMOVE_RECURSE ${root})
set(text "")
foreach(i RANGE 1 700)
  string(APPEND text "x[${i}] = y[z; // [ \\\n")
endforeach()
file(WRITE ${root}/models/long.cpp "${text}")
execute_process(COMMAND ${CMAKE_COMMAND} -DROOT=${root} -P ${CHECK} RESULT_VARIABLE rc ERROR_VARIABLE err
                OUTPUT_VARIABLE out)
if(rc EQUAL 0)
  message(FATAL_ERROR "the layout rule passed a 700-line file:\n${out}${err}")
endif()
if(NOT err MATCHES "models/long.cpp: 700 lines")
  message(FATAL_ERROR "the layout rule did not count 700 lines:\n${err}")
endif()
message(STATUS "layout rule: the 700-line file of brackets is counted as 700 lines and refused")
