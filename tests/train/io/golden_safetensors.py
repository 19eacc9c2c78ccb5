"""Golden safetensors files for tests/train/io/test_safetensors.cpp, from PyTorch 1.13.

Run with /usr/bin/python3 (the python with torch) from anywhere:
    /usr/bin/python3 tests/train/io/golden_safetensors.py
The `safetensors` package is not needed: the format is written by hand below (8-byte little-endian header
length, JSON header, raw little-endian data). Writes, under tests/data/train/:
  encoder_layer.safetensors / .golden           nn.TransformerEncoderLayer(8, 2, 16, batch_first=True), post-LN relu
  encoder_layer_prenorm.safetensors / .golden   the same with norm_first=True, activation="gelu"
  mixed.safetensors / .golden                   F32 / F64 / I64 / BOOL tensors, a 0-d and an empty one, metadata
Each .golden (tests/golden.py format) holds the input "x" and the eval-mode output "y" (or the mixed tensors).

    /usr/bin/python3 tests/train/io/golden_safetensors.py --check FILE.safetensors STEM
reads a safetensors file written by attograd (export_safetensors) by hand, loads it strictly into the PyTorch layer
of golden STEM and checks that the layer reproduces that golden's output (the PyTorch -> attograd -> PyTorch trip).
"""
import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
from golden import write_golden  # noqa: E402

import torch  # noqa: E402

DATA = os.path.join(os.path.dirname(os.path.dirname(HERE)), "data", "train")

_DT = {torch.float32: ("F32", 4), torch.float64: ("F64", 8), torch.int64: ("I64", 8), torch.bool: ("BOOL", 1)}


def write_safetensors(path, tensors, metadata=None):
    """The safetensors layout, by hand. Data laid out by element size (largest first), then name, as the
    reference writer does, so every tensor is aligned; the header is padded with spaces to 8 bytes."""
    names = sorted(tensors, key=lambda n: (-_DT[tensors[n].dtype][1], n))
    header, blobs, offset = {}, [], 0
    for name in names:
        t = tensors[name].detach().contiguous().cpu()
        blob = t.numpy().astype(t.numpy().dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": _DT[t.dtype][0], "shape": list(t.shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


_FROM = {"F32": (torch.float32, "<f4"), "F64": (torch.float64, "<f8"), "I64": (torch.int64, "<i8"), "BOOL": (torch.bool, "?")}


def read_safetensors(path):
    """The safetensors layout, read by hand (checking that the tensors tile the data section)."""
    import numpy as np

    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    metadata = header.pop("__metadata__", {})
    data = blob[8 + n:]
    spans = sorted(tuple(v["data_offsets"]) for v in header.values())
    end = 0
    for b, e in spans:
        assert b == end, "gap or overlap at %d" % b
        end = e
    assert end == len(data), "data section not covered"
    out = {}
    for name, v in header.items():
        dtype, np_dtype = _FROM[v["dtype"]]
        b, e = v["data_offsets"]
        arr = np.frombuffer(data[b:e], dtype=np_dtype).reshape(v["shape"])
        out[name] = torch.from_numpy(arr.copy()).to(dtype)
    return out, metadata


_LAYERS = {
    "encoder_layer": (0, {}),
    "encoder_layer_prenorm": (1, {"norm_first": True, "activation": "gelu"}),
}


def check_export(path, stem):
    seed, kwargs = _LAYERS[stem]
    layer = torch.nn.TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=16, batch_first=True, **kwargs).eval()
    state, metadata = read_safetensors(path)
    layer.load_state_dict(state, strict=True)
    torch.manual_seed(seed)
    torch.nn.TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=16, batch_first=True, **kwargs)
    x = torch.randn(2, 5, 8)
    with torch.no_grad():
        y = layer(x)
    torch.manual_seed(seed)
    ref = torch.nn.TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=16, batch_first=True, **kwargs).eval()
    with torch.no_grad():
        expected = ref(x)
    err = (y - expected).abs().max().item()
    print("%s: %d tensors, metadata %s, max |y - golden y| = %.3g" % (path, len(state), metadata, err))
    assert err < 1e-5
    print("OK")


def encoder_layer(stem, seed, **kwargs):
    torch.manual_seed(seed)
    layer = torch.nn.TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=16, batch_first=True, **kwargs).eval()
    x = torch.randn(2, 5, 8)
    with torch.no_grad():
        y = layer(x)
    meta = {"format": "pt", "source": "tests/train/golden_safetensors.py", "module": "TransformerEncoderLayer"}
    write_safetensors(os.path.join(DATA, stem + ".safetensors"), layer.state_dict(), meta)
    write_golden(os.path.join(DATA, stem + ".golden"), {"x": x, "y": y})


def mixed():
    tensors = {
        "f32": torch.tensor([[0.5, -1.25, float("nan")], [float("inf"), 3.0e-39, 1.0e38]], dtype=torch.float32),
        "f64": torch.tensor([1.0 / 3.0, -2.5e-300, float("-inf"), 0.1], dtype=torch.float64),
        "i64": torch.tensor([-(2 ** 62), -1, 0, 7, 2 ** 62], dtype=torch.int64),
        "mask": torch.tensor([[True, False, True], [False, False, True]]),
        "scalar": torch.tensor(3.25, dtype=torch.float32),
        "empty": torch.zeros(0, 4, dtype=torch.float32),
    }
    write_safetensors(os.path.join(DATA, "mixed.safetensors"), tensors, {"note": "mixed dtypes", "seed": "0"})
    write_golden(os.path.join(DATA, "mixed.golden"), tensors)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--check":
        check_export(sys.argv[2], sys.argv[3])
        sys.exit(0)
    os.makedirs(DATA, exist_ok=True)
    encoder_layer("encoder_layer", 0)
    encoder_layer("encoder_layer_prenorm", 1, norm_first=True, activation="gelu")
    mixed()
