// Vocabulary padding (Megatron-LM's make_vocab_size_divisible_by): the embedding and the head hold
// vocab_size rounded up to a multiple of model.make_vocab_size_divisible_by rows, so that a
// vocabulary such as GPT-2's 50257 splits over the tp ranks. The padded rows never change a number
// (see vocab_padding.c); config.json and the checkpoints keep the real vocab_size.
#pragma once
#include "config.h"

// the rows the embedding and the head hold: vocab_size rounded up to the padding's multiple
int vocab_size_with_padding(const Config *c);

// how many of the last columns of the vocab shard [vocab_start, vocab_start + V) are padding:
// those at or past vocab_size, the real vocabulary's end
int vocab_padding_columns(const Config *c, int vocab_start, int V);

// Puts the padded columns of a vocab shard's logits (N, V), its last `padded`, out of the softmax:
// they are set to -FLT_MAX. Nothing to do (no kernel runs) when padded is 0.
void vocab_padding_mask_logits(float *logits, int N, int V, int padded);
