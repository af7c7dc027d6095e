// Token files and the loader. A sample is a window of seq_length+1 tokens taken with stride
// seq_length (picotron's packing); sample i of the global order goes to dp rank i mod dp
// (DistributedSampler without shuffling), so the data position follows from the step alone.
#pragma once
#include <stdint.h>

typedef struct {
    int *tokens; // the whole corpus, every rank holds it (small corpora; mmap later)
    long num_tokens;
    int vocab_size; // largest token id + 1 seen in the file
    char path[512]; // the file, for error messages
} Dataset;

// path: ".txt" is read as UTF-8 and tokenised byte by byte (vocab 256); ".tok" is this project's
// token file (header: magic, version, token count, token width); ".bin" is an llm.c token shard.
// A missing or malformed file ends the run with one line naming it.
void dataset_open(Dataset *ds, const char *path);
void dataset_free(Dataset *ds);
long dataset_num_samples(const Dataset *ds, int seq_length);

// inputs, targets: (mbs, seq_length) host arrays, the micro-batch `micro` of step `step`
// (steps count from 0) for dp rank dp_rank; num_samples > 0 caps the samples used per epoch.
void dataset_get_batch(int *inputs, int *targets, const Dataset *ds, int step, int micro,
                       int grad_acc, int mbs, int seq_length, int dp_rank, int dp_size,
                       long num_samples);

// writes tokens as a ".tok" file (width 2 bytes when every token < 65536, else 4)
void tokens_write(const char *path, const int *tokens, long n);

// The micro-batch `micro` of step `step` for this rank (its dp samples, its cp tokens), uploaded
// into the model's activation slot: picotron's MicroBatchDataLoader.
struct Model;
void load_micro_batch(struct Model *model, int slot, const Dataset *ds, int step, int micro);
