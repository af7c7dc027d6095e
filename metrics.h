// The metrics file (logging.metrics_file): one JSON line per step, which extract_metrics.sh,
// plot_loss and the tests read. Beyond picotron, which logs to the console and wandb.
#pragma once
#include <stdio.h>

// Opens path for the run's steps from first_step on: a resumed run keeps the lines of the steps
// before it (rewritten through a temporary file, so a crash loses nothing)
FILE *metrics_open(const char *path, int first_step);
// one step's line; aux_loss NULL for a dense model (no "aux_loss" key); more: further members
// ("" for none), e.g. each domain's loss. A write that fails (a full disk) ends the job in one
// line naming the file and the error.
void metrics_write(FILE *f, int step, float loss, long tokens, double seconds, float grad_norm,
                   const float *aux_loss, const char *more);
void metrics_close(FILE *f); // fclose, checked as each write is
