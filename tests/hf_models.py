#!/usr/bin/env python3
"""The oracle of tests/hf_test.cpp: tiny random models of the architectures the hf family reads,
written by transformers' save_pretrained, and what transformers computes with them.

  hf_models.py make ROOT [CASES]  for every case (or those named, comma-separated), ROOT/<case>/: model/ (save_pretrained), tokens.npy
                              [B, T+1] int64, logits.npy (transformers' logits of tokens[:, :T]),
                              losses.npy (5 steps of plain SGD on the one batch, in transformers'
                              own loop) and trained/ (the weights after them)
  hf_models.py generate IDS N DIR...  greedy generation by transformers (model.generate, do_sample
                              False, its own key/value cache) of at most N tokens after the
                              comma-separated IDS with the model in each DIR; prints, as JSON by DIR,
                              the new ids and the end-of-text id it stops at (-1: none in the vocabulary)
  hf_models.py compare ROOT   loads every ROOT/<case>/exported with from_pretrained and prints, as
                              JSON, its largest difference from ROOT/<case>/trained per case

transformers computes RMSNorm and the rotary tables in float32 even in a float64 model (an upcast
meant for half precisions); the float64 cases run them in float64, as the float32 cases run them
in float32, so that float64 compares the same math at float64's precision (and attention is
transformers' sdpa: its eager path takes the softmax in float32).
"""
import importlib
import json
import math
import os
import sys

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM

SEQ, BATCH, STEPS, LR = 8, 4, 5, 0.1

CASES = {
    # grouped-query attention, untied head
    "llama": ("LlamaConfig", dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
                                  num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False)),
    # tied head, Llama 3.1's rope scaling, every bias
    "llama3-tied": ("LlamaConfig", dict(hidden_size=32, intermediate_size=40, num_hidden_layers=3, num_attention_heads=2,
                                        num_key_value_heads=1, max_position_embeddings=64, tie_word_embeddings=True,
                                        attention_bias=True, mlp_bias=True, rope_theta=500000.0,
                                        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 16})),
    # a sliding window shorter than the sequence
    "mistral": ("MistralConfig", dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=64, sliding_window=4,
                                      tie_word_embeddings=False)),
    # q/k/v biases, tied head
    "qwen2": ("Qwen2Config", dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
                                  num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True)),
    # each head's queries and keys RMS-normalized, a head_dim apart from hidden_size / heads, every
    # attention bias, tied head
    "qwen3": ("Qwen3Config", dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
                                  num_key_value_heads=2, head_dim=12, max_position_embeddings=64, attention_bias=True,
                                  tie_word_embeddings=True)),
    # q, k and v in one tensor, gate and up in another; a window shorter than the sequence on every
    # layer; a padding token (its embedding row takes no gradient) that the batch holds
    "phi3": ("Phi3Config", dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
                                num_key_value_heads=2, max_position_embeddings=64, sliding_window=5, pad_token_id=5,
                                tie_word_embeddings=False)),
    "gpt2": ("GPT2Config", dict(n_embd=32, n_layer=3, n_head=4, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
                                attn_pdrop=0.0)),
}
DTYPES = {"float32": torch.float32, "float64": torch.float64}


def rope_inv_freq64(config, dim):
    """transformers' inverse frequencies (default and llama3), in float64."""
    p = config.rope_parameters
    inv = 1.0 / (p["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float64) / dim))
    if p.get("rope_type", "default") != "llama3":
        return inv
    factor, low, high = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
    old = p["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > old / low, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old / high) * ~(wavelen > old / low)
    return torch.where(medium, smoothed, scaled)


def patch_float64():
    for family in ("llama", "mistral", "qwen2", "qwen3", "phi3"):
        module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
        prefix = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3", "phi3": "Phi3"}[family]
        norm = getattr(module, f"{prefix}RMSNorm")
        rotary = getattr(module, f"{prefix}RotaryEmbedding")

        def norm_forward(self, h, _orig=norm.forward):
            if h.dtype != torch.float64:
                return _orig(self, h)
            variance = h.pow(2).mean(-1, keepdim=True)
            return self.weight * (h * torch.rsqrt(variance + self.variance_epsilon))

        def rotary_forward(self, x, position_ids, _orig=rotary.forward):
            if x.dtype != torch.float64:
                return _orig(self, x, position_ids)
            c = self.config
            dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
            freqs = position_ids[..., None].to(torch.float64) * rope_inv_freq64(c, dim)
            emb = torch.cat((freqs, freqs), dim=-1)
            return emb.cos(), emb.sin()

        norm.forward = norm_forward
        rotary.forward = rotary_forward


def make(root, only=None):
    patch_float64()
    for name, (config_class, fields) in CASES.items():
        if only and name not in only.split(","):
            continue
        for dtype_name, dtype in DTYPES.items():
            out = os.path.join(root, f"{name}-{dtype_name}")
            os.makedirs(out, exist_ok=True)
            torch.manual_seed(len(name))
            config = getattr(transformers, config_class)(vocab_size=96, initializer_range=0.2, **fields)
            model = AutoModelForCausalLM.from_config(config).to(dtype)
            with torch.no_grad():  # biases and norm scales away from their initial zeros and ones
                for pname, p in model.named_parameters():
                    if p.dim() == 1:
                        p.add_(torch.randn_like(p) * 0.1)
            model.save_pretrained(os.path.join(out, "model"))
            tokens = torch.randint(0, config.vocab_size, (BATCH, SEQ + 1))
            if getattr(config, "pad_token_id", None) is not None:
                tokens[:, ::3] = config.pad_token_id  # the padding row is read, and takes no gradient
            np.save(os.path.join(out, "tokens.npy"), tokens.numpy())
            x, y = tokens[:, :SEQ], tokens[:, 1:]
            model.eval()
            with torch.no_grad():
                np.save(os.path.join(out, "logits.npy"), model(x).logits.numpy())
            model.train()
            opt = torch.optim.SGD(model.parameters(), lr=LR)
            losses = []
            for _ in range(STEPS):
                opt.zero_grad()
                logits = model(x).logits
                loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
                loss.backward()
                opt.step()
                losses.append(loss.item())
            np.save(os.path.join(out, "losses.npy"), np.array(losses, dtype=np.float64))
            model.save_pretrained(os.path.join(out, "trained"))
    print("made the cases with transformers", transformers.__version__)


def generate(ids, new_tokens, *model_dirs):
    patch_float64()
    result = {}
    for model_dir in model_dirs:
        with open(os.path.join(model_dir, "config.json")) as f:
            dtype = DTYPES.get(json.load(f).get("dtype"), torch.float32)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
        prompt = torch.tensor([[int(i) for i in ids.split(",")]])
        with torch.no_grad():
            out = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                 max_new_tokens=int(new_tokens), pad_token_id=0)
        eos = model.generation_config.eos_token_id
        eos = eos[0] if isinstance(eos, list) else eos
        in_vocab = eos is not None and 0 <= eos < model.config.vocab_size
        result[model_dir] = {"new": out[0, prompt.size(1):].tolist(), "eos": int(eos) if in_vocab else -1}
    print(json.dumps(result))


def compare(root):
    result = {}
    for case in sorted(os.listdir(root)):
        exported = os.path.join(root, case, "exported")
        if not os.path.isdir(exported):
            continue
        dtype = DTYPES[case.rsplit("-", 1)[1]]
        a = AutoModelForCausalLM.from_pretrained(exported, dtype=dtype).state_dict()
        b = AutoModelForCausalLM.from_pretrained(os.path.join(root, case, "trained"), dtype=dtype).state_dict()
        if sorted(a) != sorted(b):
            result[case] = "names differ: " + str(sorted(set(a) ^ set(b)))
            continue
        result[case] = max(float((a[k].double() - b[k].double()).abs().max()) for k in a)
    print(json.dumps(result))


if __name__ == "__main__":
    {"make": make, "generate": generate, "compare": compare}[sys.argv[1]](*sys.argv[2:])
