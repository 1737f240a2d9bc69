"""The delta codec on real training: checkpoint pairs made by PyTorch's own
AdamW (fp32 master weights, saved as bf16) at RL-like learning rates.  Each
delta must rebuild the new checkpoint byte for byte and be at most half the
size of XOR + zstd-1 of the same pair (the baseline of `shoal bench delta`:
the tensor bytes XORed, zstd level 1 per 8 MiB)."""
import ctypes
import os
import sys
import unittest

import numpy as np
import torch
import torch.nn.functional as F

import shoal
from pyutil import save_safetensors, scratch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "torch"))
from model import Decoder, batch  # noqa: E402

_z = ctypes.CDLL("libzstd.so.1")
_z.ZSTD_compressBound.restype = ctypes.c_size_t
_z.ZSTD_compressBound.argtypes = [ctypes.c_size_t]
_z.ZSTD_compress.restype = ctypes.c_size_t
_z.ZSTD_compress.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_z.ZSTD_isError.argtypes = [ctypes.c_size_t]


def xor_zstd1(a, b):
    """Bytes of XOR + zstd-1 (per 8 MiB) over the tensor data of two
    checkpoints with one layout."""
    with open(a, "rb") as fa, open(b, "rb") as fb:
        ra, rb = fa.read(), fb.read()
    n = int.from_bytes(ra[:8], "little") + 8
    assert ra[:n] == rb[:n], "the pair must share its header"
    x = np.bitwise_xor(np.frombuffer(ra, np.uint8, offset=n), np.frombuffer(rb, np.uint8, offset=n)).tobytes()
    total, C = 0, 8 << 20
    for off in range(0, len(x), C):
        src = x[off:off + C]
        cap = _z.ZSTD_compressBound(len(src))
        dst = ctypes.create_string_buffer(cap)
        k = _z.ZSTD_compress(dst, cap, src, len(src), 1)
        assert not _z.ZSTD_isError(k)
        total += k
    return total


class CodecOnAdamWTest(unittest.TestCase):
    def test_adamw_pairs(self):
        d = scratch("codec-adamw")
        torch.manual_seed(0)
        torch.set_num_threads(2)
        # 14.6 M parameters (d 768, 2 layers): tensors of 0.4-2.4 M elements.
        model = Decoder(d=768, layers=2)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
        state = {"step": 0}

        def step():
            x, y = batch(state["step"], B=4, T=32)
            loss = F.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            state["step"] += 1

        def save(path):
            save_safetensors(path, {k: v.detach().to(torch.bfloat16) for k, v in model.state_dict().items()})

        for _ in range(5):  # leave the initialisation; the moments fill
            step()
        rows = []
        for i, (lr, k) in enumerate([(1e-6, 1), (1e-6, 4), (1e-5, 1)]):
            for g in opt.param_groups:
                g["lr"] = lr
            a, b = os.path.join(d, "%d.a.safetensors" % i), os.path.join(d, "%d.b.safetensors" % i)
            save(a)
            for _ in range(k):
                step()
            save(b)
            delta, out = os.path.join(d, "%d.shd" % i), os.path.join(d, "%d.out.safetensors" % i)
            st = shoal.delta.make(a, b, delta)
            shoal.delta.apply(a, delta, out)
            with open(out, "rb") as f1, open(b, "rb") as f2:
                self.assertEqual(f1.read(), f2.read(), "lr %g x %d: the rebuilt checkpoint differs" % (lr, k))
            base = xor_zstd1(a, b)
            # The library's baseline (shoal bench delta's) is the same
            # compression plus its 16-byte hash.
            self.assertEqual(shoal.delta.xor_zstd1(a, b), base + 16)
            ratio = st["delta_bytes"] / base
            rows.append((lr, k, st["changed"] / st["units"], st["delta_bytes"], base, ratio))
        print("\nlr       steps  changed  delta B   xor+zstd1 B  ratio")
        for r in rows:
            print("%-8g %5d  %6.2f%%  %8d  %11d  %.3f" % (r[0], r[1], 100 * r[2], r[3], r[4], r[5]))
        for lr, k, ch, db, xb, ratio in rows:
            self.assertGreater(ch, 0, "lr %g x %d changed nothing: not a real pair" % (lr, k))
            self.assertLessEqual(ratio, 0.5, "lr %g x %d: delta %d B is %.3f x XOR+zstd-1 (%d B)"
                                 % (lr, k, db, ratio, xb))


if __name__ == "__main__":
    unittest.main()
