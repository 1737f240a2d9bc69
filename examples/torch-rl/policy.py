"""The policy: a small GRU language model over shoal.rl's alphabet (24
tokens), with the sampling, the log-probabilities, the warm start and the
evaluation that the trainer and the rollout workers share."""
import torch

import shoal.rl

V = len(shoal.rl.ALPHABET)


class Policy(torch.nn.Module):
    def __init__(self, width=96):
        super().__init__()
        self.emb = torch.nn.Embedding(V, width)
        self.rnn = torch.nn.GRU(width, width, batch_first=True)
        self.head = torch.nn.Linear(width, V)

    def forward(self, tokens, h=None):
        """Logits of the next token after each position: (B, T, V)."""
        out, h = self.rnn(self.emb(tokens), h)
        return self.head(out), h


def pad(seqs):
    t = torch.zeros(len(seqs), max(len(s) for s in seqs), dtype=torch.long)
    for i, s in enumerate(seqs):
        t[i, :len(s)] = torch.tensor(s)
    return t


@torch.no_grad()
def sample(model, prompts, group, max_new, seed=0):
    """group responses to each prompt (token lists, BOS first), groups
    adjacent: a list of (response tokens, their log-probabilities), EOS
    included when the response ended."""
    g = torch.Generator().manual_seed(seed & 0x7fffffffffff)
    out = []
    for p in prompts:
        logits, h = model(torch.tensor([p] * group))
        last = logits[:, -1]
        toks, lps = [[] for _ in range(group)], [[] for _ in range(group)]
        alive = torch.ones(group, dtype=torch.bool)
        for _ in range(max_new):
            lp = torch.log_softmax(last, -1)
            t = torch.multinomial(lp.exp(), 1, generator=g).squeeze(1)
            for i in range(group):
                if alive[i]:
                    toks[i].append(int(t[i]))
                    lps[i].append(float(lp[i, t[i]]))
            alive &= t != shoal.rl.EOS
            if not alive.any():
                break
            logits, h = model(t.unsqueeze(1), h)
            last = logits[:, -1]
        out.extend(zip(toks, lps))
    return out


def token_logp(model, tokens):
    """log-probability of tokens[:, t] given the prefix, for t >= 1: (B, T)."""
    logits, _ = model(tokens[:, :-1])
    lp = torch.log_softmax(logits, -1)
    out = torch.zeros(tokens.shape, dtype=lp.dtype)
    out[:, 1:] = lp.gather(2, tokens[:, 1:].unsqueeze(2)).squeeze(2)
    return out


@torch.no_grad()
def evaluate(model, task, ids, max_new, samples=4, seed=99):
    """Mean reward of `samples` responses to each held-out problem."""
    prompts = [[shoal.rl.BOS] + shoal.rl.encode(task.prompt(i)) for i in ids]
    outs = sample(model, prompts, samples, max_new, seed=seed)
    r = [task.reward(ids[k // samples], resp) for k, (resp, _) in enumerate(outs)]
    return sum(r) / len(r)


def warm_start(model, task, steps, seed, max_new, batch=32, lr=3e-3):
    """Supervised steps on the task's demonstrations: a start that RL then
    improves."""
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    ids = task.draw(steps * batch, seed)
    for s in range(steps):
        seqs, plens = [], []
        for i in ids[s * batch:(s + 1) * batch]:
            p = [shoal.rl.BOS] + shoal.rl.encode(task.prompt(i))
            seqs.append(p + shoal.rl.encode(task.answer(i))[:max_new - 1] + [shoal.rl.EOS])
            plens.append(len(p))
        x = pad(seqs)
        lp = token_logp(model, x)
        mask = torch.zeros_like(lp)
        for k, (s_, pl) in enumerate(zip(seqs, plens)):
            mask[k, pl:len(s_)] = 1
        loss = -(lp * mask).sum() / mask.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
