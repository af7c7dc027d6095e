#!/usr/bin/env python3
"""An independent reader of safetensors files, for checking what the C trainer writes.

It uses only the standard library (json, struct, array), so it runs on any python3, and it shares
no code with the C side or with Hugging Face's safetensors package: a bug has to be made twice to
go unnoticed.

The format (https://huggingface.co/docs/safetensors): a uint64 little-endian N, then N bytes of
JSON, then the data. The JSON maps each tensor name to {"dtype", "shape", "data_offsets": [begin,
end]}, offsets relative to the start of the data; an optional "__metadata__" maps strings to
strings. Tensors are row-major and little-endian, and together they cover the data exactly: no
overlap, no hole.

    safetensors_read.py list FILE                 name, dtype, shape of each tensor
    safetensors_read.py verify CKPT_DIR           checksums of model/optimizer.safetensors
                                                  against CKPT_DIR/state.json
    safetensors_read.py compare FILE_A FILE_B TOL per tensor ||a-b||/||a|| <= TOL (0: bit-identical)
    safetensors_read.py expect-llama FILE CONFIG  exactly the tensors a Hugging Face Llama with
                                                  that config.json has
    safetensors_read.py expect-mixtral FILE CONFIG [REFERENCE]
                                                  exactly the tensors transformers saves for a
                                                  Mixtral with that config.json, which is a
                                                  Mixtral's (architectures, model_type, only
                                                  MixtralConfig's keys) and, given REFERENCE (a
                                                  config.json transformers saved), the same model

FILE may also be a sharded checkpoint's model.safetensors.index.json: its shards are read as one.
Every command exits 1 with one line naming what is wrong.

The checksum of a tensor (state.json's "checksums"): with u_i the uint32 bits of fp32 element i in
row-major order, the sum over i of splitmix64((i << 32) | u_i), all mod 2^64, written as 16
lowercase hex digits. Position i enters each term, so swapped elements change the sum.
"""
import json
import math
import os
import struct
import sys
from array import array

MASK64 = (1 << 64) - 1
assert array("I").itemsize == 4 and array("H").itemsize == 2 and array("f").itemsize == 4
ITEMSIZE = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8,
            "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1}
FLOAT_DTYPES = ("F32", "BF16", "F16")  # the ones this reader turns into numbers
MAX_HEADER_BYTES = 100 * 1000 * 1000   # the official reader's limit


class FormatError(Exception):
    pass


class Tensor:
    """One entry of a header: where its bytes are, and how to read them."""

    def __init__(self, path, name, dtype, shape, begin, end, data_start):
        self.path, self.name, self.dtype, self.shape = path, name, dtype, shape
        self.begin, self.end, self.data_start = begin, end, data_start

    def numel(self):
        n = 1
        for d in self.shape:
            n *= d
        return n

    def raw(self):
        with open(self.path, "rb") as f:
            f.seek(self.data_start + self.begin)
            data = f.read(self.end - self.begin)
        if len(data) != self.end - self.begin:
            raise FormatError("%s: %s: file ends inside the tensor" % (self.path, self.name))
        return data

    def fp32_bits(self):
        """array('I'): the uint32 bits of each element as an fp32 number (exact for F32/BF16/F16)."""
        data = self.raw()
        if self.dtype == "F32":
            return little_endian(array("I", data))
        if self.dtype == "BF16":
            # bfloat16 is the top half of an fp32: its 16 bits shifted up are the fp32 exactly
            return array("I", [h << 16 for h in little_endian(array("H", data))])
        if self.dtype == "F16":
            table = f16_to_f32_table()
            return array("I", [table[h] for h in little_endian(array("H", data))])
        raise FormatError("%s: %s has dtype %s; this reader reads %s"
                          % (self.path, self.name, self.dtype, ", ".join(FLOAT_DTYPES)))

    def values(self):
        """The elements as Python floats, row-major."""
        return array("f", self.fp32_bits().tobytes()).tolist()


_F16_TABLE = []


def f16_to_f32_table():
    """fp32 bits of each of the 65536 half-precision bit patterns: exact, as the CPU converts."""
    if not _F16_TABLE:
        for h in range(65536):
            sign, exponent, mantissa = h >> 15, (h >> 10) & 0x1F, h & 0x3FF
            if exponent == 0x1F:  # inf, and NaN made quiet as the hardware conversion does
                bits = (sign << 31) | (0xFF << 23) | (mantissa << 13) | (0x400000 if mantissa else 0)
            elif exponent == 0:  # zero and subnormals, mantissa * 2^-24: a normal fp32
                bits = struct.unpack("<I", struct.pack("<f", math.copysign(mantissa * 2.0**-24,
                                                                           -1.0 if sign else 1.0)))[0]
            else:
                bits = (sign << 31) | ((exponent - 15 + 127) << 23) | (mantissa << 13)
            _F16_TABLE.append(bits)
    return _F16_TABLE


def little_endian(a):
    if sys.byteorder == "big":
        a.byteswap()
    return a


def read_header(path):
    """The tensors of one .safetensors file, {name: Tensor}, and its __metadata__, validated."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise FormatError("%s: %d bytes, too short for the 8-byte header length" % (path, size))
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER_BYTES or 8 + n > size:
            raise FormatError("%s: header length %d does not fit a file of %d bytes" % (path, n, size))
        text = f.read(n)
    try:
        header = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise FormatError("%s: the header is not UTF-8 JSON (%s)" % (path, e))
    if not isinstance(header, dict):
        raise FormatError("%s: the header is not a JSON object" % path)
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise FormatError("%s: __metadata__ must map strings to strings" % path)

    data_start, data_len = 8 + n, size - 8 - n
    tensors = {}
    for name, entry in header.items():
        where = "%s: tensor %s" % (path, name)
        if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
            raise FormatError("%s: expected exactly the keys dtype, shape, data_offsets" % where)
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if dtype not in ITEMSIZE:
            raise FormatError("%s: unknown dtype %r" % (where, dtype))
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise FormatError("%s: shape %r is not a list of sizes" % (where, shape))
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(isinstance(o, int) for o in offsets)):
            raise FormatError("%s: data_offsets %r is not [begin, end]" % (where, offsets))
        begin, end = offsets
        t = Tensor(path, name, dtype, shape, begin, end, data_start)
        if not 0 <= begin <= end <= data_len:
            raise FormatError("%s: data_offsets [%d, %d] outside the %d data bytes"
                              % (where, begin, end, data_len))
        if end - begin != t.numel() * ITEMSIZE[dtype]:
            raise FormatError("%s: %d bytes for shape %s of %s (expected %d)"
                              % (where, end - begin, shape, dtype, t.numel() * ITEMSIZE[dtype]))
        tensors[name] = t

    # sorted by offset, each tensor must start where the previous one ended
    position, previous = 0, None
    for t in sorted(tensors.values(), key=lambda t: (t.begin, t.end)):
        if t.begin < position:
            raise FormatError("%s: tensors %s and %s overlap (bytes %d..%d and %d..%d)"
                              % (path, previous.name, t.name, previous.begin, previous.end,
                                 t.begin, t.end))
        if t.begin > position:
            raise FormatError("%s: data bytes %d..%d belong to no tensor" % (path, position, t.begin))
        position, previous = t.end, t
    if position != data_len:
        raise FormatError("%s: data bytes %d..%d belong to no tensor" % (path, position, data_len))
    return tensors, metadata


def open_checkpoint(path):
    """{name: Tensor} of a .safetensors file, or of every shard a .index.json lists."""
    if not path.endswith(".index.json"):
        return read_header(path)[0]
    with open(path) as f:
        weight_map = json.load(f)["weight_map"]
    folder, tensors = os.path.dirname(path), {}
    for shard in sorted(set(weight_map.values())):
        for name, t in read_header(os.path.join(folder, shard))[0].items():
            if weight_map.get(name) != shard:
                raise FormatError("%s: %s is in %s but the index puts it in %s"
                                  % (path, name, shard, weight_map.get(name)))
            tensors[name] = t
    missing = sorted(set(weight_map) - set(tensors))
    if missing:
        raise FormatError("%s: %s is in the index but in no shard" % (path, missing[0]))
    return tensors


def checksum(bits):
    """Sum over i of splitmix64((i << 32) | bits[i]) mod 2^64, as 16 lowercase hex digits."""
    total = 0
    for i, u in enumerate(bits):
        z = (((i << 32) | u) + 0x9E3779B97F4A7C15) & MASK64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        total += z ^ (z >> 31)
    return "%016x" % (total & MASK64)


def fail(message):
    print(message)
    sys.exit(1)


def cmd_list(path):
    for name, t in open_checkpoint(path).items():
        print("%s %s %s" % (name, t.dtype, list(t.shape)))


def cmd_verify(folder):
    with open(os.path.join(folder, "state.json")) as f:
        state = json.load(f)
    expected_all = state.get("checksums")
    if not isinstance(expected_all, dict):
        fail("%s/state.json has no \"checksums\" object" % folder)
    counts, floats = [], 0
    for filename in ("model.safetensors", "optimizer.safetensors"):
        expected = expected_all.get(filename)
        if not isinstance(expected, dict):
            fail("%s/state.json: checksums has no \"%s\" object" % (folder, filename))
        tensors = read_header(os.path.join(folder, filename))[0]
        for name in expected:
            if name not in tensors:
                fail("%s: state.json lists %s but %s does not hold it" % (folder, name, filename))
        for name, t in tensors.items():
            if name not in expected:
                fail("%s: %s holds %s but state.json has no checksum for it"
                     % (folder, filename, name))
            if t.dtype != "F32":
                fail("%s: %s: %s is %s, checkpoints hold F32" % (folder, filename, name, t.dtype))
            got = checksum(t.fp32_bits())
            if got != expected[name]:
                fail("%s: %s: %s checksum %s, state.json says %s"
                     % (folder, filename, name, got, expected[name]))
            floats += t.numel()
        counts.append(len(tensors))
    print("verify %s: step %s, %d model + %d optimizer tensors (%d floats), every checksum "
          "matches state.json" % (folder, state.get("step"), counts[0], counts[1], floats))


def cmd_compare(path_a, path_b, tol):
    a, b = open_checkpoint(path_a), open_checkpoint(path_b)
    for name in a:
        if name not in b:
            fail("compare: %s is in %s but not in %s" % (name, path_a, path_b))
    for name in b:
        if name not in a:
            fail("compare: %s is in %s but not in %s" % (name, path_b, path_a))
    worst_name, worst, failed = None, -1.0, []
    for name in a:
        ta, tb = a[name], b[name]
        if ta.shape != tb.shape:
            fail("compare: %s has shape %s in %s and %s in %s"
                 % (name, ta.shape, path_a, tb.shape, path_b))
        if tol == 0 and ta.dtype == tb.dtype and ta.raw() == tb.raw():
            diff, ok = 0.0, True  # bit-identical: the same dtype and the same bytes
        else:
            va, vb = ta.values(), tb.values()
            norm_a = math.sqrt(math.fsum(x * x for x in va))
            norm_d = math.sqrt(math.fsum((x - y) * (x - y) for x, y in zip(va, vb)))
            diff = norm_d / norm_a if norm_a > 0 else norm_d  # an all-zero a: absolute
            ok = tol > 0 and diff <= tol  # NaN fails, and so does any difference at TOL 0
        if not ok:
            failed.append(name)
        if worst_name is None or not diff <= worst:
            worst_name, worst = name, diff
    what = "bit-identical" if tol == 0 else "||a-b||/||a|| <= %g" % tol
    summary = "%d tensors, worst %s: %.3g" % (len(a), worst_name, worst) if a else "0 tensors"
    if failed:
        fail("compare FAIL: %d of %d tensors not %s (first %s); %s"
             % (len(failed), len(a), what, failed[0], summary))
    print("compare ok (%s): %s" % (what, summary))


def llama_tensors(config):
    """[(name, shape)] of a Hugging Face LlamaForCausalLM with this config.json, in its order; of
    a MixtralForCausalLM's file when its model_type is mixtral: each MLP is a router
    block_sparse_moe.gate (E, C) and E experts w1, w3 (I, C), w2 (C, I), the names transformers'
    save_pretrained writes."""
    C, I = config["hidden_size"], config["intermediate_size"]
    V, L = config["vocab_size"], config["num_hidden_layers"]
    H = config["num_attention_heads"]
    KV = config.get("num_key_value_heads") or H
    D = config.get("head_dim") or C // H
    attention_bias, mlp_bias = config.get("attention_bias", False), config.get("mlp_bias", False)
    names = [("model.embed_tokens.weight", [V, C])]
    for l in range(L):
        p = "model.layers.%d." % l
        names.append((p + "input_layernorm.weight", [C]))
        for proj, rows in (("q", H * D), ("k", KV * D), ("v", KV * D)):
            names.append((p + "self_attn.%s_proj.weight" % proj, [rows, C]))
            if attention_bias:
                names.append((p + "self_attn.%s_proj.bias" % proj, [rows]))
        names.append((p + "self_attn.o_proj.weight", [C, H * D]))
        if attention_bias:
            names.append((p + "self_attn.o_proj.bias", [C]))
        names.append((p + "post_attention_layernorm.weight", [C]))
        if config.get("model_type") == "mixtral":
            E = config.get("num_local_experts", 8)
            names.append((p + "block_sparse_moe.gate.weight", [E, C]))
            for e in range(E):
                for w, shape in (("w1", [I, C]), ("w2", [C, I]), ("w3", [I, C])):
                    names.append((p + "block_sparse_moe.experts.%d.%s.weight" % (e, w), shape))
            continue
        for proj, shape in (("gate", [I, C]), ("up", [I, C]), ("down", [C, I])):
            names.append((p + "mlp.%s_proj.weight" % proj, shape))
            if mlp_bias:
                names.append((p + "mlp.%s_proj.bias" % proj, shape[:1]))
    names.append(("model.norm.weight", [C]))
    if not config.get("tie_word_embeddings", False):  # LlamaConfig's default: untied
        names.append(("lm_head.weight", [V, C]))
    return names


def cmd_expect_llama(path, config_path, kind="Llama"):
    with open(config_path) as f:
        config = json.load(f)
    tensors = open_checkpoint(path)
    expected = llama_tensors(config)
    what = "expect-%s" % kind.lower()
    for name, shape in expected:
        if name not in tensors:
            fail("%s: %s is missing from %s" % (what, name, path))
        if tensors[name].shape != shape:
            fail("%s: %s has shape %s in %s, a %s with %s has %s"
                 % (what, name, tensors[name].shape, path, kind, config_path, shape))
    names = set(n for n, _ in expected)
    for name in tensors:
        if name not in names:
            fail("%s: %s holds %s, which a %s with %s does not have"
                 % (what, path, name, kind, config_path))
    print("%s ok: %s holds exactly the %d tensors of a %s with %s"
          % (what, path, len(expected), kind, config_path))


# MixtralConfig's keys (transformers 5), and the two older spellings it still reads
MIXTRAL_KEYS = {
    "architectures", "model_type", "vocab_size", "max_position_embeddings", "hidden_size",
    "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "head_dim", "hidden_act", "initializer_range", "rms_norm_eps", "use_cache", "pad_token_id",
    "bos_token_id", "eos_token_id", "tie_word_embeddings", "rope_parameters", "sliding_window",
    "attention_dropout", "num_experts_per_tok", "num_local_experts", "output_router_logits",
    "router_aux_loss_coef", "router_jitter_noise", "dtype", "transformers_version",
    "rope_theta", "torch_dtype"}
# the keys that make two Mixtrals the same model, and MixtralConfig's defaults
MIXTRAL_MODEL = {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                 "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
                 "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
                 "tie_word_embeddings": False, "num_local_experts": 8, "num_experts_per_tok": 2,
                 "router_aux_loss_coef": 0.001, "router_jitter_noise": 0.0,
                 "sliding_window": None, "hidden_act": "silu", "attention_dropout": 0.0}


def mixtral_model(config):
    """The values that define the model, defaults filled in, head_dim and rope_theta resolved."""
    model = {key: config.get(key, default) for key, default in MIXTRAL_MODEL.items()}
    heads = model["num_attention_heads"]
    model["head_dim"] = config.get("head_dim") or model["hidden_size"] // heads
    model["rope_theta"] = (config.get("rope_parameters") or {}).get(
        "rope_theta", config.get("rope_theta", 1e6))
    return model


def cmd_expect_mixtral(path, config_path, reference_path=None):
    with open(config_path) as f:
        config = json.load(f)
    if (config.get("architectures") != ["MixtralForCausalLM"]
            or config.get("model_type") != "mixtral"):
        fail("expect-mixtral: %s has architectures %s, model_type %s (want MixtralForCausalLM, "
             "mixtral)" % (config_path, config.get("architectures"), config.get("model_type")))
    unknown = sorted(set(config) - MIXTRAL_KEYS)
    if unknown:
        fail("expect-mixtral: %s holds %s, which MixtralConfig does not have"
             % (config_path, ", ".join(unknown)))
    if reference_path:
        with open(reference_path) as f:
            want, got = mixtral_model(json.load(f)), mixtral_model(config)
        for key in want:
            if got[key] != want[key]:
                fail("expect-mixtral: %s has %s = %s, %s has %s"
                     % (config_path, key, got[key], reference_path, want[key]))
        print("expect-mixtral ok: %s is the Mixtral of %s (%d keys: %s)"
              % (config_path, reference_path, len(want), ", ".join(sorted(want))))
    cmd_expect_llama(path, config_path, "Mixtral")


def main(argv):
    usage = __doc__.split("\n\n")[3]
    try:
        if len(argv) == 2 and argv[0] == "list":
            cmd_list(argv[1])
        elif len(argv) == 2 and argv[0] == "verify":
            cmd_verify(argv[1])
        elif len(argv) == 4 and argv[0] == "compare":
            cmd_compare(argv[1], argv[2], float(argv[3]))
        elif len(argv) == 3 and argv[0] == "expect-llama":
            cmd_expect_llama(argv[1], argv[2])
        elif len(argv) in (3, 4) and argv[0] == "expect-mixtral":
            cmd_expect_mixtral(*argv[1:])
        else:
            print("usage:\n" + usage)
            sys.exit(2)
    except FormatError as e:
        fail(str(e))
    except KeyError as e:
        fail("%s: missing key %s" % (argv[0], e))
    except (OSError, ValueError) as e:
        fail("%s: %s" % (argv[0], e))


if __name__ == "__main__":
    main(sys.argv[1:])
