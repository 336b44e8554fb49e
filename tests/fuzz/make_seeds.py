#!/usr/bin/env python3
"""Writes the fuzzers' seed corpus (tests/fuzz/corpus/<target>/): small handmade valid and
near-valid inputs, built here from scratch (no real weights). Standard library only.

    python3 tests/fuzz/make_seeds.py        # rewrites corpus/ (deterministic: same bytes each run)
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ------------------------------------------------------------------------------------------------
# safetensors: [u64 header length][JSON header][data]
# ------------------------------------------------------------------------------------------------

def safetensors(tensors, metadata=None, pad=True, offsets=None):
    """tensors: list of (name, dtype, shape, bytes); offsets overrides data_offsets per name."""
    header, data = [], b""
    for name, dtype, shape, raw in tensors:
        begin = len(data)
        data += raw
        off = (offsets or {}).get(name, [begin, len(data)])
        header.append('"%s":{"dtype":"%s","shape":[%s],"data_offsets":[%d,%d]}'
                      % (name, dtype, ",".join(map(str, shape)), off[0], off[1]))
    if metadata is not None:
        header.append('"__metadata__":{%s}' % ",".join('"%s":"%s"' % kv for kv in metadata.items()))
    text = "{" + ",".join(header) + "}"
    if pad:
        text += " " * ((8 - len(text) % 8) % 8)
    h = text.encode()
    return struct.pack("<Q", len(h)) + h + data


def f32(values):
    return struct.pack("<%df" % len(values), *values)


def ramp(n, scale=0.01):
    return [((i * 37) % 101 - 50) * scale for i in range(n)]


def attention_layer(C, prefix="h.0.attn.", dtype="F32"):
    pack = f32 if dtype == "F32" else (lambda v: struct.pack("<%de" % len(v), *v))
    return [
        (prefix + "c_attn.weight", dtype, [C, 3 * C], pack(ramp(C * 3 * C))),
        (prefix + "c_attn.bias", dtype, [3 * C], pack(ramp(3 * C, 0.001))),
        (prefix + "c_proj.weight", dtype, [C, C], pack(ramp(C * C))),
        (prefix + "c_proj.bias", dtype, [C], pack(ramp(C, 0.001))),
    ]


write("safetensors", "empty_header", safetensors([]))
write("safetensors", "one_f32_matrix", safetensors([("w", "F32", [2, 3], f32(ramp(6)))]))
write("safetensors", "attention_c4_f32", safetensors(attention_layer(4), {"format": "pt"}))
write("safetensors", "attention_c4_f16_transformer",
      safetensors(attention_layer(4, "transformer.h.0.attn.", "F16")))
write("safetensors", "every_dtype", safetensors([
    ("a_f64", "F64", [], struct.pack("<d", 1.5)),
    ("b_f32", "F32", [2], f32([1.0, -2.0])),
    ("c_f16", "F16", [2], struct.pack("<2e", 0.5, -0.25)),
    ("d_bf16", "BF16", [1, 2], bytes([0x80, 0x3F, 0x00, 0xC0])),
    ("e_i64", "I64", [1], struct.pack("<q", -7)),
    ("f_i32", "I32", [1], struct.pack("<i", 7)),
    ("g_u8", "U8", [3], bytes([1, 2, 3])),
    ("h_bool", "BOOL", [1], bytes([1])),
    ("i_f8", "F8_E4M3", [1], bytes([0x38])),
    ("j_empty", "F32", [0, 4], b""),
]))
# U8 [1] first: the F32 tensor after it is misaligned (views refuse it, to_vector copies it).
write("safetensors", "misaligned_f32", safetensors([("a", "U8", [1], b"\x01"),
                                                    ("b", "F32", [2], f32([3.0, 4.0]))]))
# Near-valid: each breaks one rule.
valid = safetensors([("w", "F32", [2, 2], f32([1, 2, 3, 4]))])
write("safetensors", "bad_truncated_data", valid[:-3])
write("safetensors", "bad_overlap", safetensors(
    [("a", "F32", [1], f32([1])), ("b", "F32", [1], f32([2]))], offsets={"b": [0, 4]}))
write("safetensors", "bad_shape_overflow", safetensors(
    [("w", "F32", [4294967296, 4294967296], b"")]))
write("safetensors", "bad_header_length", struct.pack("<Q", 1 << 40) + b"{}")
nested = b'{"w":{"dtype":"F32","shape":[[[[1]]]],"data_offsets":[0,0]}}'
write("safetensors", "bad_nested", struct.pack("<Q", len(nested)) + nested)

# ------------------------------------------------------------------------------------------------
# npy: "\x93NUMPY" major minor, u16 (1.0) or u32 (2.0, 3.0) header length, dict, data
# ------------------------------------------------------------------------------------------------

def npy(descr, shape, data, major=1, fortran="False"):
    shape_text = "(%s)" % (", ".join(map(str, shape)) + ("," if len(shape) == 1 else ""))
    d = "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }" % (descr, fortran, shape_text)
    fmt = "<H" if major == 1 else "<I"
    pre = 6 + 2 + struct.calcsize(fmt)
    d += " " * (63 - (pre + len(d)) % 64) + "\n"
    return b"\x93NUMPY" + bytes([major, 0]) + struct.pack(fmt, len(d)) + d.encode() + data


write("npy", "f4_2x3", npy("<f4", [2, 3], f32(ramp(6))))
write("npy", "f8_3", npy("<f8", [3], struct.pack("<3d", 1.0, -0.5, 2.25)))
write("npy", "f4_v2_2x2x2", npy("<f4", [2, 2, 2], f32(ramp(8)), major=2))
write("npy", "f8_v3_1x1", npy("<f8", [1, 1], struct.pack("<d", 3.0), major=3))
write("npy", "f4_empty_0x4", npy("<f4", [0, 4], b""))
write("npy", "f4_8d", npy("<f4", [1] * 8, f32([1.0])))
write("npy", "bad_fortran", npy("<f4", [2], f32([1, 2]), fortran="True"))
write("npy", "bad_truncated", npy("<f4", [4], f32([1, 2, 3])))
write("npy", "bad_descr", npy(">i8", [1], struct.pack(">q", 1)))
write("npy", "bad_huge_shape", npy("<f8", [1 << 31, 1 << 31, 1 << 31], b""))

# ------------------------------------------------------------------------------------------------
# CLI arguments: [B][T] then NUL-separated argv (see fuzz_cli_args.cpp)
# ------------------------------------------------------------------------------------------------

def cli(B, T, *args):
    return bytes([B, T]) + b"\x00".join(a.encode() for a in args)


write("cli", "run_minimal", cli(1, 4, "run", "--weights", "w.safetensors", "--input", "x.npy",
                                "--output", "y.npy"))
write("cli", "run_every_flag", cli(3, 8, "run", "--weights=w.safetensors", "--layer", "2",
                                   "--input", "x.npy", "--output=y.npy", "--n-head", "4",
                                   "--dtype", "f64", "--probs", "p.npy", "--prefill", "3",
                                   "--lengths", "8,4,0", "--starts", "0,2,8"))
write("cli", "run_left_padded", cli(2, 5, "run", "--weights", "w", "--input", "x", "--output", "y",
                                    "--starts=3,0", "--lengths=2,5"))
write("cli", "demo", cli(0, 0, "demo", "--tokens", "64", "--n-head", "12", "--layer", "0"))
write("cli", "help", cli(0, 0, "run", "--help"))
write("cli", "bad_repeated", cli(1, 1, "run", "--input", "x", "--input", "y"))
write("cli", "bad_number", cli(1, 1, "demo", "--tokens", "99999999999999999999999"))
write("cli", "bad_same_file", cli(1, 1, "run", "--weights", "a", "--input", "b", "--output", "a"))
