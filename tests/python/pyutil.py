"""Helpers for the Python tests: a scratch directory and an independent
safetensors writer (plain Python, so that files the tests feed to shoal do
not come from shoal)."""
import json
import os
import shutil
import struct
import tempfile

import torch

NAMES = {torch.bfloat16: "BF16", torch.float32: "F32", torch.float16: "F16", torch.int64: "I64",
         torch.int32: "I32", torch.uint8: "U8", torch.bool: "BOOL", torch.int8: "I8",
         torch.int16: "I16", torch.float64: "F64", torch.complex64: "C64"}


def scratch(name):
    base = os.environ.get("SHOAL_TEST_TMP") or tempfile.mkdtemp(prefix="shoal-py.")
    d = os.path.join(base, "py", name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d, exist_ok=True)
    return d


def tensor_bytes(t):
    t = t.contiguous().reshape(-1)
    return t.view(torch.uint8).numpy().tobytes() if t.numel() else b""


def write_raw(path, entries):
    """A safetensors file from (name, dtype name, shape, bytes) in order,
    written here so that dtypes torch lacks can be stored too."""
    header, off, blobs = {}, 0, []
    for name, dt, shape, data in entries:
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def save_safetensors(path, tensors):
    """Writes tensors (name -> tensor) in name order, as safetensors."""
    write_raw(path, [(name, NAMES[tensors[name].dtype], tensors[name].shape, tensor_bytes(tensors[name]))
                     for name in sorted(tensors)])


def save_sharded(folder, tensors, shards=2):
    """A sharded folder: `shards` files and model.safetensors.index.json."""
    os.makedirs(folder, exist_ok=True)
    names = sorted(tensors)
    weight_map = {}
    for k in range(shards):
        part = {n: tensors[n] for n in names[k::shards]}
        fname = "model-%05d-of-%05d.safetensors" % (k + 1, shards)
        save_safetensors(os.path.join(folder, fname), part)
        weight_map.update({n: fname for n in part})
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)


def same_bits(a, b):
    return a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape) and tensor_bytes(a) == tensor_bytes(b)


def read_safetensors(path):
    """Reads a safetensors file with plain Python and torch (not shoal),
    with the aliases shoal records for tied tensors."""
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n])
    meta = hdr.pop("__metadata__", None) or {}
    dt = {v: k for k, v in NAMES.items()}
    out = {}
    for name, e in hdr.items():
        a, b = e["data_offsets"]
        buf = bytearray(raw[8 + n + a:8 + n + b])
        t = torch.frombuffer(buf, dtype=torch.uint8) if buf else torch.empty(0, dtype=torch.uint8)
        out[name] = t.view(dt[e["dtype"]]).reshape(e["shape"]).clone()
    # Tied tensors shoal.Store.publish stored once (docs/safetensors.md).
    for alias, name in json.loads(meta.get("shoal.aliases", "{}")).items():
        out[alias] = out[name]
    return out
