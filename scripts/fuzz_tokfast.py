"""Random ASCII texts: the token pass's native fast path against the tokenizers library.

Draws texts from pieces rich in what DeepSeek's pre-tokenizer tells apart
(digit runs, every punctuation character, whitespace, control characters,
letters, contractions; with ``--added`` whole added tokens and their parts,
else only ``<`` and ``|``), encodes them through ``LoadedTokenizer._encode_checked``
(the fast path first) and ``PieceEncoder.encode`` directly, and compares ids
and offsets with ``Tokenizer.encode_batch``. Prints the count of mismatches
(and the first few), how many texts took the fast path, and the cache's
size and clears. Needs the native core.

The default tokenizer is read natively (``sniffer._native.BpeModel``, the
library loaded lazily, here for the reference): the fast path's pieces are
then encoded by the native BPE, so this compares it with the library too.
``--bpe N`` also draws N random pieces (ASCII, Latin-1, any Unicode; no
pre-tokenizer) and compares ``BpeModel.encode_piece`` with the library's
model (``Tokenizer.model.tokenize`` of the byte-level spelling).

    python scripts/fuzz_tokfast.py [--texts 100000] [--seed 0] [--max-pieces 40] [--added]
        [--bpe 0]
"""

from __future__ import annotations

import argparse
import random

from sniffer.llm.tokens import LoadedTokenizer, TokenizerRegistry, _bytes_to_byte_level

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
    ap.add_argument("--bpe", type=int, default=0, help="random pieces for the native BPE")
    args = ap.parse_args()
    tok = TokenizerRegistry().default()
    if tok._fast is None:
        raise SystemExit("no fast path: the native core does not run")
    rng = random.Random(args.seed)
    if args.bpe:
        fuzz_bpe(tok, rng, args.bpe)
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
        f"cache {tok._fast.size} pieces, emptied {tok._fast.clears} times; "
        f"pieces by the native BPE: {tok._native is not None}"
    )


def fuzz_bpe(tok: LoadedTokenizer, rng: random.Random, n: int) -> None:
    """``BpeModel.encode_piece`` against the library's model on random pieces."""
    if tok._native is None:
        raise SystemExit("the default tokenizer was not read natively")
    model = tok._tok.model
    ranges = [(0, 0x7F), (0x20, 0x7E), (0, 0xFF), (0x4E00, 0x4F00), (0x1F600, 0x1F64F)]
    bad = 0
    for k in range(n):
        lo, hi = ranges[k % len(ranges)] if k % 7 else (0, 0x10FFFF)
        size = rng.randint(0, 48)
        chars = (chr(rng.randint(lo, hi)) for _ in range(size))
        piece = "".join(c for c in chars if not 0xD800 <= ord(c) <= 0xDFFF)
        want = [t.id for t in model.tokenize(_bytes_to_byte_level(piece.encode()))]
        if tok._native.encode_piece(piece) != want:
            bad += 1
            if bad <= 10:
                print(f"BPE MISMATCH {piece!r}: {tok._native.encode_piece(piece)} vs {want}")
    print(f"native BPE: pieces {n}, mismatches {bad}")


if __name__ == "__main__":
    main()
