// Checkpoints: each rank writes its shard of the flat buffers with the parameter table, so a
// checkpoint names every element by (tensor, global index) whatever the layout.
#pragma once
#include "model.h"
#include "optimizer.h"

// writes <dir>/rank_<global rank>.bin: the table, the parameters and the AdamW moments
void checkpoint_save(const Model *model, const Optimizer *opt, const char *dir, int step);
// reads this rank's file from <dir> into the model and the optimizer (moments and step count);
// returns the step it was saved at. The layout must match.
int checkpoint_load(Model *model, Optimizer *opt, const char *dir);

// one tensor of a checkpoint, for tools that compare runs
typedef struct {
    ParamInfo info;
    float *data; // (rows, cols) of this shard
} CheckpointTensor;
// reads every tensor of one rank file; returns how many (0 if the file does not exist)
int checkpoint_read_file(CheckpointTensor **tensors, const char *path);
