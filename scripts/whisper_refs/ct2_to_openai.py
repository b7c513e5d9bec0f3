"""Build an openai-whisper checkpoint from a CTranslate2 Whisper directory,
so openai-whisper runs the very weights faster-whisper runs.

usage: ct2_to_openai.py CT2_DIR OUT.pt

CTranslate2 fuses the self-attention Q/K/V (and the cross-attention K/V)
projections and keeps the key bias (zeros: Whisper's key projection has
none); openai-whisper has separate query/key/value modules. Weights are
stored as float32 (the fp16 values widened), as faster-whisper's
compute_type="float32" widens them too.
"""
import struct
import sys
from pathlib import Path

import numpy as np
import torch

# CTranslate2's DataType enum.
DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}


def read_ct2(path):
    with open(path, "rb") as f:
        data = f.read()
    pos = 0

    def take(n):
        nonlocal pos
        b = data[pos:pos + n]
        if len(b) != n:
            raise ValueError(f"{path}: truncated at byte {pos}")
        pos += n
        return b

    def u32():
        return struct.unpack("<I", take(4))[0]

    def u16():
        return struct.unpack("<H", take(2))[0]

    def string():
        return take(u16())[:-1].decode()

    version = u32()
    if version < 5:
        raise ValueError(f"{path}: CTranslate2 binary version {version} not handled")
    string()  # spec name
    u32()  # spec revision
    out = {}
    for _ in range(u32()):
        name = string()
        rank = take(1)[0]
        shape = [u32() for _ in range(rank)]
        dt = take(1)[0]
        nbytes = u32()
        raw = take(nbytes)
        if dt == 5:  # bfloat16
            arr = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            arr = np.frombuffer(raw, DTYPES[dt])
        out[name] = arr.reshape(shape)
    for _ in range(u32()):
        alias, target = string(), string()
        out[alias] = out[target]
    return out


def f32(a):
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))


def convert(ct2_dir, out_path):
    v = read_ct2(Path(ct2_dir) / "model.bin")
    sd = {}

    def linear(dst, src, bias=True):
        sd[f"{dst}.weight"] = f32(v[f"{src}/weight"])
        if bias:
            sd[f"{dst}.bias"] = f32(v[f"{src}/bias"])

    def norm(dst, src):
        sd[f"{dst}.weight"] = f32(v[f"{src}/gamma"])
        sd[f"{dst}.bias"] = f32(v[f"{src}/beta"])

    def split(src, n):
        w, b = v[f"{src}/weight"], v[f"{src}/bias"]
        d = w.shape[0] // n
        return [(w[i * d:(i + 1) * d], b[i * d:(i + 1) * d]) for i in range(n)]

    def n_layers(prefix):
        i = 0
        while f"{prefix}/layer_{i}/ffn/linear_0/weight" in v:
            i += 1
        return i

    n_audio_layer, n_text_layer = n_layers("encoder"), n_layers("decoder")
    for name in ("conv1", "conv2"):
        linear(f"encoder.{name}", f"encoder/{name}")
    sd["encoder.positional_embedding"] = f32(v["encoder/position_encodings/encodings"])
    for i in range(n_audio_layer):
        s, d = f"encoder/layer_{i}", f"encoder.blocks.{i}"
        (qw, qb), (kw, _), (vw, vb) = split(f"{s}/self_attention/linear_0", 3)
        sd[f"{d}.attn.query.weight"], sd[f"{d}.attn.query.bias"] = f32(qw), f32(qb)
        sd[f"{d}.attn.key.weight"] = f32(kw)
        sd[f"{d}.attn.value.weight"], sd[f"{d}.attn.value.bias"] = f32(vw), f32(vb)
        linear(f"{d}.attn.out", f"{s}/self_attention/linear_1")
        norm(f"{d}.attn_ln", f"{s}/self_attention/layer_norm")
        linear(f"{d}.mlp.0", f"{s}/ffn/linear_0")
        linear(f"{d}.mlp.2", f"{s}/ffn/linear_1")
        norm(f"{d}.mlp_ln", f"{s}/ffn/layer_norm")
    norm("encoder.ln_post", "encoder/layer_norm")

    sd["decoder.token_embedding.weight"] = f32(v["decoder/embeddings/weight"])
    sd["decoder.positional_embedding"] = f32(v["decoder/position_encodings/encodings"])
    for i in range(n_text_layer):
        s, d = f"decoder/layer_{i}", f"decoder.blocks.{i}"
        (qw, qb), (kw, _), (vw, vb) = split(f"{s}/self_attention/linear_0", 3)
        sd[f"{d}.attn.query.weight"], sd[f"{d}.attn.query.bias"] = f32(qw), f32(qb)
        sd[f"{d}.attn.key.weight"] = f32(kw)
        sd[f"{d}.attn.value.weight"], sd[f"{d}.attn.value.bias"] = f32(vw), f32(vb)
        linear(f"{d}.attn.out", f"{s}/self_attention/linear_1")
        norm(f"{d}.attn_ln", f"{s}/self_attention/layer_norm")
        linear(f"{d}.cross_attn.query", f"{s}/attention/linear_0")
        (kw, _), (vw, vb) = split(f"{s}/attention/linear_1", 2)
        sd[f"{d}.cross_attn.key.weight"] = f32(kw)
        sd[f"{d}.cross_attn.value.weight"], sd[f"{d}.cross_attn.value.bias"] = f32(vw), f32(vb)
        linear(f"{d}.cross_attn.out", f"{s}/attention/linear_2")
        norm(f"{d}.cross_attn_ln", f"{s}/attention/layer_norm")
        linear(f"{d}.mlp.0", f"{s}/ffn/linear_0")
        linear(f"{d}.mlp.2", f"{s}/ffn/linear_1")
        norm(f"{d}.mlp_ln", f"{s}/ffn/layer_norm")
    norm("decoder.ln", "decoder/layer_norm")

    conv1 = v["encoder/conv1/weight"]
    dims = dict(
        n_mels=int(conv1.shape[1]),
        n_vocab=int(v["decoder/embeddings/weight"].shape[0]),
        n_audio_ctx=int(v["encoder/position_encodings/encodings"].shape[0]),
        n_audio_state=int(conv1.shape[0]),
        n_audio_head=int(v["encoder/num_heads"]) if "encoder/num_heads" in v else None,
        n_audio_layer=n_audio_layer,
        n_text_ctx=int(v["decoder/position_encodings/encodings"].shape[0]),
        n_text_state=int(v["decoder/embeddings/weight"].shape[1]),
        n_text_head=int(v["decoder/num_heads"]) if "decoder/num_heads" in v else None,
        n_text_layer=n_text_layer,
    )
    for key in ("n_audio_head", "n_text_head"):
        if dims[key] is None:  # older CT2 files: Whisper heads are width / 64
            dims[key] = dims["n_audio_state"] // 64
    torch.save({"dims": dims, "model_state_dict": sd}, out_path)

    # Loading it is the check that every module got its weights.
    import whisper
    from whisper.model import ModelDimensions, Whisper
    model = Whisper(ModelDimensions(**dims))
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [m for m in missing if not m.endswith(".mask")]
    if missing or unexpected:
        raise SystemExit(f"missing {missing}, unexpected {unexpected}")
    del whisper
    print(f"{out_path}: {dims}")


if __name__ == "__main__":
    convert(sys.argv[1], sys.argv[2])
