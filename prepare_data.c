// prepare_data: text in, a token file out, through a real tokenizer: what picotron does with a
// Hugging Face dataset and its model's tokenizer, here without Python.
//   ./prepare_data --tokenizer data/gpt2 --input data/austen.txt --output tmp/austen.tok
// --input is a text file (one document), a JSON Lines file (.jsonl: one document per line, its
// "text" field, as Hugging Face datasets export them), or a folder of such files (read in name
// order), or "-" (standard input) or a pipe: one text document, read to its end (a .jsonl
// needs its name). Documents are separated by the tokenizer's end-of-text token, so the model
// learns where one ends. The .tok file records which tokenizer made it: train checks it against the
// config's dataset.tokenizer.
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "data.h"
#include "tokenizer.h"
#include "utils.h"

static const char *USAGE =
    "usage: ./prepare_data --tokenizer PATH --input FILE|FOLDER|- --output FILE.tok\n"
    "  --tokenizer  a tokenizer.json, or a folder with vocab.json and merges.txt (data/gpt2)\n"
    "  --input      a text file, a .jsonl file (a \"text\" field per line), a folder of them,\n"
    "               or - (standard input) or a pipe: one text document\n"
    "  --output     the token file to write (.tok), for dataset.name in the config";

typedef struct {
    Tokenizer *tokenizer;
    int *ids; // the token stream so far
    size_t n, cap;
    long documents;
    double bytes, input_bytes; // read so far, and in all (for the progress line)
    double start, last_report;
} Prepared;

static void add_document(Prepared *p, const char *text, size_t len) {
    int eot = tokenizer_eot(p->tokenizer);
    if (p->documents > 0 && eot >= 0) tokenizer_append(&p->ids, &p->n, &p->cap, eot);
    tokenizer_encode(&p->ids, &p->n, &p->cap, p->tokenizer, text, len);
    p->documents++;
    p->bytes += len;
    double now = now_seconds();
    if (now - p->last_report >= 1.0) { // large inputs say how far they are, once a second
        fprintf(stderr, "prepare_data: %.1f of %.1f MB, %zu tokens, %.1f MB/s\n", p->bytes / 1e6,
                p->input_bytes / 1e6, p->n, p->bytes / 1e6 / (now - p->start));
        p->last_report = now;
    }
}

static int is_jsonl(const char *path) {
    size_t n = strlen(path);
    return n > 6 && strcmp(path + n - 6, ".jsonl") == 0;
}

// one document per line: its "text" field
static void add_jsonl(Prepared *p, const char *path) {
    FILE *f = xfopen(path, "r");
    char *line = NULL;
    size_t size = 0;
    long number = 0;
    for (ssize_t len; (len = getline(&line, &size, f)) != -1;) {
        number++;
        if (strspn(line, " \t\r\n") == (size_t)len) continue; // blank lines hold no document
        char where[64];
        snprintf(where, sizeof where, " line %ld", number);
        char *at = xmalloc(strlen(path) + sizeof where + 16);
        sprintf(at, "prepare_data: %s%s", path, where);
        cJSON *doc = json_parse(line, (size_t)len, NULL, at);
        free(at);
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(doc, "text");
        if (!cJSON_IsString(text))
            user_error("prepare_data: %s line %ld is not a JSON object with a \"text\" string "
                       "(JSON Lines as Hugging Face datasets export them)",
                       path, number);
        add_document(p, text->valuestring, strlen(text->valuestring));
        cJSON_Delete(doc);
    }
    free(line);
    fclose(f);
}

static void add_file(Prepared *p, const char *path) {
    if (is_jsonl(path)) return add_jsonl(p, path);
    size_t len = 0;
    char *text = read_whole_stream(path, &len); // a regular file, or "-" or a pipe to its end
    if (!text) user_error("prepare_data: %s %s", path, file_error());
    add_document(p, text, len);
    free(text);
}

static int by_name(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

// the text and .jsonl files of a folder, in name order (so the token file is reproducible)
static int folder_files(char ***paths, const char *folder) {
    DIR *d = opendir(folder);
    if (!d) user_error("prepare_data: cannot read the folder %s: %s", folder, strerror(errno));
    int n = 0, cap = 16;
    *paths = xmalloc(cap * sizeof(char *));
    for (struct dirent *e; (e = readdir(d));) {
        size_t len = strlen(e->d_name);
        int wanted = (len > 4 && strcmp(e->d_name + len - 4, ".txt") == 0) || is_jsonl(e->d_name);
        if (!wanted) continue;
        if (n == cap) {
            *paths = realloc(*paths, (cap *= 2) * sizeof(char *));
            if (!*paths) FAIL("", "out of memory listing %s", folder);
        }
        (*paths)[n] = xmalloc(strlen(folder) + len + 2);
        sprintf((*paths)[n++], "%s/%s", folder, e->d_name);
    }
    closedir(d);
    qsort(*paths, n, sizeof(char *), by_name);
    if (n == 0)
        user_error("prepare_data: the folder %s holds no .txt or .jsonl file (--input names a "
                   "text file, a .jsonl file or a folder of them)",
                   folder);
    return n;
}

static double file_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (double)st.st_size : 0.0;
}

int main(int argc, char **argv) {
    const char *tokenizer = NULL, *input = NULL, *output = NULL;
    for (int i = 1; i < argc; i++) {
        const char **flag = strcmp(argv[i], "--tokenizer") == 0 ? &tokenizer
                            : strcmp(argv[i], "--input") == 0   ? &input
                            : strcmp(argv[i], "--output") == 0  ? &output
                                                                : NULL;
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            printf("%s\n", USAGE);
            return 0;
        }
        if (!flag) user_error("prepare_data: unknown argument '%s'\n%s", argv[i], USAGE);
        if (i + 1 >= argc) user_error("prepare_data: %s needs a value\n%s", argv[i], USAGE);
        *flag = argv[++i];
    }
    if (!tokenizer || !input || !output)
        user_error("prepare_data: --tokenizer, --input and --output are all needed\n%s", USAGE);
    size_t out_len = strlen(output);
    if (out_len < 4 || strcmp(output + out_len - 4, ".tok") != 0)
        user_error("prepare_data: --output %s must end in .tok (train reads token files by their "
                   "extension)",
                   output);
    struct stat st;
    int stream = strcmp(input, "-") == 0; // standard input: nothing to stat
    if (!stream && stat(input, &st) != 0)
        user_error("prepare_data: --input %s: %s", input, strerror(errno));

    Prepared p = {.tokenizer = tokenizer_load(tokenizer), .start = now_seconds()};
    p.last_report = p.start;
    char **paths = NULL;
    int num_paths = !stream && S_ISDIR(st.st_mode) ? folder_files(&paths, input) : 0;
    for (int i = 0; i < num_paths; i++) p.input_bytes += file_size(paths[i]);
    if (!num_paths && !stream) p.input_bytes = file_size(input);
    if (!num_paths) add_file(&p, input);
    for (int i = 0; i < num_paths; i++) {
        add_file(&p, paths[i]);
        free(paths[i]);
    }
    free(paths);
    if (p.n == 0) user_error("prepare_data: %s holds no text", stream ? "standard input" : input);

    tokens_write(output, p.ids, (long)p.n, tokenizer_fingerprint(p.tokenizer),
                 tokenizer_vocab_size(p.tokenizer));
    double seconds = now_seconds() - p.start;
    printf("prepare_data: %ld document%s, %.2f MB, %zu tokens (%.2f bytes per token, vocabulary "
           "%d) in %.1f s -> %s\n",
           p.documents, p.documents == 1 ? "" : "s", p.bytes / 1e6, p.n, p.bytes / p.n,
           tokenizer_vocab_size(p.tokenizer), seconds, output);
    free(p.ids);
    tokenizer_free(p.tokenizer);
    return 0;
}
