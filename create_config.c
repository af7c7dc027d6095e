// create_config: writes <out_dir>/<exp_name>/config.json from picotron's command-line flags, as
// picotron's create_config.py does, but with built-in Hugging Face architectures (or a local
// config.json via --model_config) instead of a download from the hub.
//   ./create_config --out_dir tmp --exp_name llama-1B --dp 2 --tp 2 --pp 2 --mbs 4
// One table row per flag drives parsing, --help and the "unknown flag" message.
#include "config.h"
#include "doremi.h"
#include "utils.h"
#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>

enum { A_INT, A_FLOAT, A_STR, A_SWITCH, A_OWN, A_OWN_SWITCH, A_NOTE, A_NOTE_SWITCH };

typedef struct {
    const char *flag;
    int type;
    size_t offset, size; // where the value goes in Config; A_OWN: main reads it by name
    const char *help;    // A_NOTE*: what this flag means here (picotron's flag, no effect)
    const char *value;   // what the command line gave, NULL when absent
} Flag;

#define SET(flag, type, member, help)                                                              \
    { flag, type, offsetof(Config, member), sizeof(((Config *)0)->member), help, NULL }
#define OWN(flag, type, help)                                                                      \
    { flag, type, 0, 0, help, NULL }

static Flag flags[] = {
    OWN("out_dir", A_OWN, "folder that holds the experiments (default tmp)"),
    OWN("exp_name", A_OWN,
        "experiment name: writes <out_dir>/<exp_name>/config.json (default dummy_exp)"),
    OWN("model_name", A_OWN,
        "a built-in preset (below) or, with --model_config, any name (default picotron-tiny)"),
    OWN("model_config", A_OWN,
        "PATH to a Hugging Face config.json (or its folder) to take the architecture from"),
    OWN("overwrite", A_OWN_SWITCH, "write into an experiment folder that already exists"),
    OWN("ranks_per_node", A_OWN,
        "ranks on each node (default: Slurm's SLURM_NTASKS_PER_NODE): warns when tp spans nodes"),
    SET("dp", A_INT, dp_size, "data-parallel size"),
    SET("tp", A_INT, tp_size, "tensor-parallel size"),
    SET("pp", A_INT, pp_size, "pipeline-parallel size"),
    SET("cp", A_INT, cp_size, "context-parallel size"),
    SET("ep", A_INT, ep_size,
        "expert-parallel size: the experts split over groups of ep dp ranks (divides dp)"),
    SET("pp_engine", A_STR, pp_engine, "pipeline schedule: afab or 1f1b"),
    SET("pp_virtual_stages", A_INT, pp_virtual_stages,
        "interleaved 1F1B: chunks of layers per pipeline rank (1: plain 1F1B)"),
    SET("backend", A_STR, backend, "collectives: nccl (GPU) or mpi"),
    SET("use_cpu", A_SWITCH, use_cpu, "train on the CPU build (its default)"),
    SET("tp_async", A_SWITCH, tp_async, "overlap the column-parallel all-reduce with compute"),
    SET("sequence_parallel", A_SWITCH, sequence_parallel,
        "split the residual stream and norms over the tokens on the tp ranks (Megatron's)"),
    SET("cp_zigzag", A_SWITCH, cp_zigzag, "zig-zag sequence chunks to balance the causal ring"),
    SET("bucket_size_mb", A_INT, bucket_size_mb, "data-parallel gradient bucket size in MB"),
    SET("timeout_s", A_FLOAT, timeout_s,
        "seconds a rank waits for a stopped peer before the job ends, naming the wait"),
    SET("dp_naive", A_SWITCH, dp_naive,
        "naive data parallelism: all-reduce each layer's gradients at once, blocking"),
    SET("zero1", A_SWITCH, zero1,
        "ZeRO-1: shard AdamW's moments over the cp*dp replicas (reduce-scatter, all-gather)"),
    SET("zero_stage", A_INT, zero_stage,
        "ZeRO stage 0-3: 1 shards AdamW's moments, 2 the gradients too, 3 the weights too"),
    SET("num_hidden_layers", A_INT, num_hidden_layers, "override the model's layer count"),
    SET("num_attention_heads", A_INT, num_attention_heads, "override the model's query heads"),
    SET("num_key_value_heads", A_INT, num_key_value_heads, "override the model's key/value heads"),
    SET("hidden_size", A_INT, hidden_size, "override the model's hidden size"),
    SET("intermediate_size", A_INT, intermediate_size, "override the model's MLP size"),
    SET("vocab_size", A_INT, vocab_size, "override the model's vocabulary size"),
    SET("make_vocab_size_divisible_by", A_INT, make_vocab_size_divisible_by,
        "pad the embedding and head to a multiple of N rows (Megatron's), masked out of the loss"),
    SET("num_experts", A_INT, num_experts,
        "mixture of experts: experts per layer, each MLP becomes a routed set (0: dense)"),
    SET("num_experts_per_tok", A_INT, num_experts_per_tok, "experts each token is routed to"),
    SET("moe_intermediate_size", A_INT, moe_intermediate_size,
        "override each expert's MLP size (default: the model's intermediate_size)"),
    SET("router_aux_loss_coef", A_FLOAT, router_aux_loss_coef,
        "weight of the load-balancing loss in the training loss"),
    SET("moe_capacity_factor", A_FLOAT, moe_capacity_factor,
        "expert capacity: ceil(factor * tokens * k / experts) pairs, the rest dropped; 0: none"),
    SET("model_type", A_STR, model_type,
        "llama, or mamba: transformers' MambaForCausalLM, a Mamba block in each layer"),
    SET("state_size", A_INT, state_size, "Mamba: states per channel (MambaConfig's)"),
    SET("expand", A_INT, expand, "Mamba: d_inner = expand * hidden_size"),
    SET("conv_kernel", A_INT, conv_kernel, "Mamba: the causal conv's width"),
    SET("time_step_rank", A_INT, time_step_rank, "Mamba: dt's rank (0: ceil(hidden_size / 16))"),
    SET("use_conv_bias", A_INT, use_conv_bias, "Mamba: 1 or 0, a bias on the conv"),
    SET("use_bias", A_INT, use_bias, "Mamba: biases on in_proj and out_proj (0; 1 is refused)"),
    SET("layer_norm_epsilon", A_FLOAT, layer_norm_epsilon, "Mamba: the RMSNorms' eps"),
    SET("time_step_min", A_FLOAT, time_step_min, "Mamba: dt's init range, low end"),
    SET("time_step_max", A_FLOAT, time_step_max, "Mamba: dt's init range, high end"),
    SET("time_step_floor", A_FLOAT, time_step_floor, "Mamba: dt's init floor"),
    SET("time_step_scale", A_FLOAT, time_step_scale, "Mamba: dt_proj.weight's init scale"),
    SET("time_step_init_scheme", A_STR, time_step_init_scheme,
        "Mamba: dt_proj.weight's init, random or constant"),
    SET("tie_word_embeddings", A_INT, tie_word_embeddings, "1: lm_head is the embedding"),
    SET("grad_acc_steps", A_INT, gradient_accumulation_steps, "gradient accumulation steps"),
    SET("mbs", A_INT, micro_batch_size, "micro-batch size, in sequences"),
    SET("seq_len", A_INT, seq_length, "sequence length, in tokens"),
    SET("learning_rate", A_FLOAT, learning_rate, "AdamW learning rate"),
    SET("grad_clip", A_FLOAT, grad_clip, "max global gradient norm; 0: no clipping"),
    SET("recompute", A_SWITCH, recompute,
        "recompute each layer's forward in the backward: keep only layer inputs (less memory)"),
    SET("total_train_steps", A_INT, total_train_steps, "optimizer steps to train"),
    SET("seed", A_INT, seed, "seed of the weights and the data order"),
    SET("dataset", A_STR, dataset_name, "a .txt (bytes), a .tok token file or an llm.c .bin"),
    OWN("domains", A_OWN,
        "name=path[:weight],...: a mixture of domains instead of --dataset, each row drawn by "
        "its weight (default 1)"),
    OWN("domain_weights", A_OWN,
        "PATH to a domain_weights.json (a DoReMi proxy's): the --domains' weights from it"),
    SET("doremi_reference", A_STR, doremi_reference,
        "DoReMi: a reference run's checkpoint; this run is the proxy that learns the weights"),
    SET("doremi_step_size", A_FLOAT, doremi_step_size, "DoReMi's eta (default 1)"),
    SET("doremi_smoothing", A_FLOAT, doremi_smoothing, "DoReMi's c, mixing in uniform (1e-3)"),
    SET("tokenizer", A_STR, tokenizer,
        "the tokenizer the .tok was made with (./prepare_data --tokenizer): train checks them"),
    SET("save_dir", A_STR, save_dir, "checkpoint folder (default <out_dir>/<exp_name>)"),
    SET("save_frequency", A_INT, save_frequency, "save a checkpoint every N steps; 0: never"),
    SET("keep_last", A_INT, keep_last, "keep the newest N checkpoints in save_dir; 0: all"),
    SET("load_path", A_STR, load_path, "resume from a checkpoint folder, or a save_dir's latest"),
    SET("init_from", A_STR, init_from,
        "start from a Hugging Face model folder's weights (its config.json is the model)"),
    SET("metrics_file", A_STR, metrics_file, "one JSON line per step goes to this file"),
    OWN("trace", A_OWN_SWITCH,
        "record every rank's timeline: <out_dir>/<exp_name>/trace.json (Perfetto) and trace.svg"),
    SET("trace_steps", A_INT, trace_steps, "how many steps --trace records"),
    OWN("hf_token", A_NOTE,
        "--hf_token is not needed: picotron.c reads no hub (built-in presets, or --model_config)"),
    OWN("subset_name", A_NOTE,
        "--subset_name is ignored: picotron.c reads one local file (--dataset)"),
    OWN("use_wandb", A_NOTE_SWITCH,
        "--use_wandb is ignored: picotron.c logs to stdout and to --metrics_file"),
    OWN("use_fused_adam", A_NOTE_SWITCH,
        "--use_fused_adam is ignored: picotron.c has one AdamW kernel per device"),
};
#define NUM_FLAGS (int)(sizeof flags / sizeof flags[0])

static int is_switch(const Flag *f) {
    return f->type == A_SWITCH || f->type == A_OWN_SWITCH || f->type == A_NOTE_SWITCH;
}

static const char *flag_value(const char *name) {
    for (int i = 0; i < NUM_FLAGS; i++)
        if (strcmp(flags[i].flag, name) == 0) return flags[i].value;
    return NULL;
}

static void usage(void) {
    Config d;
    config_defaults(&d);
    printf("usage: ./create_config [--flag value | --flag=value]...\n"
           "writes <out_dir>/<exp_name>/config.json for ./train (picotron's flags, and more)\n");
    for (int i = 0; i < NUM_FLAGS; i++) {
        const Flag *f = &flags[i];
        char name[48], def[64] = "";
        snprintf(name, sizeof name, "--%s%s", f->flag, is_switch(f) ? "" : " X");
        const char *src = (const char *)&d + f->offset;
        if (f->type == A_INT && !strstr(f->help, "override"))
            snprintf(def, sizeof def, " (default %d)", *(const int *)src);
        if (f->type == A_FLOAT) snprintf(def, sizeof def, " (default %g)", *(const float *)src);
        if (f->type == A_STR && *src && !strstr(f->help, "default"))
            snprintf(def, sizeof def, " (default %s)", src);
        printf("  %-24s %s%s\n", name,
               f->type >= A_NOTE ? "accepted for picotron's command lines; no effect" : f->help,
               def);
    }
    printf("presets: %s (an -Instruct suffix is accepted)\n", config_preset_names());
}

static void __attribute__((noreturn)) unknown_flag(const char *name) {
    int best = INT_MAX;
    const char *closest = NULL;
    for (int i = 0; i < NUM_FLAGS; i++) {
        int d = edit_distance(name, flags[i].flag);
        if (d < best) best = d, closest = flags[i].flag;
    }
    if (best <= 1 + (int)strlen(name) / 4)
        user_error("create_config: unknown flag --%s (did you mean --%s? see --help)", name,
                   closest);
    user_error("create_config: unknown flag --%s (see ./create_config --help)", name);
}

// fills flags[].value from "--flag value", "--flag=value" and "--switch"
static void parse_args(int argc, char **argv) {
    for (int a = 1; a < argc; a++) {
        const char *arg = argv[a];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            usage();
            exit(0);
        }
        if (strncmp(arg, "--", 2) != 0)
            user_error("create_config: unexpected argument \"%s\" (flags start with --; see "
                       "--help)",
                       arg);
        char name[64];
        const char *eq = strchr(arg, '='), *value = eq ? eq + 1 : NULL;
        snprintf(name, sizeof name, "%.*s", (int)(eq ? eq - arg - 2 : (long)strlen(arg) - 2),
                 arg + 2);
        Flag *f = NULL;
        for (int i = 0; i < NUM_FLAGS; i++)
            if (strcmp(flags[i].flag, name) == 0) f = &flags[i];
        if (!f) unknown_flag(name);
        if (is_switch(f)) {
            if (value) user_error("create_config: --%s is a switch and takes no value", name);
            value = "1";
        } else if (!value) {
            if (a + 1 >= argc || strncmp(argv[a + 1], "--", 2) == 0)
                user_error("create_config: --%s needs a value", name);
            value = argv[++a];
        }
        f->value = value;
    }
}

// the flags that set a Config field, after the model's architecture so they override it
static void apply_flags(Config *cfg) {
    for (int i = 0; i < NUM_FLAGS; i++) {
        const Flag *f = &flags[i];
        char *dst = (char *)cfg + f->offset, *end;
        if (!f->value || f->type > A_SWITCH) continue;
        if (f->type == A_INT) {
            long x = strtol(f->value, &end, 10);
            if (!f->value[0] || *end || x < INT_MIN || x > INT_MAX)
                user_error("create_config: --%s expects an integer, got \"%s\"", f->flag, f->value);
            *(int *)dst = (int)x;
        } else if (f->type == A_FLOAT) {
            float x = strtof(f->value, &end);
            if (!f->value[0] || *end || !isfinite(x))
                user_error("create_config: --%s expects a number, got \"%s\"", f->flag, f->value);
            *(float *)dst = x;
        } else if (f->type == A_STR) {
            if (strlen(f->value) >= f->size)
                user_error("create_config: --%s is longer than %zu characters", f->flag,
                           f->size - 1);
            strcpy(dst, f->value);
        } else {
            *(int *)dst = 1;
        }
    }
}

static void print_thousands(char *out, size_t size, long x) { // 1048576 -> "1,048,576"
    char digits[32];
    int n = snprintf(digits, sizeof digits, "%ld", x), o = 0;
    for (int i = 0; i < n && o + 2 < (int)size; i++) {
        out[o++] = digits[i];
        if ((n - i - 1) % 3 == 0 && i < n - 1) out[o++] = ',';
    }
    out[o] = '\0';
}

// Ranks per node, from --ranks_per_node or inside a Slurm allocation (SLURM_NTASKS_PER_NODE, or
// the first count of SLURM_TASKS_PER_NODE, "4(x2)"); 0 when unknown
static int ranks_per_node(void) {
    const char *v = flag_value("ranks_per_node");
    if (!v) v = getenv("SLURM_NTASKS_PER_NODE");
    if (!v) v = getenv("SLURM_TASKS_PER_NODE");
    int n = v ? atoi(v) : 0;
    if (flag_value("ranks_per_node") && n < 1)
        user_error("create_config: --ranks_per_node expects a positive integer, got \"%s\"", v);
    return n;
}

int main(int argc, char **argv) {
    parse_args(argc, argv);
    const char *out_dir = flag_value("out_dir") ? flag_value("out_dir") : "tmp";
    const char *exp_name = flag_value("exp_name") ? flag_value("exp_name") : "dummy_exp";
    const char *model_name = flag_value("model_name");
    // weights from a Hugging Face folder come with their architecture: its config.json
    const char *model_config =
        flag_value("model_config") ? flag_value("model_config") : flag_value("init_from");
    Config cfg;
    config_defaults(&cfg);

    if (model_config) {
        config_read_hf(&cfg, model_config,
                       "create_config: --model_config"); // names the model after the file
        if (!model_name) model_name = cfg.model_name;
    } else {
        if (!model_name) model_name = "picotron-tiny";
        if (!config_apply_preset(&cfg, model_name))
            user_error("create_config: unknown --model_name %s; presets: %s (or pass "
                       "--model_config PATH to a Hugging Face config.json)",
                       model_name, config_preset_names());
    }
    if (strlen(model_name) >= sizeof cfg.model_name)
        user_error("create_config: --model_name is too long");
    memmove(cfg.model_name, model_name, strlen(model_name) + 1);

    char run_path[496], path[512]; // both fit Config's 512-character paths
    if (snprintf(run_path, sizeof run_path, "%s/%s", out_dir, exp_name) >= (int)sizeof run_path)
        user_error("create_config: --out_dir/--exp_name is longer than %zu characters",
                   sizeof run_path - 1);
    snprintf(cfg.save_dir, sizeof cfg.save_dir, "%s", run_path); // as picotron
    snprintf(cfg.run_name, sizeof cfg.run_name, "%s", exp_name);
    if (flag_value("trace")) snprintf(cfg.trace, sizeof cfg.trace, "%s/trace.json", run_path);
    apply_flags(&cfg);
    if (flag_value("domain_weights") && !flag_value("domains"))
        user_error("create_config: --domain_weights needs --domains (the weights are theirs)");
    if (flag_value("domains") && flag_value("dataset"))
        user_error("create_config: --domains replaces --dataset: pass one of them");
    if (flag_value("domains")) { // the mixture is the dataset: dataset.name stays empty
        cfg.dataset_domains = domain_list_json(flag_value("domains"), flag_value("domain_weights"));
        cfg.dataset_name[0] = '\0';
    }
    if (cfg.num_experts > 0 && cfg.moe_intermediate_size == 0) // Mixtral's experts
        cfg.moe_intermediate_size = cfg.intermediate_size;
    if (config_is_mamba(&cfg)) cfg.intermediate_size = cfg.expand * cfg.hidden_size; // d_inner
    for (int i = 0; i < NUM_FLAGS; i++)
        if (flags[i].value && flags[i].type >= A_NOTE) printf("note: %s\n", flags[i].help);
    config_validate(&cfg);
    // tp's all-reduces run twice per layer each way: tp peers are world neighbours (tp fastest),
    // so tp stays inside a node when it divides the ranks per node
    int per_node = ranks_per_node();
    if (per_node > 0 && per_node % cfg.tp_size != 0)
        fprintf(stderr,
                "warning: tp = %d spans nodes of %d ranks: its all-reduces, in every layer, cross "
                "the link between nodes (choose tp dividing the ranks per node)\n",
                cfg.tp_size, per_node);

    struct stat st;
    if (stat(run_path, &st) == 0 && !flag_value("overwrite"))
        user_error("create_config: %s already exists; pass --overwrite to replace its "
                   "config.json, or choose another --exp_name",
                   run_path);
    if (make_dirs(run_path) != 0)
        user_error("create_config: cannot create folder %s: %s", run_path, strerror(errno));
    snprintf(path, sizeof path, "%s/config.json", run_path);
    if (config_save(&cfg, path) != 0)
        user_error("create_config: cannot write %s: %s", path, strerror(errno));

    long gbs = (long)cfg.micro_batch_size * cfg.gradient_accumulation_steps * cfg.dp_size;
    char tokens[32];
    print_thousands(tokens, sizeof tokens, gbs * cfg.seq_length);
    printf("Global batch size: %ld sequences (mbs %d x grad_acc_steps %d x dp %d) = %s tokens "
           "(seq_len %d)\n",
           gbs, cfg.micro_batch_size, cfg.gradient_accumulation_steps, cfg.dp_size, tokens,
           cfg.seq_length);
    printf("Configs created successfully! Saved to %s\n", path);
    printf("Run it: mpirun -np %d ./train --config %s\n",
           cfg.dp_size * cfg.tp_size * cfg.pp_size * cfg.cp_size, path);
    return 0;
}
