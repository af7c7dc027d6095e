// the CUDA emulator stands in for the real mma.h (tests/gpu/emulator/emulator.h)
#pragma once
#include "tests/gpu/emulator/emulator.h"
