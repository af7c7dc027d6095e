// Vocabulary padding, Megatron-LM's make_vocab_size_divisible_by (Shoeybi et al. 2019): GPT-2's
// 50257 tokens do not split over 2 tp ranks, 50304 rows (a multiple of 128) do, and a GPU's GEMM
// prefers such a size anyway. Beyond picotron, so it lives here: with the default multiple 1 the
// model is picotron's.
//
// Unlike Megatron, whose padded rows are trained like any other (their logits keep a share of the
// softmax), the padding here never changes a number:
//   - the padded columns of the logits are -FLT_MAX before the loss (vocab_padding_mask_logits,
//     which the vocab-parallel cross-entropy calls; the model counts the columns when it sets up
//     its loss buffers). exp(-FLT_MAX - max) is exactly 0, so the loss, every probability and
//     every gradient are the unpadded model's, and the padded columns' gradient is exactly 0: the
//     head's padded rows and their AdamW moments stay 0.
//   - the padded rows start at 0 (model.c initialises the rows a checkpoint holds, file_rows), and
//     no token id past vocab_size reaches the embedding (train.c checks the data).
//   - a checkpoint holds vocab_size rows (checkpoint.c clips each block to file_rows), which is
//     what transformers loads; reading one back pads it with zeros again.
// The real rows are initialised as in an unpadded model: init_tensor's value of an element depends
// on its row and column, not on how many rows the tensor has. The multiple is the padded size's
// own, not Megatron's make_vocab_size_divisible_by * tp, so the model is the same under every
// layout.
#include "vocab_padding.h"
#include <float.h>
#include "backend/backend.h"

int vocab_size_with_padding(const Config *c) {
    int multiple = c->make_vocab_size_divisible_by > 1 ? c->make_vocab_size_divisible_by : 1;
    return (c->vocab_size + multiple - 1) / multiple * multiple;
}

int vocab_padding_columns(const Config *c, int vocab_start, int V) {
    int real = c->vocab_size - vocab_start; // this shard's real columns: [0, real)
    return real >= V ? 0 : real > 0 ? V - real : V;
}

// -FLT_MAX, not -inf: a shard of padding alone then has a finite max, and exp(max - max) = 1 where
// -inf - -inf would be NaN; rescaled to the global max its sum is still exactly 0
void vocab_padding_mask_logits(float *logits, int N, int V, int padded) {
    if (padded > 0) fill_columns(logits, -FLT_MAX, N, V, V - padded);
}
