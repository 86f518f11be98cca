"""Random ASCII texts: the token pass's native fast path against the tokenizers library.

Draws texts from pieces rich in what DeepSeek's pre-tokenizer tells apart
(digit runs, every punctuation character, whitespace, control characters,
letters, contractions; with ``--added`` whole added tokens and their parts,
else only ``<`` and ``|``), encodes them through ``LoadedTokenizer._encode_checked``
(the fast path first) and ``PieceEncoder.encode`` directly, and compares ids
and offsets with ``Tokenizer.encode_batch``. Prints the count of mismatches
(and the first few), how many texts took the fast path, and the cache's
size and clears. Needs the native core.

    python scripts/fuzz_tokfast.py [--texts 100000] [--seed 0] [--max-pieces 40] [--added]
"""

from __future__ import annotations

import argparse
import random

from sniffer.llm.tokens import TokenizerRegistry

PIECES = [
    *["0", "1", "9", "12", "345"],
    *"!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
    *[" ", " ", "  ", "\t", "\r", "\n", "\r\n", "\x0b", "\x0c"],
    *[chr(c) for c in [*range(32), 127]],
    *"abcxyzABCZ",
    *["the", " the", "'s", "'t", "'re", "w12.34 "],
]
ADDED = ["<think>", "<|EOT|>", "<|", "|>", "<dsml:", "</think>", "<thi", "nk>"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--texts", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-pieces", type=int, default=40, help="pieces per text at most")
    ap.add_argument("--added", action="store_true", help="draw added tokens' contents too")
    args = ap.parse_args()
    tok = TokenizerRegistry().default()
    if tok._fast is None:
        raise SystemExit("no fast path: the native core does not run")
    rng = random.Random(args.seed)
    alphabet = PIECES + (ADDED if args.added else ["<", "|", "<|"])
    bad = fast = 0
    for _ in range(args.texts // 500):
        sizes = [rng.randint(0, args.max_pieces) for _ in range(500)]
        texts = ["".join(rng.choices(alphabet, k=k)) for k in sizes]
        got = tok._fast.encode(texts, tok._encode_pieces)
        mine = tok._encode_checked(texts)
        ref = tok._tok.encode_batch(texts, add_special_tokens=False)
        for text, g, m, r in zip(texts, got, mine, ref, strict=True):
            offsets = [tuple(o) for o in r.offsets]
            ok = list(m[0]) == r.ids and [tuple(o) for o in m[1]] == offsets
            if g is not None:
                fast += 1
                ok = ok and list(g[0]) == r.ids and list(g[1]) == [e for _, e in offsets]
            if not ok:
                bad += 1
                if bad <= 10:
                    print(f"MISMATCH {text!r}: {g} vs {r.ids} {r.offsets}")
    print(
        f"texts {args.texts // 500 * 500}, fast path {fast}, mismatches {bad}; "
        f"cache {tok._fast.size} pieces, emptied {tok._fast.clears} times"
    )


if __name__ == "__main__":
    main()
