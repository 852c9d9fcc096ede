# The layout rule of the source tree (docs/architecture.md, "Layers"), checked by the suite:
#   cmake -DROOT=<source dir> -P cmake/check_layout.cmake
# fails, naming the file and line, on
#  - an include that goes up a layer, or sideways between the folders of one layer:
#      0 common/
#      1 models/ schedule/ partitioner/ stages/ comm/   (each on common/ alone)
#      2 profiler/
#      3 pipeline/
#      4 job/
#      5 checkpoint/ planner/   (each on job/ and below)
#      6 train/
#      7 apps/
#    bench/, examples/, fuzz/ and tests/ sit on top and may include any folder but apps/;
#  - an include of a transport backend's header (comm/local/, comm/ucx/, comm/c10d/) outside comm/, tests/,
#    bench/ and fuzz/ (everyone else makes transports through comm/transport.h);
#  - a source file over 600 lines, unless it is listed below as one algorithm;
#  - a thread_local in a header of a layered folder (the installed headers): GCC and clang mangle
#    such a variable in an inline function differently, so an embedding program built by the
#    other compiler would get a second one (common/skip.h);
#  - a function in pipeline/, planner/ or job/ over 120 lines. Counted crudely but robustly: each
#    line loses its escapes, string and character literals, // and /* */ comments and preprocessor
#    lines; braces are then matched. A `{` whose enclosing blocks are all namespaces, classes,
#    structs, unions, enums or extern blocks opens a function when the text before it (since the
#    last `;`, `{` or `}`) ends in `)`, optionally followed by const, noexcept, override, final,
#    mutable or a trailing return type (`->`); the function's lines run from the first line of that
#    text (its signature, a template line included) to its closing `}`. Anything else opened there
#    (an initializer) is not a function, and braces inside a function are its own. Raw string
#    literals and braced member initializers of a constructor are not understood (such a
#    constructor goes uncounted).
cmake_minimum_required(VERSION 3.18)
if(NOT ROOT)
  message(FATAL_ERROR "check_layout.cmake: pass -DROOT=<source dir>")
endif()

set(layer_common 0)
set(layer_models 1)
set(layer_schedule 1)
set(layer_partitioner 1)
set(layer_stages 1)
set(layer_comm 1)
set(layer_profiler 2)
set(layer_pipeline 3)
set(layer_job 4)
set(layer_checkpoint 5)
set(layer_planner 5)
set(layer_train 6)
set(layer_apps 7)
set(consumers bench examples fuzz tests)
set(layered common models schedule partitioner stages comm profiler pipeline job checkpoint planner train apps)
# One algorithm each, kept whole on purpose.
set(long_files partitioner/min_max.cpp)
set(max_lines 600)
set(function_folders pipeline planner job)
set(max_function_lines 120)

# One line of a file in function_folders: strips it, matches its braces, and notes a function
# over max_function_lines when its closing brace is on this line (see the top of this file).
macro(count_function_lines)
  set(code "${line}")
  if(in_comment)
    if(code MATCHES "\\*/")
      string(REGEX REPLACE "^.*\\*/" "" code "${code}")
      set(in_comment FALSE)
    else()
      set(code "")
    endif()
  endif()
  if(code MATCHES "^[ \t]*#")
    set(code "")
  endif()
  string(REGEX REPLACE "<backslash>." "" code "${code}")
  string(REGEX REPLACE "\"[^\"]*\"" "\"\"" code "${code}")
  string(REGEX REPLACE "'[^']*'" "''" code "${code}")
  string(REGEX REPLACE "//.*$" "" code "${code}")
  string(REGEX REPLACE "/\\*([^*]|\\*+[^*/])*\\*+/" "" code "${code}")
  if(code MATCHES "/\\*")
    string(REGEX REPLACE "/\\*.*$" "" code "${code}")
    set(in_comment TRUE)
  endif()
  string(REPLACE "<semicolon>" "@" code "${code}")
  string(REGEX REPLACE "([{}@])" ";\\1;" parts "${code}")
  foreach(part IN LISTS parts)
    if(part STREQUAL "{")
      set(kind o)
      if(function_line EQUAL 0 AND NOT blocks MATCHES "[fo]")
        if(preamble MATCHES "(^|[^A-Za-z0-9_])(namespace|class|struct|union|enum|extern)([^A-Za-z0-9_]|$)" AND
           NOT preamble MATCHES "\\)[ \t]*$")
          set(kind c)
        elseif(preamble MATCHES "\\)[ \t]*((const|noexcept|override|final|mutable)[ \t]*)*(->[^=]*)?$")
          set(kind f)
          set(function_line ${preamble_line})
          set(function_name "a function")
          if(preamble MATCHES "([A-Za-z_~][A-Za-z0-9_:~]*)[ \t]*\\(")
            set(function_name "${CMAKE_MATCH_1}")
          endif()
        endif()
      endif()
      list(APPEND blocks ${kind})
      set(preamble "")
    elseif(part STREQUAL "}")
      if(blocks)
        list(POP_BACK blocks closed)
        if(closed STREQUAL "f")
          math(EXPR length "${n} - ${function_line} + 1")
          if(length GREATER max_function_lines)
            list(APPEND problems "${rel}:${function_line}: ${function_name} is ${length} lines (a function in pipeline/, planner/ or job/ has at most ${max_function_lines})")
          endif()
          set(function_line 0)
        endif()
      endif()
      set(preamble "")
    elseif(part STREQUAL "@")
      set(preamble "")
    elseif(function_line EQUAL 0 AND part MATCHES "[^ \t]")
      if(preamble STREQUAL "")
        set(preamble_line ${n})
      endif()
      string(APPEND preamble " ${part}")
    endif()
  endforeach()
endmacro()

set(problems "")
foreach(folder IN LISTS layered consumers)
  file(GLOB_RECURSE sources RELATIVE ${ROOT} ${ROOT}/${folder}/*.h ${ROOT}/${folder}/*.cpp ${ROOT}/${folder}/*.cu)
  foreach(rel IN LISTS sources)
    # Lines are counted and split by hand: file(STRINGS) into a list would merge the lines
    # between an unbalanced '[' and its ']' (or after a ';' or a trailing '\'), so a long file
    # full of brackets would count short and its includes could go unchecked.
    file(READ ${ROOT}/${rel} content)
    string(REGEX MATCHALL "\n" newlines "${content}")
    list(LENGTH newlines count)
    if(NOT content STREQUAL "" AND NOT content MATCHES "\n$")
      math(EXPR count "${count} + 1")  # a last line without its newline
    endif()
    string(REPLACE "\\" "<backslash>" content "${content}")
    string(REPLACE ";" "<semicolon>" content "${content}")
    string(REPLACE "[" "<open>" content "${content}")
    string(REPLACE "]" "<close>" content "${content}")
    string(REPLACE "\n" ";" lines "${content}")
    if(count GREATER max_lines AND NOT rel IN_LIST long_files)
      list(APPEND problems "${rel}: ${count} lines (at most ${max_lines} unless it is one algorithm)")
    endif()
    set(n 0)
    set(count_functions FALSE)
    if(folder IN_LIST function_folders)
      set(count_functions TRUE)
    endif()
    set(blocks "")        # per open brace: c (namespace, class, ...), f (a function), o (anything else)
    set(preamble "")      # the text since the last ; { or } outside functions
    set(preamble_line 0)
    set(function_line 0)  # where the open function starts; 0: none open
    set(in_comment FALSE)
    set(header FALSE)
    if(rel MATCHES "\\.h$" AND NOT folder IN_LIST consumers)
      set(header TRUE)
    endif()
    foreach(line IN LISTS lines)
      math(EXPR n "${n} + 1")
      if(header AND line MATCHES "^[^/]*thread_local")
        list(APPEND problems "${rel}:${n}: a thread_local in an installed header (a program built by another compiler would get its own: define it in a .cpp)")
      endif()
      if(count_functions)
        count_function_lines()
      endif()
      if(NOT line MATCHES "^[ \t]*#[ \t]*include[ \t]+\"([a-z_]+)/([^\"]*)\"")
        continue()
      endif()
      set(target ${CMAKE_MATCH_1})
      set(path ${CMAKE_MATCH_2})
      if(target STREQUAL folder)
        continue()
      endif()
      if(NOT DEFINED layer_${target})
        if(NOT target IN_LIST consumers)
          continue()  # not one of ours (e.g. a generated header's folder)
        endif()
        list(APPEND problems "${rel}:${n}: includes ${target}/${path}, a consumer folder")
        continue()
      endif()
      if(folder IN_LIST consumers)
        if(target STREQUAL "apps")
          list(APPEND problems "${rel}:${n}: includes apps/${path} (apps/ is the top)")
        endif()
      elseif(NOT layer_${target} LESS layer_${folder})
        list(APPEND problems
             "${rel}:${n}: includes ${target}/${path}: ${folder}/ (layer ${layer_${folder}}) may include only lower layers")
      endif()
      if(target STREQUAL "comm" AND path MATCHES "^(local|ucx|c10d)/" AND NOT folder MATCHES "^(comm|tests|bench|fuzz)$")
        list(APPEND problems "${rel}:${n}: includes the backend header comm/${path} (others use comm/transport.h)")
      endif()
    endforeach()
  endforeach()
endforeach()

if(problems)
  list(LENGTH problems k)
  string(REPLACE ";" "\n  " shown "${problems}")
  message(FATAL_ERROR "${k} layout problem(s):\n  ${shown}")
endif()
message(STATUS "layout: every include goes down a layer; every file within ${max_lines} lines; no thread_local in a header; "
               "no function in ${function_folders} over ${max_function_lines} lines")
