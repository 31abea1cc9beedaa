// The target that compiles tests/support/test_pch.h once (tests/CMakeLists.txt, ddp_test_pch).
