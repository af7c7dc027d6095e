// The metrics file (metrics.h)
#include "metrics.h"
#include <stdlib.h>
#include <string.h>
#include "utils.h"

FILE *metrics_open(const char *path, int first_step) {
    char tmp[600], *text = first_step > 1 ? read_whole_file(path, NULL) : NULL;
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = xfopen(tmp, "w");
    for (char *line = text, *end; line && *line; line = end + 1) {
        if (!(end = strchr(line, '\n'))) break; // a line cut short by a crash is dropped
        const char *at = strstr(line, "\"step\": ");
        if (at && at < end && atoi(at + 8) < first_step) xfwrite(line, 1, end - line + 1, f);
    }
    free(text);
    if (fflush(f) != 0 || rename(tmp, path) != 0)
        FAIL("check logging.metrics_file's folder", "cannot write %s", path);
    return f;
}

void metrics_write(FILE *f, int step, float loss, long tokens, double seconds, float grad_norm,
                   const float *aux_loss) {
    fprintf(f,
            "{\"step\": %d, \"loss\": %.9g, \"tokens\": %ld, \"seconds\": %.6f, \"grad_norm\": "
            "%.9g",
            step, loss, tokens, seconds, grad_norm);
    if (aux_loss) fprintf(f, ", \"aux_loss\": %.9g", *aux_loss);
    fprintf(f, "}\n");
    fflush(f);
}
