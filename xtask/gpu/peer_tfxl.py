#!/usr/bin/env python3
"""The peer beside `xtask/gpu/run.sh`'s XL run: HF TransfoXL (transformers 4.37.2, its last
release with TransfoXL) training Transformer-XL's enwik8 base on the same GPU and corpus.

The model and recipe are memzoo's `--preset xl-enwik8-base`: 12 layers of 512, 8 heads of 64,
d_inner 2048, memory 512, 256 byte symbols, tied output, dropout 0.1, dropatt 0; batches of
22 x 512 cut from one ordered stream with the memory carried; Adam lr 2.5e-4, gradient norm
clipped to 0.25. float32 throughout, TF32 off (memzoo's wgpu build computes in plain f32).

Prints one line per logged window and one JSON summary line:
  {"peer": "hf-transfoxl", "steps": N, "tokens_per_s": steady, "first_window_tokens_per_s": X,
   "peak_mib": torch's peak allocation, "loss": last window's mean training loss (nats)}
steady tokens/s leaves out the first window (CUDA's start-up) as run.sh does for memzoo.

  python3 xtask/gpu/peer_tfxl.py .gpu/corpus.txt.gz --steps 300 --max-seconds 90
  python3 xtask/gpu/peer_tfxl.py CORPUS --device cpu --tiny --steps 4 --log-every 2   # a CPU test
"""
import argparse, gzip, json, sys, time

import torch
from transformers import TransfoXLConfig, TransfoXLLMHeadModel


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("corpus", help="the text to train on (.gz or plain)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--max-seconds", type=float, default=90.0, help="training time cap")
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--tiny", action="store_true", help="2 layers of 64 on 2 x 16 (a CPU test)")
    args = ap.parse_args()
    for name in ("steps", "log_every"):
        if getattr(args, name) < 1:
            sys.exit(f"peer_tfxl.py: --{name.replace('_', '-')} must be positive, got {getattr(args, name)}")

    opener = gzip.open if args.corpus.endswith(".gz") else open
    with opener(args.corpus, "rb") as f:
        raw = f.read()
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device(args.device)

    if args.tiny:
        batch, tgt, layers, d, heads, dh, inner = 2, 16, 2, 64, 4, 16, 128
    else:
        batch, tgt, layers, d, heads, dh, inner = 22, 512, 12, 512, 8, 64, 2048
    cfg = TransfoXLConfig(vocab_size=256, cutoffs=[], div_val=1, d_model=d, d_embed=d, n_head=heads,
                          d_head=dh, d_inner=inner, n_layer=layers, mem_len=tgt, clamp_len=1000,
                          same_length=False, dropout=0.1, dropatt=0.0, tie_word_embeddings=True)
    model = TransfoXLLMHeadModel(cfg).to(dev)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=2.5e-4)

    stream = torch.tensor(list(raw), dtype=torch.long)
    rows = stream[: (len(stream) // batch) * batch].view(batch, -1)
    if rows.size(1) < tgt + 1:
        sys.exit(f"peer_tfxl.py: the corpus ({len(raw)} bytes) is too short for {batch} rows of {tgt + 1}")
    rows = rows.to(dev)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    mems, pos = None, 0
    windows, losses = [], []
    sync()
    start = window_start = time.time()
    done = 0
    for step in range(1, args.steps + 1):
        if pos + tgt + 1 > rows.size(1):
            pos, mems = 0, None
        x, y = rows[:, pos:pos + tgt], rows[:, pos + 1:pos + tgt + 1]
        pos += tgt
        out = model(input_ids=x, mems=mems)
        mems = out.mems
        # HF shifts `labels` inside the model, so score the shifted targets from the logits.
        logp = torch.log_softmax(out.prediction_scores, dim=-1)
        loss = -logp.gather(-1, y.unsqueeze(-1)).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        opt.step()
        losses.append(loss.detach())
        done = step
        if step % args.log_every == 0 or step == args.steps:
            sync()
            now = time.time()
            n = step - (windows[-1][0] if windows else 0)
            tps = n * batch * tgt / (now - window_start)
            mean = torch.stack(losses).mean().item()
            losses = []
            windows.append((step, tps, mean))
            print(f"peer step {step}: {tps:.1f} tokens/s, loss {mean:.4f}", flush=True)
            window_start = now
            if now - start >= args.max_seconds:
                break

    steady_steps = sum(w[0] - p[0] for p, w in zip(windows, windows[1:]))
    steady_secs = sum((w[0] - p[0]) * batch * tgt / w[1] for p, w in zip(windows, windows[1:]))
    summary = {
        "peer": "hf-transfoxl",
        "transformers": __import__("transformers").__version__,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else args.device,
        "steps": done,
        "batch": batch, "tgt_len": tgt,
        "tokens_per_s": round(steady_steps * batch * tgt / steady_secs, 1) if steady_secs > 0 else None,
        "first_window_tokens_per_s": round(windows[0][1], 1) if windows else None,
        "peak_mib": round(torch.cuda.max_memory_allocated(dev) / 2**20) if dev.type == "cuda" else None,
        "loss": round(windows[-1][2], 4) if windows else None,
    }
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
