// Token files and the loader. A sample is a window of seq_length+1 tokens taken with stride
// seq_length (picotron's packing); sample i of the global order goes to dp rank i mod dp
// (DistributedSampler without shuffling), so the data position follows from the step alone.
#pragma once
#include <stdint.h>
#include "config.h"

typedef struct {
    int *tokens; // the whole corpus, every rank holds it (small corpora; mmap later)
    long num_tokens;
    int vocab_size; // largest token id + 1 seen in the file
    // what a .tok file says of the tokenizer that made it (0: not recorded; .txt and .bin)
    uint64_t tokenizer_fingerprint;
    int tokenizer_vocab_size;
    char path[512]; // the file, for error messages
    // a mixture of domains (doremi.c) chooses each sample's window and its domain; NULL: this
    // corpus's windows in order
    const int *(*sample_window)(void *mixture, long sample, int *domain);
    void *mixture;
} Dataset;

// path: ".txt" is read as UTF-8 and tokenised byte by byte (vocab 256); ".tok" is this project's
// token file (header: magic, version, token count, token width); ".bin" is an llm.c token shard.
// A missing or unreadable path, a directory or pipe, a header count the file's size does not
// hold, a token id >= INT32_MAX or a corpus larger than memory: one line naming the file, exit 1.
void dataset_open(Dataset *ds, const char *path);
void dataset_free(Dataset *ds);
// dataset_open, then the checks a run makes against its config: the tokenizer that made a .tok
// file, and a vocabulary that holds every token
void dataset_load(Dataset *ds, const char *path, const Config *cfg);
long dataset_num_samples(const Dataset *ds, int seq_length);

// inputs, targets: (mbs, seq_length) host arrays, the micro-batch `micro` of step `step`
// (steps count from 0) for dp rank dp_rank; num_samples > 0 caps the samples used per epoch.
// domains (mbs): each row's domain (0 without a mixture); NULL when not wanted.
void dataset_get_batch(int *inputs, int *targets, int *domains, const Dataset *ds, int step,
                       int micro,
                       int grad_acc, int mbs, int seq_length, int dp_rank, int dp_size,
                       long num_samples);

// writes tokens as a ".tok" file (width 2 bytes when every token < 65536, else 4), recording
// the tokenizer that made them (fingerprint and vocabulary size; 0, 0: none)
void tokens_write(const char *path, const int *tokens, long n, uint64_t tokenizer_fingerprint,
                  int tokenizer_vocab_size);
// With dataset.tokenizer set: the model's vocabulary holds the tokenizer's, and a .tok file was
// made with that tokenizer; one line otherwise
void dataset_check_tokenizer(const Dataset *ds, const Config *cfg);

// picotron's MicroBatchDataLoader: this rank's tokens and targets for (step, micro-batch), its
// dp share of the global batch and its cp share of each sequence. It returns tokens; what reads
// them is the step code's business.
typedef struct {
    const Dataset *ds;
    int micro_batch_size, seq_length, grad_acc, dp_rank, dp_size;
    long num_samples;
    const int *positions; // (T): the positions of each sequence this cp rank holds
    int T;
    int *input_ids, *target_ids;         // (B, T): the micro-batch of the last load_micro_batch
    int *domains;                        // (B): the domain of each of its rows
    int *window_inputs, *window_targets; // (B, seq_length): the whole sequences it comes from
} MicroBatchDataLoader;

// positions: context_parallel_positions() of this rank, kept (not copied) by the loader
void micro_batch_loader_init(MicroBatchDataLoader *loader, const Dataset *ds, const Config *cfg,
                             int dp_rank, int dp_size, const int *positions, int T);
void micro_batch_loader_free(MicroBatchDataLoader *loader);
// fills loader->input_ids and loader->target_ids with micro-batch `micro` of step `step`
void load_micro_batch(MicroBatchDataLoader *loader, int step, int micro);
