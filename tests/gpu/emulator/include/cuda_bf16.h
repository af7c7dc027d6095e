// the CUDA emulator stands in for the real cuda_bf16.h (tests/gpu/emulator/emulator.h)
#pragma once
#include "tests/gpu/emulator/emulator.h"
