// picotron.c's training loop: read the config, set up the 4D process groups, build this rank's
// model shard, open its data, then for each step run the schedule, wait for the gradient
// buckets, clip, AdamW, log. Run it as: mpirun -np 8 ./train --config tmp/llama-1B/config.json
#include <math.h>
#include <mpi.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include "backend/backend.h"
#include "checkpoint.h"
#include "config.h"
#include "context_parallel.h"
#include "data.h"
#include "data_parallel.h"
#include "model.h"
#include "optimizer.h"
#include "pipeline_parallel.h"
#include "process_group_manager.h"
#include "trace.h"
#include "utils.h"
// beyond picotron: each in its own file, switched on by its config key
#include "doremi.h"               // dataset.domains
#include "expert_parallel.h"      // distributed.ep_size: the experts' gradient buckets
#include "metrics.h"              // logging.metrics_file
#include "pipeline_interleaved.h" // distributed.pp_virtual_stages
#include "sequence_parallel.h"    // distributed.sequence_parallel
#include "zero.h"                 // distributed.zero_stage (zero1: stage 1)

static const char *USAGE = "usage: mpirun -np N ./train --config PATH/config.json";

static const char *parse_args(int argc, char **argv) {
    const char *config = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--config") == 0 && i + 1 < argc)
            config = argv[++i];
        else if (strncmp(argv[i], "--config=", 9) == 0)
            config = argv[i] + 9;
        else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            if (world_rank() == 0) printf("%s\n", USAGE);
            MPI_Finalize();
            exit(0);
        } else
            user_error("train: unknown argument '%s' (%s)", argv[i], USAGE);
    }
    if (!config) user_error("train: no config given (%s; ./create_config writes one)", USAGE);
    return config;
}

// picotron's train_step without a pipeline: accumulate grad_acc micro-batches, each loss scaled
// by 1/grad_acc; the buckets all-reduce only during the last backward
static float train_step(Model *model, DataParallel *dp, MicroBatchDataLoader *loader, int step) {
    int grad_acc = model->cfg.gradient_accumulation_steps;
    float loss_scale = 1.0f / ((float)model->B * model->T * grad_acc), loss = 0.0f;
    for (int micro = 0; micro < grad_acc; micro++) {
        load_micro_batch(loader, step, micro);
        model_set_batch(model, 0, loader->input_ids, loader->target_ids);
        dp->require_backward_grad_sync = micro == grad_acc - 1;
        double start = trace_begin();
        loss += model_forward(model, 0, loss_scale) / grad_acc;
        trace_end(EV_FORWARD, micro, -1, start);
        start = trace_begin();
        model_backward(model, NULL, NULL, 0);
        trace_end(EV_BACKWARD, micro, -1, start);
    }
    return loss;
}

// one line per step in picotron's format; peak: FLOP/s of one rank's device (0: unknown)
static void log_step(const Model *model, int step, float loss, long tokens_per_step,
                     long tokens_seen, double seconds, int world_size, double peak) {
    char batch[32], tps[32], tps_device[32], seen[32];
    double tokens_per_second = tokens_per_step / seconds;
    double mfu = peak > 0
                     ? 100.0 * tokens_per_second / world_size * flops_per_token(&model->cfg) / peak
                     : 0.0;
    printf("[rank %d] Step: %-5d | Loss: %6.4f | Global batch size: %7s | Tokens/s: %7s | "
           "Tokens/s/GPU: %7s | Tokens: %7s | MFU: %5.2f%% | Memory usage: %6.2fGB\n",
           model->pgm->global_rank, step, loss, readable(batch, tokens_per_step),
           readable(tps, tokens_per_second), readable(tps_device, tokens_per_second / world_size),
           readable(seen, tokens_seen), mfu, device_memory_used() / 1e9);
    fflush(stdout);
}

int main(int argc, char **argv) {
    mpiCheck(MPI_Init(&argc, &argv));
    user_errors_init();
    const char *config_path = parse_args(argc, argv);
    Config cfg;
    config_load(&cfg, config_path);
    config_validate(&cfg);
    // picotron exports the config's environment section; the OpenMP runtime read
    // OMP_NUM_THREADS before main, so it is told directly
    // the device first: NCCL binds each communicator to the GPU current when it is made
    int local_rank, ranks_on_node;
    node_ranks(&local_rank, &ranks_on_node);
    omp_set_num_threads(threads_per_rank(cfg.omp_num_threads, ranks_on_node));
    backend_init(local_rank);
    backend_set_dtype(cfg.dtype);
    comm_set_backend(cfg.backend);
    comm_set_timeout(cfg.timeout_s);
    ProcessGroupManager pgm;
    process_group_manager_init(&pgm, cfg.tp_size, cfg.cp_size, cfg.pp_size, cfg.dp_size,
                               cfg.ep_size);
    trace_init(cfg.trace, cfg.trace_steps, &pgm);
    Dataset ds;
    DomainMixture mixture; // dataset.domains: each sample drawn from a domain (doremi.c)
    if (cfg.dataset_domains)
        domain_mixture_open(&mixture, &ds, &cfg);
    else
        dataset_load(&ds, cfg.dataset_name, &cfg);

    // each parallel file decides this rank's share: its tensor blocks, its layers, its positions
    int T = cfg.seq_length / pgm.cp_size;
    int *positions = xmalloc(T * sizeof(int));
    context_parallel_positions(positions, pgm.cp_rank, pgm.cp_size, cfg.seq_length, cfg.cp_zigzag);
    int interleaved = cfg.pp_virtual_stages > 1;
    ModelShard shard = {.tp = tensor_parallel_sizes(&cfg, &pgm.tp),
                        .stage = interleaved ? pipeline_interleaved_stage(&cfg, &pgm)
                                             : pipeline_stage(&cfg, &pgm),
                        .positions = positions,
                        .stream_rows = sequence_parallel_rows(&cfg, &pgm)};
    Model model;
    model_init(&model, &cfg, &pgm, &shard,
               interleaved ? pipeline_interleaved_num_slots(&cfg, pgm.pp_rank)
                           : pipeline_num_slots(&cfg, pgm.pp_rank));
    MicroBatchDataLoader loader;
    micro_batch_loader_init(&loader, &ds, &cfg, pgm.dp_rank, pgm.dp_size, positions, T);
    DataParallel dp; // the model's backward hook: picotron's register_backward_hook
    Zero zero = {0}; // distributed.zero_stage: AdamW on a shard; 2, 3: gradients, weights too
    ExpertBuckets experts;
    SequenceParallel sp;
    Optimizer opt;
    int sharded = cfg.zero_stage > 0 && pgm.cp_dp.size > 1;
    if (sharded)
        zero_init(&zero, &dp, &model, &pgm.cp_dp);
    else if (pgm.ep_size > 1)
        expert_parallel_buckets_init(&experts, &dp, &model, &pgm.cp_dp, &pgm.expert_dp,
                                     pgm.ep_size);
    else
        data_parallel_init(&dp, &model, &pgm.cp_dp, NULL);
    if (cfg.sequence_parallel) sequence_parallel_init(&sp, &model, &dp);
    if (sharded)
        zero_optimizer_init(&opt, &zero, &cfg);
    else
        optimizer_init(&opt, &cfg, model.num_params);
    PipelineParallel pipe;
    pipeline_parallel_init(&pipe, &model, &dp, &loader, &pgm);
    int logger = pgm.pp_is_last && pgm.tp_rank == 0 && pgm.cp_rank == 0 && pgm.dp_rank == 0;
    long tokens_per_step =
        (long)cfg.micro_batch_size * cfg.seq_length * cfg.gradient_accumulation_steps * cfg.dp_size;
    if (logger)
        printf("[rank %d] %s: %zu parameters on this rank, %s\n", pgm.global_rank, pgm.name,
               model.num_params, cfg.model_name);

    // the data position follows from the step, so a resumed run continues where it stopped
    // everything the run writes is proven writable before step 1 (logging.trace: trace_init)
    if (cfg.save_frequency > 0)
        checkpoint_lock(cfg.save_dir, &pgm);
    else if (cfg.save_dir[0])
        checkpoint_check_writable(cfg.save_dir, &pgm); // a signal's save
    // ZeRO-3: a checkpoint holds whole tensors (zero_reshard_params: sharded again, if need be)
    if (cfg.init_from[0] || cfg.load_path[0]) zero_unshard_params(&zero);
    if (cfg.init_from[0]) checkpoint_init_from(&model, cfg.init_from);
    int first_step = cfg.load_path[0] ? checkpoint_load(&model, &opt, cfg.load_path) + 1 : 1;
    zero_reshard_params(&zero);
    if (first_step > cfg.total_train_steps && pgm.global_rank == 0)
        printf("nothing to train: the checkpoint in %s is at step %d and "
               "training.total_train_steps = %d (raise it to train on)\n",
               cfg.load_path, first_step - 1, cfg.total_train_steps);
    long tokens_seen = (first_step - 1) * tokens_per_step;
    DomainLosses domain_losses; // dataset.domains: each domain's loss, and DoReMi's weights
    if (cfg.dataset_domains)
        domain_losses_init(&domain_losses, &model, &mixture, &loader, &shard, logger, first_step);
    FILE *metrics =
        logger && cfg.metrics_file[0] ? metrics_open(cfg.metrics_file, first_step) : NULL;
    catch_stop_signals();
    // measured (CPU) while the other ranks wait, napping, instead of competing for the cores
    barrier(&pgm.world);
    double peak = cfg.peak_flops > 0 ? cfg.peak_flops
                  : logger           ? device_peak_flops(ranks_on_node)
                                     : 0;
    barrier(&pgm.world);
    int steps_run = 0;
    for (int step = first_step; step <= cfg.total_train_steps; step++) {
        if (cfg.max_tokens > 0 && tokens_seen >= cfg.max_tokens) break;
        double start = now_seconds();
        trace_step_begin(step);
        backend_step_begin(); // the weights stay as they are until the optimizer's step
        if (zero.stage < 2) device_zero(model.grads, model.num_params * sizeof(float));
        if (cfg.dataset_domains) domain_losses_begin(&domain_losses, step - 1);
        float loss = cfg.pp_size == 1 ? train_step(&model, &dp, &loader, step - 1)
                     : interleaved    ? train_step_pipeline_interleaved(&pipe, step - 1)
                                      : pipeline_train_step(&pipe, step - 1);
        if (zero.stage >= 2) zero_wait(&zero); // ZeRO-2 and 3: each unit's shard, as it came
        if (zero.stage < 2) data_parallel_wait(&dp);
        if (zero.stage < 2) pipeline_sync_tied_embeddings(&model);
        double optimizer_start = trace_begin();
        float norm = clip_grad_norm(&model, &opt);
        // every rank learns at this same step whether to stop: a signal, or a number gone bad
        int stop[2] = {stop_signal_caught(),
                       !isfinite(norm) || (pgm.pp_is_last && !isfinite(loss))};
        all_reduce_host(stop, 2, MPI_INT, MPI_MAX, &pgm.world);
        // the weights going in are finite (checked when loaded or imported, and after each
        // update): the first inf or NaN appeared in this step's loss or gradients, or its update
        char name[128];
        if (stop[1]) {
            first_nonfinite_gradient(name, sizeof name, &model, &opt);
            user_error("training diverged at step %d (learning rate %g): the loss or the gradient "
                       "norm is not finite, the weights going in were finite; first tensor "
                       "with a non-finite gradient: %s. Lower training.learning_rate or set "
                       "training.grad_clip; nothing of this step was saved",
                       step, learning_rate_at(&cfg, step), name);
        }
        optimizer_step(&opt, model.params, model.grads, learning_rate_at(&cfg, step));
        if (first_nonfinite_param(name, sizeof name, &model, &opt))
            user_error("training diverged at step %d (learning rate %g) in the update: the loss "
                       "and the gradients were finite (norm %g), AdamW's update made tensor %s "
                       "not finite. Lower training.learning_rate; nothing of this step was saved",
                       step, learning_rate_at(&cfg, step), norm, name);
        if (sharded) zero_after_step(&zero);
        trace_end(EV_OPTIMIZER, -1, -1, optimizer_start);
        loss = average_loss_across_dp_cp_ranks(loss, model.scalar, &pgm.cp_dp);
        float aux = moe_step_aux_loss(&model); // the load-balancing loss; the loss stays the CE
        char domains[4096] = "";
        if (cfg.dataset_domains) domain_losses_step(&domain_losses, step);
        if (cfg.dataset_domains && metrics) // the metrics line's members, where it is written
            domain_losses_json(domains, sizeof domains, &domain_losses);
        device_synchronize();
        trace_step_end();
        double seconds = now_seconds() - start;
        tokens_seen += tokens_per_step;
        steps_run++;
        if (logger)
            log_step(&model, step, loss, tokens_per_step, tokens_seen, seconds, pgm.world_size,
                     peak);
        if (metrics)
            metrics_write(metrics, step, loss, tokens_seen, seconds, norm,
                          cfg.num_experts > 0 ? &aux : NULL, domains);
        int save = cfg.save_frequency > 0 && step % cfg.save_frequency == 0;
        if (stop[0] && cfg.save_dir[0] && cfg.save_frequency == 0)
            checkpoint_lock(cfg.save_dir, &pgm); // saving for the first time
        if ((save || stop[0]) && cfg.save_dir[0])
            zero_unshard_params(&zero), checkpoint_save(&model, &opt, step),
                zero_reshard_params(&zero);
        if (stop[0]) {
            if (pgm.global_rank == 0 && cfg.save_dir[0])
                printf("stopped by signal %d after step %d: saved %s/%d; to continue, set "
                       "checkpoint.load_path = \"%s\" and run again\n",
                       stop[0], step, cfg.save_dir, step, cfg.save_dir);
            else if (pgm.global_rank == 0)
                printf("stopped by signal %d after step %d: checkpoint.save_dir is empty, nothing "
                       "saved\n",
                       stop[0], step);
            break;
        }
    }
    if (logger && pgm.cp_dp.size > 1 && !cfg.dp_naive && zero.stage < 2)
        printf("[rank %d] data parallel: %d bucket %s of %d started during backward\n",
               pgm.global_rank, dp.started_during_backward,
               sharded ? "reduce-scatters" : "all-reduces", dp.num_buckets * steps_run);
    if (logger) moe_report(&model);
    if (logger) zero_report(&zero, steps_run);
    if (logger && cfg.dataset_domains) domain_losses_report(&domain_losses, cfg.save_dir);
    if (pgm.tp_rank == 0 && pgm.cp_rank == 0 && pgm.dp_rank == 0 && cfg.pp_size > 1)
        printf("[rank %d] pipeline stage %d: peak %d activation slots in use, %d allocated\n",
               pgm.global_rank, pgm.pp_rank, model.peak_slots_in_use, model.num_slots);
    double dp_hidden = dp.in_flight_seconds > 0 ? dp.overlapped_seconds / dp.in_flight_seconds : 0;
    RankMemory memory = {.params = (opt.params_compact ? opt.num_params : model.num_params) * 4.0,
                         .grads = (opt.grads_compact ? opt.num_params : model.num_params) * 4.0,
                         .optimizer = 2.0 * opt.num_params * sizeof(float),
                         .gathered = zero.peak_buffer_bytes,
                         .activations_peak =
                             model_activation_bytes(&model, model.peak_slots_in_use) +
                             pipe.buffer_bytes,
                         .allocated_peak = device_allocated_peak()};
    trace_finish(&memory, dp_hidden,
                 cfg.dp_naive
                     ? "naive"
                     : (const char *[]){"bucketed", "ZeRO-1", "ZeRO-2", "ZeRO-3"}[cfg.zero_stage],
                 cfg.gradient_accumulation_steps, cfg.pp_engine, cfg.pp_virtual_stages);
    if (metrics) metrics_close(metrics);
    pipeline_parallel_free(&pipe);
    if (cfg.sequence_parallel) sequence_parallel_free(&sp);
    if (sharded) zero_free(&zero);
    if (!sharded && pgm.ep_size > 1) expert_parallel_buckets_free(&experts);
    data_parallel_free(&dp);
    micro_batch_loader_free(&loader);
    optimizer_free(&opt);
    model_free(&model);
    free(positions);
    if (cfg.dataset_domains) domain_losses_free(&domain_losses);
    if (cfg.dataset_domains)
        domain_mixture_free(&mixture);
    else
        dataset_free(&ds);
    process_group_manager_free(&pgm);
    mpi_finalize_watched(cfg.timeout_s);
    return 0;
}
