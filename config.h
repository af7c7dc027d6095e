// config.json: picotron's schema (distributed, model, training, dataset, checkpoint, logging,
// environment) plus the architecture keys. Unknown keys, wrong types, missing required keys and
// impossible sizes end the run with one line naming the key.
#pragma once

typedef struct {
    // distributed
    int tp_size, cp_size, pp_size, dp_size;
    int ep_size;           // expert parallelism: the experts split over groups of ep dp ranks
    char pp_engine[16];    // "afab" or "1f1b"
    int pp_virtual_stages; // interleaved 1F1B: chunks of layers per pipeline rank (Megatron's)
    char backend[16];      // "nccl" or "mpi" ("mpi" on the CPU)
    int use_cpu;
    int tp_async;          // async column-parallel linear (nanotron's)
    int sequence_parallel; // Megatron's: the residual stream split over the tokens on tp ranks
    int cp_zigzag;         // zig-zag chunk order for a balanced causal ring
    int bucket_size_mb;    // data-parallel gradient bucket size (picotron: 25)
    int dp_naive;    // all-reduce each layer's gradients at once, blocking (picotron_tutorial 5)
    int zero1;       // ZeRO-1: AdamW's moments sharded over the cp*dp replicas (zero_stage 1)
    int zero_stage;  // 0 none; 1 ZeRO-1; 2 the gradients sharded too; 3 and the parameters
    float timeout_s; // the watchdog: a wait this long for a peer ends the job (NCCL's: 600)
    // model
    char model_name[256];
    int hidden_size, intermediate_size, num_hidden_layers, num_attention_heads;
    int num_key_value_heads, vocab_size, max_position_embeddings, tie_word_embeddings;
    float rms_norm_eps, rope_theta;
    // the embedding and the head hold vocab_size rounded up to a multiple of it (vocab_padding.c)
    int make_vocab_size_divisible_by;
    char dtype[16]; // "float32" or "bfloat16" (GPU only)
    // mixture of experts (model_moe.c): num_experts 0 is the dense Llama; else every layer's MLP
    // is num_experts SwiGLU experts of moe_intermediate_size features, num_experts_per_tok of
    // them per token (Mixtral's router), with Switch's load-balancing loss times
    // router_aux_loss_coef, and GShard's capacity ceil(factor * tokens * k / experts) (0: none)
    int num_experts, num_experts_per_tok, moe_intermediate_size;
    float router_aux_loss_coef, moe_capacity_factor;
    // Mamba (model_mamba.c): model_type "mamba" is transformers' MambaForCausalLM, each layer a
    // Mamba block (mamba.c) of d_inner = expand * hidden_size channels; the keys are MambaConfig's
    // (time_step_rank 0: "auto", ceil(hidden_size / 16)). The attention keys are then unused.
    char model_type[16]; // "llama" (a Mixtral with num_experts) or "mamba"
    int state_size, expand, conv_kernel, time_step_rank, use_conv_bias, use_bias;
    float layer_norm_epsilon, time_step_min, time_step_max, time_step_floor, time_step_scale;
    char time_step_init_scheme[16]; // "random" or "constant": dt_proj.weight's init
    // training
    int seed;
    float learning_rate;
    int total_train_steps, seq_length, micro_batch_size, gradient_accumulation_steps;
    long num_samples;  // 0: no limit
    long max_tokens;   // 0: no limit
    float grad_clip;   // max global gradient norm; 0: off (picotron: off)
    int warmup_steps;  // linear warmup, then cosine decay when lr_decay is "cosine"
    char lr_decay[16]; // "constant" (picotron) or "cosine"
    float min_lr;
    float weight_decay, adam_beta1, adam_beta2, adam_eps;
    int recompute; // full activation recomputation: layers keep only their input (model_memory.c)
    // dataset
    char dataset_name[512]; // a .txt (byte-tokenised), a token file (.tok) or llm.c .bin
    char tokenizer[512];    // the tokenizer the token file was made with ("": bytes, or unnamed)
    // a mixture of domains instead of dataset_name (doremi.c): the JSON list of {"name", "path",
    // "weight"} as the config spells it; NULL: none
    char *dataset_domains;
    // a checkpoint's special tokens, its tokenizer's (checkpoint_tokenizer.c sets them before
    // config_save_hf writes them); -1: none, written null
    int bos_token_id, eos_token_id;
    // checkpoint
    char save_dir[512];
    int save_frequency;  // 0: never
    char load_path[512]; // a checkpoint folder, or a save_dir (its latest checkpoint)
    char init_from[512]; // a Hugging Face model folder: its weights, no optimizer state
    int keep_last;       // checkpoints kept in save_dir, newest first; 0: all
    // logging
    char run_name[128];
    char metrics_file[512]; // JSONL, one object per step; "" for none
    char trace[512];        // Chrome trace JSON of every rank's events (and an .svg); "" for none
    int trace_steps;        // the first N steps are traced
    // environment
    int omp_num_threads;
    double peak_flops; // FLOP/s per device for MFU; 0: measure (CPU) or look up (GPU)
    // DoReMi (doremi.c): the proxy run learns the domains' weights against a reference model
    char doremi_reference[512]; // the reference's checkpoint (a step folder or a save_dir); "": off
    float doremi_step_size;     // eta of the exponentiated-gradient update
    float doremi_smoothing;     // c: the weights are mixed with uniform by this much
} Config;

// Reads and validates path; every problem is one line naming the key, then exit(1).
void config_load(Config *cfg, const char *path);
void config_defaults(Config *cfg); // picotron's defaults, the tiny model
// the sizes and combinations a run needs; the world size is process_group_manager_init's to check
void config_validate(const Config *cfg);
// config_validate, every line naming file (a checkpoint's or a model folder's config.json): a
// config read from a file this run did not write is checked as the run's own
void config_validate_file(const Config *cfg, const char *file);
// Writes cfg as a complete config.json (create_config uses it); 0 on success
int config_save(const Config *cfg, const char *path);
// A Hugging Face config.json (or its folder): its architecture into cfg's model keys; a missing
// or malformed key is one line starting with `who` (e.g. "checkpoint.init_from")
void config_read_hf(Config *cfg, const char *path, const char *who);
// cfg's architecture as the config.json transformers' LlamaForCausalLM loads; 0 on success
int config_save_hf(const Config *cfg, const char *path);
// 1 for a Mamba (model.model_type "mamba"); its dt rank with "auto" (0) resolved
int config_is_mamba(const Config *cfg);
int config_time_step_rank(const Config *cfg);
// Built-in architectures with Hugging Face's numbers (picotron-tiny, SmolLM-135M, ...), matched by
// name with or without the "org/" prefix and the "-Instruct" suffix: sets cfg's architecture keys
// and returns 1, or returns 0 when name is none of them. config_load applies one before the file's
// own keys, so picotron's configs (architecture keys null) get the model they name.
int config_apply_preset(Config *cfg, const char *name);
const char *config_preset_names(void); // "picotron-tiny, HuggingFaceTB/SmolLM-135M, ..."
