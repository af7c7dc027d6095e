// Checkpoints: Hugging Face safetensors of the full tensors, each rank's blocks at their offsets,
// committed by one rename; and Hugging Face weights read the same way.
#include "checkpoint.h"
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include "backend/backend.h"
#include "checkpoint_tokenizer.h"
#include "safetensors.h"
#include "utils.h"

// the three flat buffers of a checkpoint: the parameters, then AdamW's two moments
enum { NUM_PARTS = 3 };
static const struct {
    const char *file, *suffix;
} PARTS[NUM_PARTS] = {{"model.safetensors", ""},
                      {"optimizer.safetensors", ".exp_avg"},
                      {"optimizer.safetensors", ".exp_avg_sq"}};

static uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

// A tensor's checksum that ranks holding disjoint blocks of it can add up: each element's bits
// hashed with its index in the full tensor, summed mod 2^64. Any flipped bit changes it. The same
// pass clears *finite at an inf or a NaN: no checkpoint is written or read with one.
static uint64_t checksum_block(const float *block, const ParamInfo *p, int *finite) {
    uint64_t sum = 0;
    for (int r = 0; r < p->rows; r++)
        for (int c = 0; c < p->cols; c++) {
            uint32_t bits;
            memcpy(&bits, &block[(size_t)r * p->cols + c], sizeof bits);
            uint64_t index = (uint64_t)(p->row0 + r) * p->global_cols + p->col0 + c;
            sum += splitmix64(index << 32 | bits);
            *finite &= (bits & 0x7f800000u) != 0x7f800000u; // exponent all ones: inf or NaN
        }
    return sum;
}

// The rank that writes p's block, and counts it in the checksum: one copy of every element in the
// job (the first dp and cp replica; one tp rank for the norms; the first stage's tied embedding;
// for an expert's tensor, the rank of the first ep group that holds it)
static int owns_block(const Model *model, const ParamInfo *p) {
    int replica = p->expert ? model->pgm->dp_rank / model->pgm->ep_size : model->pgm->dp_rank;
    return replica == 0 && model->pgm->cp_rank == 0 && model_param_counts_once(model, p);
}

// Does this rank write p's elements of this part, and count them in the checksum? The moments
// under ZeRO-1 are each rank's own (its shard of every tensor that counts once); else owns_block.
static int writes_block(const Model *model, const Optimizer *opt, const ParamInfo *p, int part) {
    if (part > 0 && opt && opt->sharded) return model_param_counts_once(model, p);
    return owns_block(model, p);
}

// The elements of p's block this rank keeps in one part's buffer, as blocks of whole or partial
// rows of p's tensor, each block's offset its place in that buffer; returns how many (at most 3 *
// opt->num_ranges). The parameters hold p whole at p->offset. The moments hold the ranges of the
// flat buffer that opt updates, back to back: the whole buffer (one block, p itself), or ZeRO-1's
// shard, which may cut p anywhere, mid-row included.
static int part_blocks(ParamInfo *out, const ParamInfo *p, const Optimizer *opt, int part) {
    if (part == 0 || !opt) {
        out[0] = *p;
        return 1;
    }
    size_t lo = p->offset, hi = lo + (size_t)p->rows * p->cols, moments = 0, cols = p->cols;
    int n = 0;
    for (int r = 0; r < opt->num_ranges; moments += opt->size[r], r++) {
        size_t first = lo > opt->start[r] ? lo : opt->start[r];
        size_t end = hi < opt->start[r] + opt->size[r] ? hi : opt->start[r] + opt->size[r];
        if (first >= end) continue; // p and this range do not meet
        // element k of p's block, in row-major order, from first - lo to end - lo
        for (size_t k = first - lo, k_end = end - lo, take; k < k_end; k += take) {
            ParamInfo b = *p;
            b.row0 = p->row0 + (int)(k / cols);
            b.col0 = p->col0 + (int)(k % cols);
            if (k % cols != 0 || k_end - k < cols) { // a part of one row
                take = cols - k % cols < k_end - k ? cols - k % cols : k_end - k;
                b.rows = 1;
                b.cols = (int)take;
            } else { // whole rows
                b.rows = (int)((k_end - k) / cols);
                take = (size_t)b.rows * cols;
            }
            b.offset = moments + (lo + k - opt->start[r]);
            out[n++] = b;
        }
    }
    return n;
}

static int full_index(const ParamInfo *full, int n, const char *name) {
    int j = param_table_find(full, n, name);
    if (j < 0)
        FAIL("a tensor of this rank is not in the whole model's table", "unknown tensor %s", name);
    return j;
}

// p's tensor (of the given part) in whichever file holds it, its shape checked against p's (the
// rows without the vocabulary's padding)
static const SafetensorsTensor *find_tensor(const SafetensorsFile **file,
                                            const SafetensorsFile *files, int num_files,
                                            const ParamInfo *p, int part) {
    char name[160];
    snprintf(name, sizeof name, "%s%s", p->name, PARTS[part].suffix);
    for (int i = 0; i < num_files; i++) {
        const SafetensorsTensor *t = safetensors_find(&files[i], name);
        if (!t) continue;
        if (t->rows != p->file_rows || t->cols != p->global_cols)
            user_error("checkpoint error: %s holds %s as %ld x %ld, this config's is %d x %d (the "
                       "architecture must match)",
                       files[i].path, name, t->rows, t->cols, p->file_rows, p->global_cols);
        *file = &files[i];
        return t;
    }
    user_error("checkpoint error: %s has no tensor %s (saved from another architecture?)",
               files[0].path, name);
}

// The part of block b that a checkpoint holds, in place: its rows less the vocabulary's padding
// (vocab_padding.c), which is never written, and read as zeros. 0: none of it.
static int clip_to_file(ParamInfo *b) {
    b->rows = param_rows_in_file(b);
    return b->rows > 0;
}

// reads this rank's elements of every tensor of one part into host (the part's buffer: the
// parameters, or opt's moments; opt NULL: every element of p at p->offset, the padding's zeros
// left as host holds them); with sums, adds the
// checksum of each block this rank writes at its whole-model index. *nonfinite: lowered to
// part * n + that index for a tensor holding an inf or a NaN (the caller starts it at 3n).
static void read_part(float *host, const Model *model, const Optimizer *opt,
                      const SafetensorsFile *files, int num_files, int part, uint64_t *sums,
                      const ParamInfo *full, int n, int *nonfinite) {
    ParamInfo *blocks = xmalloc(3 * (opt ? opt->num_ranges : 1) * sizeof(ParamInfo));
    for (int i = 0; i < model->num_tensors; i++) {
        const ParamInfo *p = &model->table[i];
        const SafetensorsFile *f;
        const SafetensorsTensor *t = find_tensor(&f, files, num_files, p, part);
        int count = part_blocks(blocks, p, opt, part);
        for (int k = 0; k < count; k++) {
            if (!clip_to_file(&blocks[k])) continue;
            safetensors_read_block(host + blocks[k].offset, f, t, &blocks[k]);
            int finite = 1, j = full_index(full, n, p->name);
            uint64_t sum = checksum_block(host + blocks[k].offset, &blocks[k], &finite);
            if (sums && writes_block(model, opt, p, part)) sums[part * n + j] += sum;
            if (!finite && part * n + j < *nonfinite) *nonfinite = part * n + j;
        }
    }
    free(blocks);
}

void checkpoint_read_config(Config *cfg, const char *folder, const char *who) {
    char file[1100];
    snprintf(file, sizeof file, "%s/config.json", folder);
    config_read_hf(cfg, folder, who);
    // the architecture alone, under a one-rank layout: the run's layout is config_load's to check
    Config one = *cfg;
    one.tp_size = one.cp_size = one.pp_size = one.dp_size = one.ep_size = 1;
    one.pp_virtual_stages = one.micro_batch_size = one.seq_length = 1;
    one.cp_zigzag = one.sequence_parallel = one.zero1 = one.zero_stage = one.dp_naive = 0;
    config_validate_file(&one, file);
}

// The architecture keys that change the numbers must match; one line names the first that does not
static void check_architecture(const Config *cfg, const char *folder, const char *who) {
    Config saved = *cfg;
    checkpoint_read_config(&saved, folder, who);
    // a mixture of experts has no dense MLP: its config.json's intermediate_size is the experts'
    // (Mixtral's), compared as moe_intermediate_size
    if (cfg->num_experts > 0 && saved.num_experts > 0)
        saved.intermediate_size = cfg->intermediate_size;
    const struct {
        const char *key;
        double saved, current;
    } keys[] = {
        {"hidden_size", saved.hidden_size, cfg->hidden_size},
        {"intermediate_size", saved.intermediate_size, cfg->intermediate_size},
        {"num_hidden_layers", saved.num_hidden_layers, cfg->num_hidden_layers},
        {"num_attention_heads", saved.num_attention_heads, cfg->num_attention_heads},
        {"num_key_value_heads", saved.num_key_value_heads, cfg->num_key_value_heads},
        {"vocab_size", saved.vocab_size, cfg->vocab_size},
        {"tie_word_embeddings", saved.tie_word_embeddings, cfg->tie_word_embeddings},
        {"rope_theta", saved.rope_theta, cfg->rope_theta},
        {"rms_norm_eps", saved.rms_norm_eps, cfg->rms_norm_eps},
        {"num_experts", saved.num_experts, cfg->num_experts},
        {"num_experts_per_tok", saved.num_experts_per_tok, cfg->num_experts_per_tok},
        {"moe_intermediate_size", saved.moe_intermediate_size, cfg->moe_intermediate_size},
        {"model_type mamba", config_is_mamba(&saved), config_is_mamba(cfg)},
        {"state_size", saved.state_size, cfg->state_size},
        {"expand", saved.expand, cfg->expand},
        {"conv_kernel", saved.conv_kernel, cfg->conv_kernel},
        {"time_step_rank", config_time_step_rank(&saved), config_time_step_rank(cfg)},
        {"use_conv_bias", saved.use_conv_bias, cfg->use_conv_bias},
        {"layer_norm_epsilon", saved.layer_norm_epsilon, cfg->layer_norm_epsilon},
    };
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
        if (keys[k].saved != keys[k].current)
            user_error("checkpoint error: %s has %s = %g, this config has %g (the architecture "
                       "must match: ./create_config --model_config %s writes a config with it)",
                       folder, keys[k].key, keys[k].saved, keys[k].current, folder);
}

// the architecture in 16 hex digits, kept in state.json beside config.json's keys
static void architecture_fingerprint(char out[17], const Config *c) {
    char text[256];
    // a mixture of experts: the experts' size, as its config.json names intermediate_size
    int mlp = c->num_experts > 0 ? c->moe_intermediate_size : c->intermediate_size;
    snprintf(text, sizeof text, "llama %d %d %d %d %d %d %d %.9g %.9g", c->hidden_size, mlp,
             c->num_hidden_layers, c->num_attention_heads, c->num_key_value_heads, c->vocab_size,
             c->tie_word_embeddings, c->rope_theta, c->rms_norm_eps);
    if (c->num_experts > 0) // a dense model's fingerprint stays what it was
        snprintf(text + strlen(text), sizeof text - strlen(text), " moe %d %d %d", c->num_experts,
                 c->num_experts_per_tok, c->moe_intermediate_size);
    if (config_is_mamba(c)) // a Llama's fingerprint stays what it was
        snprintf(text + strlen(text), sizeof text - strlen(text), " mamba %d %d %d %d %d %.9g",
                 c->state_size, c->expand, c->conv_kernel, config_time_step_rank(c),
                 c->use_conv_bias, c->layer_norm_epsilon);
    snprintf(out, 17, "%016llx", (unsigned long long)hash_string(text));
}

static long samples_per_step(const Config *c) {
    return (long)c->micro_batch_size * c->gradient_accumulation_steps * c->dp_size;
}

// ---------------------------------------------------------------------------------------------
// files that are whole or absent

static void write_synced(const char *path, const char *text) {
    if (write_whole_file(path, text, strlen(text)) != 0)
        FAIL("is the disk full? checkpoint.save_dir must stay writable", "cannot write %s: %s",
             path, strerror(errno));
}

static void sync_dir(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY);
    if (fd < 0 || fsync(fd) != 0 || close(fd) != 0)
        FAIL("checkpoint.save_dir must stay writable", "cannot sync %s: %s", path, strerror(errno));
}

// a checkpoint folder and its files (checkpoints hold no subfolders)
static void remove_checkpoint_dir(const char *path) {
    DIR *d = opendir(path);
    if (!d) return;
    char file[1400];
    for (struct dirent *e; (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(file, sizeof file, "%s/%s", path, e->d_name);
            if (unlink(file) != 0) FAIL("check its permissions", "cannot remove %s", file);
        }
    closedir(d);
    if (rmdir(path) != 0) FAIL("check its permissions", "cannot remove %s", path);
}

static int lock_fd = -1;

// rank 0: why save_dir cannot be this run's, or "" once it holds the lock
static void take_lock(char *why, size_t size, const char *save_dir) {
    char path[1100];
    snprintf(path, sizeof path, "%s/.lock", save_dir);
    if (make_dirs(save_dir) != 0 || (lock_fd = open(path, O_RDWR | O_CREAT, 0644)) < 0) {
        snprintf(why, size,
                 "checkpoint error: cannot write in checkpoint.save_dir %s: %s (name a folder you "
                 "can write)",
                 save_dir, strerror(errno));
        return;
    }
    // flock, not a pid file: the kernel lets go when the holder dies, even by kill -9
    if (flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
        char owner[256] = "";
        ssize_t got = pread(lock_fd, owner, sizeof owner - 1, 0);
        owner[got > 0 ? got : 0] = '\0';
        owner[strcspn(owner, "\n")] = '\0';
        snprintf(why, size,
                 "checkpoint error: checkpoint.save_dir %s is in use by another run (%s); let it "
                 "finish, or set another save_dir",
                 save_dir, owner[0] ? owner : "owner unknown");
        return;
    }
    char host[128] = "unknown", text[200];
    gethostname(host, sizeof host - 1);
    int len = snprintf(text, sizeof text, "host %s pid %d\n", host, (int)getpid());
    if (ftruncate(lock_fd, 0) != 0 || pwrite(lock_fd, text, len, 0) != len)
        snprintf(why, size, "checkpoint error: cannot write %s: %s (is the disk full?)", path,
                 strerror(errno));
}

// rank 0: why save_dir cannot be written, or "": a folder made and removed in it, or in the
// nearest folder above it that exists (nothing is left behind, save_dir itself is not made)
static void probe_writable(char *why, size_t size, const char *save_dir) {
    char parent[1024], probe[1100];
    struct stat st;
    snprintf(parent, sizeof parent, "%s", save_dir);
    while (stat(parent, &st) != 0) {
        char *slash = strrchr(parent, '/');
        if (!slash)
            snprintf(parent, sizeof parent, ".");
        else if (slash == parent)
            parent[1] = '\0';
        else
            *slash = '\0';
    }
    snprintf(probe, sizeof probe, "%s/.picotron-probe-XXXXXX", parent);
    errno = ENOTDIR;
    if (!S_ISDIR(st.st_mode) || !mkdtemp(probe) || rmdir(probe) != 0)
        snprintf(why, size,
                 "checkpoint error: cannot write in checkpoint.save_dir %s: %s (name a folder you "
                 "can write)",
                 save_dir, strerror(errno));
}

// every rank exits, rank 0 saying why, when rank 0 found a reason
static void agree(const char *why, ProcessGroupManager *pgm) {
    int failed = why[0] != '\0';
    all_reduce_host(&failed, 1, MPI_INT, MPI_MAX, &pgm->world);
    if (failed) user_error("%s", why); // rank 0 knows why and says it; all exit
}

void checkpoint_lock(const char *save_dir, ProcessGroupManager *pgm) {
    char why[1400] = "";
    if (pgm->global_rank == 0) take_lock(why, sizeof why, save_dir);
    agree(why, pgm);
}

void checkpoint_check_writable(const char *save_dir, ProcessGroupManager *pgm) {
    char why[1400] = "";
    if (pgm->global_rank == 0) probe_writable(why, sizeof why, save_dir);
    agree(why, pgm);
}

// ---------------------------------------------------------------------------------------------
// saving

// rank 0: a fresh <step>.tmp/ with both files' headers (every tensor's place), the tokenizer's
// files and config.json; returns the tokenizer, for state.json
static CheckpointTokenizer begin_save(const char *tmp, const ParamInfo *full, int n,
                                      const Config *cfg) {
    remove_checkpoint_dir(tmp); // what a killed save left
    if (make_dirs(tmp) != 0)
        FAIL("set checkpoint.save_dir to a folder you can write", "cannot create %s: %s", tmp,
             strerror(errno));
    // model.safetensors takes the n parameters; optimizer.safetensors the n first moments, then
    // the n second moments: each file is made once its entries are filled in
    SafetensorsEntry *entries = xmalloc(2 * n * sizeof(SafetensorsEntry));
    char path[1100];
    for (int part = 0; part < NUM_PARTS; part++) {
        int first = part == 2 ? n : 0;
        for (int j = 0; j < n; j++) {
            SafetensorsEntry *e = &entries[first + j];
            *e = (SafetensorsEntry){.rows = full[j].file_rows,
                                    .cols = full[j].global_cols,
                                    .ndim = full[j].conv_shape       ? 3 // (rows, 1, cols)
                                            : full[j].file_rows == 1 ? 1 // norms are 1-D
                                                                     : 2};
            snprintf(e->name, sizeof e->name, "%s%s", full[j].name, PARTS[part].suffix);
        }
        if (part == 1) continue; // its file waits for the second moments
        snprintf(path, sizeof path, "%s/%s", tmp, PARTS[part].file);
        safetensors_create(path, entries, part == 0 ? n : 2 * n);
    }
    free(entries);
    CheckpointTokenizer tokenizer = checkpoint_tokenizer_save(tmp, cfg);
    Config hf = *cfg;
    hf.bos_token_id = hf.eos_token_id = tokenizer.eos;
    snprintf(path, sizeof path, "%s/config.json", tmp);
    if (config_save_hf(&hf, path) != 0)
        FAIL("is the disk full?", "cannot write %s: %s", path, strerror(errno));
    return tokenizer;
}

// rank 0, once every rank's blocks are on disk: state.json, then the rename that makes it real
static void commit_save(const char *dir, const char *tmp, int step, const Model *model,
                        const Optimizer *opt, const ParamInfo *full, int n, const uint64_t *sums,
                        const CheckpointTokenizer *tokenizer) {
    const Config *c = &model->cfg;
    char fingerprint[17], hex[17], path[1100];
    architecture_fingerprint(fingerprint, c);
    cJSON *s = cJSON_CreateObject();
    cJSON_AddStringToObject(s, "format", "picotron.c checkpoint 1");
    cJSON_AddNumberToObject(s, "step", step);
    cJSON_AddNumberToObject(s, "tokens_seen", (double)step * samples_per_step(c) * c->seq_length);
    cJSON_AddNumberToObject(s, "samples_seen", (double)step * samples_per_step(c));
    cJSON_AddNumberToObject(s, "samples_per_step", samples_per_step(c));
    cJSON_AddNumberToObject(s, "seed", c->seed);
    cJSON_AddNumberToObject(s, "optimizer_step", opt->step);
    cJSON *layout = cJSON_AddObjectToObject(s, "layout");
    cJSON_AddNumberToObject(layout, "dp_size", c->dp_size);
    cJSON_AddNumberToObject(layout, "tp_size", c->tp_size);
    cJSON_AddNumberToObject(layout, "pp_size", c->pp_size);
    cJSON_AddNumberToObject(layout, "cp_size", c->cp_size);
    cJSON_AddNumberToObject(layout, "ep_size", c->ep_size);
    cJSON_AddBoolToObject(layout, "cp_zigzag", c->cp_zigzag);
    cJSON_AddStringToObject(s, "architecture_fingerprint", fingerprint);
    if (tokenizer->fingerprint) { // ./generate checks its tokenizer against it
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)tokenizer->fingerprint);
        cJSON_AddStringToObject(s, "tokenizer_fingerprint", hex);
    }
    cJSON *checksums = cJSON_AddObjectToObject(s, "checksums");
    for (int part = 0; part < NUM_PARTS; part++) {
        cJSON *file = cJSON_GetObjectItemCaseSensitive(checksums, PARTS[part].file);
        if (!file) file = cJSON_AddObjectToObject(checksums, PARTS[part].file);
        for (int j = 0; j < n; j++) {
            snprintf(path, sizeof path, "%s%s", full[j].name, PARTS[part].suffix);
            snprintf(hex, sizeof hex, "%016llx", (unsigned long long)sums[part * n + j]);
            cJSON_AddStringToObject(file, path, hex);
        }
    }
    char *text = cJSON_Print(s);
    cJSON_Delete(s);
    snprintf(path, sizeof path, "%s/state.json", tmp);
    write_synced(path, text);
    free(text);

    snprintf(path, sizeof path, "%s.old", dir); // a checkpoint of the same step, saved before
    remove_checkpoint_dir(path);
    if (rename(dir, path) != 0 && errno != ENOENT)
        FAIL("check checkpoint.save_dir's permissions", "cannot move %s aside", dir);
    if (rename(tmp, dir) != 0)
        FAIL("check checkpoint.save_dir's permissions", "cannot rename %s to %s: %s", tmp, dir,
             strerror(errno));
    remove_checkpoint_dir(path);
    sync_dir(c->save_dir);
    char latest[1100], tmp_latest[1100], number[32];
    snprintf(latest, sizeof latest, "%s/latest", c->save_dir);
    snprintf(tmp_latest, sizeof tmp_latest, "%s/latest.tmp", c->save_dir);
    snprintf(number, sizeof number, "%d\n", step);
    write_synced(tmp_latest, number);
    if (rename(tmp_latest, latest) != 0)
        FAIL("check checkpoint.save_dir's permissions", "cannot rename %s", tmp_latest);
    sync_dir(c->save_dir);
}

static int by_step_descending(const void *a, const void *b) {
    return *(const int *)b - *(const int *)a;
}

// The step folders of save_dir (names all digits, at most 9 of them) into steps, those of steps
// after `after` only; returns how many (at most max)
static int step_folders(int *steps, int max, const char *save_dir, int after) {
    DIR *d = opendir(save_dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d)) && n < max;) {
        size_t len = strlen(e->d_name);
        if (len && len <= 9 && strspn(e->d_name, "0123456789") == len && atoi(e->d_name) > after)
            steps[n++] = atoi(e->d_name);
    }
    if (d) closedir(d);
    qsort(steps, n, sizeof(int), by_step_descending);
    return n;
}

// Keeps the newest keep_last checkpoints up to step, the one just written (which latest names);
// folders of later steps, which a run resumed from an earlier checkpoint finds, are never removed
// here (checkpoint_load says so at start-up)
static void keep_newest(const char *save_dir, int keep_last, int step) {
    if (keep_last <= 0) return;
    int steps[4096], n = step_folders(steps, 4096, save_dir, 0);
    char path[1100];
    // newest first: step itself is the first of those up to it, so it is always kept
    for (int i = 0, kept = 0; i < n; i++) {
        if (steps[i] > step || kept++ < keep_last) continue;
        snprintf(path, sizeof path, "%s/%d", save_dir, steps[i]);
        remove_checkpoint_dir(path);
    }
}

void checkpoint_save(const Model *model, const Optimizer *opt, int step) {
    const Config *cfg = &model->cfg;
    ProcessGroupManager *pgm = model->pgm;
    char dir[1024], tmp[1040], path[1100];
    snprintf(dir, sizeof dir, "%s/%d", cfg->save_dir, step);
    snprintf(tmp, sizeof tmp, "%s.tmp", dir);
    double start = now_seconds();
    int n = 0;
    ParamInfo *full = model_full_table(cfg, &n);
    CheckpointTokenizer tokenizer = {0};
    if (pgm->global_rank == 0) tokenizer = begin_save(tmp, full, n, cfg);
    barrier(&pgm->world);

    uint64_t *sums = xmalloc(NUM_PARTS * n * sizeof(uint64_t));
    float *host = xmalloc(model->num_params * sizeof(float));
    ParamInfo *blocks = xmalloc(3 * opt->num_ranges * sizeof(ParamInfo));
    const float *buffers[NUM_PARTS] = {model->params, opt->m, opt->v};
    // the other data- and context-parallel replicas hold copies: they copy and write nothing,
    // except each one's shard of the moments under ZeRO-1
    int writer = pgm->dp_rank < pgm->ep_size && pgm->cp_rank == 0; // the first ep group's
    int nonfinite = NUM_PARTS * n; // the first tensor (part * n + index) with an inf or a NaN
    for (int part = 0; part < NUM_PARTS; part++) {
        if (!writer && !(part > 0 && opt->sharded)) continue;
        size_t floats = part == 0 ? model->num_params : opt->num_params;
        device_to_host(host, buffers[part], floats * sizeof(float));
        SafetensorsFile f;
        snprintf(path, sizeof path, "%s/%s", tmp, PARTS[part].file);
        safetensors_open(&f, path, 1);
        for (int i = 0; i < model->num_tensors; i++) {
            const ParamInfo *p = &model->table[i];
            if (!writes_block(model, opt, p, part)) continue;
            const SafetensorsFile *unused;
            const SafetensorsTensor *t = find_tensor(&unused, &f, 1, p, part);
            int count = part_blocks(blocks, p, opt, part);
            for (int k = 0; k < count; k++) {
                if (!clip_to_file(&blocks[k])) continue;
                safetensors_write_block(&f, t, host + blocks[k].offset, &blocks[k]);
                int finite = 1, j = part * n + full_index(full, n, p->name);
                sums[j] += checksum_block(host + blocks[k].offset, &blocks[k], &finite);
                if (!finite && j < nonfinite) nonfinite = j;
            }
        }
        safetensors_close(&f); // synced
    }
    free(blocks);
    // tests/t_59 dies here, the files written but not committed, as a node failure would
    const char *kill_rank = test_switch("KILL_RANK_IN_SAVE");
    if (kill_rank && atoi(kill_rank) == pgm->global_rank) raise(SIGKILL);
    // once the sums are in, every rank's blocks are on disk
    all_reduce_host(sums, NUM_PARTS * n, MPI_UINT64_T, MPI_SUM, &pgm->world);
    all_reduce_host(&nonfinite, 1, MPI_INT, MPI_MIN, &pgm->world);
    if (nonfinite < NUM_PARTS * n) { // latest keeps naming the last finite checkpoint
        if (pgm->global_rank == 0) remove_checkpoint_dir(tmp);
        user_error("checkpoint error: refusing to save step %d: tensor %s%s holds an inf or a "
                   "NaN (%s/latest still names the last complete, finite checkpoint)",
                   step, full[nonfinite % n].name, PARTS[nonfinite / n].suffix, cfg->save_dir);
    }
    if (pgm->global_rank == 0) {
        commit_save(dir, tmp, step, model, opt, full, n, sums, &tokenizer);
        keep_newest(cfg->save_dir, cfg->keep_last, step);
    }
    barrier(&pgm->world);
    if (pgm->global_rank == 0) {
        double floats = 0;
        for (int j = 0; j < n; j++) floats += (double)full[j].file_rows * full[j].global_cols;
        printf("[rank 0] checkpoint %s: %.1f MB in %.2f s\n", dir,
               NUM_PARTS * floats * sizeof(float) / 1e6, now_seconds() - start);
        fflush(stdout);
    }
    free(host);
    free(sums);
    free(full);
}

// ---------------------------------------------------------------------------------------------
// loading

int checkpoint_latest(char *dir, size_t size, const char *save_dir) {
    char file[1100];
    snprintf(file, sizeof file, "%s/latest", save_dir);
    char *latest = read_whole_file(file, NULL);
    if (!latest && errno != ENOENT && errno != ENOTDIR)
        user_error("checkpoint error: %s %s", file, file_error());
    if (!latest) return 0;
    // a step number and a newline, as commit_save writes it
    char *end = latest;
    long step = strtol(latest, &end, 10);
    int whole =
        end != latest && latest[0] != '-' && latest[0] != '+' && strspn(end, "\n") == strlen(end);
    latest[strcspn(latest, "\n")] = '\0'; // the message stays one line
    if (!whole || step < 1 || step > 1 << 30)
        user_error("checkpoint error: %s holds \"%.20s\", not a step from 1 to 2^30 (it names the "
                   "newest <step> folder beside it: write that step, or remove the file)",
                   file, latest);
    snprintf(dir, size, "%s/%ld", save_dir, step);
    free(latest);
    return 1;
}

// path itself, or the checkpoint a save_dir's latest names; 0 when path is this run's save_dir
// and it holds no checkpoint yet
static int find_checkpoint(char *dir, size_t size, const char *path, const Config *cfg) {
    struct stat st;
    char file[1100];
    snprintf(file, sizeof file, "%s/state.json", path);
    if (stat(file, &st) == 0) return snprintf(dir, size, "%s", path), 1;
    if (checkpoint_latest(dir, size, path)) {
        if (stat(dir, &st) != 0)
            user_error("checkpoint error: %s/latest names %s, which is not there (removed by "
                       "hand? write the newest step folder's number into latest)",
                       path, dir);
        return 1;
    }
    if (strcmp(path, cfg->save_dir) == 0 && (stat(path, &st) != 0 || S_ISDIR(st.st_mode))) return 0;
    user_error("checkpoint error: %s holds no complete checkpoint (no state.json, no latest): "
               "checkpoint.load_path names a <save_dir>/<step> folder or a save_dir",
               path);
}

// state.json's obj.key (section: "" or "layout."), a whole number in [lo, hi]; else one line
// naming the file, the key and the range
static long state_int(const cJSON *obj, const char *section, const char *key, const char *file,
                      double lo, double hi) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!cJSON_IsNumber(item))
        user_error("checkpoint error: %s has no number %s%s (save it again, or resume from an "
                   "earlier checkpoint)",
                   file, section, key);
    double v = item->valuedouble;
    if (!(v >= lo && v <= hi) || v != floor(v))
        user_error("checkpoint error: %s: %s%s = %.17g is not a whole number from %.0f to %.0f "
                   "(the file was edited or damaged: resume from an earlier checkpoint)",
                   file, section, key, v, lo, hi);
    return (long)v;
}

// state.json's numbers, each in its range: the step, AdamW's step, the batch, the layout
static void read_state(const cJSON *state, const char *file, int *step, int *optimizer_step,
                       long *samples) {
    const cJSON *format = cJSON_GetObjectItemCaseSensitive(state, "format");
    if (!cJSON_IsString(format) || strcmp(format->valuestring, "picotron.c checkpoint 1") != 0)
        user_error("checkpoint error: %s: format is not \"picotron.c checkpoint 1\" (not a "
                   "picotron.c checkpoint, or a newer one)",
                   file);
    *step = (int)state_int(state, "", "step", file, 1, 1 << 30);
    *optimizer_step = (int)state_int(state, "", "optimizer_step", file, 0, *step);
    *samples = state_int(state, "", "samples_per_step", file, 1, 0x1p53);
    // the counts are the step's: a file that disagrees with itself was edited
    long seen = *step * *samples;
    state_int(state, "", "samples_seen", file, seen, seen);
    state_int(state, "", "tokens_seen", file, 0, 0x1p53);
    state_int(state, "", "seed", file, INT_MIN, INT_MAX);
    const cJSON *layout = cJSON_GetObjectItemCaseSensitive(state, "layout");
    const char *sizes[] = {"dp_size", "tp_size", "pp_size", "cp_size", "ep_size"};
    for (int i = 0; i < 5; i++) state_int(layout, "layout.", sizes[i], file, 1, 1 << 20);
}

// rank 0: one line when save_dir holds checkpoints of steps after the one this run resumes from
static void note_later_steps(const char *save_dir, int step) {
    int later[4096], n = step_folders(later, 4096, save_dir, step);
    if (n > 0)
        printf("note: %s holds %d checkpoint%s of later steps than %d (the newest %d): kept; this "
               "run's saves of the same steps replace them, and keep_last never removes them\n",
               save_dir, n, n == 1 ? "" : "s", step, later[0]);
}

int checkpoint_load(Model *model, Optimizer *opt, const char *path) {
    const Config *cfg = &model->cfg;
    char dir[1100], file[1200], fingerprint[17];
    if (!find_checkpoint(dir, sizeof dir, path, cfg)) return 0;
    snprintf(file, sizeof file, "%s/state.json", dir);
    size_t size = 0;
    char *text = read_whole_file(file, &size), where[1300];
    if (!text) user_error("checkpoint error: %s %s", file, file_error());
    snprintf(where, sizeof where, "checkpoint error: %s", file);
    cJSON *state = json_parse(text, size, NULL, where);
    free(text);
    if (!cJSON_IsObject(state))
        user_error("checkpoint error: %s is missing or damaged (an unfinished save? load_path = "
                   "the save_dir takes its latest complete checkpoint)",
                   file);
    int step, optimizer_step;
    long samples;
    read_state(state, file, &step, &optimizer_step, &samples);
    check_architecture(cfg, dir, "checkpoint error:");
    architecture_fingerprint(fingerprint, cfg);
    const cJSON *saved = cJSON_GetObjectItemCaseSensitive(state, "architecture_fingerprint");
    if (!cJSON_IsString(saved) || strcmp(saved->valuestring, fingerprint) != 0)
        user_error("checkpoint error: %s's architecture fingerprint differs from this config's "
                   "(its config.json was edited? or a mixture of experts saved before its "
                   "tensors took Mixtral's names, which this version does not read)",
                   file);
    if (opt && samples != samples_per_step(cfg)) // ./generate (no opt) continues no data
        user_error("checkpoint error: %s was trained with %ld samples per step, this config has "
                   "%ld: keep micro_batch_size x gradient_accumulation_steps x dp_size at %ld so "
                   "the data continues where it stopped",
                   dir, samples, samples_per_step(cfg), samples);

    SafetensorsFile files[2];
    for (int i = 0; i < 2; i++) {
        snprintf(file, sizeof file, "%s/%s", dir, PARTS[i].file);
        safetensors_open(&files[i], file, 0);
    }
    int n = 0;
    ParamInfo *full = model_full_table(cfg, &n);
    int nonfinite = NUM_PARTS * n;
    uint64_t *sums = xmalloc(NUM_PARTS * n * sizeof(uint64_t));
    float *host = xmalloc(model->num_params * sizeof(float));
    // without opt (./generate) the moments are read and checked, and kept nowhere
    float *buffers[NUM_PARTS] = {model->params, opt ? opt->m : NULL, opt ? opt->v : NULL};
    for (int part = 0; part < NUM_PARTS; part++) {
        size_t floats = part == 0 ? model->num_params : opt ? opt->num_params : 0;
        memset(host, 0, model->num_params * sizeof(float)); // the padding's rows read as zeros
        read_part(host, model, opt, &files[part ? 1 : 0], 1, part, sums, full, n, &nonfinite);
        if (buffers[part]) host_to_device(buffers[part], host, floats * sizeof(float));
    }
    all_reduce_host(sums, NUM_PARTS * n, MPI_UINT64_T, MPI_SUM, &model->pgm->world);
    all_reduce_host(&nonfinite, 1, MPI_INT, MPI_MIN, &model->pgm->world);
    const cJSON *checksums = cJSON_GetObjectItemCaseSensitive(state, "checksums");
    for (int part = 0; part < NUM_PARTS; part++)
        for (int j = 0; j < n; j++) {
            char name[160], hex[17];
            snprintf(name, sizeof name, "%s%s", full[j].name, PARTS[part].suffix);
            snprintf(hex, sizeof hex, "%016llx", (unsigned long long)sums[part * n + j]);
            const cJSON *want = cJSON_GetObjectItemCaseSensitive(
                cJSON_GetObjectItemCaseSensitive(checksums, PARTS[part].file), name);
            if (!cJSON_IsString(want) || strcmp(want->valuestring, hex) != 0)
                user_error("checkpoint error: %s/%s: tensor %s does not match its checksum (the "
                           "file is damaged; resume from an earlier checkpoint)",
                           dir, PARTS[part].file, name);
        }
    // checksums that match an inf or a NaN: saved so (by a version without this check), or crafted
    if (nonfinite < NUM_PARTS * n)
        user_error("checkpoint error: %s/%s: tensor %s%s holds an inf or a NaN: the input %s "
                   "not finite (resume from an earlier checkpoint)",
                   dir, PARTS[nonfinite / n].file, full[nonfinite % n].name,
                   PARTS[nonfinite / n].suffix,
                   nonfinite < n ? "weights are" : "optimizer moments are");
    if (opt) opt->step = optimizer_step; // AdamW's bias correction
    if (opt && cfg->save_dir[0] && model->pgm->global_rank == 0)
        note_later_steps(cfg->save_dir, step);
    for (int i = 0; i < 2; i++) safetensors_close(&files[i]);
    cJSON_Delete(state);
    free(host);
    free(sums);
    free(full);
    return step;
}

void checkpoint_init_from(Model *model, const char *folder) {
    check_architecture(&model->cfg, folder, "checkpoint.init_from");
    int num_files = 0, capacity = 1;
    SafetensorsFile *files = xmalloc(capacity * sizeof(SafetensorsFile));
    char path[1100];
    snprintf(path, sizeof path, "%s/model.safetensors", folder);
    if (access(path, F_OK) == 0) {
        safetensors_open(&files[num_files++], path, 0);
    } else {
        // a sharded model: the index maps each tensor to its file; every file is opened once
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", folder);
        size_t size = 0;
        char *text = read_whole_file(path, &size), where[1200];
        if (!text && errno != ENOENT && errno != ENOTDIR)
            user_error("checkpoint.init_from: %s %s", path, file_error());
        snprintf(where, sizeof where, "checkpoint.init_from: %s", path);
        cJSON *index = text ? json_parse(text, size, NULL, where) : NULL;
        free(text);
        const cJSON *map = cJSON_GetObjectItemCaseSensitive(index, "weight_map");
        if (!cJSON_IsObject(map))
            user_error("checkpoint.init_from %s has neither model.safetensors nor a "
                       "model.safetensors.index.json with a weight_map",
                       folder);
        for (const cJSON *e = map->child; e; e = e->next) {
            if (!cJSON_IsString(e))
                user_error("checkpoint.init_from: %s: weight_map.%s is not a file name", path,
                           e->string);
            char shard[1100];
            snprintf(shard, sizeof shard, "%s/%s", folder, e->valuestring);
            int seen = 0;
            for (int i = 0; i < num_files; i++) seen |= strcmp(files[i].path, shard) == 0;
            if (seen) continue;
            if (num_files == capacity) {
                files = realloc(files, (capacity *= 2) * sizeof(SafetensorsFile));
                if (!files) FAIL("", "out of memory opening %s's shards", folder);
            }
            safetensors_open(&files[num_files++], shard, 0);
        }
        cJSON_Delete(index);
    }
    float *host = xmalloc(model->num_params * sizeof(float));
    int n = 0;
    ParamInfo *full = model_full_table(&model->cfg, &n);
    int nonfinite = n;
    read_part(host, model, NULL, files, num_files, 0, NULL, full, n, &nonfinite);
    all_reduce_host(&nonfinite, 1, MPI_INT, MPI_MIN, &model->pgm->world);
    if (nonfinite < n)
        user_error("checkpoint.init_from %s: tensor %s holds an inf or a NaN: the input weights "
                   "are not finite (nothing was trained; fix or re-export them)",
                   folder, full[nonfinite].name);
    host_to_device(model->params, host, model->num_params * sizeof(float));
    free(full);
    free(host);
    for (int i = 0; i < num_files; i++) safetensors_close(&files[i]);
    free(files);
}
