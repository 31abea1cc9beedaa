# Dependencies: Debian packages (scripts/setup.sh installs them) and LibTorch,
# either LibTorch 2.x from the pinned PyPI torch wheel in .venv (the default,
# CUDA + NCCL inside) or Debian's libtorch-dev 1.13 (CPU).
find_package(Threads REQUIRED)

if(DDP_USE_CCACHE)
  find_program(DDP_CCACHE ccache)
  if(DDP_CCACHE)
    # Paths under the source tree are hashed relative to it, so a fresh clone elsewhere (CI) reuses
    # what an earlier build of the same sources compiled (a user's CCACHE_BASEDIR wins).
    set(_ddp_ccache_env)
    if(NOT DEFINED ENV{CCACHE_BASEDIR})
      list(APPEND _ddp_ccache_env CCACHE_BASEDIR=${PROJECT_SOURCE_DIR})
    endif()
    # Files compiled with a precompiled header (DDP_USE_PCH: libddp, the worker, the tests) are
    # cached only with this sloppiness (ccache's manual, "Precompiled headers"); without it ccache
    # passes them through uncached (its statistics: could_not_use_precompiled_header).
    if(NOT DEFINED ENV{CCACHE_SLOPPINESS})
      list(APPEND _ddp_ccache_env CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime)
    endif()
    set(CMAKE_CXX_COMPILER_LAUNCHER ${CMAKE_COMMAND} -E env ${_ddp_ccache_env} ${DDP_CCACHE})
  endif()
endif()

# Launcher side: no LibTorch.
find_package(cxxopts REQUIRED)
find_package(spdlog REQUIRED)
find_package(Boost 1.71 REQUIRED COMPONENTS filesystem)

# Worker side. Pass -DCMAKE_PREFIX_PATH=<site-packages>/torch for the wheel
# (scripts/build.sh does); it is searched before Debian's /usr copy.
find_package(Torch REQUIRED)
# LibTorch's caffe2::mkl names ${MKL_ROOT}/lib/intel64, intel64_win and win-x64 as link directories
# whether they exist or not (pytorch/pytorch#73008): with MKL_ROOT empty they became /lib/intel64...
# in every program's RPATH. Only the directories that exist are kept (the package config does the same).
if(TARGET caffe2::mkl)
  get_target_property(_mkl_dirs caffe2::mkl INTERFACE_LINK_DIRECTORIES)
  if(_mkl_dirs)
    set(_mkl_kept "")
    foreach(_dir IN LISTS _mkl_dirs)
      if(IS_DIRECTORY "${_dir}")
        list(APPEND _mkl_kept "${_dir}")
      endif()
    endforeach()
    set_property(TARGET caffe2::mkl PROPERTY INTERFACE_LINK_DIRECTORIES "${_mkl_kept}")
  endif()
endif()
find_package(yaml-cpp REQUIRED)
find_package(nlohmann_json 3 REQUIRED)
find_package(ZLIB REQUIRED)
find_package(PNG REQUIRED)   # data.name image_folder (libpng-dev)
find_package(JPEG REQUIRED)  # ... and libjpeg-turbo (libjpeg62-turbo-dev), the decoder Pillow uses

# c10d's ProcessGroupGloo.hpp includes Gloo's headers, which the torch wheel does not ship;
# Debian's libgloo-dev provides them (c10d's header holds Gloo objects only through pointers).
find_path(DDP_GLOO_INCLUDE_DIR gloo/algorithm.h HINTS ${TORCH_INCLUDE_DIRS})
if(NOT DDP_GLOO_INCLUDE_DIR)
  message(FATAL_ERROR "gloo/algorithm.h not found: c10d's ProcessGroupGloo.hpp needs Gloo's headers, which the "
                      "torch wheel does not ship; install libgloo-dev (scripts/setup.sh does)")
endif()

# Debian's yaml-cpp, spdlog and Boost are built with the C++11 ABI; LibTorch must match
# (every wheel since 2.7 and Debian's 1.13 do), or std::string crosses the boundary mangled.
if(TORCH_CXX_FLAGS MATCHES "_GLIBCXX_USE_CXX11_ABI=0")
  message(FATAL_ERROR "LibTorch ${Torch_VERSION} uses the pre-C++11 ABI (_GLIBCXX_USE_CXX11_ABI=0) but the "
                      "Debian libraries use the C++11 ABI; use torch >= 2.7 (scripts/setup.sh pins one)")
endif()

# The wheel ships fmt 12 in its include dir; Debian's spdlog is built on Debian's fmt 9 and does not
# compile against 12. An overlay dir that maps <fmt/...> to the fmt spdlog uses comes first on every
# LibTorch target (fmt's inline namespaces, fmt::v9 vs v12, keep any torch-internal use apart).
if(EXISTS "${TORCH_INSTALL_PREFIX}/include/fmt")
  get_target_property(_fmt_include_dirs fmt::fmt INTERFACE_INCLUDE_DIRECTORIES)
  find_path(DDP_SYSTEM_FMT_DIR fmt/core.h HINTS ${_fmt_include_dirs} NO_CMAKE_PATH NO_CMAKE_ENVIRONMENT_PATH)
  set(DDP_FMT_OVERLAY "${CMAKE_BINARY_DIR}/fmt_overlay")
  file(MAKE_DIRECTORY "${DDP_FMT_OVERLAY}")
  file(CREATE_LINK "${DDP_SYSTEM_FMT_DIR}/fmt" "${DDP_FMT_OVERLAY}/fmt" SYMBOLIC)
endif()

# The wheel keeps CUDA, cuDNN and NCCL in site-packages/nvidia/*/lib and lets Python
# preload them; a C++ program must find them itself.
get_filename_component(DDP_TORCH_SITE "${TORCH_INSTALL_PREFIX}/.." ABSOLUTE)
file(GLOB DDP_TORCH_NVIDIA_LIB_DIRS LIST_DIRECTORIES true "${DDP_TORCH_SITE}/nvidia/*/lib")

# NCCL follows the LibTorch build: only CUDA builds ship ProcessGroupNCCL.
if(TORCH_CUDA_LIBRARIES)
  set(DDP_TORCH_HAS_CUDA ON)
else()
  set(DDP_TORCH_HAS_CUDA OFF)
endif()
option(DDP_WITH_NCCL "Compile the NCCL backend (needs a CUDA LibTorch)" ${DDP_TORCH_HAS_CUDA})
if(DDP_WITH_NCCL)
  # ProcessGroupNCCL.hpp includes <nccl.h>: the one LibTorch was built with (the wheel's) comes
  # first, the CUDA toolkit's otherwise.
  find_path(DDP_NCCL_INCLUDE_DIR nccl.h
    HINTS "${DDP_TORCH_SITE}/nvidia/nccl/include" ${CUDAToolkit_INCLUDE_DIRS} ${CUDA_TOOLKIT_INCLUDE})
  if(NOT DDP_NCCL_INCLUDE_DIR)
    message(FATAL_ERROR "DDP_WITH_NCCL is on but nccl.h was not found; install NCCL or pass -DDDP_WITH_NCCL=OFF")
  endif()
endif()
file(WRITE "${CMAKE_BINARY_DIR}/libtorch_version.txt" "${Torch_VERSION}\n")  # for bench/ reports
message(STATUS "ddp-launch: LibTorch ${Torch_VERSION} (${TORCH_INSTALL_PREFIX}), CUDA=${DDP_TORCH_HAS_CUDA}, "
               "NCCL=${DDP_WITH_NCCL} ${DDP_NCCL_INCLUDE_DIR}")

if(DDP_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()

# LibTorch's flags stay on the targets that include it and the launcher never sees them.
# The ABI flag is PUBLIC on purpose: it must equal what the Debian libraries use (checked above).
# A CUDA LibTorch: our programs and libraries link its CPU half only (torch_cpu, c10); the code
# that needs CUDA symbols is the plugin libddp_cuda.so (comm/), loaded by ranks that take a GPU.
# libtorch_cuda and the CUDA libraries cost every process ~250 MiB and ~0.15 s, GPU or not.
if(DDP_TORCH_HAS_CUDA AND TARGET torch_cpu_library)
  add_library(ddp_torch_cpu INTERFACE)
  target_link_libraries(ddp_torch_cpu INTERFACE torch_cpu_library)
  # What the `torch` target asks of its users (C++20 for LibTorch 2.10+).
  foreach(_prop INTERFACE_COMPILE_FEATURES INTERFACE_COMPILE_OPTIONS)
    get_target_property(_value torch ${_prop})
    if(_value)
      set_property(TARGET ddp_torch_cpu APPEND PROPERTY ${_prop} ${_value})
    endif()
  endforeach()
  set(DDP_TORCH_LINK ddp_torch_cpu)
  set(DDP_CUDA_PLUGIN ON)
else()
  set(DDP_TORCH_LINK ${TORCH_LIBRARIES})
  set(DDP_CUDA_PLUGIN OFF)
endif()

function(ddp_link_torch target)
  # libstdc++ ahead of LibTorch in the programs' load order: some wheels (2.11) export their own
  # copies of std::filesystem, which then interpose libstdc++'s and crash (seen: remove_all).
  # FULL: the whole LibTorch, CUDA included (the plugin only).
  # PRIVATE: nothing of it in the target's interface (an installed, exported library).
  cmake_parse_arguments(_ddp "FULL;PRIVATE" "" "" ${ARGN})
  set(_scope PUBLIC)
  if(_ddp_PRIVATE)
    set(_scope PRIVATE)
  endif()
  if(DDP_FMT_OVERLAY)
    target_include_directories(${target} SYSTEM BEFORE ${_scope} ${DDP_FMT_OVERLAY})
  endif()
  if(_ddp_FULL)
    target_link_libraries(${target} ${_scope} stdc++ ${TORCH_LIBRARIES})
  else()
    target_link_libraries(${target} ${_scope} stdc++ ${DDP_TORCH_LINK})
  endif()
  target_include_directories(${target} SYSTEM ${_scope} ${TORCH_INCLUDE_DIRS})
  separate_arguments(_torch_flags UNIX_COMMAND "${TORCH_CXX_FLAGS}")
  target_compile_options(${target} ${_scope} ${_torch_flags})
  target_compile_definitions(${target} ${_scope} $<$<BOOL:${DDP_TORCH_HAS_CUDA}>:DDP_WITH_CUDA=1>)
  foreach(_dir ${DDP_TORCH_NVIDIA_LIB_DIRS})
    # DT_RPATH (not RUNPATH) so that libtorch_cuda's own dependencies are found too.
    target_link_options(${target} ${_scope} "LINKER:-rpath-link,${_dir}" "LINKER:-rpath,${_dir}")
  endforeach()
  if(DDP_TORCH_NVIDIA_LIB_DIRS)
    target_link_options(${target} ${_scope} "LINKER:--disable-new-dtags")
  endif()
endfunction()
