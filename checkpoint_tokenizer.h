// A checkpoint records the tokenizer its run trained with (dataset.tokenizer), so that its folder
// is a model and its tokenizer, as a Hugging Face model folder is. Besides checkpoint.h's files:
//   tokenizer.json, or vocab.json + merges.txt   byte-for-byte copies of the files it was read from
//   tokenizer_config.json   the class and the special tokens transformers' AutoTokenizer needs
//   generation_config.json  bos_token_id and eos_token_id, as config.json holds them
//   state.json              "tokenizer_fingerprint": tokenizer_fingerprint() of the copies
// Both ids are the tokenizer's end-of-text token ("<|endoftext|>", 50256 in GPT-2), the one
// prepare_data puts between documents. A run on bytes (no dataset.tokenizer) has no tokenizer to
// copy and no such token: both ids are null, so that transformers does not guess Llama's 1 and 2.
#pragma once
#include <stdint.h>
#include "config.h"
#include "tokenizer.h"

typedef struct {
    uint64_t fingerprint; // 0: no tokenizer
    int eos;              // its end-of-text id, which is also the bos; -1: none
} CheckpointTokenizer;

// Rank 0, into the checkpoint folder being written (dir): the copies of cfg->tokenizer's files,
// tokenizer_config.json and generation_config.json; returns what config.json and state.json record
CheckpointTokenizer checkpoint_tokenizer_save(const char *dir, const Config *cfg);

// The tokenizer ./generate uses for a checkpoint folder: `given` (--tokenizer; NULL: none given),
// else the folder's own copy when its state.json records a fingerprint, else NULL (bytes, as for
// a folder that records none: an older checkpoint or a Hugging Face one). A tokenizer whose
// fingerprint is not the one recorded ends the run with one line naming both.
Tokenizer *checkpoint_tokenizer_load(const char *folder, const char *given);
