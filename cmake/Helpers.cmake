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
