// Precompiled once for the test programs that use LibTorch (tests/CMakeLists.txt, ddp_test_pch):
// GoogleTest, ATen and JSON, which nearly every one of them parses. A file compiles in ~7 s with it
// instead of ~30 s on a 2-core machine; each file still includes what it uses itself.
#pragma once
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>
#include <vector>
