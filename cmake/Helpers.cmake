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
set(HP_UNITY_BATCH 4 CACHE STRING "Sources per unity translation unit of the tests and tools (0 or 1: off)")
function(hp_unity_build target)
  if(HP_UNITY_BATCH GREATER 1)
    set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE ${HP_UNITY_BATCH})
  endif()
endfunction()
