// A byte-level BPE tokenizer, the kind GPT-2 and SmolLM use: text is cut by GPT-2's
// pre-tokenisation pattern (SmolLM first cuts out each digit), each piece's UTF-8 bytes are mapped
// to printable characters, and the merges are applied by rank. Reads a Hugging Face tokenizer.json
// (model BPE; pre-tokenizer ByteLevel, maybe after a Split with GPT-2's pattern or Digits) or
// GPT-2's vocab.json + merges.txt. Its ids are those of Hugging Face tokenizers'
// encode(text, add_special_tokens=False); a file with anything else that changes ids (Llama-3's
// pattern, a normalizer, byte_fallback, ...) is refused with one line rather than mis-encoded.
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef struct Tokenizer Tokenizer; // tokenizer.c: the vocabulary, the merge ranks, the specials

// path: a tokenizer.json, a vocab.json (merges.txt beside it), or a folder holding either
// (tokenizer.json first, as transformers reads a model's folder).
// A missing or malformed file ends the run with one line naming it.
Tokenizer *tokenizer_load(const char *path);
void tokenizer_free(Tokenizer *t);
int tokenizer_vocab_size(const Tokenizer *t); // the largest id + 1
int tokenizer_eot(const Tokenizer *t);        // the end-of-text id ("<|endoftext|>"), -1: none
// what the tokenizer is, in 64 bits (its vocabulary, merges, added tokens and pre-tokenizer; the
// same from vocab.json + merges.txt as from the tokenizer.json made of them): token files record
// it, so that train can refuse a file made with another tokenizer than the config names
uint64_t tokenizer_fingerprint(const Tokenizer *t);
// the files t was read from, i = 0, 1, ...: its tokenizer.json, or its vocab.json then merges.txt;
// NULL past the last (a checkpoint keeps copies of them: checkpoint_tokenizer.c)
const char *tokenizer_file(const Tokenizer *t, int i);

// Appends the ids of text (len bytes) to *ids, growing it (*cap elements, realloc'd); returns the
// new count. Added tokens written in the text (e.g. "<|endoftext|>") become their ids, as Hugging
// Face's tokenizers do. Any bytes are accepted: a byte that is not part of valid UTF-8 becomes its
// byte's token and cuts the text there like an added token, so decoding gives every byte back.
// Safe to call from several threads on one Tokenizer: a call keeps its scratch to itself.
size_t tokenizer_encode(int **ids, size_t *n, size_t *cap, const Tokenizer *t, const char *text,
                        size_t len);
// appends one id to *ids as tokenizer_encode does (an end-of-text between documents)
void tokenizer_append(int **ids, size_t *n, size_t *cap, int id);
// the bytes of token id (byte-level decoded; a piece of a UTF-8 character is possible); sets
// *len; NULL for an id outside the vocabulary
const char *tokenizer_decode(const Tokenizer *t, int id, size_t *len);
