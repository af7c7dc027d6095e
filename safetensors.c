// safetensors: the header in cJSON, the tensors by positioned reads and writes of one block.
#include "safetensors.h"
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "utils.h"

#define MAX_HEADER_BYTES (100 << 20) // the format's own limit

static void pread_all(int fd, void *buf, size_t bytes, size_t at, const char *path) {
    for (size_t done = 0; done < bytes;) {
        ssize_t n = pread(fd, (char *)buf + done, bytes - done, (off_t)(at + done));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0)
            FAIL("the file is truncated or unreadable: save it again", "cannot read %s: %s", path,
                 n < 0 ? strerror(errno) : "unexpected end of file");
        done += (size_t)n;
    }
}

static void pwrite_all(int fd, const void *buf, size_t bytes, size_t at, const char *path) {
    for (size_t done = 0; done < bytes;) {
        ssize_t n = pwrite(fd, (const char *)buf + done, bytes - done, (off_t)(at + done));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0)
            FAIL("is the disk full? checkpoint.save_dir needs room for the model three times",
                 "cannot write %s: %s", path, strerror(errno));
        done += (size_t)n;
    }
}

void safetensors_create(const char *path, const SafetensorsEntry *entries, int n) {
    cJSON *root = cJSON_CreateObject(), *meta = cJSON_AddObjectToObject(root, "__metadata__");
    cJSON_AddStringToObject(meta, "format", "pt"); // what transformers expects of a torch file
    size_t offset = 0;
    for (int i = 0; i < n; i++) {
        const SafetensorsEntry *e = &entries[i];
        size_t bytes = (size_t)e->rows * e->cols * sizeof(float);
        double shape[3] = {e->rows, 1, e->cols}, // the last ndim of them
            offsets[2] = {(double)offset, (double)(offset + bytes)};
        if (e->ndim < 3) shape[1] = e->rows;
        cJSON *t = cJSON_AddObjectToObject(root, e->name);
        cJSON_AddStringToObject(t, "dtype", "F32");
        cJSON_AddItemToObject(t, "shape", cJSON_CreateDoubleArray(shape + 3 - e->ndim, e->ndim));
        cJSON_AddItemToObject(t, "data_offsets", cJSON_CreateDoubleArray(offsets, 2));
        offset += bytes;
    }
    char *json = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!json) FAIL("out of memory?", "cannot format the header of %s", path);
    // padded with spaces so the tensors start 8-byte aligned, as the format recommends
    size_t len = strlen(json), padded = (len + 7) / 8 * 8;
    char *header = xmalloc(8 + padded);
    uint64_t le = padded; // x86 and every GPU host are little-endian, as the format is
    memcpy(header, &le, 8);
    memcpy(header + 8, json, len);
    memset(header + 8 + len, ' ', padded - len);
    free(json);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        FAIL("set checkpoint.save_dir to a folder you can write", "cannot create %s: %s", path,
             strerror(errno));
    pwrite_all(fd, header, 8 + padded, 0, path);
    if (ftruncate(fd, (off_t)(8 + padded + offset)) != 0 || fsync(fd) != 0 || close(fd) != 0)
        FAIL("is the disk full?", "cannot size %s: %s", path, strerror(errno));
    free(header);
}

static int element_size(const char *dtype) {
    return strcmp(dtype, "F32") == 0                                 ? 4
           : strcmp(dtype, "BF16") == 0 || strcmp(dtype, "F16") == 0 ? 2
                                                                     : 0;
}

// one tensor's header entry, every size checked against the file
static void parse_tensor(SafetensorsTensor *t, const cJSON *item, size_t data_start,
                         size_t file_size, const char *path) {
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(item, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(item, "shape");
    const cJSON *offsets = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
    t->name = xmalloc(strlen(item->string) + 1); // a name is as long as its file says
    strcpy(t->name, item->string);
    if (!cJSON_IsString(dtype) || !cJSON_IsArray(shape) || cJSON_GetArraySize(offsets) != 2)
        user_error("checkpoint error: %s: tensor %s has no dtype, shape or data_offsets (not a "
                   "safetensors file?)",
                   path, t->name);
    snprintf(t->dtype, sizeof t->dtype, "%s", dtype->valuestring);
    t->element_size = element_size(t->dtype);
    t->ndim = cJSON_GetArraySize(shape);
    double count = 1, dims[2] = {1, 1};
    for (int d = 0; d < t->ndim; d++) {
        double x = cJSON_GetArrayItem(shape, d)->valuedouble;
        count *= x;
        if (t->ndim <= 2) dims[d + 2 - t->ndim] = x;
        if (t->ndim == 3) dims[d == 2] *= x; // (a, b, c) as (a*b, c): a Conv1d's (I, 1, W)
    }
    t->rows = (long)dims[0];
    t->cols = (long)dims[1];
    double begin = cJSON_GetArrayItem(offsets, 0)->valuedouble;
    double end = cJSON_GetArrayItem(offsets, 1)->valuedouble;
    if (begin < 0 || end < begin || data_start + end > file_size ||
        (t->element_size && end - begin != count * t->element_size))
        user_error("checkpoint error: %s is damaged: tensor %s's bytes [%.0f, %.0f) do not fit "
                   "its shape or the file (%zu bytes); save it again",
                   path, t->name, begin, end, file_size);
    t->begin = data_start + (size_t)begin;
    t->bytes = (size_t)(end - begin);
}

void safetensors_open(SafetensorsFile *f, const char *path, int writable) {
    memset(f, 0, sizeof *f);
    snprintf(f->path, sizeof f->path, "%s", path);
    f->writable = writable;
    f->fd = open_regular_file(path, writable ? O_RDWR : O_RDONLY);
    if (f->fd < 0) user_error("checkpoint error: %s %s", path, file_error());
    struct stat st;
    if (fstat(f->fd, &st) != 0)
        user_error("checkpoint error: %s cannot be read: %s", path, strerror(errno));
    uint64_t len = 0;
    if (st.st_size >= 8) pread_all(f->fd, &len, 8, 0, path);
    if (st.st_size < 8 || len > MAX_HEADER_BYTES || len > (uint64_t)st.st_size - 8)
        user_error("checkpoint error: %s is not a safetensors file (bad header length; a "
                   "truncated save?)",
                   path);
    char *text = xmalloc(len + 1), *where = xmalloc(strlen(path) + 32);
    pread_all(f->fd, text, len, 8, path);
    sprintf(where, "checkpoint error: %s", path);
    // the header may end in the NUL bytes some writers pad it with
    cJSON *root = json_parse(text, strlen(text), NULL, where);
    free(text);
    free(where);
    if (!cJSON_IsObject(root))
        user_error("checkpoint error: %s is not a safetensors file (its header is not JSON)", path);
    f->tensors = xmalloc(cJSON_GetArraySize(root) * sizeof(SafetensorsTensor) + 1);
    for (const cJSON *item = root->child; item; item = item->next)
        if (strcmp(item->string, "__metadata__") != 0)
            parse_tensor(&f->tensors[f->num_tensors++], item, 8 + len, (size_t)st.st_size, path);
    cJSON_Delete(root);
}

void safetensors_close(SafetensorsFile *f) {
    if (f->writable && fsync(f->fd) != 0)
        FAIL("is the disk full?", "cannot flush %s: %s", f->path, strerror(errno));
    if (close(f->fd) != 0)
        FAIL("is the disk full?", "cannot close %s: %s", f->path, strerror(errno));
    for (int i = 0; i < f->num_tensors; i++) free(f->tensors[i].name);
    free(f->tensors);
    f->tensors = NULL;
}

const SafetensorsTensor *safetensors_find(const SafetensorsFile *f, const char *name) {
    for (int i = 0; i < f->num_tensors; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}

// IEEE half to float: sign, 5-bit exponent, 10-bit mantissa (subnormals scaled, inf/nan kept)
static float half_to_float(uint16_t h) {
    int exponent = (h >> 10) & 31, mantissa = h & 1023;
    float x = exponent == 0    ? ldexpf((float)mantissa, -24)
              : exponent == 31 ? (mantissa ? NAN : INFINITY)
                               : ldexpf((float)(mantissa | 1024), exponent - 25);
    return h & 0x8000 ? -x : x;
}

static float bf16_to_float(uint16_t b) {
    uint32_t bits = (uint32_t)b << 16; // bfloat16 is float32's top half
    float x;
    memcpy(&x, &bits, 4);
    return x;
}

void safetensors_read_block(float *out, const SafetensorsFile *f, const SafetensorsTensor *t,
                            const ParamInfo *p) {
    if (!t->element_size)
        user_error("checkpoint error: %s: tensor %s is %s; picotron.c reads F32, BF16 and F16",
                   f->path, t->name, t->dtype);
    size_t esize = t->element_size, row_bytes = (size_t)p->cols * esize;
    uint16_t *half = esize == 2 ? xmalloc(row_bytes) : NULL;
    // whole rows are contiguous in the file: one read (column-parallel blocks, norms)
    int contiguous = p->cols == p->global_cols && esize == 4;
    for (int r = 0; r < (contiguous ? 1 : p->rows); r++) {
        size_t at = t->begin + ((size_t)(p->row0 + r) * p->global_cols + p->col0) * esize;
        float *row = out + (size_t)r * p->cols;
        if (esize == 4) {
            pread_all(f->fd, row, contiguous ? row_bytes * p->rows : row_bytes, at, f->path);
            continue;
        }
        pread_all(f->fd, half, row_bytes, at, f->path);
        for (int c = 0; c < p->cols; c++)
            row[c] = t->dtype[0] == 'B' ? bf16_to_float(half[c]) : half_to_float(half[c]);
    }
    free(half);
}

void safetensors_write_block(const SafetensorsFile *f, const SafetensorsTensor *t,
                             const float *block, const ParamInfo *p) {
    int contiguous = p->cols == p->global_cols;
    for (int r = 0; r < (contiguous ? 1 : p->rows); r++)
        pwrite_all(f->fd, block + (size_t)r * p->cols,
                   (size_t)p->cols * sizeof(float) * (contiguous ? p->rows : 1),
                   t->begin + ((size_t)(p->row0 + r) * p->global_cols + p->col0) * sizeof(float),
                   f->path);
}
