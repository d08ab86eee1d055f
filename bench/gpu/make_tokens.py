#!/usr/bin/env python3
"""Writes a synthetic token file in llm.c's format (a header of 256 little-endian int32: magic
20240520, version 1, token count; then the tokens as uint16), for machines where no real data
can be fetched (the GPU machine reaches nothing).

The tokens are not uniform noise: each one follows the previous one's fixed successor (a random
table drawn from the seed) with probability 1/2, else it is drawn uniformly, so a model can learn
something and its loss falls from ln(vocab) towards about half that. Python's standard library
only (the GPU machine has no numpy guarantee); about a second per million tokens.

    bench/gpu/make_tokens.py --out gpt2_tokens.bin --tokens 2000000 --vocab 50257
    bench/gpu/make_tokens.py --out char_tokens.bin --tokens 1000000 --vocab 65
"""
import argparse
import array
import random
import struct
import sys

MAGIC, VERSION = 20240520, 1  # llm.c dev/data/data_common.py, uint16 tokens


def make_tokens(n, vocab, seed):
    rng = random.Random(seed)
    successor = [rng.randrange(vocab) for _ in range(vocab)]
    out = array.array("H", bytes(2 * n))
    t = rng.randrange(vocab)
    for i in range(n):
        t = successor[t] if rng.random() < 0.5 else rng.randrange(vocab)
        out[i] = t
    return out


def write_token_file(path, tokens):
    header = struct.pack("<3i", MAGIC, VERSION, len(tokens)) + bytes(4 * 253)
    if sys.byteorder != "little":
        tokens.byteswap()
    with open(path, "wb") as f:
        f.write(header)
        f.write(tokens.tobytes())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the token file to write")
    ap.add_argument("--tokens", type=int, required=True, help="how many tokens")
    ap.add_argument("--vocab", type=int, required=True, help="ids are in [0, vocab)")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    if not 1 <= a.vocab <= 65536:
        ap.error(f"--vocab must be in [1, 65536] for uint16 tokens, got {a.vocab}")
    if not 1 <= a.tokens < 2**31:
        ap.error(f"--tokens must be in [1, 2^31) (the header's int32 count), got {a.tokens}")
    write_token_file(a.out, make_tokens(a.tokens, a.vocab, a.seed))
    print(f"make_tokens: {a.out}: {a.tokens} tokens, vocab {a.vocab}, seed {a.seed}")


if __name__ == "__main__":
    main()
