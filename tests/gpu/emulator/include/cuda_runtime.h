// the CUDA emulator stands in for the real cuda_runtime.h (tests/gpu/emulator/emulator.h)
#pragma once
#include "tests/gpu/emulator/emulator.h"
