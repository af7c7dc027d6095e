// data.c reads .txt (bytes), .tok and llm.c .bin files back to exactly the tokens that were
// written, cuts windows of seq+1 tokens with stride seq, and every dp x grad_acc layout with the
// same global batch reads the same samples in a step, sample i going to dp rank i mod dp.
// Tolerance: none, token ids are compared exactly.
//
// usage: test_data all DIR           every check, scratch files in DIR
//        test_data error KIND DIR    writes a bad file (KIND: see open_bad_file), prints its path,
//                                    opens it; must exit 1 with one line (77: cannot run here)
#include "data.h"
#include "test_util.h"
#include "utils.h"
#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_MISMATCHES 0 // token ids are integers: any difference is a bug


static void write_bytes(const char *path, const void *bytes, size_t n) {
    FILE *f = xfopen(path, "wb");
    xfwrite(bytes, 1, n, f);
    fclose(f);
}

static unsigned char *slurp(const char *path, long *size) {
    struct stat st;
    if (stat(path, &st) != 0) FAIL("", "cannot stat %s", path);
    *size = st.st_size;
    unsigned char *bytes = xmalloc(st.st_size);
    FILE *f = xfopen(path, "rb");
    xfread(bytes, 1, st.st_size, f);
    fclose(f);
    return bytes;
}

// an llm.c shard written the way llm.c's dev/data/data_common.py writes it, independent of data.c
static void write_llmc_bin(const char *path, const int *tokens, int n, int magic) {
    size_t size = 256 * 4 + 2 * (size_t)n;
    unsigned char *b = xmalloc(size);
    int header[3] = {magic, 1, n};
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++) b[4 * i + j] = (unsigned char)(header[i] >> (8 * j));
    for (int i = 0; i < n; i++) {
        b[1024 + 2 * i] = (unsigned char)(tokens[i] & 0xff);
        b[1024 + 2 * i + 1] = (unsigned char)(tokens[i] >> 8);
    }
    write_bytes(path, b, size);
    free(b);
}

static int mismatches(const int *a, const int *b, long n) {
    int bad = 0;
    for (long i = 0; i < n; i++) bad += a[i] != b[i];
    return bad;
}

static void check_txt(const char *dir) {
    // UTF-8 bytes above 127 must come back as 128..255, never as negative chars
    const char *text = "It is a truth universally acknowledged, that a single man in possession "
                       "of a good fortune, must be in want of a wife. Caf\xc3\xa9 na\xc3\xafve.\n";
    char path[1024];
    snprintf(path, sizeof path, "%s/small.txt", dir);
    long n = (long)strlen(text);
    write_bytes(path, text, n);
    Dataset ds;
    dataset_open(&ds, path);
    int *expected = xmalloc(n * sizeof(int));
    int max_byte = 0;
    for (long i = 0; i < n; i++) {
        expected[i] = (unsigned char)text[i];
        if (expected[i] > max_byte) max_byte = expected[i];
    }
    CHECK(ds.num_tokens == n, "txt: %ld tokens, expected %ld", ds.num_tokens, n);
    int bad = ds.num_tokens == n ? mismatches(ds.tokens, expected, n) : -1;
    CHECK(bad == MAX_MISMATCHES, "txt: %d tokens differ from the bytes", bad);
    CHECK(ds.vocab_size == max_byte + 1, "txt: vocab %d, expected %d", ds.vocab_size, max_byte + 1);
    printf("txt: %ld tokens equal the text's bytes (%d mismatches), vocab_size %d (max byte %d)\n",
           ds.num_tokens, bad, ds.vocab_size, max_byte);
    dataset_free(&ds);
    free(expected);
}

static void check_tok(const char *dir, int max_token, int expected_width) {
    enum { N = 1000 };
    int tokens[N];
    for (int i = 0; i < N; i++) tokens[i] = (int)((i * 2654435761u) % (unsigned)max_token);
    tokens[N / 2] = max_token; // the largest id must survive the chosen width
    char path[1024];
    snprintf(path, sizeof path, "%s/w%d.tok", dir, expected_width);
    tokens_write(path, tokens, N, 0, 0);

    // the header, byte by byte, as the format documents it
    long size;
    unsigned char *b = slurp(path, &size);
    CHECK(size == 64 + (long)N * expected_width, "tok: file is %ld bytes, expected %ld", size,
          64 + (long)N * expected_width);
    CHECK(memcmp(b, "PICOTOK\0", 8) == 0, "tok: magic is not PICOTOK\\0");
    CHECK(b[8] == 1 && b[9] == 0 && b[10] == 0 && b[11] == 0, "tok: version is not 1");
    CHECK(b[12] == expected_width && !b[13] && !b[14] && !b[15], "tok: width byte %d, expected %d",
          b[12], expected_width);
    uint64_t count = 0;
    for (int j = 7; j >= 0; j--) count = (count << 8) | b[16 + j];
    CHECK(count == N, "tok: header count %llu, expected %d", (unsigned long long)count, N);
    int nonzero = 0;
    for (int j = 24; j < 64; j++) nonzero += b[j] != 0;
    CHECK(nonzero == 0, "tok: %d nonzero bytes in the header's padding", nonzero);
    free(b);

    Dataset ds;
    dataset_open(&ds, path);
    CHECK(ds.num_tokens == N, "tok: %ld tokens read back, expected %d", ds.num_tokens, N);
    int bad = ds.num_tokens == N ? mismatches(ds.tokens, tokens, N) : -1;
    CHECK(bad == MAX_MISMATCHES, "tok: %d tokens differ", bad);
    CHECK(ds.vocab_size == max_token + 1, "tok: vocab %d, expected %d", ds.vocab_size,
          max_token + 1);
    printf("tok width %d: %d tokens up to %d read back (%d mismatches), file %ld bytes\n",
           expected_width, N, max_token, bad, size);
    dataset_free(&ds);
}

static void check_bin(const char *dir) {
    enum { N = 777 };
    int tokens[N];
    for (int i = 0; i < N; i++) tokens[i] = (i * 40503) % 50257; // GPT-2's vocabulary
    char path[1024];
    snprintf(path, sizeof path, "%s/shard.bin", dir);
    write_llmc_bin(path, tokens, N, 20240520);
    Dataset ds;
    dataset_open(&ds, path);
    CHECK(ds.num_tokens == N, "bin: %ld tokens, expected %d", ds.num_tokens, N);
    int bad = ds.num_tokens == N ? mismatches(ds.tokens, tokens, N) : -1;
    CHECK(bad == MAX_MISMATCHES, "bin: %d tokens differ", bad);
    printf("bin (llm.c shard): %d tokens read back (%d mismatches), vocab_size %d\n", N, bad,
           ds.vocab_size);
    dataset_free(&ds);
}

// tokens 0, 1, 2, ... so a window's first input token names its position in the stream
static Dataset counting_dataset(long n) {
    Dataset ds = {0};
    ds.tokens = xmalloc(n * sizeof(int));
    for (long i = 0; i < n; i++) ds.tokens[i] = (int)i;
    ds.num_tokens = n;
    ds.vocab_size = (int)n;
    snprintf(ds.path, sizeof ds.path, "counting");
    return ds;
}

static void check_windows(void) {
    // 10 tokens, seq 3: [0 1 2]->[1 2 3], [3 4 5]->[4 5 6], [6 7 8]->[7 8 9]; token 9 only a target
    Dataset ds = counting_dataset(10);
    CHECK(dataset_num_samples(&ds, 3) == 3, "windows: %ld samples of 10 tokens, seq 3, expected 3",
          dataset_num_samples(&ds, 3));
    const int want_in[3][3] = {{0, 1, 2}, {3, 4, 5}, {6, 7, 8}};
    const int want_tg[3][3] = {{1, 2, 3}, {4, 5, 6}, {7, 8, 9}};
    int bad = 0;
    for (int s = 0; s < 4; s++) { // step 3 wraps to sample 0
        int in[3], tg[3];
        dataset_get_batch(in, tg, NULL, &ds, s, 0, 1, 1, 3, 0, 1, 0);
        bad += mismatches(in, want_in[s % 3], 3) + mismatches(tg, want_tg[s % 3], 3);
    }
    CHECK(bad == 0, "windows: %d tokens differ from the hand-written windows", bad);
    dataset_free(&ds);

    // a larger stream: n tokens give (n-1)/seq samples, sample g = tokens [g*seq, g*seq+seq]
    const int seq = 16;
    const long n = 16 * 40 + 5;
    ds = counting_dataset(n);
    long samples = dataset_num_samples(&ds, seq);
    CHECK(samples == 40, "windows: %ld samples, expected 40", samples);
    int in[2 * 16], tg[2 * 16];
    int bad_large = 0, bad_cap = 0;
    for (int step = 0; step < 30; step++) { // mbs 2: steps 20.. are the second epoch
        dataset_get_batch(in, tg, NULL, &ds, step, 0, 1, 2, seq, 0, 1, 0);
        for (int b = 0; b < 2; b++) {
            long g = (2L * step + b) % 40;
            for (int t = 0; t < seq; t++) {
                bad_large += in[b * seq + t] != g * seq + t;
                bad_large += tg[b * seq + t] != g * seq + t + 1;
            }
        }
        dataset_get_batch(in, tg, NULL, &ds, step, 0, 1, 2, seq, 0, 1, 7); // num_samples = 7
        for (int b = 0; b < 2; b++) bad_cap += in[b * seq] != ((2L * step + b) % 7) * seq;
    }
    CHECK(bad_large == 0, "windows: %d tokens off over 30 steps", bad_large);
    CHECK(bad_cap == 0, "windows: %d samples ignore num_samples = 7", bad_cap);
    printf("windows: 10 tokens/seq 3 -> 3 hand-checked windows; %ld tokens/seq %d -> %ld samples, "
           "30 steps incl. wrap: %d tokens off, num_samples cap: %d off\n",
           n, seq, samples, bad_large, bad_cap);
    dataset_free(&ds);
}

static int compare_int(const void *a, const void *b) {
    return *(const int *)a - *(const int *)b;
}

// dp x grad_acc with dp*grad_acc fixed reads the same global batch; rank r only reads samples
// i = r mod dp
static void check_layouts(void) {
    enum { SEQ = 4, MBS = 2, SAMPLES = 20, GLOBAL = 8 }; // global batch: mbs * grad_acc * dp = 8
    Dataset ds = counting_dataset(SEQ * SAMPLES + 1);
    const int dps[3] = {1, 2, 4};
    int bad_union = 0, bad_rank = 0;
    for (int step = 0; step < 6; step++) { // 20 samples / 8 per step: steps 2, 4, 5 wrap
        int reference[GLOBAL];
        for (int i = 0; i < GLOBAL; i++) reference[i] = (step * GLOBAL + i) % SAMPLES;
        qsort(reference, GLOBAL, sizeof(int), compare_int);
        for (int l = 0; l < 3; l++) {
            int dp = dps[l], grad_acc = GLOBAL / (MBS * dp), got[GLOBAL], count = 0;
            for (int rank = 0; rank < dp; rank++)
                for (int micro = 0; micro < grad_acc; micro++) {
                    int in[MBS * SEQ], tg[MBS * SEQ];
                    dataset_get_batch(in, tg, NULL, &ds, step, micro, grad_acc, MBS, SEQ, rank, dp, 0);
                    for (int b = 0; b < MBS; b++) {
                        int sample = in[b * SEQ] / SEQ;
                        bad_rank += sample % dp != rank;
                        got[count++] = sample;
                    }
                }
            qsort(got, GLOBAL, sizeof(int), compare_int);
            bad_union += mismatches(got, reference, GLOBAL);
        }
    }
    CHECK(bad_union == 0, "layouts: %d samples differ from dp=1 x grad_acc=4's global batch",
          bad_union);
    CHECK(bad_rank == 0, "layouts: %d samples on a rank other than i mod dp", bad_rank);
    printf("layouts: dp=1x4, dp=2x2, dp=4x1 over 6 steps: %d samples differ from the global batch, "
           "%d on the wrong rank\n",
           bad_union, bad_rank);
    dataset_free(&ds);
}

static void check_corpus(void) {
    const char *path = "data/austen.txt"; // the bundled corpus, when run from the repo root
    struct stat st;
    if (stat(path, &st) != 0) return;
    Dataset ds;
    dataset_open(&ds, path);
    CHECK(ds.num_tokens == st.st_size, "corpus: %ld tokens, file has %ld bytes", ds.num_tokens,
          (long)st.st_size);
    CHECK(ds.vocab_size <= 256, "corpus: vocab %d > 256", ds.vocab_size);
    printf("corpus %s: %ld byte tokens, vocab_size %d, %ld samples of 128\n", path, ds.num_tokens,
           ds.vocab_size, dataset_num_samples(&ds, 128));
    dataset_free(&ds);
}

// a .tok header written by hand, so a test can claim any count and width (tokens_write cannot lie)
static void write_tok_header(FILE *f, uint64_t count, unsigned width) {
    unsigned char h[64] = "PICOTOK";
    for (int j = 0; j < 4; j++) h[8 + j] = (unsigned char)(1 >> (8 * j));
    for (int j = 0; j < 4; j++) h[12 + j] = (unsigned char)(width >> (8 * j));
    for (int j = 0; j < 8; j++) h[16 + j] = (unsigned char)(count >> (8 * j));
    xfwrite(h, 1, sizeof h, f);
}

// Writes the bad file of KIND in DIR and prints its path (t_15 then points ./train at it), then
// opens it. Returns 77 when this machine cannot make such a file.
static int open_bad_file(const char *kind, const char *dir) {
    char path[1024];
    int tokens[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    Dataset ds;
    FILE *f;
    if (strcmp(kind, "missing") == 0) {
        snprintf(path, sizeof path, "%s/no_such_file.txt", dir);
    } else if (strcmp(kind, "directory") == 0) {
        snprintf(path, sizeof path, "%s/corpus.txt", dir); // its name alone says text
        if (mkdir(path, 0755) != 0 && errno != EEXIST) FAIL("", "cannot make %s", path);
    } else if (strcmp(kind, "fifo") == 0) { // fopen would wait forever for a writer
        snprintf(path, sizeof path, "%s/pipe.txt", dir);
        if (mkfifo(path, 0644) != 0 && errno != EEXIST) FAIL("", "cannot make %s", path);
    } else if (strcmp(kind, "unreadable") == 0) {
        snprintf(path, sizeof path, "%s/secret_%d.txt", dir, (int)getuid());
        unlink(path); // an earlier run's copy cannot be opened for writing either
        write_bytes(path, "text", 4);
        if (chmod(path, 0) != 0) FAIL("", "cannot chmod %s", path);
        if (access(path, R_OK) == 0) {
            printf("skip: %s stays readable to uid %d (root reads every file)\n", path,
                   (int)getuid());
            return 77;
        }
    } else if (strcmp(kind, "tok_magic") == 0) {
        snprintf(path, sizeof path, "%s/bad.tok", dir);
        char junk[128] = "NOTATOKFILE";
        write_bytes(path, junk, sizeof junk);
    } else if (strcmp(kind, "bin_magic") == 0) {
        snprintf(path, sizeof path, "%s/bad.bin", dir);
        write_llmc_bin(path, tokens, 8, 12345);
    } else if (strcmp(kind, "truncated") == 0) {
        snprintf(path, sizeof path, "%s/cut.tok", dir);
        tokens_write(path, tokens, 8, 0, 0);
        if (truncate(path, 64 + 2 * 5) != 0) FAIL("", "cannot truncate %s", path);
    } else if (strcmp(kind, "huge_count") == 0) {
        // 2^63 tokens of 2 bytes: count * width wraps to 0, the size of this header-only file
        snprintf(path, sizeof path, "%s/huge.tok", dir);
        f = xfopen(path, "wb");
        write_tok_header(f, 1ull << 63, 2);
        fclose(f);
    } else if (strcmp(kind, "stray_byte") == 0) {
        snprintf(path, sizeof path, "%s/stray.tok", dir);
        tokens_write(path, tokens, 8, 0, 0);
        f = xfopen(path, "ab");
        xfwrite("x", 1, 1, f);
        fclose(f);
    } else if (strcmp(kind, "bin_count") == 0) { // llm.c's count is an int32: -1 here
        snprintf(path, sizeof path, "%s/count.bin", dir);
        write_llmc_bin(path, tokens, 8, 20240520);
        f = xfopen(path, "r+b");
        if (fseek(f, 8, SEEK_SET) != 0) FAIL("", "cannot seek in %s", path);
        xfwrite("\xff\xff\xff\xff", 1, 4, f);
        fclose(f);
    } else if (strcmp(kind, "big_token") == 0) {
        // id 2^31-1 would make vocab_size = id + 1 overflow an int and pass train's vocab check
        snprintf(path, sizeof path, "%s/big.tok", dir);
        f = xfopen(path, "wb");
        write_tok_header(f, 40, 4); // enough for train's first window to reach position 5
        unsigned char body[40 * 4] = {0};
        for (int j = 0; j < 4; j++) body[5 * 4 + j] = (unsigned char)(INT32_MAX >> (8 * j));
        xfwrite(body, 1, sizeof body, f);
        fclose(f);
    } else if (strcmp(kind, "huge_txt") == 0) {
        // sparse: 8 TiB of text would need 32 TiB of ints on every rank
        snprintf(path, sizeof path, "%s/huge.txt", dir);
        write_bytes(path, "", 0);
        if (truncate(path, 8ll << 40) != 0) {
            printf("skip: this file system cannot hold a sparse 8 TiB file\n");
            return 77;
        }
    } else if (strcmp(kind, "short") == 0) {
        snprintf(path, sizeof path, "%s/short.tok", dir);
        tokens_write(path, tokens, 8, 0, 0);
        printf("%s\n", path);
        fflush(stdout);
        dataset_open(&ds, path);
        dataset_num_samples(&ds, 128); // 8 tokens cannot make one window of 129
        return 0;
    } else if (strcmp(kind, "extension") == 0) {
        snprintf(path, sizeof path, "%s/tokens.npy", dir);
        write_bytes(path, tokens, sizeof tokens);
    } else {
        FAIL("", "unknown error kind %s", kind);
    }
    printf("%s\n", path);
    fflush(stdout); // before the error ends the process
    dataset_open(&ds, path);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "error") == 0) {
        if (open_bad_file(argv[2], argv[3]) == 77) return 77;
        printf("%s: the bad file was accepted\n", argv[2]);
        return 0; // the script expects a failure: returning 0 here is the bug it reports
    }
    if (argc != 3 || strcmp(argv[1], "all") != 0) {
        fprintf(stderr, "usage: %s all DIR | %s error KIND DIR\n", argv[0], argv[0]);
        return 2;
    }
    check_txt(argv[2]);
    check_tok(argv[2], 65535, 2);
    check_tok(argv[2], 1 << 30, 4);
    check_bin(argv[2]);
    check_windows();
    check_layouts();
    check_corpus();
    printf("%s (%d failed checks)\n", failures ? "FAILED" : "all data checks passed", failures);
    return failures ? 1 : 0;
}
