// ZeRO (distributed.zero_stage; zero1 is stage 1): the optimizer's state (stage 1), the gradients
// (stage 2) and the parameters (stage 3) sharded over the cp*dp replicas (see zero.c).
// Beyond picotron.
#pragma once
#include "data_parallel.h"
#include "model.h"
#include "optimizer.h"

typedef struct {
    int stage; // 0: off (nothing here runs)
    DataParallel *dp;
    Model *model;
    Group *group; // the cp*dp replicas; this rank is group->rank of R = group->size
    // the shard, as AdamW's ranges of the flat buffer: [shard_start[i], + shard_size[i]) for each
    // of num_ranges pieces (stage 1: piece r of each bucket; stages 2 and 3: of each unit)
    int num_ranges;
    size_t *shard_start, *shard_size;

    // stage 1, per bucket: R pieces of piece[b] floats (padded[b] = R * piece[b] >= its size)
    size_t *piece, *padded;
    int *all_reduced; // buckets all-reduced all the same (a pipeline's tied embedding)
    float *pad;       // (padded[last]) device scratch, when the last bucket needs padding
    Handle *gathers;  // the parameters' all-gathers

    // stages 2 and 3, per unit: unit u is the model's part u - 1 (model.h's part_start: the
    // embedding, each layer, the head), cut in R pieces of unit_piece[u] floats
    int num_units;
    size_t *unit_piece;
    size_t *shard_at;    // where piece r of unit u sits in the compact shard buffers below
    size_t shard_floats; // S, their size
    float *grad_shard;   // (S) the shard's averaged gradients, summed over the micro-batches
                         // (model->grads)
    float *param_shard;  // (S) stage 3: the fp32 master copy of the shard (model->params)
    float **grad_buffer; // the unit's whole gradient, from its backward to its reduce-scatter
    float **gathered;    // stage 3: the unit's whole weights, from its gather to its release
    Handle *scatter, *gather;
    int *scattering, *gathering;            // in flight
    ModelWeights window;                    // model_layout_params's pointers over one unit's buffer
    int part, backward;                     // the part the model last asked for, and in which pass
    size_t buffer_bytes, peak_buffer_bytes; // of grad_buffer and gathered alive at once
    long gathers_started, prefetches, scatters_started;
    double gather_in_flight, gather_hidden; // seconds, and those not waited for
} Zero;

// After model_init: the shard plan and the model's hooks. Stage 1 is data_parallel_init with
// buckets reduce-scattered; stages 2 and 3 install the model's backward hook (each unit's
// gradient reduce-scattered as soon as its backward ends) and stage 3 its parameter hook (each
// unit gathered before it is read, the next one prefetched); the full gradient buffer (2, 3) and
// the full parameters (3) are freed. dp is initialised for the schedules' use in all stages.
void zero_init(Zero *z, DataParallel *dp, Model *model, Group *group);
// AdamW over the shard: its moments, and where it reads the shard's gradients and parameters
void zero_optimizer_init(Optimizer *opt, const Zero *z, const Config *cfg);
// stages 2 and 3, the step's backward done: every reduce-scatter waited for, the tied
// embedding's two shards summed over the pipeline's first and last stage, gathers released
void zero_wait(Zero *z);
// after AdamW updated the shard: stages 1 and 2 all-gather the parameters so every replica holds
// all of them again; stages 2 and 3 zero the shard's gradients for the next step
void zero_after_step(Zero *z);
// stage 3 (nothing otherwise): model->params made whole for a checkpoint's read or write, then
// sharded again (the shard taken from it)
void zero_unshard_params(Zero *z);
void zero_reshard_params(Zero *z);
// the run's gathers and reduce-scatters, on the logging rank (stages 2 and 3)
void zero_report(const Zero *z, int steps);
void zero_free(Zero *z);
