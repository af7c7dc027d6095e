// Vocabulary padding (Megatron-LM's make_vocab_size_divisible_by): the embedding and the head hold
// vocab_size rounded up to a multiple of model.make_vocab_size_divisible_by rows, so that a
// vocabulary such as GPT-2's 50257 splits over the tp ranks. The padded rows never change a number
// (see vocab_padding.c); config.json and the checkpoints keep the real vocab_size.
#pragma once
#include "config.h"

// the rows the embedding and the head hold: vocab_size rounded up to the padding's multiple
int vocab_size_with_padding(const Config *c);

// Puts the padded columns of a vocab shard's logits (N, V) out of the softmax: columns j with
// vocab_start + j >= vocab_size (the real vocabulary) are set to -FLT_MAX. Nothing to do (no
// kernel runs) when this shard holds no padding.
void vocab_padding_mask_logits(float *logits, int N, int V, int vocab_start, int vocab_size);
