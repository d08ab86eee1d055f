"""tessel's BPE against tiktoken, token for token.

Makes a mixed text (English-like words, contractions, numbers, code, punctuation, runs of spaces,
tabs and newlines, Unicode letters of several scripts, emoji, Unicode spaces), trains a
vocabulary with `tessel tokenizer train`, encodes the text with `tessel tokenize`, and encodes it
again with tiktoken.Encoding built from the tokenizer file (tiktoken.load.load_tiktoken_bpe) and
GPT-2's pre-tokenisation pattern: every token must agree. Then the same vocabulary written as
GPT-2's encoder.json + vocab.bpe (ids in GPT-2's byte order) is read by tessel and by tiktoken
(tiktoken.load.data_gym_to_mergeable_bpe_ranks) and must again agree token for token.
Usage: tiktoken_check.py TESSEL WORKDIR [--mb MB] [--vocab N] [--bench] [--corpus TEXT]
"""
import argparse
import json
import os
import random
import struct
import subprocess
import sys
import time

import tiktoken
import tiktoken.load

GPT2_PATTERN = (r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")


def mixed_text(n_bytes, seed=29):
    rng = random.Random(seed)
    syllables = ["th", "e", "an", "re", "in", "on", "at", "er", "st", "ou", "qu", "ing", "tion",
                 "ed", "al", "ch", "sh", "o", "a", "i", "u", "y", "ll", "ss"]
    words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(3000)]
    foreign = ["déjà", "über", "naïve", "Ærø", "façade", "北京", "東京都", "日本語の文章", "Москва",
               "привет", "Ελλάδα", "λόγος", "مرحبا", "שלום", "हिन्दी", "한국어", "ภาษาไทย",
               "e\u0301", "Ǆemal", "ℕ", "Ⅻ", "١٢٣", "²³", "½"]
    symbols = ["😀", "🚀🚀", "👍🏽", "—", "…", "«", "»", "“", "”", "€", "©", "→", "∑", "\u200b"]
    spaces = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n", "\u00a0", "\u2003", "\u3000",
              "\u2028", "\u0085", "\x0b", "\x0c"]
    code = ["x = f(a, b) + 42;", "if (n >= 10) { return -1; }", "a[i] += b[j] * 3.14159",
            "print('hello, world!')", "#include <vector>", "0x7fff_ffff", "user@example.com",
            "https://example.org/path?q=1&r=2"]
    out, size = [], 0
    while size < n_bytes:
        r = rng.random()
        if r < 0.70:
            w = rng.choice(words)
            piece = (w.capitalize() if rng.random() < 0.1 else w)
            piece += rng.choice(["", "", "", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "n't"])
        elif r < 0.78:
            piece = str(rng.randint(0, 10 ** rng.randint(1, 9)))
        elif r < 0.84:
            piece = rng.choice(foreign)
        elif r < 0.87:
            piece = rng.choice(symbols)
        elif r < 0.90:
            piece = rng.choice(code)
        else:
            piece = rng.choice([",", ".", "!", "?", ";", ":", "'", '"', "(", ")", "--", "..."])
        sep = rng.choice(spaces) if rng.random() < 0.15 else " "
        out.append(piece + sep)
        size += len((piece + sep).encode())
    return "".join(out)


def read_tokens(path):
    with open(path, "rb") as f:
        data = f.read()
    magic, version, count = struct.unpack("<3i", data[:12])
    width = {(20240520, 1): 2, (20240801, 7): 4}[(magic, version)]
    assert len(data) == 1024 + count * width, "token file size disagrees with its count"
    return list(struct.unpack(f"<{count}{'H' if width == 2 else 'I'}", data[1024:]))


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def write_gpt2_files(ranks, folder):
    """The vocabulary as GPT-2's files: the single bytes first in GPT-2's order, then each
    merged token, split into two tokens of lower rank, as a merge."""
    b2u = bytes_to_unicode()
    spell = lambda bs: "".join(b2u[b] for b in bs)
    by_rank = sorted(ranks, key=ranks.get)
    encoder = {spell(bytes([b])): i for i, b in enumerate(b2u)}
    merges = []
    for token in by_rank:
        if len(token) == 1:
            continue
        r = ranks[token]
        split = next(k for k in range(1, len(token))
                     if ranks.get(token[:k], r) < r and ranks.get(token[k:], r) < r)
        merges.append(f"{spell(token[:split])} {spell(token[split:])}")
        encoder[spell(token)] = len(encoder)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "encoder.json"), "w", encoding="utf-8") as f:
        json.dump(encoder, f, ensure_ascii=False)
    with open(os.path.join(folder, "vocab.bpe"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "\n".join(merges) + "\n")


def compare(name, ours, theirs, text_len):
    if ours == theirs:
        print(f"{name}: {len(ours)} tokens, every one equal to tiktoken's")
        return True
    first = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b),
                 min(len(ours), len(theirs)))
    print(f"{name}: MISMATCH at token {first} of {len(ours)} (tiktoken {len(theirs)}): "
          f"tessel {ours[first:first + 8]} tiktoken {theirs[first:first + 8]}")
    return False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tessel")
    ap.add_argument("workdir")
    ap.add_argument("--mb", type=float, default=0.2)
    ap.add_argument("--vocab", type=int, default=1000)
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--corpus", help="a UTF-8 text file to check instead of the generated text")
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    corpus = os.path.join(args.workdir, "corpus.txt")
    if args.corpus:
        with open(args.corpus, encoding="utf-8", newline="") as f:
            text = f.read()
    else:
        text = mixed_text(int(args.mb * 1e6))
    with open(corpus, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    size = os.path.getsize(corpus)
    tok, bin_ = os.path.join(args.workdir, "tok.tiktoken"), os.path.join(args.workdir, "t.bin")

    def tessel(*argv):
        t0 = time.perf_counter()
        out = subprocess.run([args.tessel, *argv], check=True, capture_output=True, text=True)
        print("  tessel " + " ".join(argv[:2]) + ": " + out.stdout.strip())
        return time.perf_counter() - t0

    train_s = tessel("tokenizer", "train", "--vocab", str(args.vocab), "--out", tok, corpus)
    tessel("tokenize", "--tokenizer", tok, "--out", bin_, corpus)
    ours = read_tokens(bin_)

    os.environ["TIKTOKEN_CACHE_DIR"] = ""  # read the local files, cache nothing
    ranks = tiktoken.load.load_tiktoken_bpe(tok)
    enc = tiktoken.Encoding(name="tessel", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                            special_tokens={})
    t0 = time.perf_counter()
    theirs = enc.encode_ordinary(text)
    tiktoken_s = time.perf_counter() - t0
    ok = compare(f"{size} bytes, vocab {len(ranks)}", ours, theirs, size)

    gpt2 = os.path.join(args.workdir, "gpt2")
    write_gpt2_files(ranks, gpt2)
    tessel("tokenize", "--tokenizer", gpt2, "--out", bin_, corpus)
    gpt2_ranks = tiktoken.load.data_gym_to_mergeable_bpe_ranks(
        os.path.join(gpt2, "vocab.bpe"), os.path.join(gpt2, "encoder.json"))
    enc2 = tiktoken.Encoding(name="gpt2-files", pat_str=GPT2_PATTERN, mergeable_ranks=gpt2_ranks,
                             special_tokens={})
    ok &= compare("GPT-2 encoder.json + vocab.bpe", read_tokens(bin_), enc2.encode_ordinary(text),
                  size)
    if args.bench:
        print(f"train vocab {args.vocab} on {size / 1e6:.1f} MB: {train_s:.1f} s (whole command)")
        print(f"tiktoken encode_ordinary (1 thread): {tiktoken_s:.2f} s, "
              f"{size / 1e6 / tiktoken_s:.2f} MB/s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
