// Pipeline parallelism: the layer split and the AFAB / 1F1B schedules (see pipeline_parallel.c;
// the interleaved schedule is pipeline_interleaved.c's).
#pragma once
#include "config.h"
#include "data.h"
#include "data_parallel.h"
#include "model.h"
#include "process_group_manager.h"

// This rank's stage: picotron's distribute_layers gives stage i L/pp layers, the first L mod pp
// stages one more. The first stage embeds the tokens, the last holds the head.
PipelineStage pipeline_stage(const Config *cfg, const ProcessGroupManager *pgm);
// activation slots a stage needs: all micro-batches under AFAB, min(pp - stage, grad_acc) under
// 1F1B
int pipeline_num_slots(const Config *cfg, int stage);

// picotron's PipelineParallel: the model of this stage, and the gradients a stage exchanges
typedef struct {
    Model *model;
    DataParallel *dp;
    MicroBatchDataLoader *loader;
    ProcessGroupManager *pgm;
    float *input_tensor_grad;  // (N, C): the gradient of this stage's input, sent back
    float *output_tensor_grad; // (N, C): the gradient of its output, received from the next stage
    size_t buffer_bytes; // the two gradient buffers above: activations' gradients, in the report
} PipelineParallel;

void pipeline_parallel_init(PipelineParallel *pipe, Model *model, DataParallel *dp,
                            MicroBatchDataLoader *loader, ProcessGroupManager *pgm);
void pipeline_parallel_free(PipelineParallel *pipe);
// one training step over grad_acc micro-batches with the configured engine; returns the mean loss
// (on the last stage; 0 elsewhere)
float pipeline_train_step(PipelineParallel *pipe, int step);
// the tied embedding lives on the first and the last stage: sum their gradients
void pipeline_sync_tied_embeddings(Model *model);
