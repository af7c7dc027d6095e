// Checkpoints of the flat buffers, one file per rank, with the table that names each range.
#include "checkpoint.h"
#include <errno.h>
#include <string.h>
#include "backend/backend.h"
#include "utils.h"

#define CHECKPOINT_MAGIC 0x50434b50u // "PCKP"

static void rank_path(char *path, size_t size, const char *dir, int rank) {
    snprintf(path, size, "%s/rank_%05d.bin", dir, rank);
}

void checkpoint_save(const Model *model, const Optimizer *opt, const char *dir, int step) {
    if (make_dirs(dir) != 0)
        FAIL("set checkpoint.save_dir to a folder you can write", "cannot create %s: %s", dir,
             strerror(errno));
    char path[1024];
    rank_path(path, sizeof path, dir, model->pgm->global_rank);
    FILE *f = xfopen(path, "wb");
    uint32_t header[4] = {CHECKPOINT_MAGIC, 1, (uint32_t)step, (uint32_t)model->num_tensors};
    xfwrite(header, sizeof header, 1, f);
    xfwrite(model->table, sizeof(ParamInfo), model->num_tensors, f);
    float *host = xmalloc(model->num_params * sizeof(float));
    const float *buffers[3] = {model->params, opt->m, opt->v};
    for (int i = 0; i < 3; i++) {
        device_to_host(host, buffers[i], model->num_params * sizeof(float));
        xfwrite(host, sizeof(float), model->num_params, f);
    }
    free(host);
    if (fclose(f) != 0) FAIL("is the disk full?", "cannot write %s", path);
}

int checkpoint_load(Model *model, Optimizer *opt, const char *dir) {
    char path[1024];
    rank_path(path, sizeof path, dir, model->pgm->global_rank);
    FILE *f = fopen(path, "rb");
    if (!f)
        user_error("checkpoint error: %s not found (checkpoint.load_path must be a folder "
                   "saved with the same layout)",
                   path);
    uint32_t header[4];
    xfread(header, sizeof header, 1, f);
    if (header[0] != CHECKPOINT_MAGIC || header[3] != (uint32_t)model->num_tensors)
        user_error("checkpoint error: %s is not a checkpoint of this model and layout", path);
    ParamInfo *table = xmalloc(header[3] * sizeof(ParamInfo));
    xfread(table, sizeof(ParamInfo), header[3], f);
    for (int i = 0; i < model->num_tensors; i++)
        if (strcmp(table[i].name, model->table[i].name) ||
            table[i].offset != model->table[i].offset)
            user_error("checkpoint error: %s holds %s where this layout has %s (use the same "
                       "dp/tp/pp/cp sizes)",
                       path, table[i].name, model->table[i].name);
    float *host = xmalloc(model->num_params * sizeof(float));
    float *buffers[3] = {model->params, opt->m, opt->v};
    for (int i = 0; i < 3; i++) {
        xfread(host, sizeof(float), model->num_params, f);
        host_to_device(buffers[i], host, model->num_params * sizeof(float));
    }
    free(host);
    free(table);
    fclose(f);
    opt->step = (int)header[2]; // AdamW's bias correction goes on from where it stopped
    return (int)header[2];
}

int checkpoint_read_file(CheckpointTensor **tensors, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    uint32_t header[4];
    xfread(header, sizeof header, 1, f);
    if (header[0] != CHECKPOINT_MAGIC) FAIL("not a picotron.c checkpoint", "bad magic in %s", path);
    int n = (int)header[3];
    *tensors = xmalloc(n * sizeof(CheckpointTensor));
    for (int i = 0; i < n; i++) xfread(&(*tensors)[i].info, sizeof(ParamInfo), 1, f);
    for (int i = 0; i < n; i++) {
        ParamInfo *p = &(*tensors)[i].info;
        size_t count = (size_t)p->rows * p->cols;
        (*tensors)[i].data = xmalloc(count * sizeof(float));
        if (fseek(f, sizeof header + n * sizeof(ParamInfo) + p->offset * sizeof(float), SEEK_SET))
            FAIL("the file is truncated", "cannot seek in %s", path);
        xfread((*tensors)[i].data, sizeof(float), count, f);
    }
    fclose(f);
    return n;
}
