// the CUDA emulator stands in for the real cublas_v2.h (tests/gpu/emulator/emulator.h)
#pragma once
#include "tests/gpu/emulator/emulator.h"
