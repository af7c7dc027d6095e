// Reads a reference fixture written by tests/reference/make_fixture.py: a sequence of records
// [uint32 name_len][name bytes][uint32 ndim][int64 dims[ndim]][float32 data], little-endian.
// Header-only, for test programs: every function is static.
#pragma once
#include <stdint.h>
#include <string.h>
#include "utils.h"

#define FIXTURE_MAX_RECORDS 512
#define FIXTURE_MAX_DIMS    8

typedef struct {
    char name[128];
    int ndim;
    int64_t dims[FIXTURE_MAX_DIMS];
    size_t count; // prod(dims)
    float *data;  // (count), host
} FixtureRecord;

typedef struct {
    FixtureRecord rec[FIXTURE_MAX_RECORDS];
    int n;
} Fixture;

static const char *const FIXTURE_HINT =
    "regenerate it: python3 tests/reference/make_fixture.py --out tests/fixtures";

static void fixture_load(Fixture *fx, const char *path) {
    FILE *f = xfopen(path, "rb");
    fx->n = 0;
    uint32_t name_len;
    // the loop ends at the end of the file, the one place a record may not start
    while (fread(&name_len, sizeof name_len, 1, f) == 1) {
        if (fx->n == FIXTURE_MAX_RECORDS)
            FAIL(FIXTURE_HINT, "%s: more than %d records", path, FIXTURE_MAX_RECORDS);
        FixtureRecord *r = &fx->rec[fx->n];
        if (name_len == 0 || name_len >= sizeof r->name)
            FAIL(FIXTURE_HINT, "%s: record %d has a name of %u bytes", path, fx->n, name_len);
        xfread(r->name, 1, name_len, f);
        r->name[name_len] = '\0';
        uint32_t ndim;
        xfread(&ndim, sizeof ndim, 1, f);
        if (ndim > FIXTURE_MAX_DIMS)
            FAIL(FIXTURE_HINT, "%s: record %s has %u dims", path, r->name, ndim);
        r->ndim = (int)ndim;
        xfread(r->dims, sizeof(int64_t), ndim, f);
        r->count = 1;
        for (int d = 0; d < r->ndim; d++) {
            if (r->dims[d] < 0 || r->dims[d] > (1 << 28))
                FAIL(FIXTURE_HINT, "%s: record %s has dim %lld", path, r->name,
                     (long long)r->dims[d]);
            r->count *= (size_t)r->dims[d];
        }
        r->data = xmalloc(r->count * sizeof(float));
        xfread(r->data, sizeof(float), r->count, f);
        fx->n++;
    }
    fclose(f);
}

static void fixture_free(Fixture *fx) {
    for (int i = 0; i < fx->n; i++) free(fx->rec[i].data);
    fx->n = 0;
}

// NULL when absent
static const FixtureRecord *fixture_find_opt(const Fixture *fx, const char *name) {
    for (int i = 0; i < fx->n; i++)
        if (strcmp(fx->rec[i].name, name) == 0) return &fx->rec[i];
    return NULL;
}

static const FixtureRecord *fixture_find(const Fixture *fx, const char *name) {
    const FixtureRecord *r = fixture_find_opt(fx, name);
    if (!r) FAIL(FIXTURE_HINT, "fixture has no record named %s", name);
    return r;
}
