#!/usr/bin/env python3
"""The peers' points of `cargo xtask bench scale` (xtask/src/scale.rs), one per process.

Usage: scale.py CURVE MODE X [--warmup W] [--steps S] [--mem-budget-gb G]

  xl train|eval MEM   HF TransfoXL 4.37.2 (run with ~/.cache/memzoo-peers/venv-tfxl/bin/python),
                      XL-small as ../../shared/peers/bench_peers.py builds it (`xl-small-hf`:
                      6 x 256, 8 heads x 32, d_inner 1024, tied, untied r biases, no dropout,
                      no adaptive softmax, batch 8, segments of 128) with mem_len MEM and no
                      clamp_len, the memory filled with N(0, 1) hidden states before the first
                      step (as memzoo's side). train: zero_grad + forward + loss + backward +
                      AdamW; eval: forward under no_grad, memory carried.
  xl generate CTX     HF TransfoXL, the same XL-small with mem_len CTX + steps, batch 1: the prompt
                      of CTX random tokens read in one forward, then --steps tokens greedily, one
                      token per forward with `mems` (what its `generate` does after the prompt:
                      prepare_inputs_for_generation feeds the last token and the mems), under
                      no_grad; the prompt is not timed. tokens_per_s = 1 / median token time.
  compressive|rmt|block-recurrent generate CTX [--config JSON]
                      the lucidrains peer of `cargo xtask bench quality`'s recipe (quality.py's
                      model, from its DEFAULTS and --config, the recipe's numbers), batch 1, under
                      no_grad, eval mode: the prompt of CTX random tokens read segment by segment
                      (its complete segments but the last, state carried), then --steps tokens
                      greedily, each a forward over the current, unfinished segment on the
                      committed state, as the package's own generate loop does (each package
                      reads its unfinished segment again for every token): compressive as
                      AutoregressiveWrapper.generate (segments of seq_len; it carries the memories
                      every call returns, so every token also moves the XL memory and compresses
                      what leaves it), rmt as RecurrentMemoryTransformerWrapper.generate (segments
                      of seq_len, the memory committed when a segment completes), block-recurrent
                      as RecurrentTrainerWrapper.generate (windows of max_seq_len, two blocks;
                      memories and states committed when a window completes; the package's
                      generate takes no prompt longer than a window, so the prompt's complete
                      windows are read with its forward, as its training does). The first
                      token's pass reads the prompt's last segment. tokens_per_s = the tokens
                      over their total time (a token's cost grows through its segment).
  memorizing train N  memorizing-transformers-pytorch as bench_peers.py's `memorizing-small`
                      (faiss HNSW, M 15), each row's kNN memory prefilled with N random unit keys
                      (its curve: memorizing-faiss), training steps as bench_peers.py's.
  reformer generate CTX  reformer-pytorch, the same ReformerLM with max_seq_len CTX (axial
                      shape 64 x CTX/64), batch 1, under no_grad: --steps tokens greedily, each
                      one forward over the window of the last CTX tokens (what its
                      TrainingWrapper.generate does once the sequence is longer than
                      max_seq_len); the first window is not timed.
  reformer train LEN  reformer-pytorch ReformerLM (~/.cache/memzoo-peers/venv/bin/python) as
                      bench_peers.py's `reformer-small` (6 x 256, 8 heads x 32, bucket 64,
                      4 rounds, causal, reversible, ff_chunks 16, axial positions) at length
                      LEN (axial shape 64 x LEN/64), batch 1; its warm-up steps read the
                      first 1,024 tokens (as memzoo's reformer points).

bench_peers.py fixes the memory length and the sequence length in its CONFIGS; this script
takes them as arguments. Prints one JSON line (the fields of bench_peers.py's, `name`
scale-<curve>-<x>, `config` with `curve` and `x`), or {"status": "oom"} when the address
space limit (--mem-budget-gb, default 12, above what the process holds after the imports) is
hit. torch.set_num_threads(2), float32, seed 0.
"""
import argparse
import json
import resource
import statistics
import sys
import time

VOCAB = 256


def status_kb(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return -1


def reset_peak():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def build_xl(mem_len, train):
    import torch
    import transformers
    from transformers import TransfoXLConfig, TransfoXLLMHeadModel
    n_layer, d, batch, tgt = 6, 256, 8, 128
    conf = TransfoXLConfig(vocab_size=VOCAB, cutoffs=[], d_model=d, d_embed=d, n_head=8, d_head=32,
                           d_inner=1024, div_val=1, pre_lnorm=False, n_layer=n_layer,
                           mem_len=mem_len, clamp_len=0, same_length=False, adaptive=False,
                           dropout=0.0, dropatt=0.0, untie_r=True, tie_word_embeddings=True)
    model = TransfoXLLMHeadModel(conf)
    g = torch.Generator().manual_seed(1)
    data = torch.randint(0, VOCAB, (batch, tgt + 1), generator=g)
    state = {"mems": [torch.randn(mem_len, batch, d, generator=g) for _ in range(n_layer)]}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4) if train else None

    def step(warm=False):
        if train:
            model.train()
            opt.zero_grad(set_to_none=True)
            out = model(input_ids=data[:, :-1], labels=data[:, 1:], mems=state["mems"])
            out.losses.mean().backward()
            opt.step()
        else:
            model.eval()
            with torch.no_grad():
                out = model(input_ids=data[:, :-1], labels=data[:, 1:], mems=state["mems"])
        state["mems"] = [m.detach() for m in out.mems]

    info = {"impl": "HF TransfoXL", "transformers": transformers.__version__, "mem_len": mem_len,
            "tgt_len": tgt, "batch": batch}
    return step, batch * tgt, info


def build_reformer(seq):
    import torch
    import torch.nn.functional as F
    from reformer_pytorch import ReformerLM
    model = ReformerLM(num_tokens=VOCAB, dim=256, depth=6, max_seq_len=seq, heads=8, dim_head=32,
                       bucket_size=64, n_hashes=4, causal=True, ff_chunks=16,
                       axial_position_emb=True, axial_position_shape=(64, seq // 64),
                       reverse_thres=0)
    g = torch.Generator().manual_seed(1)
    data = torch.randint(0, VOCAB, (1, seq + 1), generator=g)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(warm=False):
        # The warm-up steps read the first 1,024 tokens (memzoo's side warms up on a short
        # sequence too): the timed steps' cost is the length's, not the first call's.
        n = min(seq, 1024) if warm else seq
        opt.zero_grad(set_to_none=True)
        logits = model(data[:, :n])
        F.cross_entropy(logits.reshape(-1, VOCAB), data[:, 1:n + 1].reshape(-1)).backward()
        opt.step()

    return step, seq, {"impl": "reformer-pytorch", "seq": seq, "reversible": True, "batch": 1}


def build_memorizing(stored, room):
    """memorizing-transformers-pytorch as bench_peers.py's `memorizing-small` (6 x 256, 8 heads
    x 32, kNN layer 4, top-32, batch 2, segments of 512, faiss IndexHNSWFlat M=15 on the CPU),
    each row's kNN memory prefilled with `stored` random unit keys (bench_peers.py's prefill)
    and room for the timed steps' (`room`), so that no step resets it."""
    import atexit
    import shutil
    import tempfile
    import torch
    import faiss
    from memorizing_transformers_pytorch import MemorizingTransformer
    # The memories' memmap files (~130 MB a point at 262K keys): gone when this process ends,
    # as they were not before (92 folders, 12 GB, had filled the temporary directory).
    memmaps = tempfile.mkdtemp(prefix="knnmem-")
    atexit.register(shutil.rmtree, memmaps, ignore_errors=True)
    faiss.omp_set_num_threads(2)
    seq, batch, dim_head = 512, 2, 32
    model = MemorizingTransformer(num_tokens=VOCAB, dim=256, depth=6, dim_head=dim_head, heads=8,
                                  memorizing_layers=(4,), max_knn_memories=stored + room,
                                  num_retrieved_memories=32,
                                  knn_memories_directory=memmaps,
                                  knn_memory_multiprocessing=False)
    mems = model.create_knn_memories(batch_size=batch)
    g = torch.Generator().manual_seed(2)
    left = stored
    t0 = time.perf_counter()
    while left > 0:
        n = min(left, 4096)
        kv = torch.randn(batch, n, 2, dim_head, generator=g)
        kv[:, :, 0] = torch.nn.functional.normalize(kv[:, :, 0], dim=-1)
        for m in mems:
            m.add(kv)
        left -= n
    fill_s = time.perf_counter() - t0
    recall, search_s = knn_recall(mems[0], stored, dim_head, g)
    data = torch.randint(0, VOCAB, (batch, seq + 1), generator=g)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(warm=False):
        opt.zero_grad(set_to_none=True)
        loss = model(data[:, :-1], knn_memories=mems, labels=data[:, 1:])
        loss.backward()
        opt.step()

    info = {"impl": "memorizing-transformers-pytorch", "stored_per_row": stored, "batch": batch,
            "seq": seq, "knn_index": "faiss IndexHNSWFlat(M=15, inner product)",
            "keys": "random unit vectors", "fill_s": fill_s, "recall_at_k": recall,
            "search_s": search_s}
    return step, seq * batch, info


def knn_recall(memory, stored, dim, g, queries=512, k=32):
    """Recall@k of row 0's faiss index (as the model searches it: faiss's default efSearch)
    against an exact search over the same stored keys, for `queries` random unit queries; and
    the index's search time for them."""
    import numpy as np
    import torch
    keys = np.asarray(memory.db[0, :stored, 0], dtype=np.float32)
    q = torch.nn.functional.normalize(torch.randn(queries, dim, generator=g), dim=-1).numpy()
    t0 = time.perf_counter()
    _, found = memory.knns[0].index.search(q, k)
    search_s = time.perf_counter() - t0
    exact = np.argpartition(-(q @ keys.T), k, axis=1)[:, :k]
    hits = sum(len(set(a.tolist()) & set(b.tolist())) for a, b in zip(found, exact))
    return hits / (queries * k), search_s


def generate_xl(context, tokens):
    import torch
    import transformers
    from transformers import TransfoXLConfig, TransfoXLLMHeadModel
    conf = TransfoXLConfig(vocab_size=VOCAB, cutoffs=[], d_model=256, d_embed=256, n_head=8,
                           d_head=32, d_inner=1024, div_val=1, pre_lnorm=False, n_layer=6,
                           mem_len=context + tokens, clamp_len=0, same_length=False,
                           adaptive=False, dropout=0.0, dropatt=0.0, untie_r=True,
                           tie_word_embeddings=True)
    model = TransfoXLLMHeadModel(conf).eval()
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, VOCAB, (1, context), generator=g)
    times = []
    with torch.no_grad():
        reset_peak()
        out = model(input_ids=prompt)
        mems = out.mems
        token = out.prediction_scores[:, -1:].argmax(-1)
        for _ in range(tokens):
            t0 = time.perf_counter()
            out = model(input_ids=token, mems=mems)
            mems = out.mems
            token = out.prediction_scores[:, -1:].argmax(-1)
            times.append(time.perf_counter() - t0)
    info = {"impl": "HF TransfoXL", "transformers": transformers.__version__, "context": context,
            "tokens": tokens, "mem_len": context + tokens, "curve": "generate-xl", "x": context}
    print_generation("xl", context, "HF TransfoXL", torch, info, times, tokens)


def generate_reformer(context, tokens):
    import torch
    from reformer_pytorch import ReformerLM
    model = ReformerLM(num_tokens=VOCAB, dim=256, depth=6, max_seq_len=context, heads=8,
                       dim_head=32, bucket_size=64, n_hashes=4, causal=True, ff_chunks=16,
                       axial_position_emb=True, axial_position_shape=(64, context // 64),
                       reverse_thres=0).eval()
    g = torch.Generator().manual_seed(1)
    seq = torch.randint(0, VOCAB, (1, context), generator=g)
    times = []
    with torch.no_grad():
        reset_peak()
        for i in range(tokens + 1):
            t0 = time.perf_counter()
            logits = model(seq[:, -context:])
            token = logits[:, -1:].argmax(-1)
            seq = torch.cat([seq, token], dim=1)
            if i > 0:
                times.append(time.perf_counter() - t0)
    info = {"impl": "reformer-pytorch", "context": context, "tokens": tokens,
            "window": context, "curve": "generate-reformer", "x": context}
    print_generation("reformer", context, "reformer-pytorch", torch, info, times, tokens)


def generate_recurrent(family, context, tokens, config):
    import os
    import torch
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import quality
    c = dict(quality.DEFAULTS[family])
    c.update(config)
    peer = quality.PEERS[family](c)
    model = peer.model.eval()
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, VOCAB, (1, context), generator=g)
    times = []
    with torch.no_grad():
        reset_peak()
        if family == "compressive":
            # AutoregressiveWrapper.generate: every call's memories are carried.
            seq = c["seq_len"]
            mem = None
            *primes, out = prompt.split(seq, dim=1)
            for p in primes:
                _, mem, _ = model(p, memories=mem)
            input_len = out.shape[1]
            for _ in range(tokens):
                t0 = time.perf_counter()
                logits, mem, _ = model(out[:, -input_len:], memories=mem)
                out = torch.cat((out, logits[:, -1:].argmax(-1)), dim=-1)
                input_len = input_len % seq + 1
                times.append(time.perf_counter() - t0)
        else:
            if family == "rmt":
                seq = c["seq_len"]
                state = (None, None)

                def forward(x, s):
                    logits, memories, xl = model(x, s[0], xl_memories=s[1])
                    return logits, (memories, xl)
            else:
                seq = c["max_seq_len"]
                state = ([], [])

                def forward(x, s):
                    return (lambda r: (r[0], (r[1], r[2])))(
                        model(x, xl_memories=s[0], states=s[1], return_memories_and_states=True))
            *past, cur = prompt.split(seq, dim=-1)
            for p in past:
                _, state = forward(p, state)
            for _ in range(tokens):
                t0 = time.perf_counter()
                logits, following = forward(cur, state)
                cur = torch.cat((cur, logits[:, -1:].argmax(-1)), dim=-1)
                # The segment (window) is complete: its state is committed, the new token
                # starts the next one.
                if (cur.shape[-1] - 1) % seq == 0:
                    state = following
                    cur = cur[..., -1:]
                times.append(time.perf_counter() - t0)
    info = {"impl": peer.name, "context": context, "tokens": tokens, "segment_len": seq,
            "curve": f"generate-{family}", "x": context, "rate": "mean"}
    print_generation(family, context, peer.name, torch, info, times, tokens, mean=True)


def print_generation(family, context, implementation, torch, info, times, tokens, mean=False):
    """One generation point's line; tokens_per_s = 1 / the median token's time, or with `mean`
    the tokens over their total time (for tokens whose cost varies through a segment, as
    memzoo's generator reports it)."""
    med = statistics.median(times)
    print(json.dumps({"name": f"scale-generate-{family}-{context}",
                      "implementation": implementation,
                      "backend": "torch " + torch.__version__, "threads": 2, "config": info,
                      "steps": tokens, "step_s_median": med, "step_s_min": min(times),
                      "step_s_max": max(times),
                      "tokens_per_s": len(times) / sum(times) if mean else 1.0 / med,
                      "peak_rss_mb": status_kb("VmHWM") / 1024.0}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("curve", choices=["xl", "reformer", "memorizing", "compressive", "rmt",
                                      "block-recurrent"])
    ap.add_argument("mode", choices=["train", "eval", "generate"])
    ap.add_argument("x", type=int)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--mem-budget-gb", type=float, default=12.0)
    ap.add_argument("--config", default="{}",
                    help="the model's arguments as JSON (compressive, rmt, block-recurrent)")
    a = ap.parse_args()
    import torch
    torch.set_num_threads(2)
    torch.manual_seed(0)
    if a.mem_budget_gb > 0:
        lim = int(status_kb("VmSize") * 1024 + a.mem_budget_gb * (1 << 30))
        resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
    curve = f"{a.curve}-{a.mode}" if a.curve == "xl" else a.curve
    if a.mode == "generate":
        if a.curve == "xl":
            generate_xl(a.x, a.steps)
        elif a.curve == "reformer":
            generate_reformer(a.x, a.steps)
        elif a.curve == "memorizing":
            sys.exit("memorizing-transformers-pytorch has no generation")
        else:
            generate_recurrent(a.curve, a.x, a.steps, json.loads(a.config))
        return
    try:
        if a.curve == "xl":
            step, tokens, info = build_xl(a.x, a.mode == "train")
        elif a.curve == "memorizing":
            # Its own curve name: a faiss HNSW store, beside memzoo's exact and HNSW ones.
            curve = "memorizing-faiss"
            step, tokens, info = build_memorizing(a.x, 1024 * (a.warmup + a.steps + 1))
        else:
            step, tokens, info = build_reformer(a.x)
        reset_peak()
        times = []
        for i in range(a.warmup + a.steps):
            t0 = time.perf_counter()
            step(warm=i < a.warmup)
            if i >= a.warmup:
                times.append(time.perf_counter() - t0)
    except (MemoryError, RuntimeError) as e:
        if isinstance(e, RuntimeError) and "alloc" not in str(e).lower() and "memory" not in str(e).lower():
            raise
        print(json.dumps({"name": f"scale-{curve}-{a.x}", "status": "oom",
                          "error": str(e)[:200]}))
        sys.exit(0)
    med = statistics.median(times)
    info.update(curve=curve, x=a.x)
    print(json.dumps({"name": f"scale-{curve}-{a.x}", "implementation": info["impl"],
                      "backend": "torch " + torch.__version__, "threads": 2, "config": info,
                      "steps": a.steps, "step_s_median": med, "step_s_min": min(times),
                      "step_s_max": max(times), "tokens_per_s": tokens / med,
                      "peak_rss_mb": status_kb("VmHWM") / 1024.0}))


if __name__ == "__main__":
    main()
