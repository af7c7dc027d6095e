// config.json: picotron's schema read with cJSON into a Config, checked, and written back.
// One table row per key (section, key, type, where it lives in Config) drives reading, writing
// and the "unknown key" message, so a new key is one line here and one field in config.h.
#include "config.h"
#include "utils.h"
#include "vocab_padding.h"
#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

enum { T_INT, T_LONG, T_FLOAT, T_DOUBLE, T_BOOL, T_STR, T_LIST, T_IGNORED };
static const char *type_names[] = {"an integer",    "an integer", "a number", "a number",
                                   "true or false", "a string",   "a list",   "anything"};

typedef struct {
    const char *section, *key;
    int type;
    size_t offset, size; // where the value lives in Config; size bounds a string
    const char *saved;   // T_IGNORED: the JSON config_save writes, so picotron can read it
    int mamba;           // a Mamba's key (MambaConfig's): written only for a Mamba
} Field;

#define KEY(sec, key, type, member)                                                                \
    { sec, key, type, offsetof(Config, member), sizeof(((Config *)0)->member), NULL, 0 }
#define MAMBA_KEY(key, type, member)                                                               \
    { "model", key, type, offsetof(Config, member), sizeof(((Config *)0)->member), NULL, 1 }
// read for compatibility with picotron's configs, then ignored
#define IGNORED(sec, key, json)                                                                    \
    { sec, key, T_IGNORED, 0, 0, json, 0 }

static const char *sections[] = {"distributed", "model",   "training",    "dataset",
                                 "checkpoint",  "logging", "environment", "doremi"};
#define NUM_SECTIONS (int)(sizeof sections / sizeof sections[0])

static const Field fields[] = {
    KEY("distributed", "tp_size", T_INT, tp_size),
    KEY("distributed", "cp_size", T_INT, cp_size),
    KEY("distributed", "pp_size", T_INT, pp_size),
    KEY("distributed", "dp_size", T_INT, dp_size),
    KEY("distributed", "ep_size", T_INT, ep_size),
    KEY("distributed", "pp_engine", T_STR, pp_engine),
    KEY("distributed", "pp_virtual_stages", T_INT, pp_virtual_stages),
    KEY("distributed", "backend", T_STR, backend),
    KEY("distributed", "use_cpu", T_BOOL, use_cpu),
    KEY("distributed", "tp_async", T_BOOL, tp_async),
    KEY("distributed", "sequence_parallel", T_BOOL, sequence_parallel),
    KEY("distributed", "cp_zigzag", T_BOOL, cp_zigzag),
    KEY("distributed", "bucket_size_mb", T_INT, bucket_size_mb),
    KEY("distributed", "dp_naive", T_BOOL, dp_naive),
    KEY("distributed", "zero1", T_BOOL, zero1),
    KEY("distributed", "zero_stage", T_INT, zero_stage),
    KEY("distributed", "timeout_s", T_FLOAT, timeout_s),
    KEY("model", "name", T_STR, model_name),
    KEY("model", "num_hidden_layers", T_INT, num_hidden_layers),
    KEY("model", "num_attention_heads", T_INT, num_attention_heads),
    KEY("model", "num_key_value_heads", T_INT, num_key_value_heads),
    KEY("model", "hidden_size", T_INT, hidden_size),
    KEY("model", "intermediate_size", T_INT, intermediate_size),
    KEY("model", "vocab_size", T_INT, vocab_size),
    KEY("model", "make_vocab_size_divisible_by", T_INT, make_vocab_size_divisible_by),
    KEY("model", "rms_norm_eps", T_FLOAT, rms_norm_eps),
    KEY("model", "rope_theta", T_FLOAT, rope_theta),
    KEY("model", "max_position_embeddings", T_INT, max_position_embeddings),
    KEY("model", "tie_word_embeddings", T_BOOL, tie_word_embeddings),
    KEY("model", "dtype", T_STR, dtype),
    KEY("model", "num_experts", T_INT, num_experts),
    KEY("model", "num_experts_per_tok", T_INT, num_experts_per_tok),
    KEY("model", "moe_intermediate_size", T_INT, moe_intermediate_size),
    KEY("model", "router_aux_loss_coef", T_FLOAT, router_aux_loss_coef),
    KEY("model", "moe_capacity_factor", T_FLOAT, moe_capacity_factor),
    MAMBA_KEY("model_type", T_STR, model_type),
    MAMBA_KEY("state_size", T_INT, state_size),
    MAMBA_KEY("expand", T_INT, expand),
    MAMBA_KEY("conv_kernel", T_INT, conv_kernel),
    MAMBA_KEY("time_step_rank", T_INT, time_step_rank),
    MAMBA_KEY("use_conv_bias", T_BOOL, use_conv_bias),
    MAMBA_KEY("use_bias", T_BOOL, use_bias),
    MAMBA_KEY("layer_norm_epsilon", T_FLOAT, layer_norm_epsilon),
    MAMBA_KEY("time_step_min", T_FLOAT, time_step_min),
    MAMBA_KEY("time_step_max", T_FLOAT, time_step_max),
    MAMBA_KEY("time_step_floor", T_FLOAT, time_step_floor),
    MAMBA_KEY("time_step_scale", T_FLOAT, time_step_scale),
    MAMBA_KEY("time_step_init_scheme", T_STR, time_step_init_scheme),
    IGNORED("model", "use_flash_attention", "false"),
    IGNORED("model", "use_fused_adam", "false"),
    KEY("training", "seed", T_INT, seed),
    KEY("training", "learning_rate", T_FLOAT, learning_rate),
    KEY("training", "total_train_steps", T_INT, total_train_steps),
    KEY("training", "seq_length", T_INT, seq_length),
    KEY("training", "micro_batch_size", T_INT, micro_batch_size),
    KEY("training", "gradient_accumulation_steps", T_INT, gradient_accumulation_steps),
    KEY("training", "num_samples", T_LONG, num_samples),
    KEY("training", "max_tokens", T_LONG, max_tokens),
    KEY("training", "grad_clip", T_FLOAT, grad_clip),
    KEY("training", "warmup_steps", T_INT, warmup_steps),
    KEY("training", "lr_decay", T_STR, lr_decay),
    KEY("training", "min_lr", T_FLOAT, min_lr),
    KEY("training", "weight_decay", T_FLOAT, weight_decay),
    KEY("training", "adam_beta1", T_FLOAT, adam_beta1),
    KEY("training", "adam_beta2", T_FLOAT, adam_beta2),
    KEY("training", "adam_eps", T_FLOAT, adam_eps),
    KEY("training", "recompute", T_BOOL, recompute),
    KEY("dataset", "name", T_STR, dataset_name),
    KEY("dataset", "tokenizer", T_STR, tokenizer),
    KEY("dataset", "domains", T_LIST, dataset_domains),
    IGNORED("dataset", "subset_name", "null"),
    IGNORED("dataset", "num_workers", "0"),
    IGNORED("dataset", "num_proc", "1"),
    KEY("checkpoint", "save_dir", T_STR, save_dir),
    KEY("checkpoint", "save_frequency", T_INT, save_frequency),
    KEY("checkpoint", "load_path", T_STR, load_path),
    KEY("checkpoint", "init_from", T_STR, init_from),
    KEY("checkpoint", "keep_last", T_INT, keep_last),
    IGNORED("logging", "use_wandb", "false"),
    IGNORED("logging", "project_name", "\"picotron\""),
    KEY("logging", "run_name", T_STR, run_name),
    KEY("logging", "metrics_file", T_STR, metrics_file),
    KEY("logging", "trace", T_STR, trace),
    KEY("logging", "trace_steps", T_INT, trace_steps),
    KEY("environment", "OMP_NUM_THREADS", T_INT, omp_num_threads),
    IGNORED("environment", "TOKENIZERS_PARALLELISM", "\"false\""),
    IGNORED("environment", "FLASH_ATTEN", "\"0\""),
    IGNORED("environment", "HF_TOKEN", "null"),
    KEY("environment", "PEAK_FLOPS", T_DOUBLE, peak_flops),
    KEY("doremi", "reference_checkpoint", T_STR, doremi_reference),
    KEY("doremi", "step_size", T_FLOAT, doremi_step_size),
    KEY("doremi", "smoothing", T_FLOAT, doremi_smoothing),
};
#define NUM_FIELDS (int)(sizeof fields / sizeof fields[0])

// a model whose name is no preset must spell these out: a silent tiny default would mislead
static const char *architecture_keys[] = {"hidden_size",         "intermediate_size",
                                          "num_hidden_layers",   "num_attention_heads",
                                          "num_key_value_heads", "vocab_size"};

// of those, the ones a Mamba has (MambaConfig computes its intermediate_size; it has no heads)
static int mamba_needs(const char *key) {
    return strcmp(key, "hidden_size") == 0 || strcmp(key, "num_hidden_layers") == 0 ||
           strcmp(key, "vocab_size") == 0;
}

typedef struct {
    const char *name;
    int hidden, intermediate, layers, heads, kv_heads, vocab, max_pos, tied;
    float rms_norm_eps, rope_theta;
} Preset;

// the numbers of each model's config.json on the Hugging Face hub
static const Preset presets[] = {
    {"picotron-tiny", 128, 384, 4, 4, 2, 256, 1024, 0, 1e-5f, 10000.0f}, // byte tokenizer
    {"HuggingFaceTB/SmolLM-135M", 576, 1536, 30, 9, 3, 49152, 2048, 1, 1e-5f, 10000.0f},
    {"HuggingFaceTB/SmolLM-360M", 960, 2560, 32, 15, 5, 49152, 2048, 1, 1e-5f, 10000.0f},
    {"HuggingFaceTB/SmolLM-1.7B", 2048, 8192, 24, 32, 32, 49152, 2048, 1, 1e-5f, 10000.0f},
    {"TinyLlama/TinyLlama_v1.1", 2048, 5632, 22, 32, 4, 32000, 2048, 0, 1e-5f, 10000.0f},
    {"meta-llama/Llama-2-7b-hf", 4096, 11008, 32, 32, 32, 32000, 4096, 0, 1e-5f, 10000.0f},
    {"meta-llama/Meta-Llama-3-8B", 4096, 14336, 32, 32, 8, 128256, 8192, 0, 1e-5f, 500000.0f},
};
#define NUM_PRESETS (int)(sizeof presets / sizeof presets[0])

// "HuggingFaceTB/SmolLM-360M-Instruct" and "smollm-360m" both name HuggingFaceTB/SmolLM-360M
static int preset_matches(const char *preset, const char *name) {
    const char *p = strrchr(preset, '/'), *n = strrchr(name, '/'), *suffix = "-Instruct";
    p = p ? p + 1 : preset;
    n = n ? n + 1 : name;
    size_t len = strlen(n), slen = strlen(suffix);
    if (len > slen && strcasecmp(n + len - slen, suffix) == 0) len -= slen;
    return strlen(p) == len && strncasecmp(p, n, len) == 0;
}

// state-spaces/mamba-130m-hf's config.json: a Mamba (model_mamba.c), tied, GPT-NeoX's vocabulary
static void mamba_130m(Config *cfg) {
    strcpy(cfg->model_type, "mamba");
    cfg->hidden_size = 768, cfg->num_hidden_layers = 24, cfg->vocab_size = 50280;
    cfg->intermediate_size = 1536, cfg->tie_word_embeddings = 1;
    cfg->state_size = 16, cfg->expand = 2, cfg->conv_kernel = 4, cfg->time_step_rank = 48;
    cfg->use_conv_bias = 1, cfg->use_bias = 0, cfg->layer_norm_epsilon = 1e-5f;
}

int config_is_mamba(const Config *cfg) {
    return strcmp(cfg->model_type, "mamba") == 0;
}

int config_time_step_rank(const Config *cfg) {
    return cfg->time_step_rank > 0 ? cfg->time_step_rank : (cfg->hidden_size + 15) / 16;
}

int config_apply_preset(Config *cfg, const char *name) {
    if (preset_matches("state-spaces/mamba-130m-hf", name)) {
        mamba_130m(cfg);
        return 1;
    }
    for (int i = 0; i < NUM_PRESETS; i++) {
        const Preset *p = &presets[i];
        if (!preset_matches(p->name, name)) continue;
        cfg->hidden_size = p->hidden;
        cfg->intermediate_size = p->intermediate;
        cfg->num_hidden_layers = p->layers;
        cfg->num_attention_heads = p->heads;
        cfg->num_key_value_heads = p->kv_heads;
        cfg->vocab_size = p->vocab;
        cfg->max_position_embeddings = p->max_pos;
        cfg->tie_word_embeddings = p->tied;
        cfg->rms_norm_eps = p->rms_norm_eps;
        cfg->rope_theta = p->rope_theta;
        strcpy(cfg->model_type, "llama");
        return 1;
    }
    return 0;
}

const char *config_preset_names(void) {
    static char names[512];
    names[0] = '\0';
    for (int i = 0; i < NUM_PRESETS; i++)
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s, ", presets[i].name);
    strcat(names, "state-spaces/mamba-130m-hf");
    return names;
}

void config_defaults(Config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->tp_size = cfg->cp_size = cfg->pp_size = cfg->dp_size = cfg->ep_size = 1;
    strcpy(cfg->pp_engine, "1f1b");
    cfg->pp_virtual_stages = 1;
#ifdef PICOTRON_GPU
    strcpy(cfg->backend, "nccl");
#else
    strcpy(cfg->backend, "mpi");
    cfg->use_cpu = 1;
#endif
    cfg->bucket_size_mb = 25;
    cfg->timeout_s = 600; // torch.distributed's and NCCL's default: 10 minutes
    cfg->trace_steps = 3;
    strcpy(cfg->model_name, "picotron-tiny");
    config_apply_preset(cfg, cfg->model_name);
    cfg->make_vocab_size_divisible_by = 1; // no padding
#ifdef PICOTRON_GPU
    strcpy(cfg->dtype, "bfloat16"); // picotron's default on GPUs (GEMMs in bf16, fp32 master)
#else
    strcpy(cfg->dtype, "float32");
#endif
    cfg->seed = 42;
    cfg->learning_rate = 3e-4f;
    cfg->total_train_steps = 200;
    cfg->seq_length = 128;
    cfg->micro_batch_size = 4;
    cfg->gradient_accumulation_steps = 1;
    cfg->num_experts_per_tok = 2;       // Mixtral's
    cfg->router_aux_loss_coef = 0.001f; // transformers' Mixtral and Qwen2-MoE default
    // MambaConfig's defaults (a Mamba with model_type "mamba")
    cfg->state_size = 16, cfg->expand = 2, cfg->conv_kernel = 4, cfg->use_conv_bias = 1;
    cfg->layer_norm_epsilon = 1e-5f, cfg->time_step_min = 1e-3f, cfg->time_step_max = 0.1f;
    cfg->time_step_floor = 1e-4f, cfg->time_step_scale = 1.0f;
    strcpy(cfg->time_step_init_scheme, "random");
    strcpy(cfg->lr_decay, "constant");
    cfg->weight_decay = 0.01f;
    cfg->adam_beta1 = 0.9f;
    cfg->adam_beta2 = 0.999f;
    cfg->adam_eps = 1e-8f;
    strcpy(cfg->dataset_name, "data/austen.txt");
    strcpy(cfg->save_dir, "ckpt");
    cfg->omp_num_threads = 1;
    cfg->doremi_step_size = 1.0f;  // the paper's eta
    cfg->doremi_smoothing = 1e-3f; // the paper's c
}

// ---------------------------------------------------------------------------------------------
// reading

// names the closest known key, then lists them all (one line still)
static void __attribute__((noreturn)) unknown_key(const char *section, const char *key) {
    char known[768] = "", hint[160] = "";
    int best = INT_MAX;
    for (int i = 0; i < NUM_FIELDS; i++) {
        if (strcmp(fields[i].section, section) != 0) continue;
        snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", known[0] ? ", " : "",
                 fields[i].key);
        int d = edit_distance(key, fields[i].key);
        if (d < best && d <= 1 + (int)strlen(key) / 4) {
            best = d;
            snprintf(hint, sizeof hint, " did you mean %s.%s?", section, fields[i].key);
        }
    }
    user_error("config error: unknown key %s.%s;%s (known keys: %s)", section, key, hint, known);
}

static void __attribute__((noreturn)) type_error(const Field *f, const cJSON *item) {
    char *text = cJSON_PrintUnformatted(item);
    user_error("config error: %s.%s must be %s, got %.60s", f->section, f->key, type_names[f->type],
               text ? text : "?");
}

// environment values may be strings ("1"): picotron hands them to os.environ
static int number_of(const cJSON *item, int string_ok, double *x) {
    if (cJSON_IsNumber(item)) {
        *x = item->valuedouble;
        return 1;
    }
    if (!string_ok || !cJSON_IsString(item) || !item->valuestring[0]) return 0;
    char *end;
    *x = strtod(item->valuestring, &end);
    return *end == '\0';
}

// null keeps the default, as picotron writes null for "take it from the model"
static void set_field(Config *cfg, const Field *f, const cJSON *item) {
    char *dst = (char *)cfg + f->offset;
    double x = 0;
    if (f->type == T_IGNORED || cJSON_IsNull(item)) return;
    if (f->type == T_LIST) { // kept as JSON text: its reader checks the elements (doremi.c)
        if (!cJSON_IsArray(item)) type_error(f, item);
        *(char **)dst = cJSON_PrintUnformatted(item);
        return;
    }
    if (f->type == T_STR) {
        if (!cJSON_IsString(item)) type_error(f, item);
        if (strlen(item->valuestring) >= f->size)
            user_error("config error: %s.%s is longer than %zu characters", f->section, f->key,
                       f->size - 1);
        strcpy(dst, item->valuestring);
        return;
    }
    if (f->type == T_BOOL) {
        if (cJSON_IsNumber(item) && (item->valuedouble == 0 || item->valuedouble == 1))
            *(int *)dst = item->valuedouble == 1;
        else if (cJSON_IsBool(item))
            *(int *)dst = cJSON_IsTrue(item);
        else
            type_error(f, item);
        return;
    }
    if (!number_of(item, strcmp(f->section, "environment") == 0, &x) || !isfinite(x))
        type_error(f, item);
    if (f->type == T_INT || f->type == T_LONG) {
        double limit = f->type == T_INT ? INT_MAX : 9e15; // 9e15: doubles stay exact
        if (x != floor(x) || fabs(x) > limit) type_error(f, item);
        if (f->type == T_INT)
            *(int *)dst = (int)x;
        else
            *(long *)dst = (long)x;
    } else if (f->type == T_FLOAT) {
        if (!isfinite((float)x))
            user_error("config error: %s.%s = %g does not fit a float", f->section, f->key, x);
        *(float *)dst = (float)x;
    } else {
        *(double *)dst = x;
    }
}

static const Field *find_field(const char *section, const char *key) {
    for (int i = 0; i < NUM_FIELDS; i++)
        if (strcmp(fields[i].section, section) == 0 && strcmp(fields[i].key, key) == 0)
            return &fields[i];
    return NULL;
}

static char *read_text(const char *path, size_t *size) {
    char *text = read_whole_file(path, size);
    if (!text)
        user_error("config error: %s %s%s", path, file_error(),
                   errno == ENOENT ? " (write one with ./create_config)" : "");
    return text;
}

enum { NOT_GIVEN, GIVEN_NULL, GIVEN_VALUE };

// every section, then every key in it, must be known, appear once, and have the right type
static void read_sections(Config *cfg, const cJSON *root, int given[NUM_FIELDS]) {
    for (const cJSON *sec = root->child; sec; sec = sec->next) {
        int known = 0;
        for (int s = 0; s < NUM_SECTIONS; s++) known |= strcmp(sec->string, sections[s]) == 0;
        if (!known)
            user_error("config error: unknown section \"%s\" (known sections: distributed, model, "
                       "training, dataset, checkpoint, logging, environment)",
                       sec->string);
        for (const cJSON *s = root->child; s != sec; s = s->next)
            if (strcmp(s->string, sec->string) == 0)
                user_error("config error: section \"%s\" appears twice", sec->string);
        if (!cJSON_IsObject(sec))
            user_error("config error: %s must be a JSON object {...}", sec->string);
        for (const cJSON *item = sec->child; item; item = item->next) {
            const Field *f = find_field(sec->string, item->string);
            if (!f) unknown_key(sec->string, item->string);
            if (given[f - fields])
                user_error("config error: %s.%s appears twice", f->section, f->key);
            set_field(cfg, f, item);
            given[f - fields] = cJSON_IsNull(item) ? GIVEN_NULL : GIVEN_VALUE;
        }
    }
}

void config_load(Config *cfg, const char *path) {
    config_defaults(cfg);
    size_t size = 0;
    char *text = read_text(path, &size);
    const char *end = NULL;
    char *where = xmalloc(strlen(path) + 16);
    sprintf(where, "config error: %s", path);
    cJSON *root = json_parse(text, size, &end, where);
    free(where);
    if (!root) {
        long offset = end ? end - text : 0, line = 1, column = 1;
        for (long i = 0; i < offset; i++) column = text[i] == '\n' ? (line++, 1) : column + 1;
        user_error("config error: %s is not valid JSON (error at line %ld, column %ld, byte %ld)",
                   path, line, column, offset);
    }
    if (!cJSON_IsObject(root))
        user_error("config error: %s must hold one JSON object {\"distributed\": {...}, ...}",
                   path);
    for (int s = 0; s < 3; s++) // distributed, model, training
        if (!cJSON_GetObjectItemCaseSensitive(root, sections[s]))
            user_error("config error: %s has no \"%s\" section (picotron's configs have "
                       "distributed, model and training; ./create_config writes one)",
                       path, sections[s]);
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(model, "name");
    if (cJSON_IsObject(model) && (!name || cJSON_IsNull(name))) // else read_sections says why
        user_error("config error: model.name is missing (a Hugging Face model name, or "
                   "\"picotron-tiny\")");
    int preset = cJSON_IsString(name) && config_apply_preset(cfg, name->valuestring);
    int given[NUM_FIELDS] = {0};
    read_sections(cfg, root, given);
    for (int k = 0; !preset && k < (int)(sizeof architecture_keys / sizeof *architecture_keys); k++)
        if (given[find_field("model", architecture_keys[k]) - fields] != GIVEN_VALUE &&
            !(config_is_mamba(cfg) && !mamba_needs(architecture_keys[k])))
            user_error("config error: model.%s is missing and model.name \"%s\" is no built-in "
                       "preset (%s); set it, or write the config with "
                       "./create_config --model_config",
                       architecture_keys[k], cfg->model_name, config_preset_names());
    if (strcmp(cfg->backend, "gloo") == 0) strcpy(cfg->backend, "mpi"); // picotron's CPU name
    if (cfg->zero1 && cfg->zero_stage == 0) cfg->zero_stage = 1;        // zero1 is stage 1's switch
    if (config_is_mamba(cfg)) cfg->intermediate_size = cfg->expand * cfg->hidden_size; // d_inner
    cJSON_Delete(root);
    free(text);
}

// ---------------------------------------------------------------------------------------------
// checking: each impossible setting is one line naming the keys, their values and the fix

// the file config_validate_file checks, named in every line; "" for the run's own config
static const char *checking = "";

static void __attribute__((format(printf, 1, 2), noreturn)) config_error(const char *fmt, ...) {
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    user_error("config error: %s%s%s", checking, checking[0] ? ": " : "", msg);
}

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) config_error(__VA_ARGS__);                                                    \
    } while (0)

static int one_of(const char *value, const char *a, const char *b) {
    return strcmp(value, a) == 0 || strcmp(value, b) == 0;
}

// a mixture-of-experts MLP (model.num_experts > 0)
static void config_validate_experts(const Config *c) {
    int E = c->num_experts, K = c->num_experts_per_tok, I = c->moe_intermediate_size;
    CHECK(K >= 1 && K <= E, "model.num_experts_per_tok = %d must be 1..model.num_experts = %d", K,
          E);
    CHECK(I >= 1,
          "model.moe_intermediate_size = %d must be at least 1 with model.num_experts = %d (each "
          "expert's MLP size; Mixtral's equals model.intermediate_size)",
          I, E);
    CHECK(I % c->tp_size == 0,
          "distributed.tp_size = %d does not divide model.moe_intermediate_size = %d (each tp "
          "rank holds moe_intermediate_size/tp_size features of every expert)",
          c->tp_size, I);
    CHECK(c->router_aux_loss_coef >= 0,
          "model.router_aux_loss_coef = %g is negative (0 turns the load-balancing loss off)",
          c->router_aux_loss_coef);
    CHECK(c->moe_capacity_factor >= 0,
          "model.moe_capacity_factor = %g is negative (0: no capacity, or a factor such as 1.25)",
          c->moe_capacity_factor);
    // an expert keeps its first pairs in token order over the whole micro-batch, which cp splits
    CHECK(c->moe_capacity_factor == 0 || c->cp_size == 1,
          "model.moe_capacity_factor = %g needs distributed.cp_size = 1, not %d (the capacity "
          "keeps an expert's first pairs in token order, and cp splits the sequence); set one of "
          "them",
          c->moe_capacity_factor, c->cp_size);
    CHECK(E % c->ep_size == 0,
          "distributed.ep_size = %d does not divide model.num_experts = %d (each ep rank holds "
          "num_experts/ep_size experts)",
          c->ep_size, E);
}

// expert parallelism: ep of the dp ranks share out the experts and trade tokens
static void config_validate_expert_parallel(const Config *c) {
    CHECK(c->num_experts > 0,
          "distributed.ep_size = %d needs a mixture of experts: set model.num_experts (e.g. 8), "
          "or ep_size to 1",
          c->ep_size);
    CHECK(c->dp_size % c->ep_size == 0,
          "distributed.ep_size = %d must divide distributed.dp_size = %d (the ep ranks are "
          "data-parallel ranks that split the experts; raise dp_size)",
          c->ep_size, c->dp_size);
    CHECK(c->zero_stage == 0,
          "distributed.zero_stage = %d (or zero1) with distributed.ep_size = %d is not supported "
          "(ZeRO shards one flat buffer over the cp*dp replicas, which hold different experts); "
          "set one of them off",
          c->zero_stage, c->ep_size);
    CHECK(!c->dp_naive,
          "distributed.dp_naive with distributed.ep_size = %d is not supported (the experts' "
          "gradients average over their own replicas, in the buckets); set dp_naive to false",
          c->ep_size);
}

// ZeRO-2 and 3 (zero.c) gather and reduce-scatter a Llama's parts one by one: what else would
// need a plan of its own is refused
static void config_validate_zero(const Config *c) {
    if (c->zero_stage < 2) return;
    const char *other = c->pp_virtual_stages > 1 ? "distributed.pp_virtual_stages > 1"
                        : c->num_experts > 0     ? "model.num_experts > 0"
                        : config_is_mamba(c)     ? "model.model_type \"mamba\""
                        : c->doremi_reference[0] ? "doremi.reference_checkpoint"
                        : !c->use_cpu            ? "the GPU build"
                                                 : NULL;
    CHECK(!other,
          "distributed.zero_stage = %d with %s is not supported (ZeRO-2 and 3 shard a Llama's "
          "layers one by one, on the CPU: interleaved chunks, experts, a Mamba's tensors, a "
          "reference model and the GPU's cast caches would each need their own plan); use "
          "zero_stage 1, or set %s off",
          c->zero_stage, other, other);
}

// DoReMi's proxy: its weights are the domains', its log goes to save_dir, and the reference runs
// beside it in the same layout (not yet with the extensions that reshape a stage)
static void config_validate_doremi(const Config *c) {
    CHECK(c->dataset_domains, "doremi.reference_checkpoint is set but dataset.domains is not: "
                              "DoReMi learns the weights of a mixture of domains");
    CHECK(c->doremi_step_size > 0 && isfinite(c->doremi_step_size),
          "doremi.step_size = %g must be > 0 (the paper's eta: 1)", c->doremi_step_size);
    CHECK(c->doremi_smoothing >= 0 && c->doremi_smoothing <= 1,
          "doremi.smoothing = %g must lie in [0, 1] (the paper's c: 1e-3)", c->doremi_smoothing);
    CHECK(c->save_dir[0], "doremi.reference_checkpoint needs checkpoint.save_dir: the learned "
                          "weights are written there (domain_weights.json)");
    CHECK(strcmp(c->doremi_reference, c->save_dir) != 0,
          "doremi.reference_checkpoint = checkpoint.save_dir = %s: the reference is another run's "
          "checkpoint (train it first with the same domains)",
          c->save_dir);
    const char *with = c->pp_virtual_stages > 1 ? "distributed.pp_virtual_stages > 1"
                       : c->sequence_parallel   ? "distributed.sequence_parallel"
                       : c->num_experts > 0     ? "model.num_experts > 0"
                                                : NULL;
    CHECK(!with,
          "doremi.reference_checkpoint with %s is not supported yet (the reference model "
          "runs beside the proxy in the plain layout): turn it off",
          with);
}

// a Mamba (model_mamba.c): its sizes, and the layouts it does not run yet, each in one line
static void config_validate_mamba(const Config *c) {
    const struct {
        const char *key;
        int value, min;
    } sizes[] = {{"state_size", c->state_size, 1},
                 {"expand", c->expand, 1},
                 {"conv_kernel", c->conv_kernel, 1},
                 {"time_step_rank", c->time_step_rank, 0}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        CHECK(sizes[i].value >= sizes[i].min && sizes[i].value <= 1 << 16,
              "model.%s = %d must lie in [%d, 65536]%s", sizes[i].key, sizes[i].value, sizes[i].min,
              sizes[i].min == 0 ? " (0: \"auto\", ceil(hidden_size / 16))" : "");
    CHECK(!c->use_bias, "model.use_bias = true is not supported for a Mamba (in_proj and out_proj "
                        "have no bias here, as in transformers' default): set it to false");
    CHECK(c->layer_norm_epsilon > 0, "model.layer_norm_epsilon = %g must be positive",
          c->layer_norm_epsilon);
    CHECK(c->time_step_min > 0 && c->time_step_min <= c->time_step_max,
          "model.time_step_min = %g must lie in (0, model.time_step_max = %g]", c->time_step_min,
          c->time_step_max);
    CHECK(c->time_step_floor >= 0, "model.time_step_floor = %g is negative", c->time_step_floor);
    CHECK(c->time_step_scale > 0, "model.time_step_scale = %g must be positive",
          c->time_step_scale);
    CHECK(one_of(c->time_step_init_scheme, "random", "constant"),
          "model.time_step_init_scheme = \"%s\" must be \"random\" or \"constant\"",
          c->time_step_init_scheme);
    CHECK(c->expand * c->hidden_size % c->tp_size == 0,
          "distributed.tp_size = %d does not divide the Mamba's channels, model.expand * "
          "model.hidden_size = %d (each tp rank holds d_inner / tp_size of them)",
          c->tp_size, c->expand * c->hidden_size);
    CHECK(vocab_size_with_padding(c) % c->tp_size == 0,
          "model.vocab_size = %d, padded to %d rows (model.make_vocab_size_divisible_by = %d), is "
          "not divisible by distributed.tp_size = %d: set model.make_vocab_size_divisible_by to a "
          "multiple of %d",
          c->vocab_size, vocab_size_with_padding(c), c->make_vocab_size_divisible_by, c->tp_size,
          c->tp_size);
    CHECK(c->cp_size == 1 || c->seq_length / c->cp_size >= c->conv_kernel - 1,
          "training.seq_length / distributed.cp_size = %d tokens per cp rank is fewer than the "
          "conv's model.conv_kernel - 1 = %d earlier tokens a chunk hands on; lower cp_size",
          c->seq_length / c->cp_size, c->conv_kernel - 1);
    const char *unsupported = c->cp_zigzag         ? "distributed.cp_zigzag"
                              : c->num_experts > 0 ? "model.num_experts > 0"
                              : c->ep_size > 1     ? "distributed.ep_size > 1"
                                                   : NULL;
    CHECK(!unsupported,
          "%s is not supported with model.model_type = \"mamba\" yet (every other layout "
          "is): turn it off",
          unsupported);
}

void config_validate(const Config *c) {
#ifdef PICOTRON_GPU
    CHECK(!c->use_cpu, "distributed.use_cpu is true but this is the GPU build; run `make` for the "
                       "CPU build, or set distributed.use_cpu to false");
#else
    CHECK(c->use_cpu, "distributed.use_cpu is false but this is the CPU build; rebuild with "
                      "`make GPU=1`, or set distributed.use_cpu to true");
    CHECK(strcmp(c->backend, "nccl") != 0, "distributed.backend = \"nccl\" needs the GPU build "
                                           "(`make GPU=1`); the CPU build uses \"mpi\"");
    CHECK(strcmp(c->dtype, "bfloat16") != 0, "model.dtype = \"bfloat16\" needs the GPU build "
                                             "(`make GPU=1`); the CPU build uses \"float32\"");
#endif
    const struct {
        const char *key;
        long value, min, max; // a size beyond max is a typo, not a model
    } counts[] = {
        {"distributed.tp_size", c->tp_size, 1, 1 << 20},
        {"distributed.cp_size", c->cp_size, 1, 1 << 20},
        {"distributed.pp_size", c->pp_size, 1, 1 << 20},
        {"distributed.pp_virtual_stages", c->pp_virtual_stages, 1, 1 << 10},
        {"distributed.dp_size", c->dp_size, 1, 1 << 20},
        {"distributed.ep_size", c->ep_size, 1, 1 << 20},
        {"distributed.bucket_size_mb", c->bucket_size_mb, 1, 1 << 20},
        {"distributed.zero_stage", c->zero_stage, 0, 3},
        {"model.hidden_size", c->hidden_size, 1, 1 << 17},
        {"model.intermediate_size", c->intermediate_size, 1, 1 << 20},
        {"model.num_hidden_layers", c->num_hidden_layers, 1, 1 << 14},
        {"model.num_attention_heads", c->num_attention_heads, 1, 1 << 14},
        {"model.num_key_value_heads", c->num_key_value_heads, 1, 1 << 14},
        {"model.vocab_size", c->vocab_size, 1, 1 << 24},
        {"model.make_vocab_size_divisible_by", c->make_vocab_size_divisible_by, 1, 1 << 16},
        {"model.max_position_embeddings", c->max_position_embeddings, 1, 1 << 24},
        {"model.num_experts", c->num_experts, 0, 1 << 14},
        {"training.total_train_steps", c->total_train_steps, 1, 1 << 30},
        {"training.seq_length", c->seq_length, 1, 1 << 24},
        {"training.micro_batch_size", c->micro_batch_size, 1, 1 << 20},
        {"training.gradient_accumulation_steps", c->gradient_accumulation_steps, 1, 1 << 20},
        {"training.num_samples", c->num_samples, 0, LONG_MAX},
        {"training.max_tokens", c->max_tokens, 0, LONG_MAX},
        {"training.warmup_steps", c->warmup_steps, 0, 1 << 30},
        {"checkpoint.save_frequency", c->save_frequency, 0, 1 << 30},
        {"checkpoint.keep_last", c->keep_last, 0, 1 << 20},
        {"logging.trace_steps", c->trace_steps, 1, 1 << 30},
        {"environment.OMP_NUM_THREADS", c->omp_num_threads, 1, 1 << 16},
    };
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
        CHECK(counts[i].value >= counts[i].min, "%s = %ld must be at least %ld", counts[i].key,
              counts[i].value, counts[i].min);
        CHECK(counts[i].value <= counts[i].max, "%s = %ld must be at most %ld", counts[i].key,
              counts[i].value, counts[i].max);
    }

    CHECK(!(c->zero_stage > 0 && c->dp_naive),
          "distributed.zero_stage = %d (or zero1) and distributed.dp_naive = true: ZeRO "
          "reduce-scatters the gradients, the naive mode all-reduces each layer; set one of them "
          "off",
          c->zero_stage);
    CHECK(!c->zero1 || c->zero_stage == 1,
          "distributed.zero1 = true and distributed.zero_stage = %d: zero1 is stage 1; set "
          "zero_stage alone (0 to 3) and zero1 to false",
          c->zero_stage);
    config_validate_zero(c);
    CHECK(one_of(c->pp_engine, "afab", "1f1b"),
          "distributed.pp_engine = \"%s\" must be \"afab\" or \"1f1b\"", c->pp_engine);
    CHECK(one_of(c->backend, "nccl", "mpi"),
          "distributed.backend = \"%s\" must be \"nccl\" or \"mpi\"", c->backend);
    CHECK(one_of(c->dtype, "float32", "bfloat16"),
          "model.dtype = \"%s\" must be \"float32\" or \"bfloat16\"", c->dtype);
    CHECK(one_of(c->lr_decay, "constant", "cosine"),
          "training.lr_decay = \"%s\" must be \"constant\" or \"cosine\"", c->lr_decay);

    CHECK(c->learning_rate > 0 && isfinite(c->learning_rate),
          "training.learning_rate = %g must be positive and finite", c->learning_rate);
    CHECK(c->min_lr >= 0 && c->min_lr <= c->learning_rate,
          "training.min_lr = %g must lie in [0, training.learning_rate = %g]", c->min_lr,
          c->learning_rate);
    CHECK(c->weight_decay >= 0, "training.weight_decay = %g is negative", c->weight_decay);
    CHECK(c->adam_beta1 >= 0 && c->adam_beta1 < 1, "training.adam_beta1 = %g must lie in [0, 1)",
          c->adam_beta1);
    CHECK(c->adam_beta2 >= 0 && c->adam_beta2 < 1, "training.adam_beta2 = %g must lie in [0, 1)",
          c->adam_beta2);
    CHECK(c->adam_eps > 0, "training.adam_eps = %g must be positive", c->adam_eps);
    CHECK(c->grad_clip >= 0, "training.grad_clip = %g is negative (0 turns clipping off)",
          c->grad_clip);
    CHECK(c->rms_norm_eps > 0, "model.rms_norm_eps = %g must be positive", c->rms_norm_eps);
    CHECK(c->rope_theta > 0, "model.rope_theta = %g must be positive", c->rope_theta);
    CHECK(c->timeout_s > 0 && c->timeout_s <= 86400,
          "distributed.timeout_s = %g must lie in (0, 86400]: the seconds a rank waits for a peer "
          "before it ends the job (600 is NCCL's default)",
          c->timeout_s);
    CHECK(c->peak_flops >= 0, "environment.PEAK_FLOPS = %g is negative", c->peak_flops);

    int C = c->hidden_size, H = c->num_attention_heads, KV = c->num_key_value_heads;
    int tp = c->tp_size, cp = c->cp_size, T = c->seq_length;
    CHECK(one_of(c->model_type, "llama", "mamba"),
          "model.model_type = \"%s\" must be \"llama\" (with model.num_experts: a Mixtral) or "
          "\"mamba\"",
          c->model_type);
    if (config_is_mamba(c))
        config_validate_mamba(c); // a Mamba has no attention to check
    else {
        CHECK(C % H == 0,
              "model.hidden_size = %d is not divisible by model.num_attention_heads = %d", C, H);
        CHECK(H % KV == 0,
              "model.num_attention_heads = %d is not divisible by model.num_key_value_heads = %d",
              H, KV);
        CHECK(C / H % 2 == 0,
              "model.hidden_size / model.num_attention_heads = %d / %d = %d is odd; RoPE rotates "
              "pairs, so the head dimension must be even",
              C, H, C / H);
        CHECK(H % tp == 0,
              "distributed.tp_size = %d does not divide model.num_attention_heads = %d", tp, H);
        CHECK(KV % tp == 0,
              "distributed.tp_size = %d does not divide model.num_key_value_heads = %d", tp, KV);
        CHECK(c->intermediate_size % tp == 0,
              "distributed.tp_size = %d does not divide model.intermediate_size = %d", tp,
              c->intermediate_size);
        CHECK(vocab_size_with_padding(c) % tp == 0,
              "model.vocab_size = %d, padded to %d rows (model.make_vocab_size_divisible_by = %d), "
              "is "
              "not divisible by distributed.tp_size = %d (each tp rank holds an equal share of the "
              "rows): set model.make_vocab_size_divisible_by to a multiple of %d, e.g. %d (the "
              "padded "
              "rows never get probability)",
              c->vocab_size, vocab_size_with_padding(c), c->make_vocab_size_divisible_by, tp, tp,
              128 % tp == 0 ? 128 : 128 * tp);
    }
    if (c->cp_zigzag)
        CHECK(T % (2 * cp) == 0,
              "training.seq_length = %d is not divisible by 2*distributed.cp_size = %d "
              "(distributed.cp_zigzag cuts it into 2*cp chunks)",
              T, 2 * cp);
    CHECK(T % cp == 0, "training.seq_length = %d is not divisible by distributed.cp_size = %d", T,
          cp);
    if (c->sequence_parallel)
        CHECK(c->micro_batch_size * (T / cp) % tp == 0,
              "distributed.sequence_parallel: micro_batch_size * seq_length / cp_size = %d tokens "
              "do not split over distributed.tp_size = %d; change the batch or sequence length",
              c->micro_batch_size * (T / cp), tp);
    CHECK(c->num_hidden_layers >= c->pp_size,
          "model.num_hidden_layers = %d < distributed.pp_size = %d: a pipeline stage would "
          "get no layer",
          c->num_hidden_layers, c->pp_size);
    int pp = c->pp_size, chunks = c->pp_virtual_stages;
    if (chunks > 1) { // Megatron's interleaved schedule: every rank holds chunks of equal layers
        CHECK(pp > 1,
              "distributed.pp_virtual_stages = %d needs distributed.pp_size > 1 (it splits each "
              "pipeline stage's layers into chunks); set it to 1",
              chunks);
        CHECK(strcmp(c->pp_engine, "1f1b") == 0,
              "distributed.pp_virtual_stages = %d needs distributed.pp_engine = \"1f1b\", not "
              "\"%s\" (the interleaved schedule is 1F1B's); set one of them",
              chunks, c->pp_engine);
        CHECK(c->num_hidden_layers % (pp * chunks) == 0,
              "distributed.pp_virtual_stages = %d: model.num_hidden_layers = %d is not divisible "
              "by pp_size * pp_virtual_stages = %d (every virtual stage holds as many layers); "
              "change one of them",
              chunks, c->num_hidden_layers, pp * chunks);
        CHECK(c->gradient_accumulation_steps % pp == 0,
              "training.gradient_accumulation_steps = %d is not divisible by distributed.pp_size "
              "= %d, as distributed.pp_virtual_stages = %d needs (micro-batches enter the "
              "interleaved pipeline in groups of pp)",
              c->gradient_accumulation_steps, pp, chunks);
    }
    if (c->num_experts > 0) config_validate_experts(c);
    if (c->ep_size > 1) config_validate_expert_parallel(c);
    if (c->doremi_reference[0]) config_validate_doremi(c);
    CHECK(T <= c->max_position_embeddings || config_is_mamba(c),
          "training.seq_length = %d exceeds model.max_position_embeddings = %d", T,
          c->max_position_embeddings);

    CHECK(!c->load_path[0] || !c->init_from[0],
          "checkpoint.load_path and checkpoint.init_from are both set: resume a run (load_path) or "
          "start one from Hugging Face weights (init_from), not both");
    CHECK(c->save_frequency == 0 || c->save_dir[0] != '\0',
          "checkpoint.save_frequency = %d but checkpoint.save_dir is empty (name a folder)",
          c->save_frequency);
}

void config_validate_file(const Config *c, const char *file) {
    checking = file;
    config_validate(c);
    checking = "";
}

// ---------------------------------------------------------------------------------------------
// writing

// the shortest decimal that reads back as the same value: 3e-4f is written 0.0003
static cJSON *number_json(double x, int is_float) {
    char text[32];
    if (!isfinite(x)) return cJSON_CreateNull();
    if (x == floor(x) && fabs(x) < 1e15) { // 10000, not 1e+04
        snprintf(text, sizeof text, "%.0f", x);
        return cJSON_CreateRaw(text);
    }
    for (int digits = 1; digits <= 17; digits++) {
        snprintf(text, sizeof text, "%.*g", digits, x);
        if (is_float ? strtof(text, NULL) == (float)x : strtod(text, NULL) == x) break;
    }
    return cJSON_CreateRaw(text);
}

// a float as Python's json reads a float (0.0, not 0): transformers' MixtralConfig checks types
static cJSON *python_float_json(double x) {
    char text[32];
    if (x != floor(x) || fabs(x) >= 1e15) return number_json(x, 1);
    snprintf(text, sizeof text, "%.1f", x);
    return cJSON_CreateRaw(text);
}

static cJSON *field_json(const Config *cfg, const Field *f) {
    const char *src = (const char *)cfg + f->offset;
    char text[32];
    switch (f->type) {
    case T_INT:
        if (strcmp(f->section, "environment") != 0) return cJSON_CreateNumber(*(const int *)src);
        snprintf(text, sizeof text, "%d", *(const int *)src); // a string, as picotron's
        return cJSON_CreateString(text);
    case T_LONG: // picotron writes null for "no limit"
        if (*(const long *)src == 0) return cJSON_CreateNull();
        return cJSON_CreateNumber((double)*(const long *)src);
    case T_FLOAT:
        return number_json(*(const float *)src, 1);
    case T_DOUBLE:
        return number_json(*(const double *)src, 0);
    case T_BOOL:
        return cJSON_CreateBool(*(const int *)src);
    case T_STR:
        return cJSON_CreateString(src);
    case T_LIST:
        return *(char *const *)src ? cJSON_Parse(*(char *const *)src) : cJSON_CreateNull();
    default:
        return cJSON_Parse(f->saved);
    }
}

int config_save(const Config *cfg, const char *path) {
    cJSON *root = cJSON_CreateObject();
    for (int s = 0; s < NUM_SECTIONS; s++) {
        // picotron's seven sections always; the ones beyond it only when they are used
        if (strcmp(sections[s], "doremi") == 0 && !cfg->doremi_reference[0]) continue;
        cJSON *section = cJSON_AddObjectToObject(root, sections[s]);
        for (int i = 0; i < NUM_FIELDS; i++)
            if (strcmp(fields[i].section, sections[s]) == 0 &&
                (!fields[i].mamba || config_is_mamba(cfg)))
                cJSON_AddItemToObject(section, fields[i].key, field_json(cfg, &fields[i]));
    }
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!text) return -1;
    FILE *f = fopen(path, "w");
    if (!f) {
        free(text);
        return -1;
    }
    // cJSON indents with tabs; picotron's files use 4 spaces (a tab inside a string is escaped)
    for (const char *p = text; *p; p++) {
        if (*p != '\t')
            fputc(*p, f);
        else
            fputs(p > text && p[-1] == ':' ? " " : "    ", f);
    }
    fputc('\n', f);
    int failed = ferror(f);
    failed |= fclose(f) != 0;
    free(text);
    return failed ? -1 : 0;
}

// ---------------------------------------------------------------------------------------------
// Hugging Face config.json

static cJSON *read_hf_json(const char *path, const char *who) {
    struct stat st;
    char *file = xmalloc(strlen(path) + 16), *where = xmalloc(strlen(who) + strlen(path) + 32);
    strcpy(file, path);
    if (stat(file, &st) == 0 && S_ISDIR(st.st_mode)) sprintf(file, "%s/config.json", path);
    size_t size = 0;
    char *text = read_whole_file(file, &size);
    if (!text) user_error("%s %s %s", who, file, file_error());
    sprintf(where, "%s %s", who, file);
    cJSON *root = json_parse(text, size, NULL, where);
    free(text);
    free(where);
    if (!cJSON_IsObject(root))
        user_error("%s %s is not a JSON object (is it a Hugging Face config.json?)", who, file);
    free(file);
    return root;
}

// What picotron.c builds of a Hugging Face config (c, read from root): a llama as a Llama, a
// mixtral as a mixture of experts, any other model_type as a Llama, said in one line; what it
// cannot build (a sliding window) refused, what it does not do (router jitter) said
static void check_hf_model(const Config *c, const cJSON *root, const char *path, const char *who) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    int mixtral = cJSON_IsString(type) && strcmp(type->valuestring, "mixtral") == 0;
    const cJSON *window = cJSON_GetObjectItemCaseSensitive(root, "sliding_window");
    if (cJSON_IsNumber(window) && window->valuedouble < c->max_position_embeddings)
        user_error("%s %s: sliding_window = %g is not supported (picotron.c's attention sees every "
                   "earlier position): null, or at least max_position_embeddings = %d",
                   who, path, window->valuedouble, c->max_position_embeddings);
    if (mixtral && c->num_experts < 1)
        user_error("%s %s: a mixtral needs num_local_experts of at least 1, not %d", who, path,
                   c->num_experts);
    const cJSON *jitter = cJSON_GetObjectItemCaseSensitive(root, "router_jitter_noise");
    if (world_rank() == 0 && cJSON_IsNumber(jitter) && jitter->valuedouble != 0)
        printf("note: router_jitter_noise = %g is not applied: picotron.c routes each token's own "
               "input (transformers scales it by uniform(1 - j, 1 + j) noise in training)\n",
               jitter->valuedouble);
    if (world_rank() == 0 && mixtral)
        printf("note: model_type \"mixtral\": picotron.c builds a mixture of experts, %d experts "
               "of %d features in each layer, top-%d (model_moe.c)\n",
               c->num_experts, c->moe_intermediate_size, c->num_experts_per_tok);
    else if (world_rank() == 0 && cJSON_IsString(type) && strcmp(type->valuestring, "llama") != 0)
        printf("note: model_type \"%s\" is neither llama nor mixtral, the two picotron.c knows: "
               "it builds a Llama%s of these sizes, and reads only such a model's tensors\n",
               type->valuestring, c->num_experts > 0 ? " with a mixture of experts" : "");
}

enum { HF_INT, HF_FLOAT, HF_BOOL };
typedef struct {
    const char *key;
    int type, required;
    size_t offset;
} HfKey;

// root's values of keys into cfg, each checked for its type; a missing required key is an error
static void read_hf_keys(Config *cfg, const cJSON *root, const HfKey *keys, size_t n,
                         const char *path, const char *who) {
    for (size_t k = 0; k < n; k++) {
        const cJSON *item = cJSON_GetObjectItemCaseSensitive(root, keys[k].key);
        char *dst = (char *)cfg + keys[k].offset;
        if (!item || cJSON_IsNull(item)) {
            if (keys[k].required)
                user_error("%s %s has no %s (is it a Llama-like Hugging Face config.json?)", who,
                           path, keys[k].key);
        } else if (keys[k].type == HF_BOOL && cJSON_IsBool(item)) {
            *(int *)dst = cJSON_IsTrue(item);
        } else if (keys[k].type == HF_FLOAT && cJSON_IsNumber(item)) {
            *(float *)dst = (float)item->valuedouble;
        } else if (keys[k].type == HF_INT && cJSON_IsNumber(item) &&
                   item->valuedouble == floor(item->valuedouble) && item->valuedouble < INT_MAX &&
                   item->valuedouble > INT_MIN) { // its range: config_validate_file
            *(int *)dst = (int)item->valuedouble;
        } else if (keys[k].type == HF_INT && cJSON_IsNumber(item)) {
            user_error("%s %s: %s = %.17g is not a whole number from -2^31 to 2^31 - 1", who, path,
                       keys[k].key, item->valuedouble);
        } else {
            user_error("%s %s: %s has the wrong type", who, path, keys[k].key);
        }
    }
}

// transformers' MambaConfig (model_type "mamba"), with its defaults
static void read_hf_mamba(Config *cfg, cJSON *root, const char *path, const char *who) {
    const HfKey keys[] = {
        {"hidden_size", HF_INT, 1, offsetof(Config, hidden_size)},
        {"num_hidden_layers", HF_INT, 1, offsetof(Config, num_hidden_layers)},
        {"vocab_size", HF_INT, 1, offsetof(Config, vocab_size)},
        {"state_size", HF_INT, 0, offsetof(Config, state_size)},
        {"expand", HF_INT, 0, offsetof(Config, expand)},
        {"conv_kernel", HF_INT, 0, offsetof(Config, conv_kernel)},
        {"time_step_rank", HF_INT, 0, offsetof(Config, time_step_rank)},
        {"use_bias", HF_BOOL, 0, offsetof(Config, use_bias)},
        {"use_conv_bias", HF_BOOL, 0, offsetof(Config, use_conv_bias)},
        {"layer_norm_epsilon", HF_FLOAT, 0, offsetof(Config, layer_norm_epsilon)},
        {"time_step_min", HF_FLOAT, 0, offsetof(Config, time_step_min)},
        {"time_step_max", HF_FLOAT, 0, offsetof(Config, time_step_max)},
        {"time_step_floor", HF_FLOAT, 0, offsetof(Config, time_step_floor)},
        {"time_step_scale", HF_FLOAT, 0, offsetof(Config, time_step_scale)},
        {"tie_word_embeddings", HF_BOOL, 0, offsetof(Config, tie_word_embeddings)},
    };
    Config d;
    config_defaults(&d); // MambaConfig's defaults are these, tied as MambaConfig is
    cfg->state_size = d.state_size, cfg->expand = d.expand, cfg->conv_kernel = d.conv_kernel;
    cfg->use_bias = 0, cfg->use_conv_bias = 1, cfg->layer_norm_epsilon = d.layer_norm_epsilon;
    cfg->time_step_min = d.time_step_min, cfg->time_step_max = d.time_step_max;
    cfg->time_step_floor = d.time_step_floor, cfg->time_step_scale = d.time_step_scale;
    cfg->tie_word_embeddings = 1, cfg->num_experts = 0, cfg->time_step_rank = 0;
    strcpy(cfg->time_step_init_scheme, "random");
    strcpy(cfg->model_type, "mamba");
    const cJSON *rank = cJSON_GetObjectItemCaseSensitive(root, "time_step_rank");
    if (cJSON_IsString(rank) && strcmp(rank->valuestring, "auto") == 0) // 0: auto
        cJSON_DeleteItemFromObjectCaseSensitive(root, "time_step_rank");
    read_hf_keys(cfg, root, keys, sizeof keys / sizeof keys[0], path, who);
    const cJSON *scheme = cJSON_GetObjectItemCaseSensitive(root, "time_step_init_scheme");
    if (cJSON_IsString(scheme))
        snprintf(cfg->time_step_init_scheme, sizeof cfg->time_step_init_scheme, "%s",
                 scheme->valuestring);
    cfg->intermediate_size = cfg->expand * cfg->hidden_size; // MambaConfig's
    const cJSON *inter = cJSON_GetObjectItemCaseSensitive(root, "intermediate_size");
    if (cJSON_IsNumber(inter) && inter->valuedouble != cfg->intermediate_size)
        user_error("%s %s: intermediate_size = %g is not expand * hidden_size = %d (MambaConfig "
                   "computes it so)",
                   who, path, inter->valuedouble, cfg->intermediate_size);
    if (world_rank() == 0)
        printf("note: model_type \"mamba\": picotron.c builds a Mamba, %d layers of %d channels, "
               "%d states each (model_mamba.c)\n",
               cfg->num_hidden_layers, cfg->intermediate_size, cfg->state_size);
}

void config_read_hf(Config *cfg, const char *path, const char *who) {
    const HfKey keys[] = {
        {"hidden_size", HF_INT, 1, offsetof(Config, hidden_size)},
        {"intermediate_size", HF_INT, 1, offsetof(Config, intermediate_size)},
        {"num_hidden_layers", HF_INT, 1, offsetof(Config, num_hidden_layers)},
        {"num_attention_heads", HF_INT, 1, offsetof(Config, num_attention_heads)},
        {"num_key_value_heads", HF_INT, 0, offsetof(Config, num_key_value_heads)},
        {"vocab_size", HF_INT, 1, offsetof(Config, vocab_size)},
        {"rms_norm_eps", HF_FLOAT, 0, offsetof(Config, rms_norm_eps)},
        {"rope_theta", HF_FLOAT, 0, offsetof(Config, rope_theta)},
        {"max_position_embeddings", HF_INT, 0, offsetof(Config, max_position_embeddings)},
        {"tie_word_embeddings", HF_BOOL, 0, offsetof(Config, tie_word_embeddings)},
        // a mixture of experts: Mixtral's num_local_experts, and Qwen2-MoE's names, which an
        // older picotron.c wrote
        {"num_experts", HF_INT, 0, offsetof(Config, num_experts)},
        {"num_local_experts", HF_INT, 0, offsetof(Config, num_experts)},
        {"num_experts_per_tok", HF_INT, 0, offsetof(Config, num_experts_per_tok)},
        {"moe_intermediate_size", HF_INT, 0, offsetof(Config, moe_intermediate_size)},
        {"router_aux_loss_coef", HF_FLOAT, 0, offsetof(Config, router_aux_loss_coef)},
    };
    cJSON *root = read_hf_json(path, who);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(root, "_name_or_path");
    snprintf(cfg->model_name, sizeof cfg->model_name, "%s",
             cJSON_IsString(name) && name->valuestring[0] ? name->valuestring : "custom");
    if (cJSON_IsString(type) && strcmp(type->valuestring, "mamba") == 0) {
        read_hf_mamba(cfg, root, path, who);
        cJSON_Delete(root);
        return;
    }
    strcpy(cfg->model_type, "llama");
    // transformers 5 moved rope_theta into rope_parameters; older files keep it at the top
    const cJSON *rope = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters");
    const cJSON *theta = cJSON_GetObjectItemCaseSensitive(rope, "rope_theta");
    if (theta && !cJSON_GetObjectItemCaseSensitive(root, "rope_theta"))
        cJSON_AddItemToObject(root, "rope_theta", cJSON_Duplicate(theta, 0));
    // the defaults of transformers' LlamaConfig, or MixtralConfig's for a Mixtral: a mixture of
    // experts whose intermediate_size is each expert's (model_moe.c)
    int mixtral = cJSON_IsString(type) && strcmp(type->valuestring, "mixtral") == 0;
    cfg->rms_norm_eps = mixtral ? 1e-5f : 1e-6f;
    cfg->rope_theta = mixtral ? 1e6f : 10000.0f;
    cfg->max_position_embeddings = mixtral ? 131072 : 2048;
    cfg->tie_word_embeddings = 0;
    cfg->num_key_value_heads = 0; // 0 until read: then it defaults to the query heads
    cfg->num_experts = mixtral ? 8 : 0;
    cfg->moe_intermediate_size = 0;
    if (mixtral) cfg->num_experts_per_tok = 2, cfg->router_aux_loss_coef = 0.001f;
    read_hf_keys(cfg, root, keys, sizeof keys / sizeof keys[0], path, who);
    if (cfg->num_key_value_heads == 0) cfg->num_key_value_heads = cfg->num_attention_heads;
    if (cfg->num_experts > 0 && cfg->moe_intermediate_size == 0) // Mixtral's experts
        cfg->moe_intermediate_size = cfg->intermediate_size;
    const cJSON *head_dim = cJSON_GetObjectItemCaseSensitive(root, "head_dim");
    if (cJSON_IsNumber(head_dim) && cfg->num_attention_heads > 0 && cfg->hidden_size > 0 &&
        head_dim->valuedouble != cfg->hidden_size / cfg->num_attention_heads)
        user_error(
            "%s %s: head_dim = %g is not hidden_size / num_attention_heads = %d (picotron.c's "
            "heads are that wide)",
            who, path, head_dim->valuedouble, cfg->hidden_size / cfg->num_attention_heads);
    check_hf_model(cfg, root, path, who);
    cJSON_Delete(root);
}

// LlamaConfig's keys, or MixtralConfig's for a mixture of experts
static void llama_hf_keys(cJSON *root, const Config *c, int moe) {
    const char *architecture = moe ? "MixtralForCausalLM" : "LlamaForCausalLM";
    cJSON_AddItemToObject(root, "architectures", cJSON_CreateStringArray(&architecture, 1));
    cJSON_AddStringToObject(root, "model_type", moe ? "mixtral" : "llama");
    const struct {
        const char *key;
        double value;
        int is_float;
    } numbers[] = {
        {"hidden_size", c->hidden_size, 0},
        {"intermediate_size", moe ? c->moe_intermediate_size : c->intermediate_size, 0},
        {"num_hidden_layers", c->num_hidden_layers, 0},
        {"num_attention_heads", c->num_attention_heads, 0},
        {"num_key_value_heads", c->num_key_value_heads, 0},
        {"head_dim", c->hidden_size / c->num_attention_heads, 0},
        {"vocab_size", c->vocab_size, 0},
        {"max_position_embeddings", c->max_position_embeddings, 0},
        {"rms_norm_eps", c->rms_norm_eps, 1},
        {"rope_theta", c->rope_theta, 1},
    };
    for (size_t i = 0; i < sizeof numbers / sizeof numbers[0]; i++)
        cJSON_AddItemToObject(root, numbers[i].key,
                              number_json(numbers[i].value, numbers[i].is_float));
    if (moe) { // MixtralConfig's keys: softmax over all experts, top-k, renormalised (moe.c)
        cJSON_AddNumberToObject(root, "num_local_experts", c->num_experts);
        cJSON_AddNumberToObject(root, "num_experts_per_tok", c->num_experts_per_tok);
        cJSON_AddItemToObject(root, "router_aux_loss_coef",
                              python_float_json(c->router_aux_loss_coef));
        cJSON_AddItemToObject(root, "router_jitter_noise", python_float_json(0));
        cJSON_AddNullToObject(root, "sliding_window"); // every earlier position is attended to
        cJSON_AddBoolToObject(root, "output_router_logits", 0);
    }
    cJSON_AddBoolToObject(root, "tie_word_embeddings", c->tie_word_embeddings);
    cJSON_AddStringToObject(root, "hidden_act", "silu");
    if (!moe) { // LlamaConfig's; a Mixtral has no biases and no such keys
        cJSON_AddBoolToObject(root, "attention_bias", 0);
        cJSON_AddBoolToObject(root, "mlp_bias", 0);
    }
}

// transformers' MambaConfig keys of a Mamba (model_mamba.c names its tensors as MambaForCausalLM)
static void save_hf_mamba(cJSON *root, const Config *c) {
    const struct {
        const char *key;
        double value;
        int is_float;
    } numbers[] = {
        {"hidden_size", c->hidden_size, 0},
        {"intermediate_size", c->expand * c->hidden_size, 0},
        {"num_hidden_layers", c->num_hidden_layers, 0},
        {"vocab_size", c->vocab_size, 0},
        {"state_size", c->state_size, 0},
        {"expand", c->expand, 0},
        {"conv_kernel", c->conv_kernel, 0},
        {"time_step_rank", config_time_step_rank(c), 0},
        {"layer_norm_epsilon", c->layer_norm_epsilon, 1},
        {"time_step_min", c->time_step_min, 1},
        {"time_step_max", c->time_step_max, 1},
        {"time_step_floor", c->time_step_floor, 1},
        {"time_step_scale", c->time_step_scale, 1},
    };
    for (size_t i = 0; i < sizeof numbers / sizeof numbers[0]; i++)
        cJSON_AddItemToObject(root, numbers[i].key,
                              numbers[i].is_float ? python_float_json(numbers[i].value)
                                                  : number_json(numbers[i].value, 0));
    cJSON_AddStringToObject(root, "time_step_init_scheme", c->time_step_init_scheme);
    cJSON_AddBoolToObject(root, "use_bias", c->use_bias);
    cJSON_AddBoolToObject(root, "use_conv_bias", c->use_conv_bias);
    cJSON_AddBoolToObject(root, "tie_word_embeddings", c->tie_word_embeddings);
    cJSON_AddBoolToObject(root, "residual_in_fp32", 1);
    cJSON_AddBoolToObject(root, "rescale_prenorm_residual", 0);
    cJSON_AddStringToObject(root, "hidden_act", "silu");
}

// A dense model is a Llama; a mixture of experts a Mixtral (model_moe.c names its tensors so),
// whose intermediate_size is each expert's; a Mamba a Mamba
int config_save_hf(const Config *c, const char *path) {
    int moe = c->num_experts > 0, mamba = config_is_mamba(c);
    cJSON *root = cJSON_CreateObject();
    if (mamba) {
        const char *architecture = "MambaForCausalLM";
        cJSON_AddItemToObject(root, "architectures", cJSON_CreateStringArray(&architecture, 1));
        cJSON_AddStringToObject(root, "model_type", "mamba");
        save_hf_mamba(root, c);
    } else {
        llama_hf_keys(root, c, moe);
    }
    cJSON_AddStringToObject(root, "torch_dtype", "float32");
    // the tokenizer's special tokens: null when there are none, for transformers' LlamaConfig
    // would otherwise default to 1 and 2
    const int special[2] = {c->bos_token_id, c->eos_token_id};
    const char *special_keys[2] = {"bos_token_id", "eos_token_id"};
    for (int i = 0; i < 2; i++)
        cJSON_AddItemToObject(root, special_keys[i],
                              special[i] >= 0 ? cJSON_CreateNumber(special[i])
                                              : cJSON_CreateNull());
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    FILE *f = text ? fopen(path, "w") : NULL;
    int ok = f && fputs(text, f) >= 0 && fputc('\n', f) != EOF;
    if (f) ok = fclose(f) == 0 && ok;
    free(text);
    return ok ? 0 : -1;
}
