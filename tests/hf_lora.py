"""The oracle of the hf family's LoRA adapters (tests/lora_test.cpp): PEFT itself.

make ROOT: for float64 (transformers' Llama patched to compute in float64 throughout, as
tests/hf_models.py patches it) and float32, a tiny Llama written by save_pretrained (ROOT/<dtype>/model),
a LoRA adapter of every projection with random A and B (init_lora_weights False) written by PEFT
(ROOT/<dtype>/adapter), the tokens, PEFT's logits of the model with it, its losses over 5 SGD steps
of the adapters alone, the trained adapter (ROOT/<dtype>/trained) and the trained model merged
(merge_and_unload, ROOT/<dtype>/merged); and a tied Llama in float64 with an adapter of three
projections (ROOT/tied).
check DIR ADAPTER: loads the model of DIR with the adapter ADAPTER (written by pipetrain's export
--format peft) as PEFT loads it and prints, as JSON, the largest difference of its adapters from
the trained ones' and of its logits from the trained model's.
"""
import json
import os
import sys

import hf_models  # beside this file: transformers' float64 patches (and OpenMP's passive waits)
import numpy as np
import torch
import transformers
import peft

DTYPES = {"float64": torch.float64, "float32": torch.float32}
SEQ, BATCH, STEPS, LR = 8, 4, 5, 0.5
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make(root):
    hf_models.patch_float64({"llama"})  # transformers' Llama computed in float64 throughout
    for name, dtype in DTYPES.items():
        torch.manual_seed(7)
        out = os.path.join(root, name)
        os.makedirs(out, exist_ok=True)
        config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                          tie_word_embeddings=False, dtype=name)
        model = transformers.LlamaForCausalLM(config).to(dtype)
        model.save_pretrained(os.path.join(out, "model"))
        lora = peft.LoraConfig(r=4, lora_alpha=6, lora_dropout=0.0, target_modules=TARGETS, init_lora_weights=False,
                               task_type="CAUSAL_LM")
        model = peft.get_peft_model(model, lora, autocast_adapter_dtype=False)
        model.save_pretrained(os.path.join(out, "adapter"))
        tokens = torch.randint(0, config.vocab_size, (BATCH, SEQ + 1))
        np.save(os.path.join(out, "tokens.npy"), tokens.numpy())
        x, y = tokens[:, :SEQ], tokens[:, 1:]
        model.eval()
        with torch.no_grad():
            np.save(os.path.join(out, "logits.npy"), model(input_ids=x, use_cache=False).logits.numpy())
        model.train()
        trained = [p for p in model.parameters() if p.requires_grad]
        losses = hf_models.sgd_steps(lambda: model(input_ids=x, use_cache=False).logits, y, trained, LR, STEPS)
        np.save(os.path.join(out, "losses.npy"), np.array(losses, dtype=np.float64))
        model.save_pretrained(os.path.join(out, "trained"))
        model.eval()
        with torch.no_grad():
            np.save(os.path.join(out, "trained_logits.npy"), model(input_ids=x, use_cache=False).logits.numpy())
        model.merge_and_unload().save_pretrained(os.path.join(out, "merged"))
    # A tied Llama (the head is the embedding) and its adapter, float64: the pipeline's ties frozen.
    torch.manual_seed(8)
    out = os.path.join(root, "tied")
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      tie_word_embeddings=True, dtype="float64")
    model = transformers.LlamaForCausalLM(config).to(torch.float64)
    model.save_pretrained(os.path.join(out, "model"))
    lora = peft.LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "o_proj", "up_proj"], init_lora_weights=False,
                           task_type="CAUSAL_LM")
    peft.get_peft_model(model, lora, autocast_adapter_dtype=False).save_pretrained(os.path.join(out, "adapter"))
    np.save(os.path.join(out, "tokens.npy"), torch.randint(0, config.vocab_size, (BATCH, SEQ + 1)).numpy())
    print("made the LoRA cases with peft", peft.__version__, "and transformers", transformers.__version__)


def check(case, adapter):
    hf_models.patch_float64({"llama"})
    dtype = DTYPES[os.path.basename(case.rstrip("/"))]
    base = transformers.AutoModelForCausalLM.from_pretrained(os.path.join(case, "model"), dtype=dtype)
    model = peft.PeftModel.from_pretrained(base, adapter, autocast_adapter_dtype=False).eval()
    from safetensors.torch import load_file
    ours = load_file(os.path.join(adapter, "adapter_model.safetensors"))
    theirs = load_file(os.path.join(case, "trained", "adapter_model.safetensors"))
    result = {"names": sorted(ours) == sorted(theirs)}
    result["adapters"] = max(float((ours[k].double() - theirs[k].double()).abs().max()) for k in theirs if k in ours)
    x = torch.from_numpy(np.load(os.path.join(case, "tokens.npy")))[:, :SEQ]
    with torch.no_grad():
        logits = model(input_ids=x, use_cache=False).logits
    expected = torch.from_numpy(np.load(os.path.join(case, "trained_logits.npy")))
    result["logits"] = float((logits.double() - expected.double()).abs().max())
    print(json.dumps(result))


if __name__ == "__main__":
    {"make": make, "check": check}[sys.argv[1]](*sys.argv[2:])
