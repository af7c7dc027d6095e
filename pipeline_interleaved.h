// Interleaved 1F1B (distributed.pp_virtual_stages > 1), beyond picotron (see
// pipeline_interleaved.c): each stage holds several chunks of layers.
#pragma once
#include "pipeline_parallel.h"

// This rank's chunks: chunk k of stage i holds the L/(pp*V) layers of virtual stage k*pp + i
PipelineStage pipeline_interleaved_stage(const Config *cfg, const ProcessGroupManager *pgm);
// the most micro-batches in flight at once on this stage, each holding one slot for all its chunks
int pipeline_interleaved_num_slots(const Config *cfg, int stage);
// one training step over grad_acc micro-batches (pipeline_train_step's twin); returns the mean
// loss (on the last stage; 0 elsewhere)
float train_step_pipeline_interleaved(PipelineParallel *pipe, int step);
