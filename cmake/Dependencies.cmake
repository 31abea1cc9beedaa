# Every dependency is a Debian package found here; scripts/setup.sh installs them.
find_package(Threads REQUIRED)

if(DDP_USE_CCACHE)
  find_program(DDP_CCACHE ccache)
  if(DDP_CCACHE)
    set(CMAKE_CXX_COMPILER_LAUNCHER ${DDP_CCACHE})
  endif()
endif()

# Launcher side: no LibTorch.
find_package(cxxopts REQUIRED)
find_package(spdlog REQUIRED)
find_package(Boost 1.71 REQUIRED COMPONENTS filesystem)

# Worker side.
find_package(Torch REQUIRED)
find_package(yaml-cpp REQUIRED)
find_package(nlohmann_json 3 REQUIRED)
find_package(ZLIB REQUIRED)

# NCCL follows the LibTorch build: only CUDA builds ship ProcessGroupNCCL.
if(TORCH_CUDA_LIBRARIES OR CUDA_FOUND OR CUDAToolkit_FOUND)
  set(DDP_TORCH_HAS_CUDA ON)
else()
  set(DDP_TORCH_HAS_CUDA OFF)
endif()
option(DDP_WITH_NCCL "Compile the NCCL backend (needs a CUDA LibTorch)" ${DDP_TORCH_HAS_CUDA})
message(STATUS "ddp-launch: LibTorch ${Torch_VERSION}, CUDA=${DDP_TORCH_HAS_CUDA}, NCCL=${DDP_WITH_NCCL}")

if(DDP_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()

# LibTorch wants its own flags (ABI macro) but must stay out of the launcher.
function(ddp_link_torch target)
  target_link_libraries(${target} PUBLIC ${TORCH_LIBRARIES})
  target_include_directories(${target} SYSTEM PUBLIC ${TORCH_INCLUDE_DIRS})
  separate_arguments(_torch_flags UNIX_COMMAND "${TORCH_CXX_FLAGS}")
  target_compile_options(${target} PUBLIC ${_torch_flags})
endfunction()
