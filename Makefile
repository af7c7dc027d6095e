# picotron.c: `make` builds ./train and ./create_config for the CPU; `make GPU=1` for CUDA.
# `make run` and `make test` first install what is missing (scripts/install_deps.sh).
CC       = mpicc
OPT     ?= -O2 -march=native -g
SANITIZE ?=
# -fvisibility=hidden: the programs export none of their names, so the libraries below MPI keep
# their own: our send() and recv() would otherwise replace libc's inside UCX (its TCP transport,
# between nodes, then crashes in MPI_Init)
# -fno-trapping-math: nothing here reads the floating-point exception flags; without it gcc may
# not evaluate a comparison that a branch would skip, so the loops with a clamp or a select
# (exp_approx's in SwiGLU and softmax, AdamW's) stay scalar
# -fvect-cost-model=dynamic: -O3's; -O2's "very-cheap" model vectorises no loop that needs a test
# at run time (whether two arrays overlap, whether the count is a multiple of the vector), which
# left most elementwise loops scalar (RMSNorm's, the GEMM's packing)
CFLAGS   = $(OPT) -std=gnu11 -Wall -Wextra -fopenmp -fno-math-errno -fno-trapping-math -fvect-cost-model=dynamic -fvisibility=hidden -I. $(shell pkg-config --cflags libcjson 2>/dev/null) $(SANITIZE)
LDLIBS   = -lcjson -lm -fopenmp $(SANITIZE)
BUILD   ?= build
NP      ?= 8

ifeq ($(GPU),1)
  CFLAGS   += -DPICOTRON_GPU
  CUDA_HOME ?= /usr/local/cuda
  CUDA_ARCH ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90
  NVCC      = $(CUDA_HOME)/bin/nvcc
  NVFLAGS   = -O2 -std=c++17 $(CUDA_ARCH) -I. $(shell mpicc -show | tr ' ' '\n' | grep '^-I') \
              -Xcompiler -Wall,-Wextra
  BACKEND_SRC = $(wildcard backend/cuda/*.cu)
  BACKEND_OBJ = $(BACKEND_SRC:%.cu=$(BUILD)/%.o)
  LDLIBS   += -L$(CUDA_HOME)/lib64 -lcudart -lcublas -lcublasLt -lnccl -lstdc++ -Wl,-rpath,$(CUDA_HOME)/lib64
  BUILD    := build-gpu
  CU_COMPILE = $(NVCC) $(NVFLAGS) -c -o $@ $<
else ifeq ($(GPU),emulate)
  # the GPU build's own sources on the CPU emulator of CUDA, cuBLAS and NCCL (no GPU needed):
  # what it proves and what it cannot, in tests/gpu/emulator/emulator.h
  EMU       = tests/gpu/emulator
  CFLAGS   += -DPICOTRON_GPU
  # SCORES_CAP: attention's head sets small enough that the tests' shapes use several;
  # -Wno-unknown-pragmas: g++ does not know nvcc's `#pragma unroll`
  EMUFLAGS  = -O2 -g -std=c++17 -Wall -Wextra -Wno-unknown-pragmas -fno-ipa-reference -U_FORTIFY_SOURCE \
              -I. -I$(EMU)/include -DSCORES_CAP=2048
  BACKEND_SRC = $(wildcard backend/cuda/*.cu)
  BACKEND_OBJ = $(BACKEND_SRC:%.cu=$(BUILD)/%.o) $(BUILD)/$(EMU)/emulator.o
  LDLIBS   += -lblis -lstdc++
  BUILD    := build-emu
  CU_COMPILE = perl $(EMU)/translate.pl $< >$@.cc && mpicxx $(EMUFLAGS) -c -o $@ $@.cc
else
  BACKEND_SRC = $(wildcard backend/cpu/*.c)
  BACKEND_OBJ = $(BACKEND_SRC:%.c=$(BUILD)/%.o)
endif

CORE_SRC = utils.c files.c config.c data.c doremi.c model.c model_init.c model_memory.c model_table.c model_moe.c model_mamba.c moe.c mamba.c mamba_context_parallel.c expert_parallel.c optimizer.c process_group_manager.c data_parallel.c \
           zero.c sequence_parallel.c pipeline_interleaved.c metrics.c \
           tensor_parallel.c vocab_padding.c pipeline_parallel.c context_parallel.c checkpoint.c \
           checkpoint_tokenizer.c safetensors.c tokenizer.c \
           trace.c nodes.c svg.c backend/comm_log.c backend/comm_host.c backend/kernel_time.c
CORE_OBJ = $(patsubst %.c,$(BUILD)/%.o,$(wildcard $(CORE_SRC))) $(BACKEND_OBJ)
TESTS    = $(patsubst tests/%.c,$(BUILD)/tests/%,$(wildcard tests/test_*.c tests/tool_*.c))
BENCHES  = $(patsubst bench/%.c,$(BUILD)/bench/%,$(wildcard bench/*.c))
ifneq ($(GPU),)
  # the CPU's products against BLIS, and its attention against the peak
  BENCHES := $(filter-out %/bench_gemm %/bench_attention,$(BENCHES))
endif

# the programs, each its own main: ./train, ./create_config, ./prepare_data, ./generate, ./plot_loss
PROGRAMS = $(basename $(wildcard train.c create_config.c prepare_data.c generate.c plot_loss.c))

.PHONY: all deps run test test-asan clean format
all: $(PROGRAMS) $(TESTS) $(BENCHES)

$(PROGRAMS): %: $(BUILD)/%.o $(CORE_OBJ)
	$(CC) -o $@ $^ $(LDLIBS)
$(BUILD)/bin/%: $(BUILD)/%.o $(CORE_OBJ)
	@mkdir -p $(dir $@)
	$(CC) -o $@ $^ $(LDLIBS)
$(BUILD)/tests/%: tests/%.c $(CORE_OBJ) $(wildcard tests/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(CORE_OBJ) $(LDLIBS)
$(BUILD)/bench/%: bench/%.c $(CORE_OBJ) $(wildcard bench/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(CORE_OBJ) $(LDLIBS)
# the CPU's products beside BLIS's, the one program that links BLIS
$(BUILD)/bench/bench_gemm: LDLIBS += -lblis
# the roofline estimate uses no backend, MPI or library: plain cc and libm, so it runs wherever
# bench/gpu_bench.sh does, a GPU or none
$(BUILD)/bench/roofline: bench/roofline.c
	@mkdir -p $(dir $@)
	cc $(OPT) -std=gnu11 -Wall -Wextra $(SANITIZE) -o $@ $< -lm
# Makefile: a change of flags rebuilds every object
$(BUILD)/%.o: %.c $(wildcard *.h backend/*.h backend/cpu/*.h) Makefile
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c -o $@ $<
$(BUILD)/%.o: %.cu $(wildcard *.h backend/*.h backend/cuda/*.h $(EMU)/*)
	@mkdir -p $(dir $@)
	$(CU_COMPILE)
$(BUILD)/%.o: %.cc $(wildcard $(EMU)/*)
	@mkdir -p $(dir $@)
	mpicxx $(EMUFLAGS) -c -o $@ $<
$(BUILD)/$(EMU)/test_emulator: $(BUILD)/$(EMU)/test_emulator.o $(BUILD)/$(EMU)/emulator.o
	mpicxx -o $@ $^ -lblis

deps:
	@bash scripts/install_deps.sh

# the default model on the bundled corpus, dp=2 x tp=2 x pp=2, 1F1B, on 8 ranks; builds only the
# programs scripts/run_default.sh runs (the tests and benchmarks are built by make test)
run: deps
	@$(MAKE) --no-print-directory train create_config generate plot_loss
	@bash scripts/run_default.sh

test: deps
	@$(MAKE) --no-print-directory all
	@bash tests/run_tests.sh

# the same tests under AddressSanitizer and UndefinedBehaviorSanitizer: the sanitized binaries
# stand in for ./train and ./create_config during the run, then go (the next make relinks)
ASAN = -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
# -O2 as the normal build: gcc fuses a * b + c into one FMA only from -O2, so an -O1 build trains
# to other bits than the ones the tests and the tutorial's chapters show
ASAN_OPT = -O2 -g -march=native
test-asan: deps
	@$(MAKE) --no-print-directory BUILD=build-asan OPT="$(ASAN_OPT)" SANITIZE="$(ASAN)" \
	    $(PROGRAMS:%=build-asan/bin/%) $(patsubst $(BUILD)/%,build-asan/%,$(TESTS)) \
	    build-asan/bench/roofline
	@cp $(PROGRAMS:%=build-asan/bin/%) .
	@ASAN_OPTIONS=detect_leaks=0:verify_asan_link_order=0 PICOTRON_BUILD=build-asan \
	    PICOTRON_OPT="$(ASAN_OPT)" PICOTRON_SANITIZE="$(ASAN)" bash tests/run_tests.sh; \
	    status=$$?; rm -f $(PROGRAMS); exit $$status

format:
	clang-format -i *.c *.h backend/*.h backend/cpu/*.c tests/*.c bench/*.c bench/*.h

clean:
	rm -rf build build-asan build-gpu build-emu $(PROGRAMS)
