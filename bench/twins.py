"""Python twins of pipetrain's built-in model families, for side-by-side runs against other
systems (bench/peer_pipelining.py): the same layers, in the same order, under the same parameter
names as `pipetrain export` writes, computing the same function (models/layers.cpp), so that
`load_state_dict(torch.load(exported))` gives the same network. Dropout is left out: pipetrain's
masks are keyed (the same under any split), PyTorch's are not, so a comparison runs with
dropout 0. BatchNorm trains on each micro-batch's statistics, as pipetrain's does.
"""
import collections
import math

import numpy as np
import torch
import torch.nn.functional as F


class Dense(torch.nn.Module):
    """Linear (+ ReLU), flattening an input of more than 2 dims (the cnn family's fc)."""

    def __init__(self, i, o, relu, flatten=True):
        super().__init__()
        self.linear = torch.nn.Linear(i, o)
        self.relu, self.flatten = relu, flatten

    def forward(self, x):
        y = self.linear(x.flatten(1) if self.flatten and x.dim() > 2 else x)
        return torch.relu(y) if self.relu else y


class ConvBlock(torch.nn.Module):
    def __init__(self, i, o, pool, batch_norm):
        super().__init__()
        self.conv = torch.nn.Conv2d(i, o, 3, padding=1, bias=not batch_norm)
        if batch_norm:
            self.bn = torch.nn.BatchNorm2d(o)
        self.pool = pool

    def forward(self, x):
        h = self.conv(x)
        if hasattr(self, "bn"):
            h = self.bn(h)
        h = torch.relu(h)
        return F.max_pool2d(h, 2) if self.pool else h


class Embedding(torch.nn.Module):
    def __init__(self, vocab, seq_len, d):
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, d)
        self.pos = torch.nn.Embedding(seq_len, d)

    def forward(self, tokens):
        return self.tok(tokens) + self.pos(torch.arange(tokens.size(1))).unsqueeze(0)


class Block(torch.nn.Module):
    """Pre-norm causal self-attention and a GELU MLP, as BlockImpl::forward."""

    def __init__(self, d, heads, d_ff):
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.ln2 = torch.nn.LayerNorm(d)
        self.fc1 = torch.nn.Linear(d, d_ff)
        self.fc2 = torch.nn.Linear(d_ff, d)
        self.heads = heads

    def forward(self, x):
        B, T, C = x.shape
        H, D = self.heads, C // self.heads
        q, k, v = self.qkv(self.ln1(x)).view(B, T, 3, H, D).permute(2, 0, 3, 1, 4)
        att = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(D))
        att = att.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        y = torch.matmul(torch.softmax(att, -1), v).transpose(1, 2).reshape(B, T, C)
        h = x + self.proj(y)
        return h + self.fc2(F.gelu(self.fc1(self.ln2(h))))


class Norm(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln = torch.nn.LayerNorm(d)

    def forward(self, x):
        return self.ln(x)


def build(m):
    """The family `m["family"]` of a config's model section as a torch.nn.Sequential."""
    layers = collections.OrderedDict()
    family = m.get("family")
    if family == "mlp":
        for i in range(m["layers"]):
            layers[f"fc{i + 1}"] = Dense(m["in"] if i == 0 else m["width"], m["width"], True)
        layers["head"] = Dense(m["width"], m["out"], False)
    elif family == "cnn":
        c, bn = m.get("channels", 32), m.get("batch_norm", False)
        image, cin = m.get("image_size", 28), m.get("in_channels", 1)
        layers["conv1"] = ConvBlock(cin, c, True, bn)
        layers["conv2"] = ConvBlock(c, 2 * c, True, bn)
        layers["conv3"] = ConvBlock(2 * c, 2 * c, False, bn)
        layers["fc"] = Dense(2 * c * (image // 4) ** 2, m.get("hidden", 128), True)
        layers["head"] = Dense(m.get("hidden", 128), m.get("classes", 10), False)
    elif family == "gpt":
        if m.get("tie_embeddings"):
            raise ValueError("twins: tie_embeddings is not supported")
        d = m.get("d_model", 128)
        layers["embed"] = Embedding(m.get("vocab_size", 256), m.get("seq_len", 64), d)
        for i in range(m.get("n_layers", 4)):
            layers[f"block{i}"] = Block(d, m.get("n_heads", 4), m.get("d_ff", 4 * d))
        layers["norm"] = Norm(d)
        layers["head"] = Dense(d, m.get("vocab_size", 256), False, flatten=False)
    else:
        raise ValueError(f"twins: no Python twin of the {family!r} family")
    return torch.nn.Sequential(layers)


def without_dropout(m):
    """The model section with every dropout at 0 (see the module's note)."""
    m = dict(m)
    if "dropout" in m or m.get("family") in ("cnn", "gpt"):
        m["dropout"] = 0.0
    return m


def sample_batch(m, batch, seed=0):
    """(inputs, targets) as numpy arrays for `batch` samples of the family's shape."""
    g = np.random.default_rng(seed)
    family = m.get("family")
    if family == "mlp":
        return g.standard_normal((batch, m["in"]), dtype=np.float32), g.integers(0, m["out"], batch).astype(np.int64)
    if family == "cnn":
        s, cin = m.get("image_size", 28), m.get("in_channels", 1)
        return (g.standard_normal((batch, cin, s, s), dtype=np.float32),
                g.integers(0, m.get("classes", 10), batch).astype(np.int64))
    if family == "gpt":
        v, t = m.get("vocab_size", 256), m.get("seq_len", 64)
        return g.integers(0, v, (batch, t)).astype(np.int64), g.integers(0, v, (batch, t)).astype(np.int64)
    raise ValueError(f"twins: no sample batch for the {family!r} family")


def loss(out, target):
    """pipetrain's mean cross-entropy (job/job.cpp): over every position of every sample."""
    return F.cross_entropy(out.reshape(-1, out.size(-1)), target.reshape(-1))
