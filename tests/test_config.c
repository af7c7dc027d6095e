// config_save then config_load gives back every value config_load read: prints the loaded config
// as "key value" lines (the test script checks them against the JSON file and the flags given),
// then saves it, loads the copy, and compares all printed values (exit 1 on any difference).
//   build/tests/test_config PATH [--validate]   (--validate: also runs config_validate)
#include "config.h"
#include "utils.h"
#include <string.h>

static void dump(char *out, size_t size, const Config *c) {
    snprintf(out, size,
             "tp_size %d\ncp_size %d\npp_size %d\ndp_size %d\npp_engine %s\nbackend %s\n"
             "use_cpu %d\ntp_async %d\ncp_zigzag %d\nbucket_size_mb %d\nname %s\n"
             "hidden_size %d\nintermediate_size %d\nnum_hidden_layers %d\n"
             "num_attention_heads %d\nnum_key_value_heads %d\nvocab_size %d\n"
             "max_position_embeddings %d\ntie_word_embeddings %d\nrms_norm_eps %.9g\n"
             "rope_theta %.9g\ndtype %s\nseed %d\nlearning_rate %.9g\ntotal_train_steps %d\n"
             "seq_length %d\nmicro_batch_size %d\ngradient_accumulation_steps %d\n"
             "num_samples %ld\nmax_tokens %ld\ngrad_clip %.9g\nwarmup_steps %d\nlr_decay %s\n"
             "min_lr %.9g\nweight_decay %.9g\nadam_beta1 %.9g\nadam_beta2 %.9g\n"
             "adam_eps %.9g\ndataset %s\nsave_dir %s\nsave_frequency %d\nload_path %s\n"
             "run_name %s\nmetrics_file %s\nOMP_NUM_THREADS %d\nPEAK_FLOPS %.17g\n"
             "num_experts %d\nnum_experts_per_tok %d\nmoe_intermediate_size %d\n"
             "router_aux_loss_coef %.9g\nmoe_capacity_factor %.9g\nep_size %d\n"
             "make_vocab_size_divisible_by %d\n",
             c->tp_size, c->cp_size, c->pp_size, c->dp_size, c->pp_engine, c->backend, c->use_cpu,
             c->tp_async, c->cp_zigzag, c->bucket_size_mb, c->model_name, c->hidden_size,
             c->intermediate_size, c->num_hidden_layers, c->num_attention_heads,
             c->num_key_value_heads, c->vocab_size, c->max_position_embeddings,
             c->tie_word_embeddings, c->rms_norm_eps, c->rope_theta, c->dtype, c->seed,
             c->learning_rate, c->total_train_steps, c->seq_length, c->micro_batch_size,
             c->gradient_accumulation_steps, c->num_samples, c->max_tokens, c->grad_clip,
             c->warmup_steps, c->lr_decay, c->min_lr, c->weight_decay, c->adam_beta1, c->adam_beta2,
             c->adam_eps, c->dataset_name, c->save_dir, c->save_frequency, c->load_path,
             c->run_name, c->metrics_file, c->omp_num_threads, c->peak_flops, c->num_experts,
             c->num_experts_per_tok, c->moe_intermediate_size, c->router_aux_loss_coef,
             c->moe_capacity_factor, c->ep_size, c->make_vocab_size_divisible_by);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s config.json [--validate]\n", argv[0]);
        return 2;
    }
    Config first, second;
    config_load(&first, argv[1]);
    if (argc > 2) config_validate(&first);
    static char a[8192], b[8192], copy[4096];
    dump(a, sizeof a, &first);
    fputs(a, stdout);

    snprintf(copy, sizeof copy, "%s.roundtrip.json", argv[1]);
    if (config_save(&first, copy) != 0) {
        fprintf(stderr, "config_save(%s) failed\n", copy);
        return 1;
    }
    config_load(&second, copy);
    dump(b, sizeof b, &second);
    remove(copy);
    if (strcmp(a, b) != 0) {
        fprintf(stderr, "round trip differs:\n--- loaded\n%s--- saved and reloaded\n%s", a, b);
        return 1;
    }
    int values = 0;
    for (const char *p = a; *p; p++) values += *p == '\n';
    printf("round trip: all %d values equal\n", values);
    return 0;
}
