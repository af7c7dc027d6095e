// Compares the parameters of two checkpoints saved with any layouts: both hold the full tensors
// (model.safetensors), compared tensor by tensor.
// usage: tool_compare_checkpoints DIR_A DIR_B TOLERANCE
// Prints the largest relative difference ||a - b|| / ||a|| (L2 over each tensor) and exits 1 above
// TOLERANCE, or when a tensor is missing from either side or has another shape. The L2 norm,
// because AdamW moves an element whose gradient is a near-cancelling sum by about lr whatever its
// size, so a sum in another order can change single elements by far more than the tensor.
#include <math.h>
#include <string.h>
#include "safetensors.h"
#include "utils.h"

// the whole tensor t as fp32
static float *read_whole(const SafetensorsFile *f, const SafetensorsTensor *t) {
    ParamInfo all = {.rows = (int)t->rows,
                     .cols = (int)t->cols,
                     .global_rows = (int)t->rows,
                     .global_cols = (int)t->cols};
    float *data = xmalloc((size_t)t->rows * t->cols * sizeof(float));
    safetensors_read_block(data, f, t, &all);
    return data;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s DIR_A DIR_B TOLERANCE\n", argv[0]);
        return 2;
    }
    double tolerance = atof(argv[3]), worst = 0.0, worst_abs = 0.0;
    SafetensorsFile a, b;
    char path[1100];
    snprintf(path, sizeof path, "%s/model.safetensors", argv[1]);
    safetensors_open(&a, path, 0);
    snprintf(path, sizeof path, "%s/model.safetensors", argv[2]);
    safetensors_open(&b, path, 0);
    const char *worst_name = "";
    int bad = a.num_tensors != b.num_tensors;
    for (int i = 0; i < a.num_tensors; i++) {
        const SafetensorsTensor *ta = &a.tensors[i], *tb = safetensors_find(&b, ta->name);
        if (!tb || ta->rows != tb->rows || ta->cols != tb->cols) {
            printf("tensor %s missing or of another shape in %s\n", ta->name, argv[2]);
            bad = 1;
            continue;
        }
        float *x = read_whole(&a, ta), *y = read_whole(&b, tb);
        double diff2 = 0.0, ref2 = 0.0, max_diff = 0.0;
        for (size_t e = 0; e < (size_t)ta->rows * ta->cols; e++) {
            double d = (double)x[e] - y[e];
            diff2 += d * d;
            ref2 += (double)x[e] * x[e];
            max_diff = fmax(max_diff, fabs(d));
        }
        free(x);
        free(y);
        double rel = sqrt(diff2 / (ref2 > 0 ? ref2 : 1.0));
        if (max_diff > worst_abs) worst_abs = max_diff;
        if (rel >= worst) {
            worst = rel;
            worst_name = ta->name;
        }
    }
    printf("final weights: %d tensors, max rel L2 diff %.2e (%s; max abs %.1e), tolerance %.0e\n",
           a.num_tensors, worst, worst_name, worst_abs, tolerance);
    safetensors_close(&a);
    safetensors_close(&b);
    return bad || worst > tolerance;
}
