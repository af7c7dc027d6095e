// Compares the parameters of two checkpoints saved with any layouts: each is reassembled into
// whole tensors by (name, global index) from all its rank files, then compared tensor by tensor.
// usage: tool_compare_checkpoints DIR_A DIR_B TOLERANCE
// Prints the largest relative difference ||a - b|| / ||a|| (L2 over each tensor) and exits 1 above
// TOLERANCE, or when a tensor or an element is missing from either side. The L2 norm, because
// AdamW moves an element whose gradient is a near-cancelling sum by about lr whatever its size,
// so a sum in another order can change single elements by far more than the tensor.
#include <glob.h>
#include <math.h>
#include <string.h>
#include "checkpoint.h"
#include "utils.h"

typedef struct {
    char name[96];
    int rows, cols;
    float *data;
    char *seen;
} Whole;

static int load_whole(Whole **out, const char *dir) {
    char pattern[1100];
    snprintf(pattern, sizeof pattern, "%s/rank_*.bin", dir);
    glob_t g;
    if (glob(pattern, 0, NULL, &g) != 0)
        FAIL("run the layout with checkpoint.save_frequency set", "no rank files in %s", dir);
    Whole *w = xmalloc(MAX_PARAMS * sizeof(Whole));
    int n = 0;
    for (size_t f = 0; f < g.gl_pathc; f++) {
        CheckpointTensor *t;
        int count = checkpoint_read_file(&t, g.gl_pathv[f]);
        for (int i = 0; i < count; i++) {
            ParamInfo *p = &t[i].info;
            int k = 0;
            while (k < n && strcmp(w[k].name, p->name)) k++;
            if (k == n) {
                snprintf(w[n].name, sizeof w[n].name, "%s", p->name);
                w[n].rows = p->global_rows;
                w[n].cols = p->global_cols;
                w[n].data = xmalloc((size_t)p->global_rows * p->global_cols * sizeof(float));
                w[n].seen = xmalloc((size_t)p->global_rows * p->global_cols);
                n++;
            }
            for (int r = 0; r < p->rows; r++)
                for (int c = 0; c < p->cols; c++) {
                    size_t at = (size_t)(p->row0 + r) * p->global_cols + p->col0 + c;
                    w[k].data[at] = t[i].data[(size_t)r * p->cols + c];
                    w[k].seen[at] = 1;
                }
            free(t[i].data);
        }
        free(t);
    }
    globfree(&g);
    *out = w;
    return n;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s DIR_A DIR_B TOLERANCE\n", argv[0]);
        return 2;
    }
    double tolerance = atof(argv[3]), worst = 0.0, worst_abs = 0.0;
    Whole *a, *b;
    int na = load_whole(&a, argv[1]), nb = load_whole(&b, argv[2]);
    const char *worst_name = "";
    int bad = na != nb;
    for (int i = 0; i < na; i++) {
        int k = 0;
        while (k < nb && strcmp(a[i].name, b[k].name)) k++;
        if (k == nb || a[i].rows != b[k].rows || a[i].cols != b[k].cols) {
            printf("tensor %s missing or of another shape in %s\n", a[i].name, argv[2]);
            bad = 1;
            continue;
        }
        double diff2 = 0.0, ref2 = 0.0, max_diff = 0.0;
        for (size_t e = 0; e < (size_t)a[i].rows * a[i].cols; e++) {
            if (!a[i].seen[e] || !b[k].seen[e]) {
                printf("tensor %s element %zu not saved by any rank\n", a[i].name, e);
                bad = 1;
                break;
            }
            double d = (double)a[i].data[e] - b[k].data[e];
            diff2 += d * d;
            ref2 += (double)a[i].data[e] * a[i].data[e];
            max_diff = fmax(max_diff, fabs(d));
        }
        double rel = sqrt(diff2 / (ref2 > 0 ? ref2 : 1.0));
        if (max_diff > worst_abs) worst_abs = max_diff;
        if (rel >= worst) {
            worst = rel;
            worst_name = a[i].name;
        }
    }
    printf("final weights: %d tensors, max rel L2 diff %.2e (%s; max abs %.1e), tolerance %.0e\n",
           na, worst, worst_name, worst_abs, tolerance);
    return bad || worst > tolerance;
}
