# Where a fully sharded step's time goes, ours against PyTorch FSDP2: bash bench/fsdp/step_profile.sh
add_executable(fsdp_step_breakdown ${CMAKE_CURRENT_LIST_DIR}/fsdp_step_breakdown.cc)
target_link_libraries(fsdp_step_breakdown PRIVATE ddp)
target_include_directories(fsdp_step_breakdown PRIVATE ${PROJECT_SOURCE_DIR})  # bench/fsdp/mlp_stack.h
ddp_link_torch(fsdp_step_breakdown PRIVATE)
