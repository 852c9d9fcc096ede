#!/usr/bin/env python3
"""The oracle of tests/hf_test.cpp: tiny random models of the architectures the hf family reads,
written by transformers' save_pretrained, and what transformers computes with them.

  hf_models.py make ROOT [CASES]  for every case (or those named, comma-separated) and dtype (float32, float64,
                              bfloat16: the model as from_pretrained loads it), ROOT/<case>-<dtype>/: model/ (save_pretrained), tokens.npy
                              [B, T+1] int64, logits.npy (transformers' logits of tokens[:, :T]),
                              losses.npy (5 steps of plain SGD on the one batch, in transformers'
                              own loop) and trained/ (the weights after them)
  hf_models.py models ROOT CASES  only ROOT/<case>-<dtype>/model, for float32 and float64, of the
                              comma-separated CASES
  hf_models.py generate IDS N DIR...  greedy generation by transformers (model.generate, do_sample
                              False, its own key/value cache) of at most N tokens after the
                              comma-separated IDS with the model in each DIR; prints, as JSON by DIR,
                              the new ids and the end-of-text id it stops at (-1: none in the vocabulary)
  hf_models.py compare ROOT   loads every ROOT/<case>/exported with from_pretrained and prints, as
                              JSON, its largest difference from ROOT/<case>/trained per case
  hf_models.py start DIR / stop DIR  a server that runs these commands with its imports done once
                              (tests/hf_oracle_server.py; where PIPETRAIN_HF_ORACLE names DIR, the
                              commands above are handed to it)

transformers computes RMSNorm and the rotary tables in float32 even in a float64 model (an upcast
meant for half precisions); the float64 cases run them in float64, as the float32 cases run them
in float32, so that float64 compares the same math at float64's precision (and attention is
transformers' sdpa: its eager path takes the softmax in float32).
"""
import functools
import importlib
import json
import math
import os
import sys

if __name__ == "__main__":
    import importlib.util
    import hf_oracle_server  # beside this file
    if sys.argv[1:2] == ["start"] and importlib.util.find_spec("transformers") is None:
        print("no transformers here: no oracle's server (each test that needs it is skipped)")
        sys.exit(0)
    if sys.argv[1:2] not in (["start"], ["stop"]):
        hf_oracle_server.relay(sys.argv[1:])  # returns where no server takes the command

# OpenMP's threads wait passively: the tests run two at a time on two cores, and OpenMP's spinning
# waits let two processes' threads starve each other (a run of small float64 products: 0.1 s alone,
# 29 s beside a second one, AMD EPYC, 2 cores). Where they wait changes no result.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

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
    # dynamic NTK rope (factor 4): within max_position_embeddings its frequencies are the default
    "llama-dynamic": ("LlamaConfig", dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
                                          num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False,
                                          rope_scaling={"rope_type": "dynamic", "factor": 4.0})),
    # dynamic NTK rope (factor 4) beyond its 6 positions: the batch's 8 grow its base
    "llama-dynamic-long": ("LlamaConfig", dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
                                               num_key_value_heads=2, max_position_embeddings=6, tie_word_embeddings=False,
                                               rope_scaling={"rope_type": "dynamic", "factor": 4.0})),
    # a sliding window shorter than the sequence
    "mistral": ("MistralConfig", dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=64, sliding_window=4,
                                      tie_word_embeddings=False)),
    # Ministral 3: yarn past a pretraining length of 4 positions, whose queries from the fifth on
    # are scaled by 1 + 0.5 log(1 + floor(position / 4)); its default padding token (11)
    "ministral3": ("Ministral3Config", dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
                                            num_key_value_heads=2, head_dim=8, max_position_embeddings=64, tie_word_embeddings=False,
                                            rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                                             "original_max_position_embeddings": 4, "beta_fast": 32.0,
                                                             "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                                                             "llama_4_scaling_beta": 0.5})),
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
    # yarn's long-context rope (a fractional ramp: truncate false; its attention factor), a
    # head_dim apart from hidden_size / heads
    "qwen3-yarn": ("Qwen3Config", dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=2, head_dim=16, max_position_embeddings=64, rope_theta=100.0,
                                       rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
                                                     "truncate": False}, tie_word_embeddings=False)),
    # Phi-3.5's and Phi-4-mini's longrope (long factors beyond 6 positions, the batch's 8) over
    # half of each head (partial_rotary_factor)
    "phi3-longrope": ("Phi3Config", dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
                                         num_key_value_heads=1, max_position_embeddings=64, original_max_position_embeddings=6,
                                         partial_rotary_factor=0.5, tie_word_embeddings=True, pad_token_id=None,
                                         rope_scaling={"rope_type": "longrope", "short_factor": [1.0, 1.25, 1.5, 2.0],
                                                       "long_factor": [2.0, 3.0, 5.0, 8.0]})),
    # OLMo 2: norms after attention and the MLP, queries and keys normalized over the whole
    # projection, every attention bias
    "olmo2": ("Olmo2Config", dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
                                  num_key_value_heads=2, max_position_embeddings=64, attention_bias=True, pad_token_id=None,
                                  tie_word_embeddings=False)),
    # Gemma: (1 + w) norms, a scaled embedding, GeGLU, head_dim 8 of hidden 32 / 2 heads, a padding
    # token, tied head
    "gemma": ("GemmaConfig", dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=2,
                                  num_key_value_heads=1, head_dim=8, max_position_embeddings=64, pad_token_id=5)),
    # Gemma 2: four norms a layer, query_pre_attn_scalar, attention and final soft-capping (caps
    # low enough to bite), a window of 4 on every other layer
    "gemma2": ("Gemma2Config", dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
                                    num_key_value_heads=2, head_dim=8, max_position_embeddings=64, query_pre_attn_scalar=12,
                                    attn_logit_softcapping=2.0, final_logit_softcapping=3.0, sliding_window=4, pad_token_id=None)),
    # Gemma 3: per-head (1 + w) q/k norms, a window of 4 on the sliding layers with their own rope
    # theta, linear rope scaling on the full layers
    "gemma3": ("Gemma3TextConfig", dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
                                        num_key_value_heads=2, head_dim=8, max_position_embeddings=64, query_pre_attn_scalar=12,
                                        sliding_window=4, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                                        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e5},
                                                         "sliding_attention": {"rope_type": "default", "rope_theta": 50.0}},
                                        pad_token_id=None)),
    # Granite: its four multipliers away from 1 (the embedding's, attention's scale, each branch's
    # before the residual, the logits' divisor), every bias, tied head
    "granite": ("GraniteConfig", dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=64, embedding_multiplier=6.0,
                                      attention_multiplier=0.2, residual_multiplier=0.3, logits_scaling=3.0,
                                      attention_bias=True, mlp_bias=True, tie_word_embeddings=True)),
    # SmolLM3: its middle layer without rotary positions (NoPE, no_rope_layer_interval 2) and with
    # a window of 4 (use_sliding_window), every attention bias, tied head
    "smollm3": ("SmolLM3Config", dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=64, no_rope_layer_interval=2,
                                      use_sliding_window=True, sliding_window=4, attention_bias=True, pad_token_id=None,
                                      tie_word_embeddings=True)),
    # Mixtral: 4 experts, each token's top 2 (their probabilities renormalized)
    "mixtral": ("MixtralConfig", dict(hidden_size=32, intermediate_size=24, num_hidden_layers=3, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=64, num_local_experts=4,
                                      num_experts_per_tok=2, tie_word_embeddings=False)),
    # Qwen3-MoE: 4 experts of 16, top 2 unnormalized, the middle layer a dense MLP of 40
    # (mlp_only_layers), per-head q/k norms
    "qwen3-moe": ("Qwen3MoeConfig", dict(hidden_size=32, intermediate_size=40, moe_intermediate_size=16, num_hidden_layers=3,
                                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
                                         num_experts=4, num_experts_per_tok=2, norm_topk_prob=False, mlp_only_layers=[1],
                                         tie_word_embeddings=False)),
    # Qwen2-MoE: 4 experts of 16, top 2 unnormalized, a shared expert of 24 behind its sigmoid gate
    # on every sparse layer, the middle layer a dense MLP of 40 (mlp_only_layers), q/k/v biases
    "qwen2-moe": ("Qwen2MoeConfig", dict(hidden_size=32, intermediate_size=40, moe_intermediate_size=16,
                                         shared_expert_intermediate_size=24, num_hidden_layers=3, num_attention_heads=4,
                                         num_key_value_heads=2, max_position_embeddings=64, num_experts=4,
                                         num_experts_per_tok=2, norm_topk_prob=False, mlp_only_layers=[1],
                                         tie_word_embeddings=False)),
    # OLMoE: 4 experts of 24, top 2 unnormalized, q/k norms over the projection, q, k and v
    # clamped to 2 (low enough to bite)
    "olmoe": ("OlmoeConfig", dict(hidden_size=32, intermediate_size=24, num_hidden_layers=3, num_attention_heads=4,
                                  num_key_value_heads=2, max_position_embeddings=64, num_experts=4, num_experts_per_tok=2,
                                  clip_qkv=2.0, pad_token_id=None, tie_word_embeddings=False)),
    # GraniteMoE: 4 experts of 24 in stacked tensors (each expert's gate and up in one), top 2 by
    # the softmax of their scores alone, Granite's four multipliers, attention biases, tied head
    "granitemoe": ("GraniteMoeConfig", dict(hidden_size=32, intermediate_size=24, num_hidden_layers=3, num_attention_heads=4,
                                            num_key_value_heads=2, max_position_embeddings=64, num_local_experts=4,
                                            num_experts_per_tok=2, embedding_multiplier=6.0, attention_multiplier=0.2,
                                            residual_multiplier=0.3, logits_scaling=3.0, attention_bias=True,
                                            tie_word_embeddings=True)),
    # GraniteMoeShared: GraniteMoE's 4 experts and a shared MLP of 20 for every token, without a gate
    "granitemoe-shared": ("GraniteMoeSharedConfig", dict(hidden_size=32, intermediate_size=24, shared_intermediate_size=20,
                                                         num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                                                         max_position_embeddings=64, num_local_experts=4, num_experts_per_tok=2,
                                                         embedding_multiplier=6.0, attention_multiplier=0.2, residual_multiplier=0.3,
                                                         logits_scaling=3.0, tie_word_embeddings=False)),
    # Granite 4.0-H: Mamba 2 layers (4 heads of 16 in 2 groups, a state of 8, chunks of 4: two a
    # window) around an attention layer without positions, GraniteMoeShared's experts and shared MLP
    # on every layer, Granite's multipliers
    "granitemoehybrid": ("GraniteMoeHybridConfig", dict(hidden_size=32, intermediate_size=24, shared_intermediate_size=20,
                                                        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                                                        max_position_embeddings=64, num_local_experts=4, num_experts_per_tok=2,
                                                        layer_types=["mamba", "attention", "mamba"], mamba_n_heads=4,
                                                        mamba_n_groups=2, mamba_d_state=8, mamba_d_head=16, mamba_d_conv=4,
                                                        mamba_chunk_size=4, position_embedding_type="nope",
                                                        embedding_multiplier=6.0, attention_multiplier=0.2,
                                                        residual_multiplier=0.3, logits_scaling=3.0, tie_word_embeddings=False)),
    # Granite 4.0-H without experts (its shared MLP the dense one), rotary positions on its
    # attention layer, chunks of 3 (the last one short), one group, biases on the Mamba projections
    # and none on its convolution, a tied head
    "granitemoehybrid-dense": ("GraniteMoeHybridConfig", dict(hidden_size=32, intermediate_size=24, shared_intermediate_size=40,
                                                              num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                                                              max_position_embeddings=64, num_local_experts=0,
                                                              layer_types=["attention", "mamba", "mamba"], mamba_n_heads=8,
                                                              mamba_n_groups=1, mamba_d_state=6, mamba_d_head=8, mamba_d_conv=3,
                                                              mamba_chunk_size=3, mamba_proj_bias=True, mamba_conv_bias=False,
                                                              position_embedding_type="rope", attention_multiplier=0.25,
                                                              tie_word_embeddings=True)),
    # Cohere (Command R, Aya): one LayerNorm without a bias feeding attention and the MLP side by
    # side, the rotation of interleaved pairs, attention biases, the logits scaled by 0.25, tied
    "cohere": ("CohereConfig", dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
                                    num_key_value_heads=2, max_position_embeddings=64, logit_scale=0.25, attention_bias=True,
                                    tie_word_embeddings=True)),
    # Command R+: Cohere's layers with LayerNorms of each head's queries and keys before the
    # rotation, each head its own weight (4 query heads, 2 key heads, weights away from 1)
    "cohere-qk": ("CohereConfig", dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=2, max_position_embeddings=64, logit_scale=0.25, use_qk_norm=True)),
    # Cohere 2 (Command R7B, Command A): Cohere's layers, windows of 4 on three layers of four (its
    # default pattern) rotating, the full layer without positions, the logits scaled by 0.5
    "cohere2": ("Cohere2Config", dict(hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=64, sliding_window=4, logit_scale=0.5)),
    # StarCoder2: LayerNorms with biases, an MLP without a gate through the tanh GELU, biases on
    # every projection, a window of 4, tied
    "starcoder2": ("Starcoder2Config", dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
                                            num_key_value_heads=2, max_position_embeddings=64, sliding_window=4,
                                            residual_dropout=0.0, embedding_dropout=0.0, attention_dropout=0.0)),
    # Seed-OSS: biases on q, k and v and on o, heads of 8, its padding token (1), dropouts at 0
    "seed-oss": ("SeedOssConfig", dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
                                       num_key_value_heads=2, head_dim=8, max_position_embeddings=64, attention_out_bias=True,
                                       residual_dropout=0.0, attention_dropout=0.0)),
    # GPT-NeoX (Pythia): q, k and v in one tensor head by head, a quarter of each head of 16 rotated,
    # attention beside the exact-GELU MLP each through its own LayerNorm, every bias, untied
    "gpt-neox": ("GPTNeoXConfig", dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=2,
                                       max_position_embeddings=64, tie_word_embeddings=False)),
    # GPT-NeoX's layers one after the other (use_parallel_residual false), without attention biases,
    # half of each head rotated, the fast GELU, tied
    "gpt-neox-sequential": ("GPTNeoXConfig", dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
                                                  max_position_embeddings=64, use_parallel_residual=False, attention_bias=False,
                                                  hidden_act="gelu_fast", rotary_pct=0.5, tie_word_embeddings=True)),
    # Phi (Phi-2): one LayerNorm feeding attention and a gelu_new MLP side by side, half of each head
    # rotated, every bias (the head's too), a padding token, untied
    "phi": ("PhiConfig", dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
                              max_position_embeddings=64, pad_token_id=5, tie_word_embeddings=False)),
    # Phi's LayerNorms of each head's queries and keys (one weight and bias for every head), 2 key
    # heads of 4, 0.4 of each head of 10 rotated, the exact GELU
    "phi-qk": ("PhiConfig", dict(hidden_size=40, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, max_position_embeddings=64, qk_layernorm=True, partial_rotary_factor=0.4,
                                 hidden_act="gelu", tie_word_embeddings=False)),
    # StableLM 2: Llama's SwiGLU layers with LayerNorms, a quarter of each head of 16 rotated, q/k/v
    # biases, 2 key heads of 2, untied
    "stablelm": ("StableLmConfig", dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=2,
                                        num_key_value_heads=1, max_position_embeddings=64, use_qkv_bias=True, tie_word_embeddings=False)),
    # StableLM 2 12B's: attention beside the MLP on one LayerNorm, each head its own q/k LayerNorm
    "stablelm-parallel-qk": ("StableLmConfig", dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                                                    num_key_value_heads=2, max_position_embeddings=64, use_parallel_residual=True,
                                                    qk_layernorm=True, partial_rotary_factor=0.5, tie_word_embeddings=False)),
    # Falcon-7B's: one key and value for every head (multi_query) in the fused tensor, attention
    # beside a GELU MLP on one LayerNorm, no biases, tied
    "falcon": ("FalconConfig", dict(hidden_size=32, ffn_hidden_size=48, num_hidden_layers=3, num_attention_heads=4,
                                    max_position_embeddings=64)),
    # Falcon-40B's and 180B's: groups of a key head's queries, its key and value (2 key heads of 4),
    # ln_attn and ln_mlp side by side, untied
    "falcon-40b": ("FalconConfig", dict(hidden_size=32, ffn_hidden_size=48, num_hidden_layers=3, num_attention_heads=4,
                                        num_kv_heads=2, new_decoder_architecture=True, max_position_embeddings=64,
                                        tie_word_embeddings=False)),
    # Falcon's layers one after the other, each head's query, key and value in turn, gelu_new, every
    # bias (added after each product, FalconLinear's)
    "falcon-sequential": ("FalconConfig", dict(hidden_size=32, ffn_hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
                                               multi_query=False, parallel_attn=False, activation="gelu_new", bias=True,
                                               max_position_embeddings=64)),
    # GPT-J: one LayerNorm feeding attention and a gelu_new MLP side by side, 4 of each head's 8
    # values rotated as interleaved pairs, the MLP's and the head's biases, untied
    "gptj": ("GPTJConfig", dict(n_embd=32, n_inner=48, n_layer=3, n_head=4, rotary_dim=4, n_positions=64)),
    # GPT-BigCode (StarCoder 1, SantaCoder): GPT-2's layers with one key and value head for every
    # query head in c_attn, learned positions, the tanh GELU, every bias, tied; dropouts at 0
    "gpt-bigcode": ("GPTBigCodeConfig", dict(n_embd=32, n_inner=48, n_layer=3, n_head=4, n_positions=64, resid_pdrop=0.0,
                                             embd_pdrop=0.0, attn_pdrop=0.0)),
    # without multi_query: each head's query, key and value in turn; gelu_new, untied
    "gpt-bigcode-mha": ("GPTBigCodeConfig", dict(n_embd=32, n_inner=48, n_layer=2, n_head=4, n_positions=64, multi_query=False,
                                                 activation_function="gelu_new", tie_word_embeddings=False, resid_pdrop=0.0,
                                                 embd_pdrop=0.0, attn_pdrop=0.0)),
    # OLMo (the first): LayerNorms without parameters, q, k and v clamped at 0.5 (which binds), its
    # padding token (1), untied
    "olmo": ("OlmoConfig", dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
                                num_key_value_heads=2, max_position_embeddings=64, clip_qkv=0.5, tie_word_embeddings=False)),
    # Bamba: Mamba 2 (4 heads in 2 groups, chunks of 4, steps clamped above at 0.05, which binds)
    # around an attention layer rotating half of each head, every attention and MLP bias, padding
    # rows, a tied head
    "bamba": ("BambaConfig", dict(hidden_size=32, intermediate_size=40, num_hidden_layers=3, num_attention_heads=4,
                                  num_key_value_heads=2, max_position_embeddings=64, attn_layer_indices=[1], mamba_n_heads=4,
                                  mamba_n_groups=2, mamba_d_state=8, mamba_d_head=16, mamba_d_conv=4, mamba_chunk_size=4,
                                  time_step_limit=(0.0, 0.05), attention_bias=True, mlp_bias=True, tie_word_embeddings=True)),
    # Nemotron-H: blocks of one part each (Mamba 2 of 4 heads in 2 groups, chunks of 4; attention
    # without positions; a relu² MLP; 4 relu² experts in 2 groups, DeepSeek-V3's sigmoid routing with
    # a shared expert), its layer types as layers_block_type names them
    "nemotron-h": ("NemotronHConfig", dict(hidden_size=32, layers_block_type=["mamba", "attention", "mlp", "moe", "mamba", "mlp"],
                                           num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=40,
                                           mamba_num_heads=4, mamba_head_dim=16, ssm_state_size=8, n_groups=2, chunk_size=4,
                                           n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
                                           moe_shared_expert_intermediate_size=20, n_group=2, topk_group=1,
                                           routed_scaling_factor=1.5, max_position_embeddings=64, tie_word_embeddings=False)),
    # Nemotron-H's latent experts: the routed experts on a latent of 16 (into it and out of it),
    # the router and the shared expert on the hidden state
    "nemotron-h-latent": ("NemotronHConfig", dict(hidden_size=32, layers_block_type=["moe", "mamba", "moe"], num_attention_heads=4,
                                                  num_key_value_heads=2, head_dim=8, intermediate_size=40, mamba_num_heads=4,
                                                  mamba_head_dim=16, ssm_state_size=8, n_groups=2, chunk_size=4, n_routed_experts=4,
                                                  num_experts_per_tok=2, moe_intermediate_size=24, moe_latent_size=16,
                                                  moe_shared_expert_intermediate_size=20, max_position_embeddings=64,
                                                  tie_word_embeddings=False)),
    # Nemotron-H as Nemotron Nano 2 (its pattern "M-M*-" as hybrid_override_pattern spells it,
    # dense): chunks of 3 (the last short), biases on the Mamba projections, a floor of 0.01 on the steps
    "nemotron-h-dense": ("NemotronHConfig", dict(hidden_size=32, hybrid_override_pattern="M-M*-", num_attention_heads=4,
                                                 num_key_value_heads=4, head_dim=8, intermediate_size=48, mamba_num_heads=8,
                                                 mamba_head_dim=8, ssm_state_size=6, n_groups=1, chunk_size=3, use_bias=True,
                                                 time_step_min=0.01, max_position_embeddings=64, tie_word_embeddings=False)),
    # DeepSeek-V3: multi-head latent attention (queries through a latent of 24, keys and values of
    # 16; 8 values of each query and key head unrotated, 4 rotated as interleaved pairs, values of
    # 12), yarn with mscale and mscale_all_dim (which scale attention too), attention biases; after
    # a dense first layer, 8 experts of 16 in 4 groups: sigmoid scores, the correction bias, the
    # best 2 groups, top 2 renormalized and scaled by 2.5; 2 shared experts
    "deepseek-v3": ("DeepseekV3Config", dict(hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=3,
                                             num_attention_heads=4, num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=16,
                                             qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=12, n_routed_experts=8,
                                             num_experts_per_tok=2, n_group=4, topk_group=2, n_shared_experts=2,
                                             routed_scaling_factor=2.5, first_k_dense_replace=1, max_position_embeddings=64,
                                             attention_bias=True, rope_interleave=True, tie_word_embeddings=False,
                                             rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                                                           "mscale": 1.0, "mscale_all_dim": 0.8})),
    # DeepSeek-V3 as the smaller checkpoints of its architecture set it: queries projected
    # directly (q_lora_rank None), the rotated values in halves (rope_interleave false), one group,
    # the top 3 of 6 experts unnormalized, every layer sparse, tied head
    "deepseek-v3-lite": ("DeepseekV3Config", dict(hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
                                                  num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                                                  q_lora_rank=None, kv_lora_rank=12, qk_nope_head_dim=6, qk_rope_head_dim=6,
                                                  v_head_dim=8, n_routed_experts=6, num_experts_per_tok=3, n_group=1,
                                                  topk_group=1, n_shared_experts=1, routed_scaling_factor=1.0,
                                                  norm_topk_prob=False, first_k_dense_replace=0, max_position_embeddings=64,
                                                  rope_interleave=False, tie_word_embeddings=True)),
    # DeepSeek-V2: its latent attention with queries projected directly, the rotation of
    # interleaved pairs as complex numbers left interleaved, yarn with V2's mscales; after a dense
    # first layer, the softmax's top 2 of 8 experts within the best 2 of 4 groups, unnormalized,
    # scaled by 1.5; 2 shared experts
    "deepseek-v2": ("DeepseekV2Config", dict(hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=3,
                                             num_attention_heads=4, num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=16,
                                             qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=12, n_routed_experts=8,
                                             num_experts_per_tok=2, topk_method="group_limited_greedy", n_group=4, topk_group=2,
                                             n_shared_experts=2, routed_scaling_factor=1.5, first_k_dense_replace=1,
                                             max_position_embeddings=64, tie_word_embeddings=False,
                                             rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                                                           "mscale": 0.707, "mscale_all_dim": 0.707})),
    # GLM-4.5: DeepSeek-V3's routing (8 experts in 2 groups, the best 1, scaled by 1.5, a shared
    # expert, a dense first layer) with grouped-query attention: half of each head rotated, q/k/v
    # biases (none on o), per-head q/k norms, a head_dim apart from hidden_size / heads
    "glm4-moe": ("Glm4MoeConfig", dict(hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=3,
                                       num_attention_heads=4, num_key_value_heads=2, head_dim=12, n_routed_experts=8,
                                       num_experts_per_tok=2, n_group=2, topk_group=1, n_shared_experts=1,
                                       routed_scaling_factor=1.5, first_k_dense_replace=1, use_qk_norm=True,
                                       attention_bias=True, max_position_embeddings=64, tie_word_embeddings=False)),
    # OLMo 3: OLMo 2's layer with windows of 4 on three layers of four, yarn on the full layer's
    # rope alone, every attention bias
    "olmo3": ("Olmo3Config", dict(hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
                                  num_key_value_heads=2, sliding_window=4, max_position_embeddings=64, attention_bias=True,
                                  tie_word_embeddings=False,
                                  rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16})),
    # GPT-OSS: a sink per head, biases on q, k, v and o, a window of 4 on every other layer, yarn
    # (truncate false); 4 experts in stacked tensors (gate and up interleaved), biased, the softmax of
    # the top 2 logits of a biased router, the clamped SwiGLU with a limit of 1 (low enough to bite)
    "gpt-oss": ("GptOssConfig", dict(hidden_size=32, intermediate_size=24, num_hidden_layers=3, num_attention_heads=4,
                                     num_key_value_heads=2, head_dim=8, num_local_experts=4, num_experts_per_tok=2,
                                     sliding_window=4, swiglu_limit=1.0, max_position_embeddings=64, tie_word_embeddings=False,
                                     rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                                                   "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False})),
    # Llama 4: chunks of 4 positions on its three rotary layers (interleaved pairs rotated as
    # complex numbers, Llama 3.1's scaling), their queries and keys RMS-normalized without a weight
    # after the rotation; a NoPE last layer over every position, its queries scaled by the
    # temperature of their positions (floor 2, scale 0.5); every other layer 4 experts of 16, the
    # sigmoid of the top 1 logit scaling the expert's input, and a shared expert; dense layers of 48
    "llama4": ("Llama4TextConfig", dict(hidden_size=32, intermediate_size=16, intermediate_size_mlp=48, num_hidden_layers=4,
                                        num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=4,
                                        num_experts_per_tok=1, interleave_moe_layer_step=2, attention_chunk_size=4,
                                        floor_scale=2, attn_scale=0.5, max_position_embeddings=64, tie_word_embeddings=False,
                                        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 16})),
    # Llama 4 otherwise set: a NoPE middle layer (floor 3), no chunks, no q/k norms, every layer 4
    # experts with the top 2 chosen, attention biases, tied head
    "llama4-top2": ("Llama4TextConfig", dict(hidden_size=32, intermediate_size=16, intermediate_size_mlp=40, num_hidden_layers=3,
                                             num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=4,
                                             num_experts_per_tok=2, no_rope_layers=[1, 0, 1], attention_chunk_size=None,
                                             use_qk_norm=False, floor_scale=3, attn_scale=0.5, attention_bias=True,
                                             max_position_embeddings=64, tie_word_embeddings=True)),
    # Llama 4 as its checkpoints are published: the language model of Llama4ForConditionalGeneration
    # (under language_model.) beside a vision model, which is not read and is written back as it was
    "llama4-vision": ("Llama4Config", dict(
        text_config=dict(hidden_size=32, intermediate_size=16, intermediate_size_mlp=48, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=8, num_local_experts=4, num_experts_per_tok=1,
                         interleave_moe_layer_step=2, attention_chunk_size=4, floor_scale=2, attn_scale=0.5,
                         no_rope_layer_interval=2, max_position_embeddings=64),
        vision_config=dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16, vision_output_dim=16,
                           projector_input_dim=16, projector_output_dim=16, image_size=28, patch_size=14))),
    # GLM-4: four norms a layer, half of each head rotated as interleaved pairs, q/k/v biases (none
    # on o), gate and up in one tensor, a padding token
    "glm4": ("Glm4Config", dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                                head_dim=8, pad_token_id=5, max_position_embeddings=64, tie_word_embeddings=False)),
    # Ernie 4.5: the whole head rotated as interleaved pairs in float32, every bias, tied head, yarn
    "ernie4_5": ("Ernie4_5Config", dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
                                        num_key_value_heads=2, head_dim=8, use_bias=True, max_position_embeddings=64,
                                        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16})),
    # EXAONE 4: OLMo 2's norms after attention and the MLP, per-head q/k norms, windows of 4 on every
    # other layer, the others over every position without rotary positions
    "exaone4": ("Exaone4Config", dict(hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
                                      num_key_value_heads=2, sliding_window=4, sliding_window_pattern=2, max_position_embeddings=64,
                                      tie_word_embeddings=False)),
    # MiniMax-M2: q/k norms over the whole projections, half of each head rotated (rotary_dim 4 of 8);
    # every layer 4 experts under Mixtral's names, the top 2 by sigmoid scores plus a correction
    # bias, renormalized
    "minimax-m2": ("MiniMaxM2Config", dict(hidden_size=32, intermediate_size=16, num_hidden_layers=3, num_attention_heads=4,
                                           num_key_value_heads=2, head_dim=8, rotary_dim=4, num_local_experts=4,
                                           num_experts_per_tok=2, max_position_embeddings=64, bos_token_id=1, eos_token_id=2,
                                           tie_word_embeddings=False)),
    # Arcee (AFM): Llama's attention with every bias, an MLP without a gate through relu², yarn
    "arcee": ("ArceeConfig", dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
                                  num_key_value_heads=2, max_position_embeddings=64, attention_bias=True, mlp_bias=True,
                                  rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
                                  tie_word_embeddings=False)),
    # Apertus: an MLP without a gate through xIELU (two trained scalars a layer), per-head q/k norms
    # under its own norms' names, its default rope (llama3's scaling, theta 12e6), every attention
    # bias, its padding token 3
    "apertus": ("ApertusConfig", dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=64, attention_bias=True,
                                      tie_word_embeddings=False)),
    # Hunyuan (dense): per-head q/k norms on the rotated heads, its NTK alpha rope (a fixed larger
    # base), every attention bias, tied
    "hunyuan": ("HunYuanDenseV1Config", dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
                                             num_key_value_heads=2, head_dim=8, max_position_embeddings=64, attention_bias=True,
                                             rope_parameters={"rope_type": "dynamic", "alpha": 1000.0, "rope_theta": 10000.0,
                                                              "factor": 1.0},
                                             tie_word_embeddings=True)),
    # Qwen3-Next: gated DeltaNet layers (2 key heads, 4 value heads of other sizes, a convolution
    # of 4) around a gated attention layer (a quarter of each head rotated, q/k norms), every norm's
    # (1 + weight); 4 experts top 2 renormalized with a gated shared expert, the last layer dense
    "qwen3-next": ("Qwen3NextConfig", dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
                                           num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
                                           layer_types=["linear_attention", "full_attention", "linear_attention"],
                                           linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                                           linear_value_head_dim=6, linear_conv_kernel_dim=4, num_experts=4,
                                           num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=24,
                                           mlp_only_layers=[2], tie_word_embeddings=False)),
    # Qwen3.5's text models: Qwen3-Next's layers with the DeltaNet's projections split (every
    # query, key and value in one, the output gates, b and a apart); dense, and with 4 experts top 2
    # and a gated shared expert on every layer
    "qwen3.5": ("Qwen3_5TextConfig", dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
                                          num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
                                          layer_types=["linear_attention", "full_attention", "linear_attention"],
                                          linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                                          linear_value_head_dim=6, linear_conv_kernel_dim=4, tie_word_embeddings=True)),
    "qwen3.5-moe": ("Qwen3_5MoeTextConfig", dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                                                 head_dim=16, max_position_embeddings=64,
                                                 layer_types=["linear_attention", "full_attention", "linear_attention"],
                                                 linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                                                 linear_value_head_dim=6, linear_conv_kernel_dim=4, num_experts=4,
                                                 num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=24,
                                                 tie_word_embeddings=False)),
    # LLaVA as published (Pixtral-12B's shape): Mistral's language model within
    # LlavaForConditionalGeneration beside a CLIP tower, untied (language_model.lm_head)
    "llava": ("LlavaConfig", dict(
        text_config=dict(model_type="mistral", hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=8, max_position_embeddings=64, sliding_window=None),
        vision_config=dict(model_type="clip_vision_model", hidden_size=16, intermediate_size=16, num_hidden_layers=1,
                           num_attention_heads=2, image_size=28, patch_size=14, projection_dim=16))),
    # InternVL 3 as published: Qwen2's language model (q/k/v biases) within
    # InternVLForConditionalGeneration beside its vision tower, tied by the outer config's default
    "internvl": ("InternVLConfig", dict(
        text_config=dict(model_type="qwen2", hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=64),
        vision_config=dict(hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2, image_size=[28, 28],
                           patch_size=[14, 14]))),
    # Aya Vision as published: Cohere 2's language model (windows of 4) within
    # AyaVisionForConditionalGeneration beside a SigLIP tower, tied; text_config's logit_scale 0.5,
    # which the vision model's head does not apply
    "aya-vision": ("AyaVisionConfig", dict(
        text_config=dict(model_type="cohere2", hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=64, sliding_window=4, logit_scale=0.5),
        vision_config=dict(model_type="siglip_vision_model", hidden_size=16, intermediate_size=16, num_hidden_layers=1,
                           num_attention_heads=2, image_size=28, patch_size=14, vision_use_head=False))),
    # Qwen3-VL as published: Qwen3's language model within Qwen3VLForConditionalGeneration (under
    # model.language_model.) beside its vision model, the rotation in sections of the three
    # position grids (one sequence on text alone), tied by the outer config
    "qwen3-vl": ("Qwen3VLConfig", dict(
        tie_word_embeddings=True,
        text_config=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=8, max_position_embeddings=64,
                         rope_parameters={"rope_type": "default", "rope_theta": 5e5, "mrope_section": [2, 1, 1], "mrope_interleaved": True}),
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=32,
                           deepstack_visual_indexes=[0]))),
    # Qwen3-VL-MoE as published: Qwen3-MoE's language model (4 experts top 2, always renormalized,
    # stacked and transposed in the checkpoint; a dense first layer) beside its vision model
    "qwen3-vl-moe": ("Qwen3VLMoeConfig", dict(
        text_config=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=12,
                         mlp_only_layers=[0], rope_parameters={"rope_type": "default", "rope_theta": 5e5, "mrope_section": [2, 1, 1]}),
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=32,
                           deepstack_visual_indexes=[0]))),
    # Qwen2.5-VL as published: Qwen2's language model within Qwen2_5_VLForConditionalGeneration
    # (saved under Qwen2's names) beside its vision model (visual.), windows of 4 from the second
    # layer on, the rotation in sections of the three position grids (one sequence on text alone)
    "qwen2.5-vl": ("Qwen2_5_VLConfig", dict(
        text_config=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64, use_sliding_window=True, sliding_window=4, max_window_layers=1,
                         rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 1, 1]}),
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=32,
                           fullatt_block_indexes=[0]))),
    # Gemma 3 (4B and up) as published: its language model (as gemma3) within
    # Gemma3ForConditionalGeneration beside a SigLIP vision tower, tied by the outer config; a soft
    # cap of 2 in text_config, which the vision model's head does not apply
    "gemma3-vision": ("Gemma3Config", dict(
        text_config=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=8, max_position_embeddings=64, query_pre_attn_scalar=12,
                         sliding_window=4, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                         rope_parameters={"full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e5},
                                          "sliding_attention": {"rope_type": "default", "rope_theta": 50.0}},
                         pad_token_id=None, final_logit_softcapping=2.0),
        vision_config=dict(hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                           patch_size=14),
        mm_tokens_per_image=4)),
    # Mistral 3 (Mistral Small 3.1 and 3.2) as published: Mistral's language model within
    # Mistral3ForConditionalGeneration beside a Pixtral vision tower, its head untied
    # (language_model.lm_head), a window of 4
    "mistral3-vision": ("Mistral3Config", dict(
        tie_word_embeddings=False,
        text_config=dict(model_type="mistral", hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=8, max_position_embeddings=64, sliding_window=4),
        vision_config=dict(model_type="pixtral", hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                           head_dim=8, image_size=28, patch_size=14))),
    # Qwen3.5-MoE as published: its language model (as qwen3.5-moe) within
    # Qwen3_5MoeForConditionalGeneration beside a vision model, its head tied by the outer config
    "qwen3.5-moe-vision": ("Qwen3_5MoeConfig", dict(
        tie_word_embeddings=True,
        text_config=dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         max_position_embeddings=64, layer_types=["linear_attention", "full_attention", "linear_attention"],
                         linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=6,
                         linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                         shared_expert_intermediate_size=24),
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=32))),
    "gpt2": ("GPT2Config", dict(n_embd=32, n_layer=3, n_head=4, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
                                attn_pdrop=0.0)),
}
# Mixtures of experts again: transformers' grouped_mm experts against experts_kernel "grouped"
for _case in ("mixtral", "gpt-oss", "deepseek-v3"):
    CASES[_case + "-grouped"] = CASES[_case]
# Quantized checkpoints as they are published (DeepSeek-V3's and Qwen3's fp8 blocks, GPT-OSS's MXFP4
# experts): the case's model, its weights quantized by quantize() below, read by transformers
# dequantized (as it reads them without a GPU): (the case, the method, fp8's block [rows, columns],
# changes to the case's config: MXFP4's groups of 32 need inputs of a multiple of 32)
QUANTIZED = {"qwen3-fp8": ("qwen3", "fp8", [8, 16], {}), "deepseek-v3-fp8": ("deepseek-v3", "fp8", [4, 8], {}),
             "gpt-oss-mxfp4": ("gpt-oss", "mxfp4", None, {"intermediate_size": 32})}
for _case, (_base, _, _, _changes) in QUANTIZED.items():
    CASES[_case] = (CASES[_base][0], dict(CASES[_base][1], **_changes))
# compressed-tensors checkpoints (llm-compressor's, which vLLM serves), written by
# compressed-tensors' own compressors in compress() below and read by transformers dequantized:
# (the case, the format, the weights' quantization, the inputs', the kv cache's). W4A16 with zero
# points (asymmetric groups of 16, packed into int32); W8A8 in int8 by rows on Phi-3's fused
# matrices (the activations' dynamic quantization, as transformers' dequantized model, not
# applied); fp8 by blocks of 8x16 with static input and kv-cache scales stored (not read); NVFP4
# (e2m1 codes by groups of 16, float8 scales, a global scale).
COMPRESSED = {
    "llama-w4a16-asymmetric": ("llama", "pack-quantized",
                               dict(num_bits=4, type="int", strategy="group", group_size=16, symmetric=False), None, None),
    "phi3-w8a8-int8": ("phi3", "int-quantized", dict(num_bits=8, type="int", strategy="channel", symmetric=True),
                       dict(num_bits=8, type="int", strategy="token", dynamic=True, symmetric=True), None),
    "qwen3-fp8-blocks-static": ("qwen3", "float-quantized", dict(num_bits=8, type="float", strategy="block", block_structure=[8, 16]),
                                dict(num_bits=8, type="float", strategy="tensor", dynamic=False),
                                dict(num_bits=8, type="float", strategy="tensor", dynamic=False)),
    "mistral-nvfp4": ("mistral", "nvfp4-pack-quantized",
                      dict(num_bits=4, type="float", strategy="tensor_group", group_size=16, scale_dtype="torch.float8_e4m3fn"),
                      dict(num_bits=4, type="float", strategy="tensor_group", group_size=16, dynamic="local"), None),
}
for _case, (_base, *_) in COMPRESSED.items():
    CASES[_case] = CASES[_base]
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def rope64(config, head_dim, seq_len, p=None):
    """transformers' inverse frequencies and attention factor (default, linear, llama3, yarn,
    longrope; partial rotary) of the rope parameters p (the config's), in float64."""
    p = p or config.rope_parameters
    dim = int(head_dim * p.get("partial_rotary_factor", 1.0))
    base = p["rope_theta"]
    if p.get("rope_type") == "dynamic" and p.get("alpha"):  # Hunyuan's NTK alpha: a larger base, fixed
        base = base * p["alpha"] ** (dim / (dim - 2))
    elif p.get("rope_type") == "dynamic" and seq_len > config.max_position_embeddings:  # the base grown for seq_len
        factor = p["factor"]
        base = base * ((factor * seq_len / config.max_position_embeddings) - (factor - 1)) ** (dim / (dim - 2))
    powers = base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float64) / dim)
    inv = 1.0 / powers
    kind = p.get("rope_type", "default")
    old = p.get("original_max_position_embeddings")
    if kind == "linear":
        return inv / p["factor"], 1.0
    if kind == "llama3":
        factor, low, high = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old / low, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old / high) * ~(wavelen > old / low)
        return torch.where(medium, smoothed, scaled), 1.0
    if kind == "yarn":
        factor = p["factor"]

        def mscale(m=1.0):
            return 0.1 * m * math.log(factor) + 1.0 if factor > 1 else 1.0

        both = p.get("mscale") and p.get("mscale_all_dim")
        attention = p.get("attention_factor") or (mscale(p["mscale"]) / mscale(p["mscale_all_dim"]) if both else mscale())

        def correction(rotations):
            return dim * math.log(old / (rotations * 2 * math.pi)) / (2 * math.log(base))

        lo, hi = correction(p.get("beta_fast") or 32), correction(p.get("beta_slow") or 1)
        if p.get("truncate", True):
            lo, hi = math.floor(lo), math.ceil(hi)
        lo, hi = max(lo, 0), min(hi, dim - 1)
        hi = hi + 0.001 if lo == hi else hi
        keep = 1 - torch.clamp((torch.arange(dim // 2, dtype=torch.float64) - lo) / (hi - lo), 0, 1)
        return (1.0 / (factor * powers)) * (1 - keep) + inv * keep, attention
    if kind == "longrope":
        factor = p.get("factor") or config.max_position_embeddings / old
        attention = p.get("attention_factor") or (math.sqrt(1 + math.log(factor) / math.log(old)) if factor > 1 else 1.0)
        ext = p["long_factor"] if seq_len > old else p["short_factor"]
        return 1.0 / (torch.tensor(ext, dtype=torch.float64) * powers), attention
    return inv, 1.0


PREFIX = {"llama": "Llama", "mistral": "Mistral", "ministral3": "Ministral3", "qwen2": "Qwen2", "qwen3": "Qwen3", "phi3": "Phi3", "olmo2": "Olmo2", "olmo3": "Olmo3",
          "gemma": "Gemma", "gemma2": "Gemma2", "gemma3": "Gemma3", "granite": "Granite", "granitemoe": "GraniteMoe", "granitemoeshared": "GraniteMoeShared", "smollm3": "SmolLM3", "mixtral": "Mixtral", "qwen2_moe": "Qwen2Moe", "qwen3_moe": "Qwen3Moe",
          "olmoe": "Olmoe", "deepseek_v2": "DeepseekV2", "deepseek_v3": "DeepseekV3", "glm4_moe": "Glm4Moe", "gpt_oss": "GptOss",
          "llama4": "Llama4Text", "glm4": "Glm4", "ernie4_5": "Ernie4_5", "exaone4": "Exaone4", "minimax_m2": "MiniMaxM2",
          "arcee": "Arcee", "apertus": "Apertus", "hunyuan_v1_dense": "HunYuanDenseV1", "qwen3_next": "Qwen3Next",
          "qwen3_5": "Qwen3_5", "qwen3_5_moe": "Qwen3_5Moe",
          "granitemoehybrid": "GraniteMoeHybrid", "nemotron_h": "NemotronH", "bamba": "Bamba", "cohere": "Cohere", "cohere2": "Cohere2", "starcoder2": "Starcoder2", "seed_oss": "SeedOss", "gpt_neox": "GPTNeoX", "phi": "Phi", "stablelm": "StableLm", "falcon": "Falcon", "gptj": "GPTJ", "olmo": "Olmo", "qwen3_vl": "Qwen3VLText", "qwen2_5_vl": "Qwen2_5_VL", "qwen3_vl_moe": "Qwen3VLMoeText"}


def best_groups(router, group_scores):
    """The DeepSeek routers' mask [tokens, experts] of each token's topk_group groups of highest
    score, in transformers' operations."""
    best = torch.topk(group_scores, k=router.topk_group, dim=-1, sorted=False)[1]
    mask = torch.zeros_like(group_scores).scatter_(1, best, 1)
    per = router.num_experts // router.num_group
    return mask.unsqueeze(-1).expand(-1, router.num_group, per).reshape(-1, router.num_experts).bool()


def family_of(config_class):
    """The transformers family (its models/ folder) a config class belongs to."""
    return config_class.__module__.split(".")[2]


def families_of(name):
    """The case's transformers families: its config's, and its language model's where text_config
    names another (Mistral 3's Mistral)."""
    fields = CASES[name][1]
    text_type = fields.get("text_config", {}).get("model_type")
    return {family_of(getattr(transformers, CASES[name][0]))} | ({text_type} if text_type else set())


def patch_float64(families=None):
    """Patches the named families (PREFIX's keys; all where None): importing every family's
    modeling file costs seconds that each case would pay."""
    for family, prefix in PREFIX.items():
        if families is not None and family not in families:
            continue
        module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
        # Cohere's LayerNorm; StarCoder2's torch's own (exact in float64 already)
        norm = getattr(module, f"{prefix}RMSNorm", None) or getattr(module, f"{prefix}LayerNorm", None)
        rotary = getattr(module, f"{prefix}RotaryEmbedding", None) or getattr(module, f"{prefix}TextRotaryEmbedding", None)
        gemma = family.startswith("gemma") or family.startswith("qwen3_5") or family == "qwen3_next"  # their norms' (1 + weight)

        def norm_forward(self, h, _orig=getattr(norm, "forward", None), _gemma=gemma, _center=family in ("cohere", "cohere2"),
                         _olmo=family == "olmo"):
            if h.dtype != torch.float64:
                return _orig(self, h)
            if _olmo:  # OLMo's LayerNorm without parameters (transformers: in float32)
                return torch.nn.functional.layer_norm(h, self.normalized_shape, None, None, eps=1e-5)
            eps = getattr(self, "variance_epsilon", getattr(self, "eps", None))
            h = h - h.mean(-1, keepdim=True) if _center else h
            normed = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
            return normed * (1.0 + self.weight) if _gemma else self.weight * normed

        def rotary_forward(self, x, position_ids, layer_type=None, _orig=getattr(rotary, "forward", None), _complex=family in ("deepseek_v2", "llama4"),
                           _half=family == "gpt_oss", _interleaved=family in ("cohere", "cohere2"), _gptj=family == "gptj"):
            if x.dtype != torch.float64:
                return _orig(self, x, position_ids, layer_type) if layer_type else _orig(self, x, position_ids)
            if _gptj:  # GPT-J's table: (sin, cos) of its rotary_dim / 2 angles, base 10000
                dim = self.pos_embd_dim
                inv = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float64) / dim))
                freqs = position_ids[..., None].to(torch.float64) * inv
                return freqs.sin(), freqs.cos()
            c = self.config
            if position_ids.dim() == 3:  # Qwen3.5's three grids' positions, equal for text
                position_ids = position_ids[0]
            dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
            params = c.rope_parameters[layer_type] if layer_type else None
            inv, attention = rope64(c, dim, int(position_ids.max()) + 1, params)
            freqs = position_ids[..., None].to(torch.float64) * inv
            if _complex:  # DeepSeek-V2's and Llama 4's, as complex numbers
                return torch.polar(torch.ones_like(freqs), freqs) * attention
            if _half:  # GPT-OSS's: one angle per pair
                return freqs.cos() * attention, freqs.sin() * attention
            emb = torch.repeat_interleave(freqs, 2, dim=-1) if _interleaved else torch.cat((freqs, freqs), dim=-1)
            return emb.cos() * attention, emb.sin() * attention

        if norm is not None:
            norm.forward = norm_forward
        if rotary is not None:  # Nemotron-H has none
            rotary.forward = rotary_forward
        # GPT-OSS's runs in its type; MiniMax-M2's sigmoid router is patched below
        router = getattr(module, f"{prefix}TopKRouter", None) if family not in ("gpt_oss", "minimax_m2") else None
        if router is not None:  # the routing probabilities in float64 (transformers: float32)

            def router_forward(self, h, _orig=router.forward, _chosen=family.startswith("granitemoe")):
                if h.dtype != torch.float64:
                    return _orig(self, h)
                logits = torch.nn.functional.linear(h.reshape(-1, self.weight.size(1)), self.weight)
                if _chosen:  # GraniteMoE's: the softmax over the chosen experts' scores alone
                    top, chosen = torch.topk(logits, self.top_k, dim=-1)
                    return logits, torch.softmax(top, dim=-1), chosen
                top, chosen = torch.topk(torch.softmax(logits, dim=-1), self.top_k, dim=-1)
                if getattr(self, "norm_topk_prob", True):
                    top = top / top.sum(dim=-1, keepdim=True)
                return logits, top, chosen

            router.forward = router_forward
        if family == "deepseek_v2":  # its rotation and routing in float64 (transformers: float32)
            complex_rotation64(module, 1)
            v2_router = module.DeepseekV2TopkRouter

            def v2_forward(self, h, _orig=v2_router.forward):
                if h.dtype != torch.float64:
                    return _orig(self, h)
                logits = torch.nn.functional.linear(h.reshape(-1, self.hidden_dim), self.weight)
                scores = logits.softmax(dim=-1)
                if self.topk_method == "group_limited_greedy":
                    groups = scores.view(-1, self.num_group, self.num_experts // self.num_group).max(dim=-1).values
                    scores = scores.masked_fill(~best_groups(self, groups), 0.0)
                top, chosen = torch.topk(scores, k=self.top_k, dim=-1, sorted=False)
                return logits, top * self.routed_scaling_factor, chosen

            v2_router.forward = v2_forward
        if family == "llama4":
            patch_llama4_float64(module)
        if family in ("qwen3_next", "qwen3_5", "qwen3_5_moe"):
            patch_deltanet_float64(module, prefix)
        if family in ("granitemoehybrid", "nemotron_h", "bamba"):
            patch_mamba_float64(module, prefix)
        if family == "nemotron_h":  # its logits cast to float32 (.float()): in float64 here
            causal = module.NemotronHForCausalLM

            @functools.wraps(causal.forward)  # its signature, which generate reads
            def causal_forward(self, input_ids=None, _orig=causal.forward, **kw):
                if self.lm_head.weight.dtype != torch.float64 or kw.get("use_cache", True) is not False:
                    return _orig(self, input_ids=input_ids, **kw)
                hidden = self.model(input_ids=input_ids, use_cache=False)[0]
                return transformers.modeling_outputs.MoeCausalLMOutputWithPast(logits=self.lm_head(hidden))

            causal.forward = causal_forward
        if family == "minimax_m2":  # its sigmoid routing in float64 (transformers: float32)
            minimax_router = module.MiniMaxM2TopKRouter

            def minimax_forward(self, h, bias, _orig=minimax_router.forward):
                if h.dtype != torch.float64:
                    return _orig(self, h, bias)
                logits = torch.nn.functional.linear(h.reshape(-1, self.hidden_dim), self.weight)
                scores = logits.sigmoid()
                chosen = torch.topk(scores + bias, self.top_k, dim=-1, sorted=False)[1]
                top = scores.gather(1, chosen)
                return logits, top / top.sum(dim=-1, keepdim=True), chosen

            minimax_router.forward = minimax_forward
        if family == "ernie4_5":  # its rotation in float32: in float64 here
            ernie_rotate = module.apply_rotary_pos_emb

            def ernie64(q, k, cos, sin, unsqueeze_dim=1, _orig=ernie_rotate, _turn=module.rotate_half):
                if q.dtype != torch.float64:
                    return _orig(q, k, cos, sin, unsqueeze_dim)
                cos = cos.unsqueeze(unsqueeze_dim)[..., : cos.shape[-1] // 2].repeat_interleave(2, dim=-1)
                sin = sin.unsqueeze(unsqueeze_dim)[..., : sin.shape[-1] // 2].repeat_interleave(2, dim=-1)
                return q * cos + _turn(q) * sin, k * cos + _turn(k) * sin

            module.apply_rotary_pos_emb = ernie64
        if family in ("cohere", "cohere2"):  # its rotation in float32 (q.float()): in float64 here
            cohere_rotate = module.apply_rotary_pos_emb

            def cohere64(q, k, cos, sin, unsqueeze_dim=1, _orig=cohere_rotate, _turn=module.rotate_half):
                if q.dtype != torch.float64:
                    return _orig(q, k, cos, sin, unsqueeze_dim)
                cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
                return q * cos + _turn(q) * sin, k * cos + _turn(k) * sin

            module.apply_rotary_pos_emb = cohere64
        sigmoid_router = getattr(module, f"{prefix}TopkRouter", None) if family != "deepseek_v2" else None
        if sigmoid_router is not None:  # DeepSeek-V3's routing in float64 (transformers: float32)

            def sigmoid_forward(self, h, _orig=sigmoid_router.forward):
                if h.dtype != torch.float64:
                    return _orig(self, h)
                logits = torch.nn.functional.linear(h.reshape(-1, self.hidden_dim), self.weight)
                scores = logits.sigmoid()
                choice = scores + self.e_score_correction_bias
                groups = choice.view(-1, self.num_group, self.num_experts // self.num_group).topk(2, dim=-1)[0].sum(dim=-1)
                chosen = torch.topk(choice.masked_fill(~best_groups(self, groups), float("-inf")), k=self.top_k, dim=-1, sorted=False)[1]
                top = scores.gather(1, chosen)
                if self.norm_topk_prob:
                    top = top / (top.sum(dim=-1, keepdim=True) + 1e-20)
                return logits, top * self.routed_scaling_factor, chosen

            sigmoid_router.forward = sigmoid_forward
        if family.startswith("gemma"):  # the embedding's scale a float32 value, as from_config makes its buffer
            embedding = getattr(module, f"{prefix}TextScaledWordEmbedding", None) or getattr(module, f"{prefix}ScaledWordEmbedding")

            def embed_forward(self, ids, _orig=embedding.forward):
                scale = torch.tensor(self.scalar_embed_scale, dtype=torch.float32).to(self.weight.dtype)
                return torch.nn.functional.embedding(ids, self.weight, self.padding_idx) * scale

            embedding.forward = embed_forward
        if family == "gemma2":  # its eager attention takes the softmax in float32
            eager = module.eager_attention_forward

            def eager64(m, query, key, value, mask, dropout=0.0, scaling=None, softcap=None, _orig=eager, _repeat=module.repeat_kv, **kw):
                if query.dtype != torch.float64:
                    return _orig(m, query, key, value, mask, dropout=dropout, scaling=scaling, softcap=softcap, **kw)
                k, v = _repeat(key, m.num_key_value_groups), _repeat(value, m.num_key_value_groups)
                w = torch.matmul(query, k.transpose(2, 3)) * scaling
                if softcap is not None:
                    w = torch.tanh(w / softcap) * softcap
                if mask is not None:
                    w = w + mask
                w = torch.softmax(w, dim=-1)
                return torch.matmul(w, v).transpose(1, 2).contiguous(), w

            module.eager_attention_forward = eager64


def complex_rotation64(module, heads_dim):
    """DeepSeek-V2's and Llama 4's rotation of interleaved pairs as complex numbers in float64
    (transformers: float32); the frequencies given a heads dimension at heads_dim (1: DeepSeek-V2's
    [B, H, T, D] heads, 2: Llama 4's [B, T, H, D])."""
    rotate = module.apply_rotary_emb

    def rotate64(xq, xk, freqs_cis, _orig=rotate):
        if xq.dtype != torch.float64:
            return _orig(xq, xk, freqs_cis)
        f = freqs_cis.unsqueeze(heads_dim)
        q = torch.view_as_complex(xq.reshape(*xq.shape[:-1], -1, 2).contiguous())
        k = torch.view_as_complex(xk.reshape(*xk.shape[:-1], -1, 2).contiguous())
        return torch.view_as_real(q * f).flatten(3), torch.view_as_real(k * f).flatten(3)

    module.apply_rotary_emb = rotate64


def patch_llama4_float64(module):
    """Llama 4's rotation, its q/k norms and its router's sigmoid in float64 (transformers: float32)."""
    complex_rotation64(module, 2)
    l2 = module.Llama4TextL2Norm

    def l2_forward(self, x, _orig=l2.forward):
        return _orig(self, x) if x.dtype != torch.float64 else x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    l2.forward = l2_forward
    router = module.Llama4Router

    def router_forward(self, h, _orig=router.forward):
        if h.dtype != torch.float64:
            return _orig(self, h)
        logits = torch.nn.functional.linear(h, self.weight)
        top, chosen = torch.topk(logits, self.top_k, dim=1)
        return torch.full_like(logits, float("-inf")).scatter_(1, chosen, top).sigmoid(), logits

    router.forward = router_forward


def delta_rule64(q, k, v, g, beta):
    """The gated delta rule token by token in float64 (transformers' chunked form runs in float32):
    q, k [B, T, Hk, Dk], v [B, T, Hv, Dv], g and beta [B, T, Hv]; queries and keys L2-normalized,
    queries scaled by Dk^-1/2; the state S [B, Hv, Dk, Dv] decays by exp(g), then takes
    beta (v - S^T k) k^T, and the output is S^T q."""
    r = v.size(2) // k.size(2)
    q, k = q.repeat_interleave(r, 2), k.repeat_interleave(r, 2)
    q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6) * q.size(-1) ** -0.5
    k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    state = torch.zeros(v.size(0), v.size(2), k.size(3), v.size(3), dtype=torch.float64)
    out = []
    for t in range(v.size(1)):
        state = state * g[:, t].exp()[..., None, None]
        read = (state * k[:, t, :, :, None]).sum(-2)
        state = state + k[:, t, :, :, None] * ((v[:, t] - read) * beta[:, t, :, None])[:, :, None, :]
        out.append((state * q[:, t, :, :, None]).sum(-2))
    return torch.stack(out, 1)


def patch_deltanet_float64(module, prefix):
    """Qwen3-Next's and Qwen3.5's gated DeltaNet and its gated norm in float64 (transformers: the
    delta rule, the decay and the norm in float32), the delta rule token by token (delta_rule64)."""
    gated = getattr(module, f"{prefix}RMSNormGated")

    def gated_forward(self, h, gate, _orig=gated.forward):
        if h.dtype != torch.float64:
            return _orig(self, h, gate)
        normed = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * normed * torch.nn.functional.silu(gate)

    gated.forward = gated_forward
    net = getattr(module, f"{prefix}GatedDeltaNet")

    def net_forward(self, hidden_states, cache=None, attention_mask=None, _orig=net.forward, **kw):  # without a cache (make's forwards)
        if hidden_states.dtype != torch.float64 or cache is not None:
            return _orig(self, hidden_states, cache=cache, attention_mask=attention_mask, **kw)
        B, T = hidden_states.shape[:2]
        if hasattr(self, "in_proj_qkvz"):  # Qwen3-Next's grouped projections
            q, k, v, z, b, a = self.fix_query_key_value_ordering(self.in_proj_qkvz(hidden_states), self.in_proj_ba(hidden_states))
            mixed = torch.cat([x.reshape(B, T, -1) for x in (q, k, v)], -1).transpose(1, 2)
        else:  # Qwen3.5's
            mixed = self.in_proj_qkv(hidden_states).transpose(1, 2)
            z = self.in_proj_z(hidden_states).reshape(B, T, -1, self.head_v_dim)
            b, a = self.in_proj_b(hidden_states), self.in_proj_a(hidden_states)
        mixed = torch.nn.functional.conv1d(mixed, self.conv1d.weight, padding=self.conv_kernel_size - 1, groups=mixed.size(1))
        mixed = torch.nn.functional.silu(mixed[..., :T]).transpose(1, 2)
        q, k, v = torch.split(mixed, [self.key_dim, self.key_dim, self.value_dim], -1)
        g = -self.A_log.exp() * torch.nn.functional.softplus(a + self.dt_bias)
        out = delta_rule64(q.reshape(B, T, -1, self.head_k_dim), k.reshape(B, T, -1, self.head_k_dim),
                           v.reshape(B, T, -1, self.head_v_dim), g, b.sigmoid())
        out = self.norm(out.reshape(-1, self.head_v_dim), z.reshape(-1, self.head_v_dim))
        return self.out_proj(out.reshape(B, T, -1))

    net.forward = net_forward


def mamba64(x, dt, A, B, C, D):
    """Mamba 2's scan position by position in float64 (transformers' chunked form runs in float32):
    x [b, T, H, P], dt [b, T, H], A [H], B and C [b, T, G, N] (each group's for H / G heads), D [H];
    each head's state S [b, H, P, N] takes S exp(dt A) + dt x B^T, and the output is S C + D x."""
    r = x.size(2) // B.size(2)
    B, C = B.repeat_interleave(r, 2), C.repeat_interleave(r, 2)
    state = torch.zeros(x.size(0), x.size(2), x.size(3), B.size(3), dtype=torch.float64)
    out = []
    for t in range(x.size(1)):
        state = state * (dt[:, t] * A).exp()[..., None, None] + dt[:, t, :, None, None] * x[:, t, :, :, None] * B[:, t, :, None, :]
        out.append((state * C[:, t, :, None, :]).sum(-1) + D[:, None] * x[:, t])
    return torch.stack(out, 1)


def patch_mamba_float64(module, prefix):
    """Granite 4.0-H's, Nemotron-H's and Bamba's Mamba 2 layers in float64 (transformers: the scan, the decays and the gated
    norm in float32), the scan position by position (mamba64)."""
    layer = getattr(module, f"{prefix}MambaLayer", None) or getattr(module, f"{prefix}Mamba2Mixer", None) or getattr(module, f"{prefix}Mixer")

    def mamba_forward(self, hidden_states, cache=None, attention_mask=None, _orig=layer.forward, **kw):  # without a cache (make's forwards)
        if hidden_states.dtype != torch.float64 or cache is not None:
            return _orig(self, hidden_states, cache=cache, attention_mask=attention_mask, **kw)
        b, T = hidden_states.shape[:2]
        H, P, G, N = self.num_heads, self.head_dim, self.n_groups, self.ssm_state_size
        gate, xbc, dt = self.in_proj(hidden_states).split([self.intermediate_size, self.conv_dim, H], -1)
        xbc = torch.nn.functional.conv1d(xbc.transpose(1, 2), self.conv1d.weight, self.conv1d.bias,
                                         padding=self.conv_kernel_size - 1, groups=self.conv_dim)
        xbc = torch.nn.functional.silu(xbc[..., :T]).transpose(1, 2)
        x, B, C = torch.split(xbc, [self.intermediate_size, G * N, G * N], -1)
        dt = torch.clamp(torch.nn.functional.softplus(dt + self.dt_bias), *self.time_step_limit)
        y = mamba64(x.reshape(b, T, H, P), dt, -self.A_log.exp(), B.reshape(b, T, G, N), C.reshape(b, T, G, N), self.D)
        y = (y.reshape(b, T, -1) * torch.nn.functional.silu(gate)).view(b, T, G, -1)
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.norm.variance_epsilon)
        return self.out_proj(self.norm.weight * y.view(b, T, -1))

    layer.forward = mamba_forward


def model_class(config):
    """The case's transformers class: the vision and language model where the config is one's,
    the causal language model otherwise."""
    beside = {transformers.Llama4Config: transformers.Llama4ForConditionalGeneration,
              transformers.Qwen3_5MoeConfig: transformers.Qwen3_5MoeForConditionalGeneration,
              transformers.Gemma3Config: transformers.Gemma3ForConditionalGeneration,
              transformers.Mistral3Config: transformers.Mistral3ForConditionalGeneration,
              transformers.Qwen3VLConfig: transformers.Qwen3VLForConditionalGeneration,
              transformers.Qwen2_5_VLConfig: transformers.Qwen2_5_VLForConditionalGeneration,
              transformers.Qwen3VLMoeConfig: transformers.Qwen3VLMoeForConditionalGeneration,
              transformers.LlavaConfig: transformers.LlavaForConditionalGeneration,
              transformers.InternVLConfig: transformers.InternVLForConditionalGeneration,
              transformers.AyaVisionConfig: transformers.AyaVisionForConditionalGeneration}
    return beside.get(type(config), AutoModelForCausalLM)


def language_model(model):
    """What computes the logits: Llama 4's language model within its vision and language model
    (whose own forward fails on text alone in transformers 5.24), the model itself otherwise."""
    return getattr(model, "language_model", None) or model


def experts_impl(config, case="", dtype_name=""):
    """A mixture of experts runs transformers' eager experts (its loop over the experts, the
    reference its grouped_mm kernels stand in for, and which takes float64); a "-grouped" case's
    its grouped_mm experts, but in float64, which torch's grouped GEMM does not take."""
    text = getattr(config, "text_config", None) or config
    moe = getattr(text, "num_local_experts", None) or getattr(text, "num_experts", None)
    grouped = case.endswith("-grouped") and dtype_name != "float64"
    return {"experts_implementation": "grouped_mm" if grouped else "eager"} if moe else {}


def quantize(model_dir, method, block):
    """model_dir's checkpoint rewritten as a quantized one. fp8: every projection's weight in
    float8_e4m3fn by blocks of block[0] rows and block[1] columns (the last block of each dimension
    may be short), each block scaled by its largest magnitude / 448, that scale beside it as
    <weight>_scale_inv (the factor that dequantizes); the embeddings, norms, routers and head as
    they were. mxfp4: the stacked experts' gate_up_proj and down_proj (GPT-OSS's, [experts, in,
    out]) as <name>_blocks (two FP4 (e2m1) codes a byte, the even element in the low half, by
    groups of 32 along the input) and <name>_scales (each group's power of two, biased by 127),
    the nearest code of each value. config.json gains the quantization_config that says so."""
    from safetensors.torch import load_file, save_file
    path = os.path.join(model_dir, "model.safetensors")
    saved, out = load_file(path), {}
    lut = torch.tensor(FP4_VALUES, dtype=torch.float64)
    for k, v in saved.items():
        if method == "fp8" and k.endswith("proj.weight") and v.dim() == 2:
            rows, cols = v.shape
            br, bc = block
            gr, gc = -(-rows // br), -(-cols // bc)
            padded = torch.zeros(gr * br, gc * bc, dtype=torch.float64)
            padded[:rows, :cols] = v.double()
            amax = padded.reshape(gr, br, gc, bc).abs().amax(dim=(1, 3)).clamp(min=1e-12)
            scale = (amax / 448.0).float()
            wide = scale.double().repeat_interleave(br, 0)[:rows].repeat_interleave(bc, 1)[:, :cols]
            out[k] = (v.double() / wide).to(torch.float8_e4m3fn)
            out[k + "_scale_inv"] = scale
        elif method == "mxfp4" and k.endswith(("experts.gate_up_proj", "experts.down_proj")):
            w = v.double().transpose(1, 2)  # [experts, out, in]: the groups run along the input
            groups = w.reshape(*w.shape[:2], -1, 32)
            e = torch.ceil(torch.log2(groups.abs().amax(-1).clamp(min=1e-30) / 6.0)).clamp(-127, 127)
            code = ((groups / torch.exp2(e)[..., None])[..., None] - lut).abs().argmin(-1)
            out[k + "_blocks"] = (code[..., 0::2] | (code[..., 1::2] << 4)).to(torch.uint8)
            out[k + "_scales"] = (e + 127).to(torch.uint8)
        else:
            out[k] = v
    save_file(out, path, metadata={"format": "pt"})
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"] = ({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                      "weight_block_size": block} if method == "fp8" else
                                     {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn",
                                      "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]})
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)


def compress(model_dir, fmt, weights, inputs, kv_cache):
    """model_dir's checkpoint rewritten by compressed-tensors' compressor for fmt: every
    projection's weight quantized as `weights` says (its scales and zero points from the weight's
    own range: compressed-tensors' calculate_qparams, NVFP4's global scale its generate_gparam),
    the embeddings, norms and head as they were; static input scales (and the kv cache's, on the
    attention) stored as ones. config.json gains the quantization_config that says so."""
    from safetensors.torch import load_file, save_file
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationConfig, QuantizationScheme
    from compressed_tensors.quantization.utils import calculate_qparams, generate_gparam
    path = os.path.join(model_dir, "model.safetensors")
    saved, out = load_file(path), {}
    wargs = QuantizationArgs(**weights)
    iargs = QuantizationArgs(**inputs) if inputs else None
    scheme = QuantizationScheme(targets=["Linear"], weights=wargs, input_activations=iargs, format=fmt)
    compressor = BaseCompressor.get_value_from_registry(fmt)
    for k, v in saved.items():
        if not (k.endswith("proj.weight") and v.dim() == 2):
            out[k] = v
            continue
        w = v.double() if v.dtype == torch.float64 else v.float()
        rows, cols = w.shape
        if wargs.strategy in ("group", "tensor_group"):
            g = w.reshape(rows, cols // wargs.group_size, wargs.group_size)
            lo, hi = g.amin(-1), g.amax(-1)
        elif wargs.strategy == "block":
            br, bc = wargs.block_structure
            g = w.reshape(rows // br, br, cols // bc, bc)
            lo, hi = g.amin(dim=(1, 3)), g.amax(dim=(1, 3))
        else:
            lo, hi = w.amin(1, keepdim=True), w.amax(1, keepdim=True)
        gs = generate_gparam(w.min(), w.max()).reshape(1) if wargs.strategy == "tensor_group" else None
        scale, zp = calculate_qparams(lo, hi, wargs, global_scale=gs)
        parts = {"weight": v, "weight_scale": scale if wargs.scale_dtype else scale.to(v.dtype), "weight_zero_point": zp}
        if gs is not None:
            parts["weight_global_scale"] = gs
        base = k[: -len("weight")]
        for n, t in compressor.compress(parts, scheme).items():
            out[base + n] = t
        if iargs is not None and fmt.startswith("nvfp4"):
            out[base + "input_global_scale"] = torch.ones(1)
        elif iargs is not None and not iargs.dynamic:
            out[base + "input_scale"] = torch.ones(1, dtype=v.dtype)
        if kv_cache and k.endswith("self_attn.k_proj.weight"):
            out[k.replace("k_proj.weight", "k_scale")] = torch.ones(1, dtype=v.dtype)
            out[k.replace("k_proj.weight", "v_scale")] = torch.ones(1, dtype=v.dtype)
    save_file(out, path, metadata={"format": "pt"})
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    q = QuantizationConfig(config_groups={"group_0": scheme}, format=fmt, quantization_status="compressed", ignore=["lm_head"],
                           kv_cache_scheme=QuantizationArgs(**kv_cache) if kv_cache else None)
    config["quantization_config"] = q.to_dict()
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)


def load_kwargs(config, case="", dtype_name=""):
    """from_pretrained's arguments for the case: its experts' implementation, and for MXFP4 the
    dequantization transformers would choose itself without a GPU."""
    kw = experts_impl(config, case, dtype_name)
    q = getattr(config, "quantization_config", None)
    if q is not None and (q.get("quant_method") if isinstance(q, dict) else getattr(q, "quant_method", None)) == "mxfp4":
        kw["quantization_config"] = transformers.Mxfp4Config(dequantize=True)
    if q is not None and (q.get("quant_method") if isinstance(q, dict) else getattr(q, "quant_method", None)) == "compressed-tensors":
        kw["quantization_config"] = transformers.CompressedTensorsConfig(dequantize=True)
    return kw


def random_model(name, dtype_name, root):
    """The case's random model in the dtype, saved in ROOT/<case>-<dtype>/model; its config and
    directory with it."""
    config_class, fields = CASES[name]
    out = os.path.join(root, f"{name}-{dtype_name}")
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(len(name))
    if "text_config" in fields:  # a vision and language model: the sizes are its language model's
        fields = dict(fields, text_config=dict(fields["text_config"], vocab_size=96, initializer_range=0.2))
        config = getattr(transformers, config_class)(**fields)
        model = model_class(config)._from_config(config, **experts_impl(config, name, dtype_name)).to(DTYPES[dtype_name])
    else:
        config = getattr(transformers, config_class)(vocab_size=96, initializer_range=0.2, **fields)
        model = AutoModelForCausalLM.from_config(config, **experts_impl(config, name, dtype_name)).to(DTYPES[dtype_name])
    with torch.no_grad():  # biases and norm scales away from their initial zeros and ones
        for pname, p in model.named_parameters():
            if p.dim() == 1 or pname.endswith(("_bias", "q_norm.weight", "k_norm.weight")):  # GPT-OSS's stacked experts' biases, Command R+'s per-head norms too
                p.add_(torch.randn_like(p) * 0.1)
        for pname, p in model.named_parameters():  # Qwen3-Next's decays as Mamba 2 draws them: A in [1, 16], dt in [0.001, 0.1]
            if pname.endswith(("linear_attn.A_log", "mamba.A_log", "mixer.A_log")):
                p.copy_(torch.empty_like(p).uniform_(1, 16).log())
            if pname.endswith(("linear_attn.dt_bias", "mamba.dt_bias", "mixer.dt_bias")):
                dt = torch.empty_like(p).uniform_(math.log(1e-3), math.log(0.1)).exp()
                p.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus's inverse
        for bname, b in model.named_buffers():  # DeepSeek-V3's router's correction bias, Apertus's xIELU's beta
            if bname.endswith(("e_score_correction_bias", "act_fn.beta")):
                b.add_(torch.randn_like(b) * 0.1)
    model.save_pretrained(os.path.join(out, "model"))
    if name in QUANTIZED or name in COMPRESSED:  # the model is now transformers' of the quantized checkpoint, dequantized
        if name in QUANTIZED:
            quantize(os.path.join(out, "model"), QUANTIZED[name][1], QUANTIZED[name][2])
        else:
            compress(os.path.join(out, "model"), *COMPRESSED[name][1:])
        config = transformers.AutoConfig.from_pretrained(os.path.join(out, "model"))
        model = AutoModelForCausalLM.from_pretrained(os.path.join(out, "model"), dtype=DTYPES[dtype_name],
                                                     **load_kwargs(config, name, dtype_name))
        if dtype_name == "float64":
            router_float64(model, os.path.join(out, "model"))
    return model, config, out


def models(root, only):
    """The named cases' models alone, in float32 and float64 (what generation needs)."""
    for name in only.split(","):
        for dtype_name in ("float32", "float64"):
            random_model(name, dtype_name, root)
    print("made the models with transformers", transformers.__version__)


def sgd_steps(logits_of, y, params, lr, steps):
    """`steps` steps of plain SGD of `params` on the cross-entropy of logits_of()'s logits against y;
    the losses."""
    opt = torch.optim.SGD(params, lr=lr)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        logits = logits_of()
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def make(root, only=None):
    patch_float64(None if not only else {family for n in only.split(",") for family in families_of(n)})
    for name in CASES:
        if only and name not in only.split(","):
            continue
        for dtype_name, dtype in DTYPES.items():
            model, config, out = random_model(name, dtype_name, root)
            text = getattr(config, "text_config", None) or config
            tokens = torch.randint(0, text.vocab_size, (BATCH, SEQ + 1))
            if getattr(text, "pad_token_id", None) is not None:
                tokens[:, ::3] = text.pad_token_id  # the padding row is read, and takes no gradient
            np.save(os.path.join(out, "tokens.npy"), tokens.numpy())
            x, y = tokens[:, :SEQ], tokens[:, 1:]
            model.eval()
            if dtype == torch.bfloat16:
                # The model as from_pretrained loads it: .to(bfloat16) above rounded the rotary
                # frequencies too.
                model = model_class(config).from_pretrained(os.path.join(out, "model"), dtype=dtype,
                                                             **load_kwargs(config, name, dtype_name))
                model.eval()
                with torch.no_grad():
                    np.save(os.path.join(out, "logits.npy"), language_model(model)(x, use_cache=False).logits.float().numpy())
            else:
                with torch.no_grad():
                    np.save(os.path.join(out, "logits.npy"), language_model(model)(x, use_cache=False).logits.numpy())
            model.train()
            losses = sgd_steps(lambda: language_model(model)(x, use_cache=False).logits, y, model.parameters(), LR, STEPS)
            np.save(os.path.join(out, "losses.npy"), np.array(losses, dtype=np.float64))
            model.save_pretrained(os.path.join(out, "trained"))
    print("made the cases with transformers", transformers.__version__)


def router_float64(model, model_dir):
    """The DeepSeeks' and GLM-4.5's routers hold their weight (and bias) in float32 whatever the
    model's dtype, so from_pretrained rounds a float64 checkpoint's: here they are the
    checkpoint's, in float64."""
    from safetensors.torch import load_file
    saved = load_file(os.path.join(model_dir, "model.safetensors"))
    for k in list(saved):  # Nemotron-H's checkpoint names under backbone., its model's under model.
        if k.startswith("backbone."):
            saved["model." + k[len("backbone."):]] = saved[k]
    tensors = list(model.named_parameters()) + list(model.named_buffers())
    wanted = [n for n, t in tensors if n in saved and t.is_floating_point() and t.dtype != torch.float64]
    if not wanted:
        return
    model.to(torch.float64)
    with torch.no_grad():
        for n in wanted:
            module_name, leaf = n.rsplit(".", 1)
            getattr(model.get_submodule(module_name), leaf).copy_(saved[n])


def generate(ids, new_tokens, *model_dirs):
    patch_float64({family_of(type(transformers.AutoConfig.from_pretrained(d))) for d in model_dirs})
    result = {}
    for model_dir in model_dirs:
        with open(os.path.join(model_dir, "config.json")) as f:
            dtype = DTYPES.get(json.load(f).get("dtype"), torch.float32)
        config = transformers.AutoConfig.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, **experts_impl(config)).eval()
        if dtype == torch.float64:
            router_float64(model, model_dir)
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
        config = transformers.AutoConfig.from_pretrained(exported)
        eager, cls = experts_impl(config), model_class(config)
        a = cls.from_pretrained(exported, dtype=dtype, **eager).state_dict()
        b = cls.from_pretrained(os.path.join(root, case, "trained"), dtype=dtype, **eager).state_dict()
        if sorted(a) != sorted(b):
            result[case] = "names differ: " + str(sorted(set(a) ^ set(b)))
            continue
        result[case] = max(float((a[k].double() - b[k].double()).abs().max()) for k in a)
    print(json.dumps(result))


def run(argv):
    {"make": make, "models": models, "generate": generate, "compare": compare}[argv[0]](*argv[1:])


def warm():
    """The server's imports beyond this file's: every case's modeling module, and what reads
    quantized checkpoints."""
    for config_class, _ in CASES.values():
        importlib.import_module(getattr(transformers, config_class).__module__.replace(".configuration_", ".modeling_"))
    importlib.import_module("safetensors.torch")
    if importlib.util.find_spec("compressed_tensors"):
        importlib.import_module("compressed_tensors")


if __name__ == "__main__":
    if sys.argv[1] == "start":
        hf_oracle_server.start(run, sys.argv[2], warm)
    elif sys.argv[1] == "stop":
        hf_oracle_server.stop(sys.argv[2])
    else:
        run(sys.argv[1:])
