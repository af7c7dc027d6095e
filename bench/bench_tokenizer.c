// How fast tokenizer.c encodes a file on one thread: the whole file in one call (where the cache
// of pieces pays), and one call a line, each line with its "\n" (as a caller of short documents
// calls it). Prints "whole MB/s ids" and "lines MB/s ids", the best of REPEATS runs each;
// bench/bench_tokenizer.sh sets them beside Hugging Face tokenizers.
//   build/bench/bench_tokenizer TOKENIZER FILE
#include "tokenizer.h"
#include "utils.h"
#include <errno.h>
#include <string.h>

#define REPEATS 3

// the best MB/s of REPEATS runs; *count: the ids of one run
static double encode_speed(size_t *count, const Tokenizer *t, const char *text, size_t len,
                           int by_line) {
    double best = 0;
    int *ids = NULL;
    size_t cap = 0;
    for (int r = 0; r < REPEATS; r++) {
        size_t n = 0;
        double start = now_seconds();
        if (!by_line) tokenizer_encode(&ids, &n, &cap, t, text, len);
        for (size_t at = 0, end; by_line && at < len; at = end) {
            const char *newline = memchr(text + at, '\n', len - at);
            end = newline ? (size_t)(newline - text) + 1 : len;
            tokenizer_encode(&ids, &n, &cap, t, text + at, end - at);
        }
        double mbs = len / 1e6 / (now_seconds() - start);
        if (mbs > best) best = mbs;
        *count = n;
    }
    free(ids);
    return best;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s TOKENIZER FILE\n", argv[0]);
        return 2;
    }
    Tokenizer *t = tokenizer_load(argv[1]);
    size_t len, count;
    char *text = read_whole_file(argv[2], &len);
    if (!text) user_error("bench_tokenizer: %s: %s", argv[2], strerror(errno));
    double mbs = encode_speed(&count, t, text, len, 0);
    printf("whole %.2f %zu\n", mbs, count);
    mbs = encode_speed(&count, t, text, len, 1);
    printf("lines %.2f %zu\n", mbs, count);
    free(text);
    tokenizer_free(t);
    return 0;
}
