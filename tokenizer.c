// Byte-level BPE with the ids of Hugging Face tokenizers. Encoding a text takes four steps:
//   1. added tokens written in the text ("<|endoftext|>") are cut out first and become their ids,
//      the longest of those that start leftmost winning, as Hugging Face's AddedVocabulary does;
//   2. each stretch between them is cut into pieces by the pre-tokenizer's stages, in order:
//      GPT-2's pattern 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//      (written out by hand below, with the Unicode classes of unicode_tables.h) and, for
//      SmolLM, Digits, which cuts out each number character;
//   3. each byte of a piece becomes the id of its byte token (GPT-2 shows the 256 bytes as
//      printable characters, so "Ġthe" is " the");
//   4. merges join neighbouring tokens, the lowest rank first and the leftmost among equals,
//      until no neighbouring pair has a merge. A heap of candidate merges makes a piece of n
//      bytes cost O(n log n), so a megabyte without a space costs what as many words cost.
// Invalid UTF-8, which Hugging Face cannot be given (it takes strings): each byte that is not
// part of a well-formed character is a piece of its own, its byte's token, and it cuts the text
// as an added token does, so the text on each side gets the ids Hugging Face gives it alone and
// decoding gives every byte back.
#include "tokenizer.h"
#include "unicode_tables.h"
#include "utils.h"
#include <cjson/cJSON.h>
#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_ID          (1 << 24) // larger ids are refused: a corrupt file must not ask for gigabytes
#define MAX_STAGES      4         // pre-tokenizer stages, applied one after another
#define EMPTY_PAIR      UINT64_MAX
#define FNV_OFFSET      14695981039346656037ull
#define CACHE_SLOTS     (1 << 16) // pieces one call remembers, the table at most half full
#define CACHE_MIN_TEXT  4096      // a shorter text repeats too few pieces to pay for the table
#define CACHE_MAX_PIECE 64        // longer pieces are rare: they would only fill the table
#define GPT2_PATTERN                                                                               \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define HOW_TO_FIX                                                                                 \
    "give a tokenizer.json, a vocab.json with merges.txt beside it, or a folder holding them"

enum { SPLIT_GPT2, SPLIT_DIGITS, SPLIT_DIGIT_RUNS }; // the pre-tokenizer stages

typedef struct {
    const char *content; // the text that stands for it in a text to encode
    size_t len;
    int id;
} AddedToken;

typedef struct {
    uint64_t pair; // left id << 32 | right id; EMPTY_PAIR marks a free slot
    int rank, id;  // which merge (lower ranks merge first) and the id it makes
} MergeSlot;

struct Tokenizer {
    char path[1024];   // the file read, for messages
    int vocab_size;    // the largest id + 1
    char **strings;    // (vocab_size): each id as the file spells it; NULL: no such id
    char **bytes;      // (vocab_size): the bytes each id decodes to
    int *num_bytes;    // (vocab_size)
    int *vocab_slots;  // the model's vocabulary, string -> id, open addressing; -1: free
    size_t vocab_mask; // slots - 1, a power of two minus one
    MergeSlot *merges; // (left id, right id) -> rank and merged id, open addressing
    size_t merge_mask; // slots - 1
    int num_merges;    // merges read, the next rank
    int byte_id[256];  // the id of each byte's token
    AddedToken *added; // longest first, so the first that matches is the longest
    int num_added;
    unsigned char starts_added[256]; // 1: an added token starts with this byte
    int stages[MAX_STAGES], num_stages;
    int ignore_merges; // a piece that is a whole token is that token (a tokenizer.json option)
    int eot;
    uint64_t fingerprint;   // FNV-1a of the merges as they are read, then of the ids (finish)
    char merges_path[1040]; // the merges.txt read beside a vocab.json; "": none (tokenizer.json)
};

// ---------------------------------------------------------------------------------------------
// UTF-8, the classes of GPT-2's pattern, and GPT-2's byte-level alphabet

// the length of the well-formed UTF-8 character at s (n bytes left), its code point in *cp;
// 0 when s does not start one: a stray continuation byte, an overlong form, a surrogate, a code
// point above U+10FFFF or a character cut short
static int utf8_char(uint32_t *cp, const unsigned char *s, size_t n) {
    static const uint32_t smallest[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (s[0] < 0x80) {
        *cp = s[0];
        return 1;
    }
    int len = s[0] >= 0xF0 ? 4 : s[0] >= 0xE0 ? 3 : s[0] >= 0xC0 ? 2 : 0;
    if (len == 0 || (size_t)len > n) return 0;
    uint32_t x = s[0] & (0x7F >> len);
    for (int k = 1; k < len; k++) {
        if ((s[k] & 0xC0) != 0x80) return 0;
        x = x << 6 | (s[k] & 0x3F);
    }
    if (x < smallest[len] || x > 0x10FFFF || (x >= 0xD800 && x <= 0xDFFF)) return 0;
    *cp = x;
    return len;
}

// a character of GPT-2's alphabet (below) as UTF-8: it ends at U+0143, so two bytes at most
static int put_utf8(char *out, uint32_t cp) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xC0 | cp >> 6);
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

// 'L' letter, 'N' number, 'S' white space, 'D' a number to Digits only, 'O' any other
static char unicode_class(uint32_t cp) {
    if (cp < 0x80) {
        if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') return 'L';
        if (cp >= '0' && cp <= '9') return 'N';
        return cp == ' ' || (cp >= '\t' && cp <= '\r') ? 'S' : 'O';
    }
    int lo = 0, hi = (int)(sizeof unicode_runs / sizeof unicode_runs[0]) - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (cp < unicode_runs[mid].first)
            hi = mid - 1;
        else if (cp > unicode_runs[mid].last)
            lo = mid + 1;
        else
            return unicode_runs[mid].char_class;
    }
    return 'O';
}

// the class of the character at s, and its length (the text a pre-tokenizer cuts is valid UTF-8)
static char class_at(int *len, const unsigned char *s, size_t n) {
    uint32_t cp = 0xFFFD;
    *len = utf8_char(&cp, s, n);
    if (*len == 0) *len = 1; // not reached: invalid bytes were cut out before
    return unicode_class(cp);
}

// the class GPT-2's pattern sees
static char pattern_class(int *len, const unsigned char *s, size_t n) {
    char c = class_at(len, s, n);
    return c == 'D' ? 'O' : c;
}

// GPT-2 shows each byte as a printable character, so that tokens are readable strings: the
// printable bytes of Latin-1 stand for themselves, the other 68 take U+0100 on, in byte order
static uint32_t byte_char(int byte) {
    if ((byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) || byte >= 0xAE) return byte;
    int before = byte < '!' ? byte : byte < 0xA1 ? byte - 94 : 67; // the non-printable ones below
    return 256 + before;
}

// the byte that character cp stands for, -1 when cp is not in the alphabet
static int char_byte(uint32_t cp) {
    if (cp < 256) return byte_char(cp) == cp ? (int)cp : -1;
    for (int b = 0; b < 256; b++)
        if (byte_char(b) == cp) return b;
    return -1;
}

// ---------------------------------------------------------------------------------------------
// The tables: vocabulary strings -> ids, and pairs of ids -> merges

// hash_string's FNV-1a, over bytes that may hold a zero
static uint64_t fnv1a(uint64_t h, const void *data, size_t n) {
    for (size_t i = 0; i < n; i++) h = (h ^ ((const unsigned char *)data)[i]) * 1099511628211ull;
    return h;
}

static size_t slots_for(size_t entries) { // a power of two, at most half full
    size_t slots = 16;
    while (slots < 2 * entries) slots *= 2;
    return slots;
}

static int vocab_find(const Tokenizer *t, const char *s, size_t len) {
    for (size_t i = fnv1a(FNV_OFFSET, s, len) & t->vocab_mask;; i = (i + 1) & t->vocab_mask) {
        int id = t->vocab_slots[i];
        if (id < 0 || (strncmp(t->strings[id], s, len) == 0 && t->strings[id][len] == 0)) return id;
    }
}

static MergeSlot *merge_slot(const Tokenizer *t, int left, int right) {
    uint64_t pair = (uint64_t)left << 32 | (uint32_t)right;
    // Fibonacci hashing: the high half of pair * 2^64/phi, which every bit of the pair moves
    for (size_t i = (pair * 11400714819323198485ull) >> 32 & t->merge_mask;;
         i = (i + 1) & t->merge_mask)
        if (t->merges[i].pair == pair || t->merges[i].pair == EMPTY_PAIR) return &t->merges[i];
}

// ---------------------------------------------------------------------------------------------
// Loading: tokenizer.json, or vocab.json + merges.txt

static cJSON *read_json(const char *path) {
    size_t size;
    char *text = read_whole_file(path, &size);
    if (!text) user_error("tokenizer error: %s %s (%s)", path, file_error(), HOW_TO_FIX);
    const char *end = NULL;
    char *where = xmalloc(strlen(path) + 32);
    sprintf(where, "tokenizer error: %s", path);
    cJSON *root = json_parse(text, size, &end, where);
    free(where);
    if (!cJSON_IsObject(root)) {
        long at = root || !end ? 0 : end - text, line = 1;
        for (long i = 0; i < at; i++) line += text[i] == '\n';
        user_error("tokenizer error: %s: not a JSON object (%s at byte %ld, line %ld); "
                   "download the file again",
                   path, root ? "another value" : "a syntax error", at, line);
    }
    free(text);
    return root;
}

static int json_true(const cJSON *object, const char *key) {
    return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(object, key));
}

static const char *json_string(const cJSON *object, const char *key) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(object, key);
    return cJSON_IsString(item) ? item->valuestring : "";
}

// the id of token `token` in a file: a whole number in [0, MAX_ID)
static int read_id(const cJSON *item, const char *token, const char *path) {
    double x = cJSON_IsNumber(item) ? item->valuedouble : -1;
    if (x < 0 || x >= MAX_ID || x != (int)x)
        user_error("tokenizer error: %s: token \"%s\" has id %s, not a whole number from 0 to %d",
                   path, token, cJSON_IsNumber(item) ? cJSON_PrintUnformatted(item) : "(none)",
                   MAX_ID - 1);
    return (int)x;
}

static char *copy_string(const char *s, size_t len) {
    char *copy = xmalloc(len + 1);
    memcpy(copy, s, len);
    return copy;
}

// Makes room for ids up to max_id and the vocabulary table, for vocab (an object string: id);
// tokenizer.json's added tokens may lie beyond the model's vocabulary.
static void alloc_vocab(Tokenizer *t, const cJSON *vocab, int max_id) {
    int count = 0;
    for (const cJSON *e = vocab->child; e; e = e->next, count++) {
        int id = read_id(e, e->string, t->path);
        if (id > max_id) max_id = id;
    }
    t->vocab_size = max_id + 1;
    t->strings = xmalloc(t->vocab_size * sizeof(char *));
    t->bytes = xmalloc(t->vocab_size * sizeof(char *));
    t->num_bytes = xmalloc(t->vocab_size * sizeof(int));
    size_t slots = slots_for(count);
    t->vocab_mask = slots - 1;
    t->vocab_slots = xmalloc(slots * sizeof(int));
    memset(t->vocab_slots, 0xff, slots * sizeof(int)); // -1: free
}

static void set_string(Tokenizer *t, int id, const char *s) {
    if (t->strings[id] && strcmp(t->strings[id], s) != 0)
        user_error("tokenizer error: %s: id %d is given to both \"%s\" and \"%s\"", t->path, id,
                   t->strings[id], s);
    if (!t->strings[id]) t->strings[id] = copy_string(s, strlen(s));
}

static void read_vocab(Tokenizer *t, const cJSON *vocab) {
    for (const cJSON *e = vocab->child; e; e = e->next) {
        int id = read_id(e, e->string, t->path);
        set_string(t, id, e->string);
        size_t len = strlen(e->string);
        int found = vocab_find(t, e->string, len);
        if (found >= 0 && found != id)
            user_error("tokenizer error: %s: \"%s\" has two ids, %d and %d", t->path, e->string,
                       found, id);
        size_t i = fnv1a(FNV_OFFSET, e->string, len) & t->vocab_mask;
        while (t->vocab_slots[i] >= 0 && t->vocab_slots[i] != id) i = (i + 1) & t->vocab_mask;
        t->vocab_slots[i] = id;
    }
}

static void add_token(Tokenizer *t, const char *content, int id) {
    set_string(t, id, content);
    t->added = realloc(t->added, (t->num_added + 1) * sizeof(AddedToken));
    if (!t->added) FAIL("", "out of memory for %d added tokens", t->num_added + 1);
    t->added[t->num_added++] = (AddedToken){t->strings[id], strlen(content), id};
}

// merge number t->num_merges: left + right -> their concatenation, three strings of the vocabulary
static void add_merge(Tokenizer *t, const char *left, const char *right, const char *where) {
    size_t nl = strlen(left), nr = strlen(right);
    char *joined = xmalloc(nl + nr + 1);
    memcpy(joined, left, nl);
    memcpy(joined + nl, right, nr);
    const char *missing = NULL;
    int a = vocab_find(t, left, nl), b = vocab_find(t, right, nr),
        ab = vocab_find(t, joined, nl + nr);
    if (a < 0 || b < 0 || ab < 0) missing = a < 0 ? left : b < 0 ? right : joined;
    if (missing)
        user_error("tokenizer error: %s: merge \"%s %s\": \"%s\" is not in the vocabulary (the "
                   "vocabulary and the merges come from different tokenizers?)",
                   where, left, right, missing);
    free(joined);
    // a pair merged twice keeps its last rank, as Hugging Face's table of merges does
    MergeSlot *slot = merge_slot(t, a, b);
    *slot = (MergeSlot){(uint64_t)a << 32 | (uint32_t)b, t->num_merges++, ab};
    int pair[2] = {a, b};
    t->fingerprint = fnv1a(t->fingerprint, pair, sizeof pair);
}

static void alloc_merges(Tokenizer *t, size_t count) {
    size_t slots = slots_for(count);
    t->merge_mask = slots - 1;
    t->merges = xmalloc(slots * sizeof(MergeSlot));
    for (size_t i = 0; i < slots; i++) t->merges[i].pair = EMPTY_PAIR;
}

// one stage of the pre-tokenizer; ByteLevel, which maps bytes to characters, must come last
static void read_pre_tokenizer_step(Tokenizer *t, const cJSON *step, int *byte_level) {
    const char *type = json_string(step, "type");
    if (*byte_level)
        user_error("tokenizer error: %s: pre-tokenizer %s after ByteLevel; this tokenizer needs "
                   "ByteLevel last",
                   t->path, type);
    if (t->num_stages == MAX_STAGES)
        user_error("tokenizer error: %s: more than %d pre-tokenizers", t->path, MAX_STAGES);
    int *stage = &t->stages[t->num_stages];
    const cJSON *pattern = cJSON_GetObjectItemCaseSensitive(step, "pattern");
    if (strcmp(type, "ByteLevel") == 0) {
        if (!cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(step, "add_prefix_space")))
            user_error("tokenizer error: %s: ByteLevel with add_prefix_space true, which this "
                       "tokenizer does not support (set it to false)",
                       t->path);
        *byte_level = 1;
        // use_regex, true by default, is GPT-2's pattern
        if (!cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(step, "use_regex"))) {
            *stage = SPLIT_GPT2;
            t->num_stages++;
        }
    } else if (strcmp(type, "Split") == 0) {
        if (strcmp(json_string(pattern, "Regex"), GPT2_PATTERN) != 0 ||
            strcmp(json_string(step, "behavior"), "Isolated") != 0 || json_true(step, "invert"))
            user_error("tokenizer error: %s: a Split pre-tokenizer other than GPT-2's pattern, "
                       "Isolated, not inverted; this tokenizer knows GPT-2's pattern only",
                       t->path);
        *stage = SPLIT_GPT2;
        t->num_stages++;
    } else if (strcmp(type, "Digits") == 0) {
        *stage = json_true(step, "individual_digits") ? SPLIT_DIGITS : SPLIT_DIGIT_RUNS;
        t->num_stages++;
    } else {
        user_error("tokenizer error: %s: pre-tokenizer \"%s\"; this tokenizer knows ByteLevel, "
                   "Split with GPT-2's pattern, Digits and a Sequence of them",
                   t->path, type);
    }
}

// checks that the options which change ids are those this file implements
static void check_tokenizer_json(const Tokenizer *t, const cJSON *root, const cJSON *model) {
    const cJSON *normalizer = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    const char *decoder = json_string(cJSON_GetObjectItemCaseSensitive(root, "decoder"), "type");
    const char *refused = NULL;
    if (strcmp(json_string(model, "type"), "BPE") != 0)
        refused = "a model other than BPE";
    else if (normalizer && !cJSON_IsNull(normalizer))
        refused = "a normalizer";
    else if (json_true(model, "byte_fallback"))
        refused = "byte_fallback";
    else if (cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(model, "dropout")))
        refused = "BPE dropout";
    else if (json_string(model, "continuing_subword_prefix")[0])
        refused = "a continuing_subword_prefix";
    else if (json_string(model, "end_of_word_suffix")[0])
        refused = "an end_of_word_suffix";
    else if (decoder[0] && strcmp(decoder, "ByteLevel") != 0)
        refused = "a decoder other than ByteLevel";
    if (refused)
        user_error("tokenizer error: %s: it has %s; this tokenizer reads byte-level BPE "
                   "(GPT-2, SmolLM) only",
                   t->path, refused);
}

static void load_tokenizer_json(Tokenizer *t, const cJSON *root) {
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    check_tokenizer_json(t, root, model);
    if (!cJSON_IsObject(vocab) || !cJSON_IsArray(merges) || (added && !cJSON_IsArray(added)))
        user_error("tokenizer error: %s: model.vocab must be an object, model.merges and "
                   "added_tokens lists (download the file again)",
                   t->path);
    t->ignore_merges = json_true(model, "ignore_merges");
    int byte_level = 0;
    const cJSON *steps = cJSON_GetObjectItemCaseSensitive(pre, "pretokenizers");
    if (strcmp(json_string(pre, "type"), "Sequence") == 0 && cJSON_IsArray(steps))
        for (const cJSON *step = steps->child; step; step = step->next)
            read_pre_tokenizer_step(t, step, &byte_level);
    else if (pre && !cJSON_IsNull(pre))
        read_pre_tokenizer_step(t, pre, &byte_level);
    if (!byte_level)
        user_error("tokenizer error: %s: no ByteLevel pre-tokenizer, so not byte-level BPE "
                   "(GPT-2, SmolLM): this tokenizer cannot read it",
                   t->path);

    int max_id = -1;
    for (const cJSON *a = added ? added->child : NULL; a; a = a->next) {
        const char *content = json_string(a, "content");
        int id = read_id(cJSON_GetObjectItemCaseSensitive(a, "id"), content, t->path);
        if (id > max_id) max_id = id;
        if (json_true(a, "lstrip") || json_true(a, "rstrip") || json_true(a, "single_word") ||
            !content[0])
            user_error("tokenizer error: %s: added token \"%s\" is empty or asks for lstrip, "
                       "rstrip or single_word, which this tokenizer does not support",
                       t->path, content);
    }
    alloc_vocab(t, vocab, max_id);
    read_vocab(t, vocab);
    for (const cJSON *a = added ? added->child : NULL; a; a = a->next)
        add_token(t, json_string(a, "content"),
                  (int)cJSON_GetObjectItemCaseSensitive(a, "id")->valuedouble); // read above

    alloc_merges(t, cJSON_GetArraySize(merges));
    for (const cJSON *m = merges->child; m; m = m->next) {
        // "left right" (files before tokenizers 0.20) or ["left", "right"]
        const char *s = cJSON_IsString(m) ? m->valuestring : NULL, *space = s ? strchr(s, ' ') : 0;
        if (space && !strchr(space + 1, ' ')) {
            char *left = copy_string(s, space - s);
            add_merge(t, left, space + 1, t->path);
            free(left);
        } else if (cJSON_GetArraySize(m) == 2 && cJSON_IsString(m->child) &&
                   cJSON_IsString(m->child->next)) {
            add_merge(t, m->child->valuestring, m->child->next->valuestring, t->path);
        } else {
            user_error("tokenizer error: %s: merge %d is neither \"left right\" nor "
                       "[\"left\", \"right\"] (download the file again)",
                       t->path, t->num_merges);
        }
    }
}

// GPT-2's own files: merges.txt beside vocab.json, one "left right" a line after "#version";
// "<|endoftext|>" is the added special token, as GPT2TokenizerFast makes it
static void load_vocab_and_merges(Tokenizer *t, const cJSON *vocab) {
    char *merges_path = t->merges_path;
    const char *slash = strrchr(t->path, '/');
    snprintf(merges_path, sizeof t->merges_path, "%.*smerges.txt",
             slash ? (int)(slash - t->path + 1) : 0, t->path);
    size_t size;
    char *text = read_whole_file(merges_path, &size);
    if (!text)
        user_error("tokenizer error: %s%s%s; %s needs GPT-2's merges.txt beside it (or give a "
                   "tokenizer.json)",
                   merges_path, errno == ENOENT ? ": " : " ",
                   errno == ENOENT ? "no such file" : file_error(), t->path);
    t->stages[t->num_stages++] = SPLIT_GPT2;
    alloc_vocab(t, vocab, -1);
    read_vocab(t, vocab);
    int eot = vocab_find(t, "<|endoftext|>", strlen("<|endoftext|>"));
    if (eot >= 0) add_token(t, "<|endoftext|>", eot);

    size_t lines = 0;
    for (size_t i = 0; i < size; i++) lines += text[i] == '\n';
    alloc_merges(t, lines + 1);
    char *line = text, *next;
    for (int number = 1; line < text + size; line = next, number++) {
        next = strchr(line, '\n');
        next = next ? (*next = 0, next + 1) : text + size;
        if (strncmp(line, "#version", 8) == 0) continue;
        char *space = strchr(line, ' ');
        if (!space || strchr(space + 1, ' ') || space == line || !space[1])
            user_error("tokenizer error: %s:%d: not \"left right\" (download merges.txt again)",
                       merges_path, number);
        *space = 0;
        char where[sizeof t->merges_path + 16];
        snprintf(where, sizeof where, "%s:%d", merges_path, number);
        add_merge(t, line, space + 1, where);
    }
    free(text);
}

// The bytes a token string stands for: its characters back to bytes; a string with a character
// outside GPT-2's alphabet (an added token such as "<|im start|>" with a real space) is its own
// UTF-8, as Hugging Face's ByteLevel decoder does.
static char *token_bytes(int *n, const char *s) {
    size_t len = strlen(s);
    char *out = xmalloc(len + 1);
    const unsigned char *u = (const unsigned char *)s;
    *n = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp = 0;
        int k = utf8_char(&cp, u + i, len - i), byte = k ? char_byte(cp) : -1;
        if (byte < 0) {
            memcpy(out, s, len);
            *n = (int)len;
            return out;
        }
        out[(*n)++] = (char)byte;
        i += k;
    }
    return out;
}

static int longer_first(const void *a, const void *b) {
    size_t la = ((const AddedToken *)a)->len, lb = ((const AddedToken *)b)->len;
    return la > lb ? -1 : la < lb;
}

// what both loaders share once the vocabulary, the added tokens and the merges are read
static void finish(Tokenizer *t) {
    for (int b = 0; b < 256; b++) {
        char s[4];
        int len = put_utf8(s, byte_char(b));
        t->byte_id[b] = vocab_find(t, s, len);
        if (t->byte_id[b] < 0)
            user_error("tokenizer error: %s: byte %d (\"%.*s\") has no token, so this is not a "
                       "byte-level BPE vocabulary",
                       t->path, b, len, s);
    }
    // the merges went into the fingerprint as they were read; the ids and the splitting follow
    for (int id = 0; id < t->vocab_size; id++) {
        if (!t->strings[id]) continue;
        t->bytes[id] = token_bytes(&t->num_bytes[id], t->strings[id]);
        t->fingerprint = fnv1a(t->fingerprint, &id, sizeof id);
        t->fingerprint = fnv1a(t->fingerprint, t->strings[id], strlen(t->strings[id]));
    }
    qsort(t->added, t->num_added, sizeof(AddedToken), longer_first);
    t->eot = -1;
    for (int i = 0; i < t->num_added; i++) {
        t->starts_added[(unsigned char)t->added[i].content[0]] = 1;
        if (!strcmp(t->added[i].content, "<|endoftext|>")) t->eot = t->added[i].id;
        t->fingerprint = fnv1a(t->fingerprint, &t->added[i].id, sizeof(int));
    }
    t->fingerprint = fnv1a(t->fingerprint, t->stages, t->num_stages * sizeof(int));
    t->fingerprint = fnv1a(t->fingerprint, &t->ignore_merges, sizeof(int));
}

Tokenizer *tokenizer_load(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0)
        user_error("tokenizer error: %s: %s (%s)", path,
                   errno == ENOENT ? "no such file or folder" : strerror(errno), HOW_TO_FIX);
    Tokenizer *t = xmalloc(sizeof(Tokenizer));
    if (strlen(path) + 32 > sizeof t->path) // room for "/tokenizer.json" and "merges.txt"
        user_error("tokenizer error: %s is longer than %zu characters", path, sizeof t->path - 32);
    snprintf(t->path, sizeof t->path, "%s", path);
    if (S_ISDIR(st.st_mode)) { // a model's folder: tokenizer.json first, as transformers does
        snprintf(t->path, sizeof t->path, "%s/tokenizer.json", path);
        if (stat(t->path, &st) != 0) snprintf(t->path, sizeof t->path, "%s/vocab.json", path);
        if (stat(t->path, &st) != 0)
            user_error("tokenizer error: %s: a folder with neither tokenizer.json nor vocab.json "
                       "in it (%s)",
                       path, HOW_TO_FIX);
    }
    t->fingerprint = FNV_OFFSET;
    cJSON *root = read_json(t->path);
    // a tokenizer.json has a "model" object; a vocab.json may have the token "model" (GPT-2's does)
    if (cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(root, "model")))
        load_tokenizer_json(t, root);
    else
        load_vocab_and_merges(t, root);
    cJSON_Delete(root);
    finish(t);
    return t;
}

void tokenizer_free(Tokenizer *t) {
    if (!t) return;
    for (int id = 0; id < t->vocab_size; id++) {
        free(t->strings[id]);
        free(t->bytes[id]);
    }
    free(t->strings);
    free(t->bytes);
    free(t->num_bytes);
    free(t->vocab_slots);
    free(t->merges);
    free(t->added);
    free(t);
}

int tokenizer_vocab_size(const Tokenizer *t) {
    return t->vocab_size;
}
int tokenizer_eot(const Tokenizer *t) {
    return t->eot;
}
uint64_t tokenizer_fingerprint(const Tokenizer *t) {
    return t->fingerprint;
}
const char *tokenizer_file(const Tokenizer *t, int i) {
    return i == 0 ? t->path : i == 1 && t->merges_path[0] ? t->merges_path : NULL;
}

const char *tokenizer_decode(const Tokenizer *t, int id, size_t *len) {
    if (id < 0 || id >= t->vocab_size || !t->strings[id]) return NULL;
    *len = (size_t)t->num_bytes[id];
    return t->bytes[id];
}

// ---------------------------------------------------------------------------------------------
// Pre-tokenisation: where the piece that starts at s[i] ends (i < end, end: the stretch's end)

// GPT-2's pattern, its alternatives tried in order, as the regex engine does
static size_t gpt2_piece_end(const unsigned char *s, size_t i, size_t end) {
    // 's 't 're 've 'm 'll 'd, in lower case only as the pattern is written
    if (s[i] == '\'' && i + 1 < end) {
        unsigned char a = s[i + 1], b = i + 2 < end ? s[i + 2] : 0;
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
        if ((a == 'r' || a == 'v') && b == 'e') return i + 3;
        if (a == 'l' && b == 'l') return i + 3;
    }
    // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: a space may lead a run of one class
    int len, next_len;
    char c = pattern_class(&len, s + i, end - i);
    size_t run = i + len;
    if (s[i] == ' ' && run < end) {
        char next = pattern_class(&next_len, s + run, end - run);
        if (next != 'S') {
            c = next;
            run += next_len;
        }
    }
    if (c != 'S') {
        while (run < end && pattern_class(&len, s + run, end - run) == c) run += len;
        return run;
    }
    // `\s+(?!\S)`: white space up to the stretch's end, or up to its last character when
    // something else follows, so that character (a space) can lead the next piece; `\s+`: one
    size_t last = i; // where the run's last character starts
    for (; run < end && pattern_class(&len, s + run, end - run) == 'S'; run += len) last = run;
    return run == end || last == i ? run : last;
}

// Digits: each number character a piece of its own, or each run of them (individual_digits false)
static size_t digits_piece_end(int individual, const unsigned char *s, size_t i, size_t end) {
    int len;
    char c = class_at(&len, s + i, end - i);
    int numeric = c == 'N' || c == 'D';
    size_t run = i + len;
    if (numeric && individual) return run;
    for (; run < end; run += len) {
        c = class_at(&len, s + run, end - run);
        if ((c == 'N' || c == 'D') != numeric) break;
    }
    return run;
}

// ---------------------------------------------------------------------------------------------
// BPE over one piece, and the encoder that feeds it

typedef struct {
    int rank, pos; // merging the symbol at pos with the next one, rank of that merge
} Candidate;

// A piece seen before in this call: its ids are those of its first time, already in the output
typedef struct {
    size_t at, len;      // the piece is text[at, at + len); len 0: a free slot
    size_t first, count; // its ids are (*ids)[first, first + count)
} CachedPiece;

typedef struct {
    const Tokenizer *t;
    const unsigned char *text;
    int **ids; // the caller's array, grown as ids come
    size_t *n, *cap;
    CachedPiece *cache; // CACHE_SLOTS, for a text of CACHE_MIN_TEXT bytes or more; else NULL
    int cached;         // pieces in the cache
    // scratch for one piece, grown to the longest piece so far
    int *sym, *prev, *next; // each symbol's id (-1: merged into its left neighbour) and links
    Candidate *heap;        // a min-heap on (rank, pos): Hugging Face's order of merges
    size_t heap_size, scratch;
    char *mapped; // ignore_merges: the piece as the vocabulary spells it
} Encoder;

void tokenizer_append(int **ids, size_t *n, size_t *cap, int id) {
    if (*n == *cap) {
        size_t grown_cap = *cap ? 2 * *cap : 1024;
        int *grown = realloc(*ids, grown_cap * sizeof(int));
        if (!grown)
            FAIL("the text is too large for this machine", "out of memory for %zu ids", grown_cap);
        *ids = grown;
        *cap = grown_cap;
    }
    (*ids)[(*n)++] = id;
}

static void push_id(Encoder *e, int id) {
    tokenizer_append(e->ids, e->n, e->cap, id);
}

static int before(Candidate a, Candidate b) {
    return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos);
}

// queues the merge of symbol pos with the next one, if the vocabulary has one
static void push_candidate(Encoder *e, int pos) {
    const MergeSlot *m = merge_slot(e->t, e->sym[pos], e->sym[e->next[pos]]);
    if (m->pair == EMPTY_PAIR) return;
    size_t i = e->heap_size++;
    Candidate c = {m->rank, pos};
    for (; i > 0 && before(c, e->heap[(i - 1) / 2]); i = (i - 1) / 2)
        e->heap[i] = e->heap[(i - 1) / 2];
    e->heap[i] = c;
}

static Candidate pop_candidate(Encoder *e) {
    Candidate top = e->heap[0], last = e->heap[--e->heap_size];
    size_t i = 0;
    for (size_t child; (child = 2 * i + 1) < e->heap_size; i = child) {
        if (child + 1 < e->heap_size && before(e->heap[child + 1], e->heap[child])) child++;
        if (!before(e->heap[child], last)) break;
        e->heap[i] = e->heap[child];
    }
    e->heap[i] = last;
    return top;
}

static void free_scratch(Encoder *e) {
    free(e->sym);
    free(e->prev);
    free(e->next);
    free(e->heap);
    free(e->mapped);
}

static void grow_scratch(Encoder *e, size_t n) {
    if (n <= e->scratch) return;
    free_scratch(e);
    e->scratch = 2 * n;
    e->sym = xmalloc(e->scratch * sizeof(int));
    e->prev = xmalloc(e->scratch * sizeof(int));
    e->next = xmalloc(e->scratch * sizeof(int));
    e->heap = xmalloc(3 * e->scratch * sizeof(Candidate)); // n - 1 first, then 2 a merge
    e->mapped = xmalloc(2 * e->scratch + 1);               // at most 2 bytes a character
}

static void encode_piece(Encoder *e, size_t start, size_t end) {
    const Tokenizer *t = e->t;
    const unsigned char *s = e->text + start;
    int n = (int)(end - start);
    if (n == 1) { // most pieces of a text are longer, but spaces and punctuation are not
        push_id(e, t->byte_id[s[0]]);
        return;
    }
    grow_scratch(e, n);
    if (t->ignore_merges) {
        size_t len = 0;
        for (int k = 0; k < n; k++) len += put_utf8(e->mapped + len, byte_char(s[k]));
        int id = vocab_find(t, e->mapped, len);
        if (id >= 0) {
            push_id(e, id);
            return;
        }
    }
    for (int k = 0; k < n; k++) {
        e->sym[k] = t->byte_id[s[k]];
        e->prev[k] = k - 1;
        e->next[k] = k + 1 < n ? k + 1 : -1;
    }
    e->heap_size = 0;
    for (int k = 0; k + 1 < n; k++) push_candidate(e, k);
    while (e->heap_size > 0) {
        Candidate c = pop_candidate(e);
        int left = c.pos, right = e->next[left];
        if (e->sym[left] < 0 || right < 0) continue; // merged away since it was queued
        const MergeSlot *m = merge_slot(t, e->sym[left], e->sym[right]);
        if (m->pair == EMPTY_PAIR || m->rank != c.rank) continue; // the pair changed since
        e->sym[left] = m->id;
        e->sym[right] = -1;
        e->next[left] = e->next[right];
        if (e->next[left] >= 0) e->prev[e->next[left]] = left;
        if (e->prev[left] >= 0) push_candidate(e, e->prev[left]);
        if (e->next[left] >= 0) push_candidate(e, left);
    }
    for (int k = 0; k >= 0; k = e->next[k]) push_id(e, e->sym[k]);
}

// Words repeat, so most pieces of a long text were encoded before: their ids are copied from
// the first time, found by the piece's bytes
static void encode_piece_cached(Encoder *e, size_t start, size_t end) {
    size_t len = end - start;
    if (!e->cache || len == 1 || len > CACHE_MAX_PIECE) {
        encode_piece(e, start, end);
        return;
    }
    const unsigned char *s = e->text + start;
    size_t i = fnv1a(FNV_OFFSET, s, len) & (CACHE_SLOTS - 1);
    for (; e->cache[i].len; i = (i + 1) & (CACHE_SLOTS - 1)) {
        const CachedPiece *c = &e->cache[i];
        if (c->len != len || memcmp(e->text + c->at, s, len) != 0) continue;
        for (size_t k = 0; k < c->count; k++) push_id(e, (*e->ids)[c->first + k]);
        return;
    }
    size_t first = *e->n;
    encode_piece(e, start, end);
    if (e->cached < CACHE_SLOTS / 2) {
        e->cache[i] = (CachedPiece){start, len, first, *e->n - first};
        e->cached++;
    }
}

// cuts text[start, end) by pre-tokenizer stage `stage` and the ones after it, then encodes
static void encode_stretch(Encoder *e, int stage, size_t start, size_t end) {
    if (start == end) return; // between two added tokens
    if (stage == e->t->num_stages) {
        encode_piece_cached(e, start, end);
        return;
    }
    int kind = e->t->stages[stage];
    for (size_t i = start, piece_end; i < end; i = piece_end) {
        piece_end = kind == SPLIT_GPT2 ? gpt2_piece_end(e->text, i, end)
                                       : digits_piece_end(kind == SPLIT_DIGITS, e->text, i, end);
        encode_stretch(e, stage + 1, i, piece_end);
    }
}

// The longest added token written at s, NULL if none. Hugging Face looks for the tokens with
// "normalized": false first, then for the others: the same cuts unless two added tokens overlap.
static const AddedToken *added_at(const Tokenizer *t, const unsigned char *s, size_t n) {
    for (int i = 0; i < t->num_added; i++)
        if (t->added[i].len <= n && memcmp(s, t->added[i].content, t->added[i].len) == 0)
            return &t->added[i];
    return NULL;
}

size_t tokenizer_encode(int **ids, size_t *n, size_t *cap, const Tokenizer *t, const char *text,
                        size_t len) {
    Encoder e = {.t = t, .text = (const unsigned char *)text, .ids = ids, .n = n, .cap = cap};
    if (len >= CACHE_MIN_TEXT) e.cache = xmalloc(CACHE_SLOTS * sizeof(CachedPiece));
    const unsigned char *s = e.text;
    size_t stretch = 0; // where the text since the last added token or invalid byte starts
    for (size_t i = 0; i < len;) {
        const AddedToken *added = t->starts_added[s[i]] ? added_at(t, s + i, len - i) : NULL;
        uint32_t cp;
        int char_len = added ? 0 : utf8_char(&cp, s + i, len - i);
        if (char_len > 0) {
            i += char_len;
            continue;
        }
        encode_stretch(&e, 0, stretch, i);
        push_id(&e, added ? added->id : t->byte_id[s[i]]);
        i += added ? added->len : 1;
        stretch = i;
    }
    encode_stretch(&e, 0, stretch, len);
    free_scratch(&e);
    free(e.cache);
    return *n;
}
