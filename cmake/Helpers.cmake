# One precompiled LibTorch header, built once and reused by every target that
# includes LibTorch (a bare <torch/torch.h> costs ~27 s per translation unit).
function(hp_use_torch_pch target)
  if(NOT HP_USE_PCH)
    return()
  endif()
  if(NOT TARGET hp_pch)
    message(FATAL_ERROR "internal: hp_pch must be defined before ${target}")
  endif()
  target_precompile_headers(${target} REUSE_FROM hp_pch)
endfunction()

# Sources of a PCH target that include no LibTorch header, not even through
# ours: they compile without the precompiled header. Using it is not free:
# an empty file compiled against it takes ~9 s and ~900 MB, nearly all of it
# GCC instantiating the templates LibTorch's headers leave pending, against
# about 1 s for such a file alone (measured, session 25); the 27 files listed
# with this took 496 s of compile jobs with the header, 120 s without. A file
# listed here that starts to include LibTorch still builds, only slower:
# `python3 scripts/pch_scan.py build` lists both kinds of mismatch.
# Call it in the directory that defines the target.
function(hp_without_torch_pch)
  if(HP_USE_PCH)
    set_source_files_properties(${ARGN} PROPERTIES SKIP_PRECOMPILE_HEADERS ON)
  endif()
endfunction()

# A feature plugin: one shared library named libhp_feature_<name>.so in
# build/plugins/, installed to lib/hyperparallel/plugins/.
function(hp_add_feature_plugin name)
  cmake_parse_arguments(ARG "NO_INSTALL;NO_TORCH" "OUTPUT_DIR" "SOURCES;LIBS" ${ARGN})
  set(target hp_feature_${name})
  add_library(${target} MODULE ${ARG_SOURCES})
  target_link_libraries(${target} PRIVATE hp_framework ${ARG_LIBS})
  set(outdir ${HP_PLUGIN_OUTPUT_DIR})
  if(ARG_OUTPUT_DIR)
    set(outdir ${ARG_OUTPUT_DIR})
  endif()
  set_target_properties(${target} PROPERTIES
    LIBRARY_OUTPUT_DIRECTORY ${outdir}
    PREFIX "lib"
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  if(NOT ARG_NO_TORCH)
    hp_use_torch_pch(${target})
  endif()
  if(NOT ARG_NO_INSTALL)
    install(TARGETS ${target} LIBRARY DESTINATION ${HP_INSTALL_PLUGIN_DIR})
  endif()
endfunction()

# Unity build: a target's sources compiled HP_UNITY_BATCH at a time (0 or 1:
# one translation unit per file). Each file instantiates and optimises the
# same LibTorch, GoogleTest and CLI11 templates; measured on 2 cores, the
# unit-test executables build in 312 s this way against 533 s file by file.
# Used for the tests and the multi-file tools, not for the libraries (files
# there carry their own compile options, e.g. adam_kernel.cpp's
# -ffp-contract=off, which a unity file would drop). Helpers in different
# files of one such target must not share a name: an anonymous namespace is
# one per translation unit.
#
# The unity files are written here rather than by CMake's UNITY_BUILD, whose
# files (before CMake 3.32) include each source by its absolute path: a
# checkout in another directory then hashes differently and misses ccache
# on every unit. Ours include each source by its path under the source root
# (found through -I <root>, which ccache's CCACHE_BASEDIR makes relative),
# so every checkout writes the same bytes. A unity file is rewritten only
# when its list changes (file(CONFIGURE)), so a reconfigure rebuilds nothing.
set(HP_UNITY_BATCH 4 CACHE STRING "Sources per unity translation unit of the tests and tools (0 or 1: off)")
function(hp_unity_build target)
  if(NOT HP_UNITY_BATCH GREATER 1)
    return()
  endif()
  get_target_property(sources ${target} SOURCES)
  get_target_property(source_dir ${target} SOURCE_DIR)
  set(kept "")
  set(units "")
  set(body "")
  set(count 0)
  set(index 0)
  foreach(src IN LISTS sources)
    if(NOT src MATCHES "\\.(cpp|cc|cxx)$")
      list(APPEND kept ${src})
      continue()
    endif()
    get_filename_component(abs ${src} ABSOLUTE BASE_DIR ${source_dir})
    file(RELATIVE_PATH rel ${PROJECT_SOURCE_DIR} ${abs})
    string(APPEND body "#include \"${rel}\"\n")
    math(EXPR count "${count} + 1")
    if(count EQUAL HP_UNITY_BATCH)
      set(unit ${CMAKE_CURRENT_BINARY_DIR}/unity/${target}_${index}.cpp)
      file(CONFIGURE OUTPUT ${unit} CONTENT "${body}" @ONLY)
      list(APPEND units ${unit})
      math(EXPR index "${index} + 1")
      set(body "")
      set(count 0)
    endif()
  endforeach()
  if(count GREATER 0)
    set(unit ${CMAKE_CURRENT_BINARY_DIR}/unity/${target}_${index}.cpp)
    file(CONFIGURE OUTPUT ${unit} CONTENT "${body}" @ONLY)
    list(APPEND units ${unit})
  endif()
  set_property(TARGET ${target} PROPERTY SOURCES ${units} ${kept})
  target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR})
endfunction()
