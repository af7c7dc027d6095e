// Hugging Face's safetensors format: an 8-byte little-endian header length, a JSON header
// {name: {"dtype", "shape", "data_offsets": [begin, end]}}, then the raw tensors, row-major.
// Checkpoints read and write blocks of it in place (pread/pwrite at their offsets), so each rank
// touches only the slice of each tensor it holds.
#pragma once
#include <stddef.h>
#include "model.h"

typedef struct {
    char *name;          // as long as the file's header has it
    char dtype[8];       // "F32", "BF16" or "F16": the three a Llama checkpoint comes in
    int element_size;    // bytes
    int ndim;            // 1, 2 or 3
    long rows, cols;     // a 1-D tensor is one row; a 3-D one (a, b, c) is (a*b, c)
    size_t begin, bytes; // in the file: the first byte, and how many
} SafetensorsTensor;

typedef struct {
    char path[1024];
    int fd, writable;
    int num_tensors;
    SafetensorsTensor *tensors;
} SafetensorsFile;

// One entry of the file a checkpoint writes: a tensor of the full model, fp32
typedef struct {
    char name[128];
    int rows, cols, ndim; // ndim 3: (rows, 1, cols), a depthwise Conv1d's weight
} SafetensorsEntry;

// Writes the header of a file holding these fp32 tensors in this order and sizes the file (rank
// 0 alone calls it); every rank then opens it with safetensors_open(.., writable = 1).
void safetensors_create(const char *path, const SafetensorsEntry *entries, int n);
// Opens path and reads its header; a file that is not safetensors, or whose offsets do not fit
// it, ends the run with one line naming it.
void safetensors_open(SafetensorsFile *f, const char *path, int writable);
void safetensors_close(SafetensorsFile *f); // fsyncs what was written
const SafetensorsTensor *safetensors_find(const SafetensorsFile *f, const char *name);

// The block [row0, row0+rows) x [col0, col0+cols) a rank holds (p's place in the full tensor):
// read as fp32 whatever the file's dtype, or written (F32 files only)
void safetensors_read_block(float *out, const SafetensorsFile *f, const SafetensorsTensor *t,
                            const ParamInfo *p);
void safetensors_write_block(const SafetensorsFile *f, const SafetensorsTensor *t,
                             const float *block, const ParamInfo *p);
