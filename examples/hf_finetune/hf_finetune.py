"""The Python half of the fine-tuning example (run.sh runs it; see docs/models.md).

    python hf_finetune.py prepare WORK [--vocab N] [--hidden H] [--layers L]
    python hf_finetune.py check WORK [--samples N] [--new-tokens N] [--results DIR --cpu MODEL] [--peft ADAPTER]

prepare: trains a byte-level BPE tokenizer on the licence texts Debian installs on every machine
(/usr/share/common-licenses, from base-files), every tenth paragraph held out; writes a
small Llama model with random weights beside the tokenizer (WORK/model, as save_pretrained does)
and the two splits as uint16 token files (WORK/train.bin, WORK/test.bin).

check: loads what `pipetrain export --format hf` wrote (WORK/exported) with from_pretrained,
computes the test loss on the windows pipetrain evaluates (each test id after a window's first
predicted once), compares it with the test loss of WORK/metrics.jsonl, and samples a few lines.
With --peft (run.sh --lora), PEFT's model of WORK/model with the adapter pipetrain exported must
give the same test loss too. Prints one JSON line of results last; exits non-zero when the losses
disagree.
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import torch

LICENSES = "/usr/share/common-licenses"
HELD_OUT = 10  # every tenth paragraph of each licence is the test text
TOLERANCE = 1e-4  # |transformers' test loss - pipetrain's|, nats per token, float32
PROMPTS = ["This License", "You may", "THE SOFTWARE IS PROVIDED"]


def licence_texts():
    """(train, test) text per licence file (not the links to them): every tenth paragraph held out."""
    train, test = [], []
    for name in sorted(os.listdir(LICENSES)):
        path = os.path.join(LICENSES, name)
        if os.path.islink(path) or not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            paragraphs = f.read().split("\n\n")
        train.append("\n\n".join(p for i, p in enumerate(paragraphs) if i % HELD_OUT != HELD_OUT - 1))
        test.append("\n\n".join(p for i, p in enumerate(paragraphs) if i % HELD_OUT == HELD_OUT - 1))
    if not train:
        sys.exit(f"no licence texts in {LICENSES} (Debian's base-files installs them)")
    return train, test


def prepare(args):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    work = args.work
    os.makedirs(work, exist_ok=True)
    train_docs, test_docs = licence_texts()

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(train_docs, trainers.BpeTrainer(
        vocab_size=args.vocab, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    eot = tokenizer.convert_tokens_to_ids("<|endoftext|>")

    def ids(docs):  # each licence ends with the end-of-text token, as GPT-2's data does
        out = []
        for doc in docs:
            out += tokenizer(doc)["input_ids"] + [eot]
        return np.array(out, dtype=np.uint16)

    train, test = ids(train_docs), ids(test_docs)
    train.tofile(os.path.join(work, "train.bin"))
    test.tofile(os.path.join(work, "test.bin"))

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=args.hidden, intermediate_size=args.hidden * 11 // 4,
                         num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, bos_token_id=eot, eos_token_id=eot)
    model = LlamaForCausalLM(config)
    model.save_pretrained(os.path.join(work, "model"))
    tokenizer.save_pretrained(os.path.join(work, "model"))
    params = sum(p.numel() for p in model.parameters())
    print(f"prepare: {len(train_docs)} licences, {sum(map(len, train_docs))} + {sum(map(len, test_docs))} "
          f"characters; BPE vocabulary {len(tokenizer)}; {len(train)} training and {len(test)} test tokens; "
          f"Llama model of {params} parameters ({args.layers} layers, hidden {args.hidden})")


def metrics(path):
    steps, test = [], None
    with open(path) as f:
        for line in f:
            j = json.loads(line)
            if "event" not in j:
                steps.append(j)
            elif j["event"] == "test":
                test = j
    if test is None:
        sys.exit(f"{path}: no test line (did the run finish?)")
    return steps, test


def test_loss(model, windows):
    """The summed cross-entropy of every window's next ids."""
    total = 0.0
    with torch.no_grad():
        for batch in windows.split(16):
            logits = model(input_ids=batch[:, :-1]).logits
            total += torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.size(-1)).double(), batch[:, 1:].reshape(-1), reduction="sum").item()
    return total


def check(args):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    work = args.work
    steps, test = metrics(os.path.join(work, "metrics.jsonl"))
    exported = os.path.join(work, "exported")
    model = AutoModelForCausalLM.from_pretrained(exported).eval()
    tokenizer = AutoTokenizer.from_pretrained(exported)
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "finetune.json")) as f:
        seq_len = json.load(f)["model"]["seq_len"]

    # pipetrain's test windows: one every seq_len ids, seq_len + 1 ids each, the tail that fills
    # no window left out (job/tokens_data.cpp).
    ids = torch.from_numpy(np.fromfile(os.path.join(work, "test.bin"), dtype=np.uint16).astype(np.int64))
    rows = (len(ids) - 1) // seq_len
    windows = torch.stack([ids[r * seq_len:r * seq_len + seq_len + 1] for r in range(rows)])
    loss = test_loss(model, windows) / (rows * seq_len)
    diff = abs(loss - test["test_loss"])
    print(f"check: transformers' test loss {loss:.5f} on {rows} windows of {seq_len} tokens; pipetrain's "
          f"{test['test_loss']:.5f} (difference {diff:.2g}); unigram baseline {test['baseline_loss']:.4f}")
    peft_loss = None
    if args.peft:  # the source model with pipetrain's adapter, as PEFT loads it
        import peft
        base = AutoModelForCausalLM.from_pretrained(os.path.join(work, "model"))
        adapted = peft.PeftModel.from_pretrained(base, args.peft).eval()
        peft_loss = test_loss(adapted, windows) / (rows * seq_len)
        trainable = sum(p.numel() for n, p in adapted.named_parameters() if "lora_" in n)
        print(f"check: PEFT's test loss with the adapter {peft_loss:.5f} (difference {abs(peft_loss - test['test_loss']):.2g}); "
              f"{trainable} adapter parameters beside {sum(p.numel() for n, p in adapted.named_parameters() if 'lora_' not in n)} frozen")
        diff = max(diff, abs(peft_loss - test["test_loss"]))

    samples = []
    torch.manual_seed(args.seed)
    for prompt in PROMPTS[:args.samples]:
        x = tokenizer(prompt, return_tensors="pt")
        with torch.no_grad():
            out = model.generate(**x, max_new_tokens=args.new_tokens, do_sample=True, top_k=40, temperature=0.8,
                                 pad_token_id=tokenizer.eos_token_id)
        text = tokenizer.decode(out[0], skip_special_tokens=True)
        samples.append(text)
        print(f"sample: {text!r}")

    result = {"transformers_test_loss": loss, "pipetrain_test_loss": test["test_loss"], "difference": diff,
              "baseline_loss": test["baseline_loss"], "perplexity": math.exp(loss),
              "pipetrain_test_accuracy": test["test_accuracy"], "steps": len(steps),
              "first_loss": steps[0]["loss"] if steps else None, "last_loss": steps[-1]["loss"] if steps else None,
              "train_time_s": steps[-1]["time_s"] if steps else None, "samples": samples}
    if peft_loss is not None:
        result["peft_test_loss"] = peft_loss
    print(json.dumps(result))
    if args.results:
        write_results(args.results, steps, work, result, args.cpu)
    if not diff <= TOLERANCE:
        sys.exit(f"check: the exported model's test loss differs from pipetrain's by {diff:.3g} (> {TOLERANCE})")


def write_results(folder, steps, work, result, cpu):
    """The loss curve (every evaluation), the test loss beside the baseline, the samples."""
    os.makedirs(folder, exist_ok=True)
    evals = {}
    with open(os.path.join(work, "metrics.jsonl")) as f:
        for line in f:
            j = json.loads(line)
            if j.get("event") in ("eval", "test"):
                evals[j["step"]] = j["test_loss"]
    rows = ["| step | train loss | test loss | elapsed |", "|---|---|---|---|"]
    for s in steps:
        if s["step"] == 1 or s["step"] in evals:
            test = f"{evals[s['step']]:.4f}" if s["step"] in evals else ""
            rows.append(f"| {s['step']} | {s['loss']:.4f} | {test} | {s['time_s']:.0f} s |")
    r = result
    text = [
        "# The fine-tuning example's figures",
        "",
        f"`bash examples/hf_finetune/run.sh` on {os.cpu_count()} cores ({cpu}): {r['steps']} steps "
        f"in {r['train_time_s']:.0f} s (load average {os.getloadavg()[0]:.1f} when it ended: the machine ran other "
        f"jobs too).",
        "",
        *rows,
        "",
        f"Test loss {r['pipetrain_test_loss']:.4f} nats per token (perplexity {r['perplexity']:.1f}, next-token "
        f"accuracy {r['pipetrain_test_accuracy']:.3f}); "
        f"unigram baseline {r['baseline_loss']:.4f}. transformers on the exported model: "
        f"{r['transformers_test_loss']:.5f}"
        + (f"; PEFT on the source model with the exported adapter: {r['peft_test_loss']:.5f}" if "peft_test_loss" in r else "")
        + f" (largest difference {r['difference']:.2g}).",
        "",
        "Samples (`model.generate`, top-k 40, temperature 0.8):",
        "",
        *[line for s in r["samples"] for line in ("```", s.rstrip(), "```", "")],
    ]
    with open(os.path.join(folder, "results.md"), "w") as f:
        f.write("\n".join(text))
    with open(os.path.join(folder, "summary.json"), "w") as f:
        json.dump({**r, "cpu": cpu, "cores": os.cpu_count()}, f, indent=1)
        f.write("\n")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    a = sub.add_parser("prepare")
    a.add_argument("work")
    a.add_argument("--vocab", type=int, default=2048)
    a.add_argument("--hidden", type=int, default=128)
    a.add_argument("--layers", type=int, default=4)
    a = sub.add_parser("check")
    a.add_argument("work")
    a.add_argument("--results", help="write results.md and summary.json here")
    a.add_argument("--cpu", default="", help="the CPU model, for the results")
    a.add_argument("--samples", type=int, default=3)
    a.add_argument("--new-tokens", type=int, default=40)
    a.add_argument("--seed", type=int, default=1)
    a.add_argument("--peft", help="a PEFT adapter pipetrain exported: PEFT's test loss with it must equal pipetrain's too")
    args = p.parse_args()
    prepare(args) if args.command == "prepare" else check(args)


if __name__ == "__main__":
    main()
