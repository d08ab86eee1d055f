"""tessel <-> transformers: logits of exported GPTs, greedy tokens of an imported one (run.sh).

    python hf_roundtrip.py TESSEL WORK_DIR
"""
import json
import os
import subprocess
import sys

import numpy as np
import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel, GPT2Tokenizer

CORPUS = "/usr/share/games/fortunes/songs-poems"
CONTEXT, WINDOWS, NEW_TOKENS = 64, 8, 40
tessel, work = sys.argv[1], sys.argv[2]


def run(*args):
    r = subprocess.run([tessel, *args], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"hf_roundtrip: tessel {' '.join(args)} failed:\n{r.stdout}{r.stderr}")
    return r.stdout


def path(name):
    return os.path.join(work, name)


def exported_logits(kind):
    """(a): tessel's eval logits against transformers' on the same test windows."""
    with open(CORPUS, encoding="utf-8") as f:
        test_text = f.read()[:20000]
    with open(path("test.txt"), "w", encoding="utf-8") as f:
        f.write(test_text)
    tokenizer_line = ""
    if kind == "bpe":
        run("tokenizer", "train", "--vocab", "512", "--out", path("songs.tiktoken"), CORPUS)
        tokenizer_line = f'tokenizer = "{path("songs.tiktoken")}"\n'
    config = path(f"{kind}.toml")
    with open(config, "w") as f:
        f.write(f'seed = 1\n[model]\nkind = "gpt"\nlayers = 2\nheads = 4\nembed = 64\n'
                f'[data]\nkind = "text"\npath = "{CORPUS}"\ntest_path = "{path("test.txt")}"\n'
                f'{tokenizer_line}context = {CONTEXT}\n[optim]\nkind = "adamw"\nlr = 0.003\n'
                f'[train]\nbatch = 32\nmax_steps = 150\nclip_norm = 1.0\n')
    run_dir, hf_dir = path(f"{kind}_run"), path(f"{kind}_hf")
    run("train", config, "--quiet", "--run-dir", run_dir)
    run("ckpt", "export", "--format", "hf", run_dir, hf_dir)
    run("eval", config, "--checkpoint", run_dir, "--logits", path(f"{kind}.npy"),
        "--limit", str(WINDOWS))
    ours = np.load(path(f"{kind}.npy"))
    tokenizer = GPT2Tokenizer.from_pretrained(hf_dir)
    ids = tokenizer(test_text)["input_ids"]
    windows = torch.tensor([ids[i * CONTEXT:(i + 1) * CONTEXT] for i in range(WINDOWS)])
    model = GPT2LMHeadModel.from_pretrained(hf_dir, attn_implementation="eager").eval()
    with torch.no_grad():
        theirs = model(windows).logits.float().numpy()
    diff = float(np.abs(theirs - ours).max())
    scale = float(np.abs(theirs).max())
    print(f"(a) {kind:4s} GPT, vocabulary {model.config.vocab_size}: logits of {WINDOWS} test "
          f"windows x {CONTEXT} positions, max |tessel - transformers| = {diff:.2e} "
          f"(largest |logit| {scale:.2f}) -> {'PASS' if diff <= 1e-5 else 'FAIL'} (<= 1e-5)")
    return diff <= 1e-5


def imported_generation():
    """(b): a transformers-initialised GPT-2 imported; greedy tokens both ways."""
    chars = bytes(range(32, 127))  # printable ASCII: one token each, ids in this order
    config = GPT2Config(vocab_size=len(chars), n_positions=CONTEXT, n_embd=64, n_layer=2,
                        n_head=4, initializer_range=0.3, bos_token_id=None, eos_token_id=None)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config).eval()
    hf_dir, run_dir = path("random_hf"), path("random_run")
    model.save_pretrained(hf_dir)
    # GPT-2's byte-to-character table keeps '!'..'~' and spells ' ' as U+0120 ("Ġ").
    with open(os.path.join(hf_dir, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump({("\u0120" if b == 32 else chr(b)): i for i, b in enumerate(chars)}, f,
                  ensure_ascii=False)
    with open(os.path.join(hf_dir, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
    run("ckpt", "import", hf_dir, run_dir)
    prompts = ["The quick brown fox", "Hello, world", "a", "tessel, transformers: ",
               "0123456789", "~~~"]
    with open(path("prompts.txt"), "w") as f:
        f.write("\n".join(prompts) + "\n")
    run("predict", os.path.join(run_dir, "config.toml"), "--checkpoint", run_dir, "--input",
        path("prompts.txt"), "--output", path("generated.jsonl"), "--set",
        f"infer.max_new_tokens={NEW_TOKENS}")
    with open(path("generated.jsonl")) as f:
        ours = [json.loads(line)["text"] for line in f]
    equal = 0
    for prompt, text in zip(prompts, ours):
        ids = torch.tensor([[chars.index(c) for c in prompt.encode()]])
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=NEW_TOKENS, pad_token_id=0)
        theirs = bytes(chars[i] for i in out[0, ids.shape[1]:].tolist()).decode()
        equal += theirs == text
        if theirs != text:
            print(f"    differ for {prompt!r}: tessel {text!r}, transformers {theirs!r}")
    print(f"(b) random GPT-2 (vocabulary {len(chars)}, 2 blocks, width 64) imported: "
          f"{equal}/{len(prompts)} prompts with the same {NEW_TOKENS} greedy tokens -> "
          f"{'PASS' if equal == len(prompts) else 'FAIL'}")
    return equal == len(prompts)


print(f"torch {torch.__version__}, transformers {transformers.__version__}")
ok = [exported_logits("char"), exported_logits("bpe"), imported_generation()]
sys.exit(0 if all(ok) else 1)
