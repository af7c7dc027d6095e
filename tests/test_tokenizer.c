// tokenizer.c gives exactly the ids of Hugging Face tokenizers, which
// tests/reference/make_tokenizer_fixture.py stored in tests/fixtures/tokenizer/: on the hard cases,
// on text with invalid UTF-8 and on the whole of data/austen.txt, for GPT-2 read from vocab.json +
// merges.txt, from tokenizer.json and from its folder, and for the variants of that tokenizer.json
// in variants.json (the pattern as a Split with "left right" merges, SmolLM's Digits, and both
// pre-tokenizers with ignore_merges and every piece of the hard cases a token, so that the ids
// show each cut). Decoding the ids gives back every byte of each text, random bytes included.
// Tolerance: none, ids are integers.
//
// usage: test_tokenizer all DIR          every check, scratch files in DIR
//        test_tokenizer error KIND DIR   writes a bad tokenizer (KIND: see write_bad), prints the
//                                        file the error must name, loads it: must exit 1
#include "data.h"
#include "tokenizer.h"
#include "utils.h"
#include <cjson/cJSON.h>
#include <stdarg.h>
#include <string.h>
#include <sys/stat.h>

#define FIXTURES    "tests/fixtures/tokenizer"
#define GPT2        "data/gpt2"
#define AUSTEN      "data/austen.txt"
#define SHOW_AROUND 4 // ids shown on each side of the first difference

static int failures = 0;

// a claim that failed: one line saying what was measured
static __attribute__((format(printf, 1, 2))) void fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("FAIL ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    failures++;
}

typedef struct {
    int *ids;
    size_t n, cap;
} Ids;

static char *slurp(size_t *size, const char *path) {
    char *text = read_whole_file(path, size);
    if (!text)
        FAIL("run the test from the repository (tests/t_16_tokenizer.sh)", "cannot read %s", path);
    return text;
}

static void write_text(const char *path, const char *text) {
    FILE *f = xfopen(path, "wb");
    xfwrite(text, 1, strlen(text), f);
    fclose(f);
}

static Ids encode(const Tokenizer *t, const char *text, size_t len) {
    Ids out = {0};
    tokenizer_encode(&out.ids, &out.n, &out.cap, t, text, len);
    return out;
}

// a token as printable text: its bytes, with escapes for the others
static void print_token(const Tokenizer *t, int id) {
    size_t len = 0;
    const char *bytes = tokenizer_decode(t, id, &len);
    printf(" %d'", id);
    for (size_t i = 0; bytes && i < len; i++) {
        unsigned char c = (unsigned char)bytes[i];
        if (c >= 32 && c < 127 && c != '\'')
            putchar(c);
        else
            printf("\\x%02x", c);
    }
    printf("'");
}

static void print_ids(const Tokenizer *t, const int *ids, size_t n, size_t from, size_t to) {
    for (size_t i = from; i < to && i < n; i++) print_token(t, ids[i]);
    printf("\n");
}

// the C ids against the reference's, with the ids around the first difference on failure
static void compare(const char *what, const Tokenizer *t, const Ids *got, const int *want,
                    size_t n_want) {
    size_t i = 0;
    while (i < got->n && i < n_want && got->ids[i] == want[i]) i++;
    if (i == got->n && i == n_want) {
        printf("ok   %s: %zu ids, all equal to Hugging Face's\n", what, n_want);
        return;
    }
    size_t from = i > SHOW_AROUND ? i - SHOW_AROUND : 0;
    fail("%s: %zu ids, Hugging Face %zu; the first difference is at id %zu", what, got->n, n_want,
         i);
    printf("    C: ");
    print_ids(t, got->ids, got->n, from, i + SHOW_AROUND);
    printf("    HF:");
    print_ids(t, want, n_want, from, i + SHOW_AROUND);
}

// decode(encode(text)) == text, byte for byte
static void check_round_trip(const char *what, const Tokenizer *t, const Ids *ids, const char *text,
                             size_t len) {
    size_t at = 0, piece;
    int bad_id = -1;
    for (size_t i = 0; i < ids->n && bad_id < 0; i++) {
        const char *bytes = tokenizer_decode(t, ids->ids[i], &piece);
        if (!bytes || at + piece > len || memcmp(text + at, bytes, piece) != 0)
            bad_id = (int)i;
        else
            at += piece;
    }
    if (bad_id < 0 && at == len)
        printf("ok   %s: decoding gives back all %zu bytes\n", what, len);
    else
        fail("%s: decoding gives back %zu of its %zu bytes (id %d differs)", what, at, len, bad_id);
}

// a .tok file as data.c reads it
static Ids read_tok(const char *path) {
    Dataset ds;
    dataset_open(&ds, path);
    Ids out = {ds.tokens, (size_t)ds.num_tokens, (size_t)ds.num_tokens};
    return out;
}

static uint64_t hash_ids(const int *ids, size_t n) {
    uint64_t h = 14695981039346656037ull; // FNV-1a 64 over little-endian uint32, as the script
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < 4; k++)
            h = (h ^ ((uint32_t)ids[i] >> (8 * k) & 0xff)) * 1099511628211ull;
    return h;
}

// the ids of data/austen.txt against the hash of each block of the reference's (austen.blocks)
static void compare_blocks(const char *what, const Tokenizer *t, const Ids *got, const char *path) {
    FILE *f = xfopen(path, "r");
    char line[256];
    long n_want = -1, block = -1, bad = -1, blocks = 0;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#' || sscanf(line, "ids %ld", &n_want) == 1 ||
            sscanf(line, "block %ld", &block) == 1)
            continue;
        size_t from = (size_t)(blocks * block), n = from < got->n ? got->n - from : 0;
        uint64_t want = strtoull(line, NULL, 16);
        if (bad < 0 && hash_ids(got->ids + from, n < (size_t)block ? n : (size_t)block) != want)
            bad = blocks;
        blocks++;
    }
    fclose(f);
    if (!(n_want > 0 && block > 0)) fail("%s: no \"ids\" and \"block\" lines", path);
    if (bad < 0 && (long)got->n == n_want) {
        printf("ok   %s: %zu ids in %ld blocks, every block's hash equal to Hugging Face's\n", what,
               got->n, blocks);
        return;
    }
    fail("%s: %zu ids, Hugging Face %ld; block %ld (ids %ld..) is the first that differs", what,
         got->n, n_want, bad, bad * block);
    if (bad >= 0) {
        printf("    C ids of that block's start:");
        print_ids(t, got->ids, got->n, (size_t)(bad * block),
                  (size_t)(bad * block + 3 * SHOW_AROUND));
    }
}

// data/gpt2/tokenizer.json with a variant's edits (variants.json), written to dir, loaded
static Tokenizer *load_variant(const char *dir, const cJSON *edit) {
    size_t size;
    char *text = slurp(&size, GPT2 "/tokenizer.json");
    cJSON *root = cJSON_Parse(text);
    free(text);
    cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(edit, "pre_tokenizer");
    if (pre) cJSON_ReplaceItemInObjectCaseSensitive(root, "pre_tokenizer", cJSON_Duplicate(pre, 1));
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(edit, "merges_as_strings"))) {
        cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
        for (cJSON *pair = merges->child, *next; pair; pair = next) { // a list: walk, not index
            char joined[512];
            snprintf(joined, sizeof joined, "%s %s", pair->child->valuestring,
                     pair->child->next->valuestring);
            next = pair->next;
            cJSON_ReplaceItemViaPointer(merges, pair, cJSON_CreateString(joined));
        }
    }
    const cJSON *ignore = cJSON_GetObjectItemCaseSensitive(edit, "ignore_merges");
    if (ignore)
        cJSON_ReplaceItemInObjectCaseSensitive(model, "ignore_merges", cJSON_Duplicate(ignore, 1));
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(edit, "vocab");
    for (const cJSON *e = vocab ? vocab->child : NULL; e; e = e->next)
        cJSON_AddItemToObject(cJSON_GetObjectItemCaseSensitive(model, "vocab"), e->string,
                              cJSON_Duplicate(e, 1));
    char path[2048], *json = cJSON_PrintUnformatted(root);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    write_text(path, json);
    free(json);
    cJSON_Delete(root);
    return tokenizer_load(path);
}

typedef struct {
    char *text;
    size_t len;
} Text;

// one tokenizer against one variant's reference ids, on every text
static void check_tokenizer(const char *name, const Tokenizer *t, const char *variant,
                            const Text *hard, const Text *invalid, const Text *austen) {
    char what[256], path[1024];
    const Text *texts[2] = {hard, invalid};
    const char *names[2] = {"hard_cases", "invalid_utf8"};
    for (int k = 0; k < 2; k++) {
        Ids got = encode(t, texts[k]->text, texts[k]->len);
        snprintf(path, sizeof path, FIXTURES "/%s/%s.tok", variant, names[k]);
        Ids want = read_tok(path);
        snprintf(what, sizeof what, "%s, %s", name, names[k]);
        compare(what, t, &got, want.ids, want.n);
        check_round_trip(what, t, &got, texts[k]->text, texts[k]->len);
        free(got.ids);
        free(want.ids);
    }
    double start = now_seconds();
    Ids got = encode(t, austen->text, austen->len);
    double seconds = now_seconds() - start;
    snprintf(what, sizeof what, "%s, austen.txt (%.1f MB/s)", name, austen->len / 1e6 / seconds);
    snprintf(path, sizeof path, FIXTURES "/%s/austen.blocks", variant);
    compare_blocks(what, t, &got, path);
    if (strcmp(variant, "gpt2") == 0) check_round_trip(what, t, &got, austen->text, austen->len);
    free(got.ids);
}

// random bytes, and random strings of pieces that are hard together (cut characters, added
// tokens, contractions, spaces), come back byte for byte
static void check_random_round_trip(const Tokenizer *t) {
    static const char *parts[4][5] = {
        {"a", "s", "ll", "'", "!"},               // letters, 's 'll, punctuation
        {" ", "  ", "\t", "\n ", "\xe3\x80\x80"}, // white space, U+3000 last
        {"1", "\xc3\xa9", "\xf0\x9f\x98\x80", "<|endoftext|>",
         "\r\n\t"},                                      // characters, an added token
        {"\xc3", "\xa9", "\xe2\x82", "\xff", "<|endo"}}; // broken pieces of them
    size_t len = 1 << 20;
    char *text = xmalloc(len + 16);
    uint64_t state = 1234;
    for (int round = 0; round < 2; round++) {
        size_t at = 0;
        while (at < len) {
            state = state * 6364136223846793005ull + 1442695040888963407ull;
            int part = (int)((state >> 33) % 20);
            if (round == 0)
                text[at++] = (char)(state >> 40); // any byte
            else
                at += (size_t)snprintf(text + at, 16, "%s", parts[part / 5][part % 5]);
        }
        Ids got = encode(t, text, at);
        check_round_trip(round == 0 ? "1 MB of random bytes" : "1 MB of random hard pieces", t,
                         &got, text, at);
        free(got.ids);
    }
    free(text);
}

static void check_gpt2_basics(const Tokenizer *t) {
    Ids got = encode(t, "hello world", 11);
    if (!(got.n == 2 && got.ids[0] == 31373 && got.ids[1] == 995))
        fail("\"hello world\" is not [31373, 995]");
    size_t len;
    if (tokenizer_vocab_size(t) != 50257 || tokenizer_eot(t) != 50256)
        fail("GPT-2: vocab %d and eot %d, not 50257 and 50256", tokenizer_vocab_size(t),
             tokenizer_eot(t));
    if (tokenizer_decode(t, -1, &len) || tokenizer_decode(t, 50257, &len))
        fail("ids outside the vocabulary decode to something");
    printf("     GPT-2: \"hello world\" = [%d, %d], vocab %d, eot %d\n", got.ids[0], got.ids[1],
           tokenizer_vocab_size(t), tokenizer_eot(t));
    free(got.ids);
}

static void check_all(const char *dir) {
    Text hard, invalid, austen;
    hard.text = slurp(&hard.len, FIXTURES "/hard_cases.txt");
    invalid.text = slurp(&invalid.len, FIXTURES "/invalid_utf8.bin");
    austen.text = slurp(&austen.len, AUSTEN);

    // GPT-2 three ways: one tokenizer, so one fingerprint
    const char *paths[3] = {GPT2 "/vocab.json", GPT2 "/tokenizer.json", GPT2};
    uint64_t fingerprint[3];
    for (int k = 0; k < 3; k++) {
        double start = now_seconds();
        Tokenizer *t = tokenizer_load(paths[k]);
        printf("     %s loads in %.3f s, fingerprint %016llx\n", paths[k], now_seconds() - start,
               (unsigned long long)tokenizer_fingerprint(t));
        fingerprint[k] = tokenizer_fingerprint(t);
        if (k == 0) {
            check_gpt2_basics(t);
            check_random_round_trip(t);
        }
        if (k < 2) check_tokenizer(paths[k], t, "gpt2", &hard, &invalid, &austen);
        tokenizer_free(t);
    }
    if (!(fingerprint[0] == fingerprint[1] && fingerprint[1] == fingerprint[2]))
        fail("GPT-2's fingerprints differ between its vocab.json, tokenizer.json and folder");

    size_t size;
    char *text = slurp(&size, FIXTURES "/variants.json");
    cJSON *variants = cJSON_Parse(text);
    if (!cJSON_IsObject(variants)) fail(FIXTURES "/variants.json is not a JSON object");
    for (const cJSON *v = variants ? variants->child : NULL; v; v = v->next) {
        if (strcmp(v->string, "gpt2") == 0) continue; // read from the shipped files above
        char vdir[1024], name[256];
        snprintf(vdir, sizeof vdir, "%s/%s", dir, v->string);
        if (make_dirs(vdir) != 0) fail("cannot make %s", vdir);
        snprintf(name, sizeof name, "variant %s", v->string);
        Tokenizer *t = load_variant(vdir, v);
        check_tokenizer(name, t, v->string, &hard, &invalid, &austen);
        // the split variant is GPT-2 in other words; the others encode differently
        int same = tokenizer_fingerprint(t) == fingerprint[0];
        if (same != (strcmp(v->string, "split") == 0))
            fail("%s: fingerprint %s GPT-2's", name, same ? "equal to" : "unlike");
        tokenizer_free(t);
    }
    cJSON_Delete(variants);
    free(text);
    free(hard.text);
    free(invalid.text);
    free(austen.text);
}

// Writes the bad tokenizer KIND in DIR; returns the path to load, and in *named the file the one
// line must name.
static const char *write_bad(const char **named, const char *kind, const char *dir) {
    static char path[1024], other[1024];
    // tokenizer.json files, each wrong in one way
    static const char *json_kinds[][2] = {
        {"malformed", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0,"},
        {"not_bpe", "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"a\": 0}}}"},
        {"llama3_split",
         "{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": "
         "\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+\"}, "
         "\"behavior\": \"Isolated\", \"invert\": false}, \"model\": {\"type\": "
         "\"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}"},
        {"no_byte_tokens", "{\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": "
                           "false}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, "
                           "\"merges\": []}}"},
        {"bad_id", "{\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false}, "
                   "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -3}, \"merges\": []}}"},
    };
    // vocab.json + merges.txt (NULL: no merges.txt)
    static const char *pair_kinds[][2] = {
        {"no_merges", NULL},
        {"merges_line", "#version: 0.2\na b\nab\n"},
        {"merge_not_in_vocab", "#version: 0.2\na b\nb a\n"},
    };
    snprintf(path, sizeof path, "%s/%s", dir, kind);
    if (make_dirs(path) != 0) FAIL("", "cannot make %s", path);
    *named = path;
    if (strcmp(kind, "missing") == 0) {
        snprintf(path, sizeof path, "%s/missing/nothing_here.json", dir);
        return path;
    }
    if (strcmp(kind, "empty_folder") == 0) return path;
    for (size_t k = 0; k < sizeof json_kinds / sizeof json_kinds[0]; k++) {
        if (strcmp(kind, json_kinds[k][0]) != 0) continue;
        snprintf(path, sizeof path, "%s/%s/tokenizer.json", dir, kind);
        write_text(path, json_kinds[k][1]);
        return path;
    }
    for (size_t k = 0; k < sizeof pair_kinds / sizeof pair_kinds[0]; k++) {
        if (strcmp(kind, pair_kinds[k][0]) != 0) continue;
        snprintf(path, sizeof path, "%s/%s/vocab.json", dir, kind);
        write_text(path, "{\"a\": 0, \"b\": 1, \"ab\": 2}");
        snprintf(other, sizeof other, "%s/%s/merges.txt", dir, kind);
        if (pair_kinds[k][1]) write_text(other, pair_kinds[k][1]);
        *named = other;
        return path;
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "error") == 0) {
        const char *named, *path = write_bad(&named, argv[2], argv[3]);
        if (!path) {
            fprintf(stderr, "unknown kind %s\n", argv[2]);
            return 2;
        }
        printf("%s\n", named);
        fflush(stdout);
        tokenizer_load(path);
        printf("%s: the bad tokenizer was accepted\n", argv[2]);
        return 0; // the script expects a failure: returning 0 here is the bug it reports
    }
    if (argc != 3 || strcmp(argv[1], "all") != 0) {
        fprintf(stderr, "usage: %s all DIR | %s error KIND DIR\n", argv[0], argv[0]);
        return 2;
    }
    check_all(argv[2]);
    printf("%s (%d failed checks)\n", failures ? "FAILED" : "all tokenizer checks passed",
           failures);
    return failures ? 1 : 0;
}
