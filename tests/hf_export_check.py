#!/usr/bin/env python3
"""Checks `cqk export` folders against cqk itself (driven by tests/hf_export_test.cpp).

  hf_export_check.py CASES.json
  hf_export_check.py --choice-accuracy DIR DOCS.jsonl
CASES.json is a list of {"dir": export folder, "logits": the safetensors of
`cqk generate --logits-out` (input_ids [T], logits [T, vocab]), "greedy": the
ids `cqk generate --temperature 0` continued the same ids with} and, for the
text run, "text": {"prompt", "continuation"}: cqk's prompt and its printed
continuation. Prints one JSON line per case; the C++ test judges them.
--choice-accuracy prints the accuracy of the folder's model on multiple-choice
docs {context, choices, answer}, scoring each choice by its log-likelihood after
the context: the number lm-eval's task on the same docs must report.
"""
import json
import sys

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer


def check(case):
    model = AutoModelForCausalLM.from_pretrained(case["dir"], trust_remote_code=True, dtype=torch.float32)
    model.eval()
    cqk = load_file(case["logits"])
    ids = cqk["input_ids"].unsqueeze(0)
    with torch.no_grad():
        logits = model(ids).logits[0]
    reference = cqk["logits"]
    out = {"dir": case["dir"], "max_abs": (logits - reference).abs().max().item(),
           "scale": reference.abs().max().item()}
    out["max_rel"] = out["max_abs"] / out["scale"]
    # The loss with labels (one target ignored, -100), against the mean negative
    # log-likelihood of cqk's own logits in float64, summed term by term.
    labels = ids.clone()
    labels[0, 1] = -100
    with torch.no_grad():
        loss = model(ids, labels=labels).loss.item()
    log_probs = torch.log_softmax(reference.double(), -1)
    terms = [-log_probs[t, ids[0, t + 1]].item() for t in range(ids.size(1) - 1) if labels[0, t + 1] != -100]
    expected = sum(terms) / len(terms)
    out["loss"], out["loss_expected"] = loss, expected
    out["loss_rel"] = abs(loss - expected) / expected
    if case["greedy"]:
        greedy = model.generate(ids, max_new_tokens=len(case["greedy"]), do_sample=False)
        out["greedy"] = greedy[0, ids.size(1):].tolist()
        out["greedy_cqk"] = case["greedy"]
    if "text" in case:
        tokenizer = AutoTokenizer.from_pretrained(case["dir"], trust_remote_code=True)
        prompt = case["text"]["prompt"]
        encoded = tokenizer(prompt)["input_ids"]
        out["encoded_same"] = encoded == cqk["input_ids"].tolist()
        out["round_trip_same"] = tokenizer.decode(encoded) == prompt
        generated = model.generate(torch.tensor([encoded]), max_new_tokens=case["text"]["tokens"], do_sample=False)
        text = tokenizer.decode(generated[0, len(encoded):].tolist())
        out["continuation_same"] = text == case["text"]["continuation"]
        out["continuation"] = text
    return out


def choice_accuracy(folder, docs_path):
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    with open(docs_path) as f:
        docs = [json.loads(line) for line in f]
    correct = 0
    for doc in docs:
        context = tokenizer(doc["context"])["input_ids"]
        scores = []
        for choice in doc["choices"]:
            whole = tokenizer(doc["context"] + choice)["input_ids"]
            with torch.no_grad():
                logprobs = torch.log_softmax(model(torch.tensor([whole])).logits[0].double(), -1)
            scores.append(sum(logprobs[i - 1, whole[i]].item() for i in range(len(context), len(whole))))
        correct += int(max(range(len(scores)), key=scores.__getitem__) == doc["answer"])
    print(json.dumps({"acc": correct / len(docs), "docs": len(docs)}))


def main():
    if sys.argv[1] == "--choice-accuracy":
        return choice_accuracy(sys.argv[2], sys.argv[3])
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    torch.set_num_threads(1)
    for case in cases:
        print(json.dumps(check(case)), flush=True)


if __name__ == "__main__":
    main()
