// The tokenizer a checkpoint was trained with: its files copied in, and its fingerprint checked
// by ./generate (checkpoint_tokenizer.h)
#include "checkpoint_tokenizer.h"
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "utils.h"

static void write_json(const char *dir, const char *name, cJSON *root) {
    char path[1100], *text = cJSON_Print(root);
    cJSON_Delete(root);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    size_t len = text ? strlen(text) : 0;
    if (text) text[len] = '\n'; // cJSON_Print's '\0' becomes the last line's end
    if (!text || write_whole_file(path, text, len + 1) != 0)
        FAIL("is the disk full? checkpoint.save_dir must stay writable", "cannot write %s: %s",
             path, strerror(errno));
    free(text);
}

static void copy_file(const char *from, const char *dir, const char *name) {
    char path[1100];
    size_t size = 0;
    char *bytes = read_whole_file(from, &size);
    if (!bytes)
        user_error("checkpoint error: dataset.tokenizer's file %s %s (it was read at start-up: "
                   "was it changed?)",
                   from, file_error());
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (write_whole_file(path, bytes, size) != 0)
        FAIL("is the disk full? checkpoint.save_dir must stay writable", "cannot write %s: %s",
             path, strerror(errno));
    free(bytes);
}

// an id, or null (none)
static cJSON *id_json(int id) {
    return id >= 0 ? cJSON_CreateNumber(id) : cJSON_CreateNull();
}

// What AutoTokenizer.from_pretrained(dir) needs beside the files: the class that reads them
// (GPT-2's slow class for vocab.json + merges.txt, the fast one for a tokenizer.json), and the
// special tokens. Without it transformers would take config.json's model_type, llama, and
// LlamaTokenizer would add a "<s>" that the model never saw.
static void write_tokenizer_config(const char *dir, int gpt2_files, int eos, const Config *cfg) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "tokenizer_class",
                            gpt2_files ? "GPT2Tokenizer" : "PreTrainedTokenizerFast");
    const char *names[] = {"bos_token", "eos_token", "unk_token"};
    for (int i = 0; i < (gpt2_files ? 3 : 2); i++)
        cJSON_AddItemToObject(root, names[i],
                              eos >= 0 ? cJSON_CreateString("<|endoftext|>") : cJSON_CreateNull());
    cJSON_AddBoolToObject(root, "add_bos_token", 0); // prepare_data adds none either
    cJSON_AddBoolToObject(root, "add_prefix_space", 0);
    cJSON_AddBoolToObject(root, "clean_up_tokenization_spaces", 0);
    cJSON_AddNumberToObject(root, "model_max_length", cfg->max_position_embeddings);
    write_json(dir, "tokenizer_config.json", root);
}

CheckpointTokenizer checkpoint_tokenizer_save(const char *dir, const Config *cfg) {
    CheckpointTokenizer r = {.fingerprint = 0, .eos = -1};
    int gpt2_files = 0;
    if (cfg->tokenizer[0]) {
        Tokenizer *t = tokenizer_load(cfg->tokenizer);
        gpt2_files = tokenizer_file(t, 1) != NULL;
        copy_file(tokenizer_file(t, 0), dir, gpt2_files ? "vocab.json" : "tokenizer.json");
        if (gpt2_files) copy_file(tokenizer_file(t, 1), dir, "merges.txt");
        tokenizer_free(t);
        // what the folder holds is what it records, even if the originals changed meanwhile
        t = tokenizer_load(dir);
        r.fingerprint = tokenizer_fingerprint(t);
        r.eos = tokenizer_eot(t);
        tokenizer_free(t);
        write_tokenizer_config(dir, gpt2_files, r.eos, cfg);
    }
    cJSON *gen = cJSON_CreateObject();
    cJSON_AddItemToObject(gen, "bos_token_id", id_json(r.eos));
    cJSON_AddItemToObject(gen, "eos_token_id", id_json(r.eos));
    write_json(dir, "generation_config.json", gen);
    return r;
}

// state.json's tokenizer_fingerprint; 0 when the folder has no state.json or it records none
static uint64_t recorded_fingerprint(const char *folder) {
    char path[1100], where[1200];
    snprintf(path, sizeof path, "%s/state.json", folder);
    size_t size = 0;
    char *text = read_whole_file(path, &size);
    if (!text) return 0;
    snprintf(where, sizeof where, "generate: %s", path);
    cJSON *state = json_parse(text, size, NULL, where);
    free(text);
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(state, "tokenizer_fingerprint");
    uint64_t fingerprint = 0;
    char *end = NULL;
    if (cJSON_IsString(item)) fingerprint = strtoull(item->valuestring, &end, 16);
    if (item && (!end || *end || strlen(item->valuestring) != 16 || !fingerprint))
        user_error("generate: %s: tokenizer_fingerprint is not 16 hex digits (was the file "
                   "edited? ./train writes it)",
                   path);
    cJSON_Delete(state);
    return fingerprint;
}

Tokenizer *checkpoint_tokenizer_load(const char *folder, const char *given) {
    uint64_t recorded = recorded_fingerprint(folder);
    if (!given && !recorded) return NULL;
    Tokenizer *t = tokenizer_load(given ? given : folder);
    uint64_t fingerprint = tokenizer_fingerprint(t);
    if (recorded && fingerprint != recorded && given)
        user_error("generate: --tokenizer %s has fingerprint %016llx, but %s was trained with the "
                   "tokenizer of fingerprint %016llx (its state.json): leave out --tokenizer to "
                   "use the checkpoint's own copy, or give the tokenizer it was trained with",
                   given, (unsigned long long)fingerprint, folder, (unsigned long long)recorded);
    if (recorded && fingerprint != recorded)
        user_error("generate: the tokenizer files in %s have fingerprint %016llx, but its "
                   "state.json records %016llx: they were changed; give --tokenizer with the "
                   "tokenizer it was trained with",
                   folder, (unsigned long long)fingerprint, (unsigned long long)recorded);
    return t;
}
