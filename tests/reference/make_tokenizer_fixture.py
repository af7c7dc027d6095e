#!/usr/bin/env python3
"""Writes the reference ids tests/test_tokenizer.c must reproduce, from Hugging Face's own code.

    /tmp/benchvenv/bin/python tests/reference/make_tokenizer_fixture.py

(with `tokenizers` and `transformers`). It writes:
  data/gpt2/tokenizer.json   GPT-2's vocab.json + merges.txt as GPT2TokenizerFast converts them,
                             saved by `tokenizers` (one line, 1.5 MB)
  tests/fixtures/tokenizer/
    hard_cases.txt           the hard cases below, as UTF-8 (CRLF and all)
    invalid_utf8.bin         text with bytes that are not UTF-8
    variants.json            how each variant's tokenizer.json is made from data/gpt2/tokenizer.json
    <variant>/hard_cases.tok, <variant>/invalid_utf8.tok   the reference ids (.tok: data.h)
    <variant>/austen.blocks  the reference ids of data/austen.txt, as the FNV-1a hash of each
                             block of BLOCK ids (4 MB of text is 1M ids: 2 MB as ids, 2 KB so)

The variants, each encoded by Hugging Face from its own tokenizer.json:
  gpt2           data/gpt2/tokenizer.json itself. The script checks that GPT2TokenizerFast read
                 from vocab.json + merges.txt gives the same ids, so the C loader of those files
                 is held to these ids too.
  split          GPT-2's pattern written as a Split before ByteLevel(use_regex=false), and the
                 merges as "left right" strings (tokenizers before 0.20): the same tokenizer in
                 other words, so the same ids (checked here).
  digits         SmolLM's pre-tokenizer: Digits(individual_digits) before ByteLevel.
  pieces         model.ignore_merges (Llama-3's option: a piece that is a token is that token),
                 with every piece Hugging Face cuts from the hard cases and invalid_utf8.bin, and
                 every two neighbouring pieces joined, added to the vocabulary: a piece cut
                 elsewhere is then not the one id Hugging Face gives, so the ids show every cut,
                 even where GPT-2's merges would hide it (a rare character's class). " Bingley"
                 and " Woodhouse", which no merge makes, join too, for austen.txt.
  digit_pieces   the same for the digits variant.

Invalid UTF-8 cannot be given to Hugging Face (it takes str; a lone surrogate from
errors="surrogateescape" is refused), so its reference is the C rule, with Hugging Face for all
the rest: each byte that is not part of a well-formed character is its own byte's token and cuts
the text there, the valid text between such bytes being encoded by Hugging Face alone.
"""
import json
import os
import shutil
import struct
import sys
import tempfile

import tokenizers
import transformers
from tokenizers import Tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GPT2 = os.path.join(ROOT, "data", "gpt2")
OUT = os.path.join(ROOT, "tests", "fixtures", "tokenizer")
BLOCK = 4096  # ids a hash of austen.blocks covers
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"

# What each variant changes in data/gpt2/tokenizer.json; test_tokenizer.c makes the same edits.
VARIANTS = {
    "gpt2": {},
    "split": {
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": GPT2_PATTERN}, "behavior": "Isolated",
             "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": False}]},
        "merges_as_strings": True,
    },
    "digits": {
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": True}]},
    },
    # the vocabulary of these two grows by the pieces of the hard cases (pieces_vocab)
    "pieces": {"ignore_merges": True},
    "digit_pieces": {"ignore_merges": True},
}
VARIANTS["digit_pieces"]["pre_tokenizer"] = VARIANTS["digits"]["pre_tokenizer"]
# GPT-2's merges make every token of its vocabulary: these words no merge makes
AUSTEN_WORDS = ["\u0120Bingley", "\u0120Woodhouse"]

# The hard cases, one line of the file each (joined by "\n"; some hold their own \r\n).
HARD_CASES = [
    "It is a truth universally acknowledged, that a single man in possession of a good fortune",
    # contractions: lower case only in the pattern, so 'S 'T 'RE are punctuation then letters
    "I'm sure they'll say it's fine, don't you think? We've seen it; you'd agree, they're here.",
    "IT'S DONE. SHE'LL GO. WE'RE OFF. I'M IN. THEY'VE LEFT. HE'D STAY. DON'T. 'S 'T 'Re 'rE",
    "'s's''s ''ll 'lll 're're ' s ’s ‘quoted’ \"double\" ''",
    # white space: runs, tabs, trailing spaces, NBSP, ideographic space, NEL, line separator
    "two  spaces   three    four     five",
    "\ttab\t\ttwo tabs \t mixed\t \t",
    "trailing spaces   ",
    "nbsp\u00a0word \u00a0x\u00a0\u00a0y thin\u2009space ideographic\u3000space\u3000\u3000end",
    "next line\u0085here line\u2028separator paragraph\u2029separator",
    "zero\u200bwidth\u200d joiner \ufeffbom word\u2060joiner",
    "windows line\r\nending\r\n\r\nand lone\rreturn",
    "\n\n\nthree newlines before, spaces after   \n   \n",
    " " * 40 + "forty spaces, then a word",
    # digits: ASCII, Arabic-Indic, Devanagari, fullwidth, superscripts, fractions, Roman numerals
    "1234567890 3.14159 1,000,000 -42 +7 x2 2x 10th 1st",
    "\u0661\u0662\u0663 \u0966\u0967\u0968 \uff11\uff12\uff13 x\u00b2 \u00bd \u2167 \u3007 \U0001d7d8",
    # Unicode 17 digits (Rust's is_numeric knows them, Oniguruma's Unicode 16 does not)
    "tolong \U00011de0\U00011de1\U00011de9 x\U00016ff4\U00016ff6y !\U00011de0 1\U00011de9 \U00016ff5!",
    # scripts
    "Caf\u00e9 na\u00efve r\u00e9sum\u00e9 fa\u00e7ade \u00c5ngstr\u00f6m \u00df \u0131 \u0130 \u01c5",
    "Cafe\u0301 nai\u0308ve combining: a\u0300\u0301\u0302 e\u0323\u0302 \u0301alone",
    "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac \u0420\u0443\u0441\u0441\u043a\u0438\u0439 "
    "\u0423\u043a\u0440\u0430\u0457\u043d\u0441\u044c\u043a\u0430 \u0540\u0561\u0575",
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645 "
    "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd",
    "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e "
    "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35 \u0ea5\u0eb2\u0ea7",
    "\u4f60\u597d\uff0c\u4e16\u754c\uff01\u8fd9\u662f\u4e00\u4e2a\u6d4b\u8bd5\u3002 "
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u30fc \ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8",
    # letters new in Unicode 16 (Garay, Todhri): the tables must be those of the reference
    "garay \U00010d4a\U00010d4b\U00010d4c todhri \U000105c0\U000105c1 x\u1c89y",
    # emoji: pictographs, skin tones, ZWJ families, flags, keycaps, variation selectors
    "Emoji: \U0001f600\U0001f44d\U0001f3fd \U0001f1fa\U0001f1f8 \u2764\ufe0f "
    "\U0001f468\u200d\U0001f469\u200d\U0001f467 1\ufe0f\u20e3 a\U0001f600b",
    # punctuation runs, with and without a leading space
    "Punctuation!!! ??? ... --- (parens) [brackets] {braces} <angles> a--b a.b.c @#$%^&*",
    "def foo(x):\n    return x ** 2  # comment\n\n\nclass A:\n\tpass\n",
    # added tokens in the text, whole and broken
    "end<|endoftext|>start <|endoftext|> spaced  <|endoftext|>  twice<|endoftext|><|endoftext|>",
    "<|endoftext|>at the start, broken <|endoftext| <|endoftext |> <|ENDOFTEXT|> at the end<|endoftext|>",
    # controls, private use, noncharacters, the last code point
    "nul\x00byte bell\x07 escape\x1b[0m del\x7f c1\x80\x9f",
    "private\ue000use nonchar\ufdd0\ufffe\uffff last\U0010ffff replacement\ufffd",
    # long runs, one piece each: the heap keeps them O(n log n)
    "a" * 300 + " " + "ab" * 150 + " " + "!" * 200 + " " + "9" * 100,
    "supercalifragilisticexpialidocious antidisestablishmentarianism "
    "pneumonoultramicroscopicsilicovolcanoconiosis",
    "Mixed123Case456 snake_case_name CamelCaseName kebab-case-name ALLCAPS x86_64 v1.2.3",
    "http://example.com/path?query=1&b=2#frag user@example.com $100.00 50% \u00a3\u20ac\u00a5",
    "last line without a newline, two trailing spaces  ",
]

# Bytes that are not UTF-8, amid text: a stray continuation byte, 0xFF, a character cut short,
# overlong forms, an encoded surrogate, a code point above U+10FFFF, a lead byte before ASCII.
# Two spaces before each: if the C side took the bytes for a character, the spaces would be cut
# " ", " <bytes>" instead of "  ", so the ids would show it.
INVALID_UTF8 = (
    b"Hello\xffworld \x80lead caf\xc3 cut short \xe2\x82 two of three \xf0\x9f\x98 three of four\n"
    b"overlong  \xc0\xaf  \xe0\x80\xaf  \xf0\x80\x80\xaf surrogate  \xed\xa0\x80  \xed\xbf\xbf "
    b"too big  \xf4\x90\x80\x80  \xf5\x80\x80\x80  \xf8\x88\x80\x80\x80 cut  \xc3 x  \xe2\x82 x  "
    b"\xf0\x9f\x98 x  \x80 x  \xbf x  \xfe x  \xff\n"
    b"a  \xff  b 12\xff34 it\xff's \xff\xff\xff <|endoftext|>\xff<|endoftext|> \xc3\xa9\xa9 "
    b"\xe2\x82\xac\xac euro \xe2\x82 a\n   \xff\n\xff"
)


def write_tok(path, ids):
    """a .tok file as data.c's tokens_write writes it"""
    width = 2 if max(ids, default=0) < 65536 else 4
    header = b"PICOTOK\0" + struct.pack("<IIQ", 1, width, len(ids))
    with open(path, "wb") as f:
        f.write(header + bytes(64 - len(header)))
        f.write(struct.pack("<%d%s" % (len(ids), "H" if width == 2 else "I"), *ids))


def fnv1a(ids):
    """FNV-1a 64 over the ids as little-endian uint32, as test_tokenizer.c hashes them"""
    h = 14695981039346656037
    for byte in struct.pack("<%dI" % len(ids), *ids):
        h = ((h ^ byte) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def write_blocks(path, ids, source):
    with open(path, "w") as f:
        f.write("# the reference ids of %s in blocks of %d ids: FNV-1a 64 of each block's ids as "
                "little-endian uint32 (tests/reference/make_tokenizer_fixture.py)\n" % (source, BLOCK))
        f.write("ids %d\nblock %d\n" % (len(ids), BLOCK))
        for i in range(0, len(ids), BLOCK):
            f.write("%016x\n" % fnv1a(ids[i:i + BLOCK]))


def encode(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False).ids


def encode_invalid(tokenizer, data, byte_token):
    """the C rule: each invalid byte is its byte's token and cuts the text; the rest is HF's"""
    ids, valid = [], ""
    for c in data.decode("utf-8", errors="surrogateescape"):
        if 0xDC80 <= ord(c) <= 0xDCFF:  # Python's mark for an invalid byte
            ids += encode(tokenizer, valid) + [byte_token[ord(c) - 0xDC00]]
            valid = ""
        else:
            valid += c
    return ids + encode(tokenizer, valid)


def byte_tokens(vocab):
    """each byte's id: GPT-2's printable stand-in for the byte, looked up in the vocabulary"""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    other = [b for b in range(256) if b not in printable]
    char = {b: chr(b) for b in printable} | {b: chr(256 + i) for i, b in enumerate(other)}
    return [vocab[char[b]] for b in range(256)]


def variant_json(base, edit):
    tok = json.loads(base)
    if "pre_tokenizer" in edit:
        tok["pre_tokenizer"] = edit["pre_tokenizer"]
    if edit.get("merges_as_strings"):
        tok["model"]["merges"] = [" ".join(pair) for pair in tok["model"]["merges"]]
    if "ignore_merges" in edit:
        tok["model"]["ignore_merges"] = edit["ignore_merges"]
    tok["model"]["vocab"].update(edit.get("vocab", {}))
    return json.dumps(tok, ensure_ascii=False)


def pieces_vocab(base, edit, stretches):
    """the tokens to add so that the ids show each cut: every piece the variant's pre-tokenizer
    cuts from the stretches, and every two neighbouring pieces joined (a C side that does not cut
    between them then gives one id where Hugging Face gives two), with the ids after the last"""
    tokenizer = Tokenizer.from_str(variant_json(base, edit))
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    new = {}
    for stretch in stretches:
        pieces = [p for p, _ in tokenizer.pre_tokenizer.pre_tokenize_str(stretch)]
        joined = [a + b for a, b in zip(pieces, pieces[1:])]
        for piece in pieces + joined + AUSTEN_WORDS:
            if piece not in vocab and piece not in new:
                new[piece] = len(vocab) + len(new)
    return new


def stretches(text):
    """the text between added tokens and invalid bytes, which the pre-tokenizer sees alone"""
    marked = text.decode("utf-8", errors="surrogateescape")
    for c in set(marked):
        if 0xDC80 <= ord(c) <= 0xDCFF:
            marked = marked.replace(c, "<|endoftext|>")
    return marked.split("<|endoftext|>")


def main():
    print("tokenizers %s, transformers %s" % (tokenizers.__version__, transformers.__version__))
    # GPT2TokenizerFast from vocab.json + merges.txt alone (a folder with tokenizer.json in it
    # would be read from that instead)
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("vocab.json", "merges.txt"):
            shutil.copy(os.path.join(GPT2, name), tmp)
        from_files = transformers.GPT2TokenizerFast.from_pretrained(tmp, local_files_only=True)
    base = from_files.backend_tokenizer.to_str()
    with open(os.path.join(GPT2, "tokenizer.json"), "w", encoding="utf-8") as f:
        f.write(base)

    os.makedirs(OUT, exist_ok=True)
    hard = "\n".join(HARD_CASES) + "\n"
    with open(os.path.join(OUT, "hard_cases.txt"), "wb") as f:
        f.write(hard.encode("utf-8"))
    with open(os.path.join(OUT, "invalid_utf8.bin"), "wb") as f:
        f.write(INVALID_UTF8)
    for name in ("pieces", "digit_pieces"):
        VARIANTS[name]["vocab"] = pieces_vocab(
            base, VARIANTS[name], stretches(hard.encode("utf-8")) + stretches(INVALID_UTF8))
    with open(os.path.join(OUT, "variants.json"), "w") as f:
        json.dump(VARIANTS, f, indent=1)
        f.write("\n")
    with open(os.path.join(ROOT, "data", "austen.txt"), "rb") as f:
        austen = f.read().decode("utf-8")

    texts = {"hard_cases": hard, "austen": austen}
    reference = {}
    for name, edit in VARIANTS.items():
        tokenizer = Tokenizer.from_str(variant_json(base, edit))
        byte_token = byte_tokens(tokenizer.get_vocab(with_added_tokens=False))
        ids = {k: encode(tokenizer, text) for k, text in texts.items()}
        ids["invalid_utf8"] = encode_invalid(tokenizer, INVALID_UTF8, byte_token)
        reference[name] = ids
        os.makedirs(os.path.join(OUT, name), exist_ok=True)
        write_tok(os.path.join(OUT, name, "hard_cases.tok"), ids["hard_cases"])
        write_tok(os.path.join(OUT, name, "invalid_utf8.tok"), ids["invalid_utf8"])
        write_blocks(os.path.join(OUT, name, "austen.blocks"), ids["austen"], "data/austen.txt")
        print("%-13s hard_cases %5d ids, invalid_utf8 %4d ids, austen.txt %d ids"
              % (name, len(ids["hard_cases"]), len(ids["invalid_utf8"]), len(ids["austen"])))

    # the claims the C test leans on
    for k, text in texts.items():
        if from_files(text, add_special_tokens=False)["input_ids"] != reference["gpt2"][k]:
            sys.exit("GPT2TokenizerFast from vocab.json + merges.txt differs from tokenizer.json "
                     "on " + k)
    if reference["split"] != reference["gpt2"]:
        sys.exit("the Split + ByteLevel(use_regex=false) variant differs from ByteLevel alone")
    for name in ("digits", "pieces", "digit_pieces"):  # with gpt2's ids it would test nothing
        differ = [k for k in reference[name] if reference[name][k] != reference["gpt2"][k]]
        print("%s: ids unlike gpt2's on %s" % (name, ", ".join(differ) or "nothing"))


if __name__ == "__main__":
    main()
