// The metrics file (metrics.h)
#include "metrics.h"
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "utils.h"

// the file's name, for the line that ends the job when a write to it fails
static char metrics_path[600];

static void __attribute__((noreturn)) write_failed(const char *path) {
    FAIL("is the disk full? logging.metrics_file must stay writable (or set it to \"\")",
         "cannot write logging.metrics_file %s: %s", path, strerror(errno));
}

FILE *metrics_open(const char *path, int first_step) {
    char tmp[600], *text = first_step > 1 ? read_whole_file(path, NULL) : NULL;
    snprintf(metrics_path, sizeof metrics_path, "%s", path);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) write_failed(tmp);
    for (char *line = text, *end; line && *line; line = end + 1) {
        if (!(end = strchr(line, '\n'))) break; // a line cut short by a crash is dropped
        const char *at = strstr(line, "\"step\": ");
        size_t len = end - line + 1;
        if (at && at < end && atoi(at + 8) < first_step && fwrite(line, 1, len, f) != len)
            write_failed(tmp);
    }
    free(text);
    if (fflush(f) != 0) write_failed(tmp);
    if (rename(tmp, path) != 0) write_failed(path);
    return f;
}

void metrics_write(FILE *f, int step, float loss, long tokens, double seconds, float grad_norm,
                   const float *aux_loss, const char *more) {
    int failed =
        fprintf(f,
                "{\"step\": %d, \"loss\": %.9g, \"tokens\": %ld, \"seconds\": %.6f, \"grad_norm\": "
                "%.9g",
                step, loss, tokens, seconds, grad_norm) < 0;
    if (aux_loss) failed |= fprintf(f, ", \"aux_loss\": %.9g", *aux_loss) < 0;
    if (more[0]) failed |= fprintf(f, ", %s", more) < 0;
    failed |= fprintf(f, "}\n") < 0;
    // each line reaches the file at its step: a full disk ends the job now, not in silence
    if (failed || fflush(f) != 0) write_failed(metrics_path);
}

void metrics_close(FILE *f) {
    if (ferror(f) | fclose(f)) write_failed(metrics_path);
}
