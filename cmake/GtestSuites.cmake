# Script mode (cmake -P), run after a GoogleTest executable is linked: lists
# its tests (--gtest_list_tests) and writes a CTest file registering one test
# per suite, `<PREFIX>.<Suite>`, that runs `<EXE> --gtest_filter=<Suite>.*`.
# One process per suite instead of one per test: loading LibTorch costs about
# 0.7 s a process, most of a unit test's time (docs/toolchain.md).
#
# Inputs (-D): EXE, PREFIX, OUT (the file written), WORKDIR, TIMEOUT (per
# test; a suite gets it times its number of tests, at most 900 s), LABELS
# (comma-separated).
foreach(v EXE PREFIX OUT WORKDIR TIMEOUT LABELS)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "GtestSuites.cmake: -D${v}=... is required")
  endif()
endforeach()
execute_process(COMMAND "${EXE}" --gtest_list_tests WORKING_DIRECTORY "${WORKDIR}" TIMEOUT 60
                OUTPUT_VARIABLE listing ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${EXE} --gtest_list_tests failed (${rc}): ${err}")
endif()
string(REPLACE ";" "\\;" listing "${listing}")
string(REPLACE "\n" ";" lines "${listing}")
set(suites "")
set(suite "")
foreach(line IN LISTS lines)
  # A suite line: "Suite." or "Instance/Suite.  # TypeParam = ..."; its tests
  # follow, indented by two spaces.
  if(line MATCHES "^([^ #]+)\\.")
    set(suite "${CMAKE_MATCH_1}")
    if(NOT suite MATCHES "^DISABLED_")
      list(APPEND suites "${suite}")
      set(count_${suite} 0)
    endif()
  elseif(line MATCHES "^  [^ ]" AND DEFINED count_${suite})
    math(EXPR count_${suite} "${count_${suite}} + 1")
  endif()
endforeach()
string(REPLACE "," ";" labels "${LABELS}")
set(text "# Written by cmake/GtestSuites.cmake from `${EXE} --gtest_list_tests`.\n")
foreach(s IN LISTS suites)
  math(EXPR t "${TIMEOUT} * ${count_${s}}")
  if(t GREATER 900)
    set(t 900)
  endif()
  string(APPEND text "add_test([=[${PREFIX}.${s}]=] [==[${EXE}]==] [=[--gtest_filter=${s}.*]=])\n"
         "set_tests_properties([=[${PREFIX}.${s}]=] PROPERTIES TIMEOUT ${t} WORKING_DIRECTORY [==[${WORKDIR}]==] "
         "LABELS [=[${labels}]=])\n")
endforeach()
if(NOT suites)
  string(APPEND text "add_test([=[${PREFIX}.NO_TESTS]=] [==[${CMAKE_COMMAND}]==] -E false)\n")
endif()
file(WRITE "${OUT}.tmp" "${text}")
file(RENAME "${OUT}.tmp" "${OUT}")
