# Finds every dependency; a missing one stops configure and names the Debian
# package that provides it (scripts/install-deps.sh installs them all).

function(hp_require found what package)
  if(NOT ${found})
    message(FATAL_ERROR
      "hyperparallel: ${what} not found. Install the Debian package '${package}' "
      "(or run scripts/install-deps.sh, which installs every dependency).")
  endif()
endfunction()

find_program(HP_CCACHE ccache)
if(HP_USE_CCACHE AND HP_CCACHE)
  # PCH + ccache needs these sloppiness settings or every PCH user misses.
  # CCACHE_BASEDIR makes the paths under the source root relative in what
  # ccache hashes, and the debug-prefix map takes the checkout's directory
  # out of the debug info (ccache hashes the working directory of a -g
  # compile unless it is mapped): a clone in another directory, as CI makes,
  # reuses the objects of this one. Debug info names sources relative to the
  # source root (gdb: `directory <checkout>`).
  set(CMAKE_CXX_COMPILER_LAUNCHER ${CMAKE_COMMAND} -E env
      CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
      CCACHE_BASEDIR=${CMAKE_SOURCE_DIR}
      ${HP_CCACHE})
  add_compile_options(-fdebug-prefix-map=${CMAKE_SOURCE_DIR}=.)
endif()

find_package(Torch QUIET PATHS /usr/lib/x86_64-linux-gnu/cmake/Torch)
hp_require(Torch_FOUND "LibTorch (find_package(Torch))" libtorch-dev)
# Debian's TorchConfig puts -D_GLIBCXX_USE_CXX11_ABI and friends in TORCH_CXX_FLAGS.
find_path(HP_GLOO_INCLUDE gloo/config.h)
hp_require(HP_GLOO_INCLUDE "Gloo headers (gloo/config.h)" libgloo-dev)
set(HP_HAVE_CUDA OFF)
if(TARGET torch_cuda OR CUDA_FOUND)
  set(HP_HAVE_CUDA ON)
endif()

find_package(yaml-cpp QUIET)
hp_require(yaml-cpp_FOUND "yaml-cpp" libyaml-cpp-dev)

find_package(Boost 1.70 QUIET COMPONENTS filesystem)
hp_require(Boost_FOUND "Boost (with Boost.DLL and Boost.Filesystem)" "libboost-dev libboost-filesystem-dev")
find_path(HP_BOOST_DLL boost/dll/shared_library.hpp)
hp_require(HP_BOOST_DLL "Boost.DLL headers" libboost-dev)

find_package(fmt QUIET)
hp_require(fmt_FOUND "fmt" libfmt-dev)
find_package(spdlog QUIET)
hp_require(spdlog_FOUND "spdlog" libspdlog-dev)

find_package(nlohmann_json 3 QUIET)
hp_require(nlohmann_json_FOUND "nlohmann-json" nlohmann-json3-dev)

find_package(CLI11 QUIET)
if(NOT CLI11_FOUND)
  find_path(HP_CLI11_INCLUDE CLI/CLI.hpp)
  hp_require(HP_CLI11_INCLUDE "CLI11" libcli11-dev)
  add_library(CLI11::CLI11 INTERFACE IMPORTED)
  target_include_directories(CLI11::CLI11 INTERFACE ${HP_CLI11_INCLUDE})
endif()

find_path(HP_XXHASH_INCLUDE xxhash.h)
find_library(HP_XXHASH_LIB xxhash)
hp_require(HP_XXHASH_LIB "xxhash" libxxhash-dev)

# Tokenizers (framework/data/tokenizer.cpp): PCRE2 runs the byte-level BPE
# pre-tokenizer regexes (Unicode classes \p{L}, \p{N}, lookahead), which
# std::regex cannot; SentencePiece is reached only through its own module
# (framework/data/sentencepiece_module.cpp says why).
find_path(HP_PCRE2_INCLUDE pcre2.h)
find_library(HP_PCRE2_LIB pcre2-8)
hp_require(HP_PCRE2_LIB "pcre2-8" libpcre2-dev)
find_path(HP_SENTENCEPIECE_INCLUDE sentencepiece_processor.h)
find_library(HP_SENTENCEPIECE_LIB sentencepiece)
find_library(HP_SENTENCEPIECE_TRAIN_LIB sentencepiece_train)
hp_require(HP_SENTENCEPIECE_LIB "sentencepiece" libsentencepiece-dev)
hp_require(HP_SENTENCEPIECE_TRAIN_LIB "sentencepiece_train" libsentencepiece-dev)

# The metrics registry, types and text format (framework/metrics) are
# prometheus-cpp's core library; only its pull Exposer is left unused:
find_package(prometheus-cpp QUIET CONFIG)
if(prometheus-cpp_FOUND AND NOT TARGET prometheus-cpp::core)
  set(prometheus-cpp_FOUND FALSE)
endif()
hp_require(prometheus-cpp_FOUND "prometheus-cpp (target prometheus-cpp::core)" prometheus-cpp-dev)
# /metrics is served by framework/metrics/http_exposer.cpp on plain sockets:
# Debian's civetweb 1.15 starts its threads with a fixed 100 KiB stack, which
# glibc refuses in a process that has loaded LibTorch + OpenBLAS (their
# thread-local storage alone is larger), so civetweb cannot run inside a trainer.

if(HP_BUILD_TESTS)
  find_package(GTest QUIET)
  hp_require(GTest_FOUND "GoogleTest" "libgtest-dev libgmock-dev")
endif()

# The process allocator (include/hp/memory/allocator.h says why): mimalloc,
# linked ahead of glibc by the executables that train (target hp_allocator).
find_path(HP_MIMALLOC_INCLUDE mimalloc.h)
find_library(HP_MIMALLOC_LIB NAMES mimalloc libmimalloc.so.2)
hp_require(HP_MIMALLOC_LIB "mimalloc" libmimalloc-dev)
hp_require(HP_MIMALLOC_INCLUDE "mimalloc.h" libmimalloc-dev)

find_package(Threads REQUIRED)
