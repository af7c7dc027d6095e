// ./generate: text from a checkpoint, one token at a time, on one process.
//   ./generate --checkpoint ckpt/100 --prompt "It is a truth" --max_new_tokens 200 --top_k 40
// It prints the prompt, then the continuation as it comes (--print_ids: the new ids alone).
// The model is the training model of a one-rank layout (B = 1, a window of T positions), with
// the weights of a folder ./train wrote (<save_dir>/<step>, or a save_dir: its latest) or of any
// Hugging Face Llama folder. Two ways to compute each new token's logits, which must agree:
//   --no_kv_cache  the training forward (model_forward) on the whole window, the tokens so far
//                  padded with zeros: attention is causal, so the padding changes no earlier row,
//                  and row len-1 of the logits predicts the next token. Every token costs T
//                  positions.
//   KV cache       the prompt runs through the same training forward once (the whole window,
//                  padding too). The slot it fills keeps every layer's rotated keys and values,
//                  (T, KV*D) each: that is the cache. Each new token then runs decode_step, which
//                  computes the slot's row at the token's position from the rows before it, as
//                  model_forward would have: each token costs one position.
// Only backend kernels touch device memory, so the GPU build runs it too (both ways give the
// fixture's ids on the CUDA emulator, make GPU=emulate). A mixture-of-experts model (num_experts
// in its config.json) takes the first way: each token's experts depend on that token alone. A
// Mamba's cache is its recurrent state (model_mamba.c's mamba_decode_step): each layer's conv
// window, the rows of xi before the token, and its scan's state, stepped by one token.
#include <errno.h>
#include <math.h>
#include <mpi.h>
#include <omp.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "backend/backend.h"
#include "checkpoint.h"
#include "checkpoint_tokenizer.h"
#include "config.h"
#include "model.h"
#include "process_group_manager.h"
#include "tokenizer.h"
#include "utils.h"

static const char *USAGE =
    "usage: ./generate --checkpoint DIR [--tokenizer PATH] --prompt TEXT [--max_new_tokens N] "
    "[--temperature T] [--top_k K] [--top_p P] [--seed S] [--no_kv_cache] [--print_ids]";

typedef struct {
    const char *checkpoint, *tokenizer, *prompt;
    int max_new_tokens; // default 64
    double temperature; // 0 (default): greedy, the most likely token every time
    int top_k;          // sample among the k most likely tokens; 0 (default): all
    double top_p;       // then among the fewest whose probability reaches p; 1 (default): all
    uint64_t seed;
    int kv_cache;  // 0: --no_kv_cache
    int print_ids; // print the new ids, not the prompt and the new text
} Args;

// the number after a flag: the whole text is one, in [lo, hi] (and whole, if asked); `want` says
// what the flag takes
static double number(const char *flag, const char *text, double lo, double hi, int whole,
                     const char *want) {
    if (!text) user_error("generate: %s needs a value (%s)", flag, USAGE);
    char *end = NULL;
    double v = strtod(text, &end);
    if (end == text || *end || !(v >= lo && v <= hi) || (whole && v != floor(v)))
        user_error("generate: %s %s: want %s", flag, text, want);
    return v;
}

static Args parse_args(int argc, char **argv) {
    Args a = {.max_new_tokens = 64, .top_p = 1.0, .seed = 1337, .kv_cache = 1};
    for (int i = 1; i < argc; i++) {
        const char *flag = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(flag, "--help") == 0 || strcmp(flag, "-h") == 0) {
            printf("%s\n", USAGE);
            MPI_Finalize();
            exit(0);
        } else if (strcmp(flag, "--no_kv_cache") == 0) {
            a.kv_cache = 0;
            continue;
        } else if (strcmp(flag, "--print_ids") == 0) {
            a.print_ids = 1;
            continue;
        } else if (strcmp(flag, "--checkpoint") == 0) {
            a.checkpoint = v;
        } else if (strcmp(flag, "--tokenizer") == 0) {
            a.tokenizer = v;
        } else if (strcmp(flag, "--prompt") == 0) {
            a.prompt = v;
        } else if (strcmp(flag, "--max_new_tokens") == 0) {
            a.max_new_tokens = (int)number(flag, v, 1, 1e9, 1, "a whole number from 1 to 10^9");
        } else if (strcmp(flag, "--temperature") == 0) {
            a.temperature =
                number(flag, v, 0, 1e6, 0,
                       "a number from 0 (greedy) to 10^6; 1 keeps the model's distribution");
        } else if (strcmp(flag, "--top_k") == 0) {
            a.top_k =
                (int)number(flag, v, 0, 1e9, 1, "a whole number from 0 (every token) to 10^9");
        } else if (strcmp(flag, "--top_p") == 0) {
            a.top_p = number(flag, v, 0, 1, 0, "a number from 0 to 1 (every token)");
        } else if (strcmp(flag, "--seed") == 0) {
            a.seed = (uint64_t)number(flag, v, 0, 0x1p53, 1, "a whole number from 0 to 2^53");
        } else {
            user_error("generate: unknown argument '%s' (%s)", flag, USAGE);
        }
        if (!v) user_error("generate: %s needs a value (%s)", flag, USAGE);
        i++;
    }
    if (!a.checkpoint) user_error("generate: no --checkpoint given (%s)", USAGE);
    if (!a.prompt) user_error("generate: no --prompt given (%s)", USAGE);
    if (!a.prompt[0])
        user_error("generate: --prompt is empty (the model continues a text: give it "
                   "at least one character)");
    return a;
}

// The checkpoint a save_dir's `latest` names, else DIR itself (a ./train step folder, a Hugging
// Face folder). `latest` first: create_config's save_dir is the experiment folder, whose
// config.json is the training config, not a model's.
static void find_model_folder(char *out, size_t size, const char *dir) {
    struct stat st;
    char file[1100];
    if (strlen(dir) + 32 > size || strlen(dir) + 32 > sizeof file)
        user_error("generate: --checkpoint %s is longer than %zu characters", dir,
                   (size < sizeof file ? size : sizeof file) - 32);
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        user_error("generate: --checkpoint %s: %s (name a <save_dir>/<step> folder ./train wrote, "
                   "a save_dir, or a Hugging Face model folder)",
                   dir, stat(dir, &st) != 0 ? strerror(errno) : "not a folder");
    if (checkpoint_latest(out, size, dir)) return;
    snprintf(file, sizeof file, "%s/config.json", dir);
    if (stat(file, &st) != 0)
        user_error("generate: --checkpoint %s holds neither config.json nor a `latest` file (name "
                   "a <save_dir>/<step> folder ./train wrote, a save_dir, or a Hugging Face model "
                   "folder)",
                   dir);
    snprintf(out, size, "%s", dir);
}

// The prompt's ids, P of them: its bytes for a byte model (./train's .txt data), else the
// tokenizer's. Refuses ids the model has no row for, and more than its positions.
static int *prompt_ids(size_t *P, const char *prompt, const Tokenizer *tok, const Config *cfg,
                       const char *folder) {
    size_t n = 0, cap = 0, len = strlen(prompt);
    int *ids = NULL;
    if (tok) {
        n = tokenizer_encode(&ids, &n, &cap, tok, prompt, len);
    } else {
        ids = xmalloc(len * sizeof(int));
        for (n = 0; n < len; n++) ids[n] = (unsigned char)prompt[n];
    }
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= cfg->vocab_size)
            user_error("generate: the prompt's token %d is outside the model's vocabulary "
                       "(vocab_size %d in %s/config.json): %s",
                       ids[i], cfg->vocab_size, folder,
                       tok ? "give the tokenizer the model was trained with"
                           : "a byte model needs vocab_size 256");
    if ((long)n > cfg->max_position_embeddings)
        user_error("generate: the prompt is %zu tokens, more than the model's "
                   "max_position_embeddings = %d (shorten it)",
                   n, cfg->max_position_embeddings);
    *P = n;
    return ids;
}

// The whole model on this one rank: no tensor, pipeline or context split, one sequence of T
// positions, the weights read from folder
static void build_model(Model *model, ProcessGroupManager *pgm, Config *cfg, const char *folder,
                        int T) {
    cfg->tp_size = cfg->cp_size = cfg->pp_size = cfg->dp_size = 1;
    cfg->micro_batch_size = 1;
    cfg->seq_length = T;
    cfg->cp_zigzag = 0;
    comm_set_backend("mpi"); // groups of one rank: no NCCL communicator needed
    process_group_manager_init(pgm, 1, 1, 1, 1, 1);
    int *positions = xmalloc((size_t)T * sizeof(int));
    for (int t = 0; t < T; t++) positions[t] = t;
    ModelShard shard = {.tp = tensor_parallel_sizes(cfg, &pgm->tp),
                        .stage = {.num_layers = cfg->num_hidden_layers,
                                  .has_embedding = 1,
                                  .has_head = 1,
                                  .num_chunks = 1},
                        .positions = positions,
                        .stream_rows = cfg->micro_batch_size * T};
    model_init(model, cfg, pgm, &shard, 1);
    // a folder ./train wrote is checked as ./train checks it when it resumes; else Hugging Face's
    char state[1300];
    snprintf(state, sizeof state, "%s/state.json", folder);
    if (access(state, F_OK) == 0)
        checkpoint_load(model, NULL, folder);
    else
        checkpoint_init_from(model, folder);
    free(positions);
}

// Position pos alone, its token given: what model_forward computes for row pos of slot 0, from the
// keys and values that rows 0..pos-1 left in the slot. Writes row pos of every activation it
// passes through (its k and v rows join the cache) and of model->logits. The steps are those of
// model.c's attention_forward and mlp_forward with N = 1, tp = 1: plain matmuls, no all-reduce.
// positions: (T) device ints 0..T-1, the attention kernel's query and key positions;
// lse: (H) device floats, one query's log-sum-exp.
static void decode_step(Model *model, int pos, int token, const int *positions, float *lse) {
    Activations *a = &model->slots[0];
    int C = model->C, D = model->D, H = model->H, KV = model->KV, I = model->I, V = model->V;
    size_t p = pos, NC = (size_t)model->T * C; // row p of every (T, width) activation
    float eps = model->cfg.rms_norm_eps;
    const float *cos = model->rope_cos + p * (D / 2), *sin = model->rope_sin + p * (D / 2);
    host_to_device(a->tokens + p, &token, sizeof token);
    embedding_forward(a->resid + p * C, a->tokens + p, model->w.embed_tokens, 1, C, 0, V);
    for (int l = 0; l < model->L; l++) {
        const AttentionWeights *wa = &model->w.layers[l].self_attn;
        const MlpWeights *wm = &model->w.layers[l].mlp;
        const AttentionActivations *sa = &a->layers[l].self_attn;
        const MlpActivations *sm = &a->layers[l].mlp;
        float *x = a->resid + l * NC + p * C, *out = a->resid + (l + 1) * NC + p * C;
        float *mid = a->layers[l].mid + p * C;
        float *ln1 = sa->ln1 + p * C, *q = sa->q + p * H * D, *att = sa->att + p * H * D;
        float *k = sa->k + p * KV * D, *v = sa->v + p * KV * D;
        // mid = x + o_proj(attention of q over the keys and values of 0..pos)
        rmsnorm_forward(ln1, sa->rstd1 + p, x, wa->input_layernorm, 1, C, eps);
        matmul_forward(q, ln1, wa->q_proj, 1, C, H * D);
        matmul_forward(k, ln1, wa->k_proj, 1, C, KV * D);
        matmul_forward(v, ln1, wa->v_proj, 1, C, KV * D);
        rope_forward(q, cos, sin, 1, 1, H, D);
        rope_forward(k, cos, sin, 1, 1, KV, D);
        fill(att, 0.0f, (size_t)H * D);
        fill(lse, -INFINITY, H);
        attention_forward_block(att, lse, q, sa->k, sa->v, positions + pos, positions, 1, 1,
                                pos + 1, H, KV, D);
        matmul_forward(mid, att, wa->o_proj, 1, H * D, C);
        add_inplace(mid, x, C);
        // out = mid + down_proj(silu(gate_proj(ln2)) * up_proj(ln2))
        float *ln2 = sm->ln2 + p * C, *gate = sm->gate + p * I, *up = sm->up + p * I;
        float *act = sm->act + p * I;
        rmsnorm_forward(ln2, sm->rstd2 + p, mid, wm->post_attention_layernorm, 1, C, eps);
        matmul_forward(gate, ln2, wm->gate_proj, 1, C, I);
        matmul_forward(up, ln2, wm->up_proj, 1, C, I);
        swiglu_forward(act, gate, up, I);
        matmul_forward(out, act, wm->down_proj, 1, I, C);
        add_inplace(out, mid, C);
    }
    float *lnf = a->lnf + p * C;
    rmsnorm_forward(lnf, a->rstdf + p, a->resid + model->L * NC + p * C, model->w.norm, 1, C, eps);
    matmul_forward(model->logits + p * V, lnf, model->w.lm_head, 1, C, V);
}

// The training forward on the window: tokens (T) are the text so far, then zeros. The loss it
// computes against zero targets is thrown away; what is kept is model->logits (T, V) and, in the
// slot, every layer's keys and values.
static void forward_window(Model *model, const int *tokens, const int *zeros) {
    model_set_batch(model, 0, tokens, zeros);
    model_forward(model, 0, 1.0f);
}

// splitmix64 (Steele et al.): the state steps by a constant, a mixer whitens it; 53 of its bits
// make a double uniform in [0, 1)
static double random_uniform(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (double)((z ^ (z >> 31)) >> 11) * 0x1.0p-53;
}

typedef struct {
    double weight; // the logit, then exp((logit - max) / temperature)
    int id;
} Candidate;

// most likely first; ties by id, so the order never depends on qsort's
static int by_weight_descending(const void *pa, const void *pb) {
    const Candidate *a = pa, *b = pb;
    if (a->weight != b->weight) return a->weight < b->weight ? 1 : -1;
    return a->id - b->id;
}

// The next id from logits (V): the first argmax at temperature 0 (torch.argmax's choice). Else a
// draw u in [0, 1) from softmax(logits / temperature), as transformers' sampling cuts it: to the
// top_k most likely ids (0: all), then to the fewest of those whose probability reaches top_p
// (the nucleus, Holtzman et al. 2019; at least one).
static int sample_token(const float *logits, int V, const Args *args, double u) {
    if (args->temperature == 0) {
        int best = 0;
        for (int i = 1; i < V; i++) best = logits[i] > logits[best] ? i : best;
        return best;
    }
    Candidate *c = xmalloc((size_t)V * sizeof *c);
    for (int i = 0; i < V; i++) c[i] = (Candidate){logits[i], i};
    qsort(c, V, sizeof *c, by_weight_descending);
    int k = args->top_k > 0 && args->top_k < V ? args->top_k : V;
    double max = c[0].weight, sum = 0.0, kept = 0.0;
    for (int i = 0; i < k; i++) {
        c[i].weight = exp((c[i].weight - max) / args->temperature);
        sum += c[i].weight;
    }
    int n = 0;
    while (n < k && (n == 0 || kept < args->top_p * sum)) kept += c[n++].weight;
    // walk the n kept ids until their weights add up past u of their total
    double target = u * kept;
    int i = 0;
    while (i < n - 1 && (target -= c[i].weight) >= 0) i++;
    int id = c[i].id;
    free(c);
    return id;
}

// id's text as it comes: its bytes (a byte model's id is its byte), or its number
static void print_token(int id, const Tokenizer *tok, int print_ids, int first) {
    if (print_ids) {
        printf(first ? "%d" : " %d", id);
    } else if (tok) {
        size_t len = 0;
        const char *text = tokenizer_decode(tok, id, &len);
        if (text) xfwrite(text, 1, len, stdout);
    } else {
        putchar(id);
    }
    fflush(stdout);
}

// Appends up to args->max_new_tokens ids to tokens (T + 1, the prompt's P first, zeros after),
// printing each as it comes. text_vocab: ids below it have text; the others are never drawn.
// eot: the end-of-text id, which stops it unprinted (-1: none). Returns how many it added.
static int generate(Model *model, int *tokens, int P, int text_vocab, int eot, const Args *args,
                    const Tokenizer *tok) {
    int T = model->T, V = model->V, made = 0;
    float *logits = xmalloc((size_t)V * sizeof(float));
    int *zeros = xmalloc((size_t)T * sizeof(int)), *host_positions = xmalloc(T * sizeof(int));
    for (int t = 0; t < T; t++) {
        zeros[t] = 0; // the targets of a loss nobody reads
        host_positions[t] = t;
    }
    int *positions = device_malloc((size_t)T * sizeof(int));
    host_to_device(positions, host_positions, (size_t)T * sizeof(int));
    free(host_positions);
    float *lse = device_malloc((size_t)model->H * sizeof(float));
    uint64_t rng = args->seed;
    forward_window(model, tokens, zeros); // the prompt: the first logits, and the cache
    int mamba = config_is_mamba(&model->cfg);
    float *states = mamba && args->kv_cache ? mamba_decode_begin(model, P) : NULL;
    for (int len = P; made < args->max_new_tokens; len++) {
        device_to_host(logits, model->logits + (size_t)(len - 1) * V, (size_t)V * sizeof(float));
        int next = sample_token(logits, text_vocab, args, random_uniform(&rng));
        if (next == eot) break;
        print_token(next, tok, args->print_ids, made++ == 0);
        tokens[len] = next;
        if (made == args->max_new_tokens) break;
        if (len == T) { // the window is as long as the model's positions go
            fprintf(stderr, "\ngenerate: stopped after %d tokens: max_position_embeddings = %d\n",
                    made, model->cfg.max_position_embeddings);
            break;
        }
        if (args->kv_cache && mamba) // the conv's window and the scan's state, per layer
            mamba_decode_step(model, len, next, states);
        else if (args->kv_cache)
            decode_step(model, len, next, positions, lse);
        else
            forward_window(model, tokens, zeros);
    }
    device_synchronize();
    free(logits);
    free(zeros);
    device_free(positions);
    device_free(lse);
    if (states) device_free(states);
    return made;
}

int main(int argc, char **argv) {
    mpiCheck(MPI_Init(&argc, &argv));
    user_errors_init();
    Args args = parse_args(argc, argv);
    // one thread unless OMP_NUM_THREADS says otherwise, as ./train's default: a decode step's
    // products have one row, which the CPU backend gives one thread, and idle threads of a
    // busy machine's OpenMP team spin at every barrier (40 tokens of hf_tiny without the cache
    // took 7 s with 2 threads beside another program, 0.05 s with 1)
    if (!getenv("OMP_NUM_THREADS")) omp_set_num_threads(1);
    char folder[1200];
    find_model_folder(folder, sizeof folder, args.checkpoint);
    Config cfg;
    config_defaults(&cfg);
    checkpoint_read_config(&cfg, folder, "generate: --checkpoint");
    // decode_step is the dense Llama's: a mixture of experts runs the training forward each token
    // (a Mamba keeps its recurrent state instead of a cache: model_mamba.c)
    if (cfg.num_experts > 0) args.kv_cache = 0;

    // --tokenizer, else the checkpoint's own copy (checkpoint_tokenizer.h), else bytes
    Tokenizer *tok = checkpoint_tokenizer_load(folder, args.tokenizer);
    size_t P;
    int *ids = prompt_ids(&P, args.prompt, tok, &cfg, folder);

    // the window: the prompt and the new tokens but the last (no token comes after it)
    long window = (long)P + args.max_new_tokens - 1;
    int T = window < cfg.max_position_embeddings ? (int)window : cfg.max_position_embeddings;
    int *tokens = xmalloc(((size_t)T + 1) * sizeof(int));
    memset(tokens, 0, ((size_t)T + 1) * sizeof(int));
    memcpy(tokens, ids, P * sizeof(int));
    // a byte model draws bytes only; a tokenizer's model, the ids the tokenizer can write
    int text_vocab = tok ? tokenizer_vocab_size(tok) : 256;
    if (text_vocab > cfg.vocab_size) text_vocab = cfg.vocab_size;
    if (!tok && cfg.vocab_size > 256)
        fprintf(stderr,
                "note: no --tokenizer: the model's vocabulary is %d ids, generate uses "
                "ids 0..255 as bytes (give --tokenizer for a model trained on tokens)\n",
                cfg.vocab_size);
    backend_init(0);
    ProcessGroupManager pgm;
    Model model;
    build_model(&model, &pgm, &cfg, folder, T);

    // the prompt first, so that the continuation reads on from it
    if (!args.print_ids) {
        fputs(args.prompt, stdout);
        fflush(stdout);
    }
    double start = now_seconds();
    int made =
        generate(&model, tokens, (int)P, text_vocab, tok ? tokenizer_eot(tok) : -1, &args, tok);
    double seconds = now_seconds() - start;
    printf("\n");
    fflush(stdout);
    fprintf(stderr, "generate: %d token%s in %.3f s, %.1f tokens/s (%s; prompt %zu tokens)\n", made,
            made == 1 ? "" : "s", seconds, made / seconds,
            args.kv_cache ? "kv cache" : "no kv cache: the whole window per token", P);

    model_free(&model);
    process_group_manager_free(&pgm);
    if (tok) tokenizer_free(tok);
    free(ids);
    free(tokens);
    mpi_finalize_watched(cfg.timeout_s);
    return 0;
}
