// Pipeline parallelism: layer split and the AFAB / 1F1B schedules (see pipeline_parallel.c).
#pragma once
#include "config.h"
#include "data.h"
#include "data_parallel.h"

// picotron's rule: stage i gets L/pp layers, the first L mod pp stages one more
void distribute_layers(int *layer0, int *count, int num_layers, int pp, int stage);

// activation slots a stage needs: all micro-batches under AFAB, pp - stage under 1F1B
int pipeline_num_slots(const Config *cfg, int stage);
// one training step over grad_acc micro-batches with the configured engine; returns the mean loss
// (on the last stage; 0 elsewhere)
float pipeline_train_step(Model *model, DataParallel *dp, const Dataset *ds, int step);
// the tied embedding lives on the first and the last stage: sum their gradients
void pipeline_sync_tied_embeddings(Model *model);
