// Token files and the loader (picotron's MicroBatchDataLoader without the Hugging Face datasets).
// The corpus is one stream of tokens cut into windows of seq_length+1 tokens with stride
// seq_length, so sample i's targets overlap sample i+1's first input token, as picotron packs
// them. Sample i of the global order goes to dp rank i mod dp, like torch's DistributedSampler
// without shuffling: the data a rank reads follows from (step, micro-batch, dp rank) alone, which
// makes every layout read exactly the same global batch.
#include "data.h"
#include "tokenizer.h"
#include "utils.h"
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>

#define TOK_MAGIC        "PICOTOK" // 8 bytes with its terminating zero
#define TOK_VERSION      1
#define TOK_HEADER_BYTES 64
#define LLMC_MAGIC       20240520 // llm.c's GPT-2 token shards
#define LLMC_VERSION     1
#define LLMC_HEADER_INTS 256
#define READ_CHUNK_BYTES (1 << 20) // the file streams through this buffer into the token array
#define DATASET_KINDS    "a .txt, .tok or .bin file"
#define DATASET_HINT     "set dataset.name in the config to " DATASET_KINDS

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

// little-endian reads and writes, so files move between machines unchanged
static uint64_t read_le(const unsigned char *p, int bytes) {
    uint64_t x = 0;
    for (int i = bytes - 1; i >= 0; i--) x = (x << 8) | p[i];
    return x;
}

static void write_le(unsigned char *p, uint64_t x, int bytes) {
    for (int i = 0; i < bytes; i++, x >>= 8) p[i] = (unsigned char)(x & 0xff);
}

// The file, open for reading, and its size: open_regular_file refuses a directory (which fopen
// would "open", its size reading as LONG_MAX) and a FIFO (on which fopen blocks forever)
static FILE *dataset_file(const char *path, uint64_t *size) {
    int fd = open_regular_file(path, O_RDONLY);
    if (fd < 0 && errno == ENOENT)
        user_error("dataset error: %s: no such file (%s)", path, DATASET_HINT);
    if (fd < 0)
        user_error("dataset error: %s %s; dataset.name must be " DATASET_KINDS, path, file_error());
    struct stat st;
    FILE *f = fstat(fd, &st) == 0 ? fdopen(fd, "rb") : NULL;
    if (!f) user_error("dataset error: %s cannot be read: %s", path, strerror(errno));
    *size = (uint64_t)st.st_size;
    return f;
}

// exactly n bytes: the size was checked first, so a short read means a disk error or a file that
// changed while it was read
static void read_exactly(void *buf, size_t n, FILE *f, const char *path) {
    if (fread(buf, 1, n, f) == n) return;
    if (ferror(f))
        user_error("dataset error: %s: reading failed: %s (check the disk)", path, strerror(errno));
    user_error("dataset error: %s: the file ended early (did it change while train read it?)",
               path);
}

// ".tok": magic[8] "PICOTOK\0", uint32 version, uint32 token width (2 or 4), uint64 token count,
// uint64 tokenizer fingerprint, uint32 tokenizer vocabulary size (both 0: not recorded), zeros up
// to 64 bytes, then the tokens
static void read_tok_header(Dataset *ds, uint64_t *count, unsigned *width, FILE *f, uint64_t size,
                            const char *path) {
    unsigned char h[TOK_HEADER_BYTES];
    if (size >= TOK_HEADER_BYTES) read_exactly(h, TOK_HEADER_BYTES, f, path);
    if (size < TOK_HEADER_BYTES || memcmp(h, TOK_MAGIC, 8) != 0)
        user_error("dataset error: %s: not a .tok file (bad magic; write it with tokens_write)",
                   path);
    uint32_t version = (uint32_t)read_le(h + 8, 4);
    *width = (uint32_t)read_le(h + 12, 4);
    *count = read_le(h + 16, 8);
    ds->tokenizer_fingerprint = read_le(h + 24, 8);
    ds->tokenizer_vocab_size = (int)read_le(h + 32, 4);
    if (version != TOK_VERSION)
        user_error("dataset error: %s: .tok version %u, this build reads version %d "
                   "(rewrite it with tokens_write)",
                   path, version, TOK_VERSION);
    if (*width != 2 && *width != 4)
        user_error("dataset error: %s: token width %u bytes, expected 2 or 4 "
                   "(rewrite it with tokens_write)",
                   path, *width);
}

// ".bin": llm.c's shard, 256 int32 (magic, version, token count, unused) then uint16 tokens
static void read_llmc_header(uint64_t *count, FILE *f, uint64_t size, const char *path) {
    unsigned char h[LLMC_HEADER_INTS * 4];
    if (size >= sizeof h) read_exactly(h, sizeof h, f, path);
    if (size < sizeof h || read_le(h, 4) != LLMC_MAGIC)
        user_error("dataset error: %s: not an llm.c token shard (bad magic, expected %d; "
                   "write GPT-2 shards with llm.c's dev/data scripts)",
                   path, LLMC_MAGIC);
    uint32_t version = (uint32_t)read_le(h + 4, 4);
    if (version != LLMC_VERSION)
        user_error("dataset error: %s: llm.c shard version %u, this build reads version %d "
                   "(uint16 GPT-2 tokens)",
                   path, version, LLMC_VERSION);
    *count = read_le(h + 8, 4);
}

// The header's count must be exactly what the bytes after it hold. Dividing the size, never
// multiplying the count, keeps a crafted count from wrapping around into a match, and nothing is
// allocated before this check.
static void check_token_count(const char *path, uint64_t count, uint64_t size, unsigned header,
                              unsigned width) {
    uint64_t fits = (size - header) / width, stray = (size - header) % width;
    if (count == fits && stray == 0) return;
    user_error("dataset error: %s: its header says %llu tokens but its %llu bytes hold %llu "
               "(a %u-byte header, then %u bytes a token%s): the file is truncated or corrupt "
               "(write it again)",
               path, (unsigned long long)count, (unsigned long long)size, (unsigned long long)fits,
               header, width, stray ? ", and stray bytes at the end" : "");
}

// every rank holds the whole corpus, so one larger than a rank's memory is the user's to shrink
static int *alloc_tokens(uint64_t count, const char *path) {
    int *tokens = NULL;
    if (count <= SIZE_MAX / sizeof(int)) tokens = malloc(count ? count * sizeof(int) : 1);
    if (!tokens)
        user_error("dataset error: %s: %llu tokens need %.1f GiB on every rank, more than this "
                   "machine can allocate (use a smaller dataset)",
                   path, (unsigned long long)count, (double)count * sizeof(int) / (1 << 30));
    return tokens;
}

// tokens: (count) ids, each `width` little-endian bytes in the file. An id must leave room for
// vocab_size = id + 1 in an int.
static void read_tokens(int *tokens, FILE *f, uint64_t count, unsigned width, const char *path) {
    unsigned char *chunk = xmalloc(READ_CHUNK_BYTES);
    for (uint64_t done = 0; done < count;) {
        uint64_t n = READ_CHUNK_BYTES / width;
        if (n > count - done) n = count - done;
        read_exactly(chunk, n * width, f, path);
        for (uint64_t i = 0; i < n; i++) {
            uint64_t token = read_le(chunk + i * width, (int)width);
            if (token >= INT32_MAX)
                user_error("dataset error: %s: token %llu at position %llu is above the largest "
                           "id this build reads, %d (write it again with tokens_write)",
                           path, (unsigned long long)token, (unsigned long long)(done + i),
                           INT32_MAX - 1);
            tokens[done + i] = (int)token;
        }
        done += n;
    }
    free(chunk);
}

void dataset_open(Dataset *ds, const char *path) {
    memset(ds, 0, sizeof *ds);
    snprintf(ds->path, sizeof ds->path, "%s", path);
    int is_txt = ends_with(path, ".txt"), is_tok = ends_with(path, ".tok");
    if (!is_txt && !is_tok && !ends_with(path, ".bin"))
        user_error("dataset error: %s: unknown file type (%s)", path, DATASET_HINT);
    uint64_t size = 0;
    FILE *f = dataset_file(path, &size);
    // byte-level tokens for .txt: every byte of the UTF-8 text is one token, vocab 256
    uint64_t count = size;
    unsigned width = 1, header = 0;
    if (is_tok) {
        read_tok_header(ds, &count, &width, f, size, path);
        header = TOK_HEADER_BYTES;
    } else if (!is_txt) {
        read_llmc_header(&count, f, size, path);
        width = 2;
        header = LLMC_HEADER_INTS * 4;
    }
    check_token_count(path, count, size, header, width);
    ds->tokens = alloc_tokens(count, path);
    ds->num_tokens = (long)count;
    read_tokens(ds->tokens, f, count, width, path);
    fclose(f); // read-only: nothing is lost if closing fails
    for (long i = 0; i < ds->num_tokens; i++)
        if (ds->tokens[i] >= ds->vocab_size) ds->vocab_size = ds->tokens[i] + 1;
}

void dataset_free(Dataset *ds) {
    free(ds->tokens);
    ds->tokens = NULL;
    ds->num_tokens = 0;
}

// windows of seq_length+1 tokens with stride seq_length: the last token of a window is the first
// of the next, so n tokens give (n - 1) / seq_length samples
long dataset_num_samples(const Dataset *ds, int seq_length) {
    long n = ds->num_tokens > 0 ? (ds->num_tokens - 1) / seq_length : 0;
    if (n < 1)
        user_error("dataset error: %s: %ld tokens, fewer than one sample of training.seq_length+1 "
                   "= %d tokens (use a larger dataset or a smaller seq_length)",
                   ds->path, ds->num_tokens, seq_length + 1);
    return n;
}

void dataset_get_batch(int *inputs, int *targets, int *domains, const Dataset *ds, int step,
                       int micro, int grad_acc, int mbs, int seq_length, int dp_rank, int dp_size,
                       long num_samples) {
    long epoch = ds->sample_window ? 0 : dataset_num_samples(ds, seq_length);
    if (num_samples > 0 && num_samples < epoch) epoch = num_samples;
    for (int b = 0; b < mbs; b++) {
        // k counts this rank's samples; the global order interleaves the dp ranks
        long k = ((long)step * grad_acc + micro) * mbs + b;
        long g = k * dp_size + dp_rank;
        int domain = 0;
        const int *window = // (seq_length + 1) tokens; wraps: training may run several epochs
            ds->sample_window ? ds->sample_window(ds->mixture, g, &domain)
                              : ds->tokens + (g % epoch) * seq_length;
        if (domains) domains[b] = domain;
        memcpy(inputs + (long)b * seq_length, window, seq_length * sizeof(int));
        memcpy(targets + (long)b * seq_length, window + 1, seq_length * sizeof(int));
    }
}

void tokens_write(const char *path, const int *tokens, long n, uint64_t tokenizer_fingerprint,
                  int tokenizer_vocab_size) {
    int width = 2;
    for (long i = 0; i < n; i++) {
        if (tokens[i] < 0)
            FAIL("token ids are >= 0", "tokens_write %s: token %d at position %ld", path, tokens[i],
                 i);
        if (tokens[i] > 65535) width = 4;
    }
    unsigned char header[TOK_HEADER_BYTES] = {0};
    memcpy(header, TOK_MAGIC, 8);
    write_le(header + 8, TOK_VERSION, 4);
    write_le(header + 12, (uint64_t)width, 4);
    write_le(header + 16, (uint64_t)n, 8);
    write_le(header + 24, tokenizer_fingerprint, 8);
    write_le(header + 32, (uint64_t)tokenizer_vocab_size, 4);
    unsigned char *body = xmalloc((size_t)n * width);
    for (long i = 0; i < n; i++) write_le(body + i * width, (uint64_t)tokens[i], width);
    FILE *f = xfopen(path, "wb");
    xfwrite(header, 1, sizeof header, f);
    xfwrite(body, 1, (size_t)n * width, f);
    if (fclose(f) != 0) FAIL("is the disk full?", "closing %s failed", path);
    free(body);
}

void dataset_check_tokenizer(const Dataset *ds, const Config *cfg) {
    if (ds->tokenizer_vocab_size > cfg->vocab_size)
        user_error("config error: model.vocab_size = %d is smaller than the vocabulary of the "
                   "tokenizer %s was made with (%d tokens): raise it",
                   cfg->vocab_size, ds->path, ds->tokenizer_vocab_size);
    if (!cfg->tokenizer[0]) return;
    if (!ends_with(ds->path, ".tok"))
        user_error("dataset error: dataset.tokenizer = %s, but %s is not a token file: make one "
                   "with ./prepare_data --tokenizer %s --input %s --output FILE.tok",
                   cfg->tokenizer, ds->path, cfg->tokenizer, ds->path);
    Tokenizer *t = tokenizer_load(cfg->tokenizer);
    int vocab = tokenizer_vocab_size(t);
    uint64_t fingerprint = tokenizer_fingerprint(t);
    tokenizer_free(t);
    if (cfg->vocab_size < vocab)
        user_error("config error: model.vocab_size = %d is smaller than the vocabulary of "
                   "dataset.tokenizer %s (%d tokens): raise it",
                   cfg->vocab_size, cfg->tokenizer, vocab);
    if (!ds->tokenizer_fingerprint)
        user_error("dataset error: %s records no tokenizer, but dataset.tokenizer = %s: prepare "
                   "it with ./prepare_data --tokenizer %s, or leave dataset.tokenizer empty",
                   ds->path, cfg->tokenizer, cfg->tokenizer);
    if (ds->tokenizer_fingerprint != fingerprint)
        user_error("dataset error: %s was made with another tokenizer than dataset.tokenizer = "
                   "%s: prepare it again with ./prepare_data --tokenizer %s",
                   ds->path, cfg->tokenizer, cfg->tokenizer);
}

void dataset_load(Dataset *ds, const char *path, const Config *cfg) {
    dataset_open(ds, path);
    dataset_check_tokenizer(ds, cfg);
    if (ds->vocab_size > cfg->vocab_size)
        user_error("config error: model.vocab_size = %d but %s holds token %d (raise it)",
                   cfg->vocab_size, path, ds->vocab_size - 1);
}

void micro_batch_loader_init(MicroBatchDataLoader *loader, const Dataset *ds, const Config *cfg,
                             int dp_rank, int dp_size, const int *positions, int T) {
    size_t B = cfg->micro_batch_size, S = cfg->seq_length;
    *loader = (MicroBatchDataLoader){.ds = ds,
                                     .micro_batch_size = cfg->micro_batch_size,
                                     .seq_length = cfg->seq_length,
                                     .grad_acc = cfg->gradient_accumulation_steps,
                                     .dp_rank = dp_rank,
                                     .dp_size = dp_size,
                                     .num_samples = cfg->num_samples,
                                     .positions = positions,
                                     .T = T,
                                     .input_ids = xmalloc(B * T * sizeof(int)),
                                     .target_ids = xmalloc(B * T * sizeof(int)),
                                     .domains = xmalloc(B * sizeof(int)),
                                     .window_inputs = xmalloc(B * S * sizeof(int)),
                                     .window_targets = xmalloc(B * S * sizeof(int))};
}

void micro_batch_loader_free(MicroBatchDataLoader *loader) {
    free(loader->input_ids);
    free(loader->target_ids);
    free(loader->domains);
    free(loader->window_inputs);
    free(loader->window_targets);
}

// the dp rank's sequences of the global batch, then the cp rank's positions of each
void load_micro_batch(MicroBatchDataLoader *loader, int step, int micro) {
    int B = loader->micro_batch_size, S = loader->seq_length, T = loader->T;
    dataset_get_batch(loader->window_inputs, loader->window_targets, loader->domains, loader->ds,
                      step, micro, loader->grad_acc, B, S, loader->dp_rank, loader->dp_size,
                      loader->num_samples);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            loader->input_ids[b * T + t] = loader->window_inputs[b * S + loader->positions[t]];
            loader->target_ids[b * T + t] = loader->window_targets[b * S + loader->positions[t]];
        }
}
