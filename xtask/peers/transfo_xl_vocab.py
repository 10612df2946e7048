#!/usr/bin/env python3
"""Converts HF's pickled TransfoXL vocabulary (`vocab.pkl`) into memzoo's JSON vocabulary, once.

HF ships `transfo-xl-wt103`'s word vocabulary only as `vocab.pkl`: a pickled Python `__dict__`,
which `pickle.load` executes as code. Run this once, on a machine with internet and transformers
4.x (the last with TransfoXL; e.g. the venv of ../../shared/peers/setup.sh, with `sacremoses`),
after deciding to trust that file; memzoo then reads the JSON and never a pickle:

    TRUST_REMOTE_CODE=True python xtask/peers/transfo_xl_vocab.py vocab.json \
        --model transfo-xl/transfo-xl-wt103
    TRUST_REMOTE_CODE=True python xtask/peers/transfo_xl_vocab.py vocab.json --pickle vocab.pkl

(`TRUST_REMOTE_CODE=True` is HF's own switch for unpickling the vocabulary.) Put `vocab.json` in
the model directory before `memzoo import --from hf-transfo-xl DIR`: the import copies it into
the run, and `memzoo generate` then reads and writes words.

The JSON holds the tokenizer's state that decides tokens and ids (HF attribute names):
`{"format": "memzoo-transfo-xl-vocab", "idx2sym": [...], "lower_case", "delimiter", "unk_idx",
"never_split", "language"}`.
"""
import argparse
import json
import os
import sys

FORMAT = "memzoo-transfo-xl-vocab"


def to_json(tokenizer):
    """The memzoo vocabulary of an HF `TransfoXLTokenizer`."""
    d = tokenizer.__dict__
    idx2sym = list(d["idx2sym"])
    sym2idx = d["sym2idx"]
    for i, s in enumerate(idx2sym):  # HF's ids are positions in idx2sym (first occurrence)
        assert sym2idx[s] <= i, (s, sym2idx[s], i)
    unk_idx = d.get("unk_idx")
    return {
        "format": FORMAT,
        "idx2sym": idx2sym,
        "lower_case": bool(d.get("lower_case", False)),
        "delimiter": d.get("delimiter"),
        "unk_idx": None if unk_idx is None else int(unk_idx),
        "never_split": list(tokenizer.never_split),
        "language": d.get("language", "en"),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="an HF model id or directory with vocab.pkl")
    src.add_argument("--pickle", help="a local vocab.pkl")
    args = ap.parse_args()
    if os.environ.get("TRUST_REMOTE_CODE", "False") != "True":
        sys.exit("set TRUST_REMOTE_CODE=True once you trust the pickle (HF's switch for unpickling it)")
    from transformers import TransfoXLTokenizer

    if args.model:
        tok = TransfoXLTokenizer.from_pretrained(args.model)
    else:
        tok = TransfoXLTokenizer(pretrained_vocab_file=args.pickle)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(to_json(tok), f, ensure_ascii=False)
    print(f"wrote {args.out}: {len(tok.idx2sym)} words, lower_case={tok.lower_case}")


if __name__ == "__main__":
    main()
