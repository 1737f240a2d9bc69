"""A small decoder-only transformer (about 3.4 M parameters with the
defaults) and the byte-level task it trains on, shared by the trainer and
the followers so that both build the same tensor names and shapes."""
import hashlib

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.ln2 = nn.LayerNorm(d)
        self.up = nn.Linear(d, 4 * d, bias=False)
        self.down = nn.Linear(4 * d, d, bias=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        att = (q @ k.transpose(-2, -1)) / (C // self.heads) ** 0.5
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(B, T, C))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class Decoder(nn.Module):
    def __init__(self, vocab=256, d=256, layers=4, heads=4, ctx=64):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        # GPT-2's initialisation: weights of the scale LLM checkpoints have
        # (std 0.02), which sets how often a bf16 weight moves per step.
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


def batch(step, B=8, T=64, seed=0):
    """Byte sequences of additions ("123+45=168;..."), reproducible by step."""
    g = torch.Generator().manual_seed(seed * 1000003 + step)
    rows = []
    for _ in range(B):
        s = ""
        while len(s) < T + 1:
            a, b = torch.randint(0, 1000, (2,), generator=g).tolist()
            s += "%d+%d=%d;" % (a, b, a + b)
        rows.append(list(s[:T + 1].encode()))
    t = torch.tensor(rows)
    return t[:, :-1], t[:, 1:]


def digest(named_tensors):
    """sha256 over (name, dtype, shape, bytes) of every tensor in name order:
    what "bit-identical" is checked against, computed without shoal."""
    h = hashlib.sha256()
    for name in sorted(named_tensors):
        t = named_tensors[name].detach().contiguous()
        h.update(("%s|%s|%s|" % (name, t.dtype, tuple(t.shape))).encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
