#!/usr/bin/env python3
"""Learning curves of memzoo's PyTorch peers, for `cargo xtask bench quality`.

Usage: quality.py FAMILY STEPS EVAL_AT DATA [--config JSON]

  FAMILY   xl (HF TransfoXL 4.37.2: run with ~/.cache/memzoo-peers/venv-tfxl/bin/python),
           reformer (reformer-pytorch), memorizing (memorizing-transformers-pytorch) or
           compressive (compressive-transformer-pytorch), rmt (recurrent-memory-transformer-pytorch) or
           block-recurrent (block-recurrent-transformer-pytorch), with ~/.cache/memzoo-peers/venv/bin/python
  STEPS    optimizer steps
  EVAL_AT  comma-separated steps at which the whole validation split is scored
  DATA     a text file (bytes are tokens, vocab 256)
  --config the model shape and the recipe as JSON; `cargo xtask bench quality` passes the numbers
           of its memzoo configs (xtask/src/quality.rs), so both sides use the same ones. Without
           it the defaults below apply (a copy of those numbers, for running this file alone).

Prints one JSON line per evaluation point on stdout:
  {"kind": "quality", "family", "impl", "step", "valid_bpc", "train_loss", "wall_s", ...}
(`train_loss`: mean training loss, nats, over the last `window` steps, window = gcd(10, EVAL_AT);
`wall_s`: training seconds up to that step, evaluations excluded), and progress on stderr.

cargo xtask runs it with OMP_WAIT_POLICY=PASSIVE (unless set): spinning OpenMP threads stall for
seconds on a machine shared with other processes.

Recipe (the same as memzoo's side and ../../shared/peers/quality_tfxl.py): seed 0,
torch.set_num_threads(2), float32, AdamW lr 1e-3 weight_decay 0.01 eps 1e-8 over all parameters,
50 linear warm-up steps (lr (s+1)/50) then cosine to 0 at STEPS, global grad-norm clip 0.25,
dropout 0.1. Data: last 5% of the bytes valid, the 5% before test, the rest train; the train split
is cut into `batch` contiguous rows, each step reads the next `tgt_len` tokens of every row
(`segments_per_step` segments of `tgt_len` for the RMT; targets shifted by one), wrapping to the start (and clearing every memory) when a row has no full
segment left. Loss = mean NLL of the next byte, scored from the model's log-probabilities here
(HF TransfoXL shifts `labels` itself: passing shifted labels would train 2-ahead prediction).
Validation: the whole split cut into `eval_rows` contiguous rows (default: `batch`, as `memzoo train`
evaluates), read in segments of `tgt_len` (full segments only, as memzoo's evaluation), memory
carried (kNN memories cleared at the start); bpc = mean NLL / ln 2. (quality_tfxl.py reads it as one
row: 8 rows start cold 8 times instead of once, and run several times faster.)

Where the peers differ from memzoo and cannot be matched by a setting:

xl (HF TransfoXL): none in the architecture (same function given the same weights). HF's
  `adaptive=True` with `cutoffs=[]` is a plain softmax (as quality_tfxl.py runs it).
reformer (reformer-pytorch ReformerLM, always reversible):
  - dropout: the peer has no embedding dropout and no dropout on the attention output
    (ReformerLM forces post_attn_dropout=0); its `ff_dropout` sits inside the feed-forward,
    after the GELU. memzoo's `dropout` is on the embedding and on the attention and
    feed-forward outputs. Set: peer ff_dropout = dropout, memzoo dropout = dropout.
  - axial positions: reformer-pytorch's AxialPositionalEmbedding sums two full-width
    embeddings by default; memzoo concatenates two halves. Matched: the peer's `pos_emb` is
    replaced by AxialPositionalEmbedding(dim, shape, axial_dims=(dim/2, dim/2)) (concatenated).
  - hash-round de-duplication: memzoo counts a key found in several rounds once (trax); the
    peer's ReformerLM does not expose it. Matched: `_allow_duplicate_attention = False` is set
    on every LSH layer (trax's count-based correction, in the peer's code).
  - rotations: the peer draws fresh random rotations on every forward, evaluation included;
    memzoo fixes them in evaluation (`eval_seed`).
  - initialisation: PyTorch defaults (embedding N(0, 1), kaiming-uniform linears); memzoo's is
    its own library default.
memorizing (memorizing-transformers-pytorch MemorizingTransformer). memzoo's quality config is
  the paper's model; every point below except dropout and initialisation now has an XlConfig
  option that gives the package's function (`kv_heads`, `knn.mixing`, `knn.feed`,
  `knn.when_full`, `memory_keys_values`, `shared_t5`, `positions.bias_scale` /
  `memory_offset`, `attention_output_bias`; `memzoo import --from lucidrains-memorizing` sets
  them), not used by this benchmark:
  - multi-query attention (one key/value head shared by the query heads) in every layer;
    memzoo: a key/value per head.
  - the kNN layer: one softmax over the retrieved and the local keys together, no gate; memzoo:
    the paper's two softmaxes mixed by a learned gate. Both: cosine scores with a learned
    per-head temperature, initially 20.
  - the kNN memory receives the keys/values that leave the XL memory (one segment later than
    memzoo, which adds each segment's keys after reading it); it is a faiss HNSW index (memzoo:
    exact search at this size) that is *reset to empty* once it holds more than
    `max_knn_memories` (memzoo evicts the oldest).
  - the XL memory holds keys/values (memzoo: the layer inputs, projected again).
  - T5 bias scaled by sqrt(d_head) and its embedding drawn from N(0, 1), one table shared by
    the layers and a separate one for the kNN layer, bucketed by i - j ignoring the memory.
  - dropout: `attn_dropout` on the attention probabilities (0 here, as memzoo's dropatt) and
    `ff_dropout` inside the feed-forward; no embedding or residual dropout.
compressive (compressive-transformer-pytorch 0.4.0 CompressiveTransformer): the same function as
  memzoo's quality config (memzoo imports the package's checkpoints with parity), but for:
  - the reconstruction loss: the package detaches `to_kv.weight` *in place* the first time it
    computes the loss, so from then on the LM loss no longer trains W_kv either. The paper (and
    memzoo) stop only the reconstruction loss's gradient into the attention. Matched: that line
    of the package's `SelfAttention.forward` is replaced by a detached copy of the weight for
    the compressed keys/values (`CompressivePeer.patch`); the LM loss trains `to_kv` as usual.
  - dropout: `attn_layer_dropout` on the attention output and `ff_dropout` inside the
    feed-forward (both 0.1); memzoo drops at the same two sites (`embedding_dropout`,
    `ff_output_dropout` and `final_dropout` off).
  - initialisation: the same weights: `cargo xtask bench quality` has this script write the
    seeded initial model (`--init-out`) and memzoo imports it.
  The training loss adds the model's reconstruction loss (`aux_loss`), as memzoo's does.
rmt (recurrent-memory-transformer-pytorch 0.7.0 RecurrentMemoryTransformer): the same function
  as memzoo's quality config (memzoo imports the package's checkpoints with parity), but for:
  - the steps: each reads `segments_per_step` segments of every row through the package's
    RecurrentMemoryTransformerWrapper (`truncate_at_step` = segments_per_step), the memory in the
    graph across them, then detached and carried to the next step, as memzoo's trainer does.
  - dropout: `ff_dropout` inside the feed-forward; memzoo drops there only (the import's
    dropout sites).
  - initialisation: the same weights (`--init-out`, imported by memzoo).
block-recurrent (block-recurrent-transformer-pytorch 0.4.4 BlockRecurrentTransformer): the same
  function (memzoo imports the package's checkpoints with parity) and, from the same weights
  (`--init-out`), the same training: a step is one forward over `max_seq_len` tokens (memzoo's
  unroll of `max_seq_len / block_width` segments of one block), the states and key/value memories
  it returns carried detached to the next step. The package has no dropout (neither side drops).
  Evaluation reads one block per forward, so both sides score the same full blocks.
"""
import argparse
import json
import math
import os
import sys
import tempfile
import time
from functools import reduce

import torch

RECIPE = dict(seed=0, threads=2, lr=1e-3, weight_decay=0.01, beta_1=0.9, beta_2=0.999, eps=1e-8,
              warmup=50, clip=0.25, valid_fraction=0.05, test_fraction=0.05)

# The numbers of xtask/src/quality.rs (which passes them with --config).
DEFAULTS = {
    "xl": dict(n_layer=6, d_model=256, n_head=8, d_head=32, d_inner=1024, mem_len=128, clamp_len=1000,
               tgt_len=128, batch=8, dropout=0.1, dropatt=0.0, pre_lnorm=False, tie=True, untie_r=True),
    "reformer": dict(depth=3, dim=128, heads=4, dim_head=32, ff_mult=4, max_seq_len=256, bucket_size=32,
                     n_hashes=2, axial_shape=[16, 16], tgt_len=256, batch=8, dropout=0.1, dropatt=0.0),
    "memorizing": dict(depth=4, dim=128, heads=4, dim_head=32, ff_mult=4, knn_layer=3, topk=32,
                       max_knn_memories=4096, xl_max_memories=128, tgt_len=128, batch=8, dropout=0.1,
                       dropatt=0.0),
    "compressive": dict(num_tokens=256, dim=128, seq_len=128, depth=4, heads=4, mem_len=128, cmem_len=32,
                        cmem_ratio=4, reconstruction_loss_weight=1.0, tgt_len=128, batch=8, dropout=0.1,
                        dropatt=0.0),
    "rmt": dict(num_tokens=256, dim=128, depth=4, heads=4, dim_head=32, num_memory_tokens=16, seq_len=128,
                ff_mult=4.0, ff_dropout=0.1, attn_dropout=0.0, use_xl_memories=False, num_residual_streams=1,
                truncate_at_step=2, batch=8, tgt_len=128, segments_per_step=2),
    "block-recurrent": dict(num_tokens=256, dim=128, depth=4, heads=4, dim_head=32, ff_mult=4, max_seq_len=128,
                            block_width=64, recurrent_layers=[2], num_state_vectors=64, batch=8, tgt_len=64,
                            segments_per_step=2),
}


def log(msg):
    print(msg, file=sys.stderr, flush=True)


class XlPeer:
    """HF TransfoXL, as ../../shared/peers/quality_tfxl.py builds it."""

    def __init__(self, c):
        import transformers
        from transformers import TransfoXLConfig, TransfoXLLMHeadModel
        conf = TransfoXLConfig(vocab_size=256, cutoffs=[], div_val=1, d_model=c["d_model"], d_embed=c["d_model"],
                               n_head=c["n_head"], d_head=c["d_head"], d_inner=c["d_inner"], n_layer=c["n_layer"],
                               mem_len=c["mem_len"], clamp_len=c["clamp_len"], same_length=False,
                               dropout=c["dropout"], dropatt=c["dropatt"], pre_lnorm=c["pre_lnorm"],
                               untie_r=c["untie_r"], tie_word_embeddings=c["tie"])
        self.model = TransfoXLLMHeadModel(conf)
        self.name = f"HF TransfoXL {transformers.__version__}"

    def new_state(self, batch):
        return None

    def logprobs(self, x, state):
        out = self.model(input_ids=x, mems=state)
        # prediction_scores are log-probabilities (adaptive softmax without cutoffs).
        return out.prediction_scores, [m.detach() for m in out.mems]


class ReformerPeer:
    """reformer-pytorch ReformerLM; each segment is read on its own (no memory)."""

    def __init__(self, c):
        from axial_positional_embedding import AxialPositionalEmbedding
        from reformer_pytorch import ReformerLM
        dim, shape = c["dim"], tuple(c["axial_shape"])
        self.model = ReformerLM(num_tokens=256, dim=dim, depth=c["depth"], max_seq_len=c["max_seq_len"],
                                heads=c["heads"], dim_head=c["dim_head"], bucket_size=c["bucket_size"],
                                n_hashes=c["n_hashes"], ff_chunks=1, ff_mult=c["ff_mult"], causal=True,
                                lsh_dropout=c["dropatt"], ff_dropout=c["dropout"], axial_position_emb=True,
                                axial_position_shape=shape)
        # memzoo concatenates two half-width axial embeddings (the peer's default sums two
        # full-width ones).
        self.model.pos_emb = AxialPositionalEmbedding(dim, shape, axial_dims=(dim // 2, dim - dim // 2))
        # memzoo counts a key found in several hash rounds once (trax's correction).
        for m in self.model.modules():
            if hasattr(m, "_allow_duplicate_attention"):
                m._allow_duplicate_attention = False
        self.name = "reformer-pytorch ReformerLM"

    def new_state(self, batch):
        return None

    def logprobs(self, x, state):
        return torch.log_softmax(self.model(x), dim=-1), None


class MemorizingPeer:
    """memorizing-transformers-pytorch with kNN memories (faiss) and XL memories."""

    def __init__(self, c):
        import faiss
        from memorizing_transformers_pytorch import MemorizingTransformer
        faiss.omp_set_num_threads(RECIPE["threads"])
        self.tmp = tempfile.TemporaryDirectory(prefix="memzoo-quality-knn-")
        self.model = MemorizingTransformer(num_tokens=256, dim=c["dim"], depth=c["depth"], dim_head=c["dim_head"],
                                           heads=c["heads"], attn_dropout=c["dropatt"], ff_mult=c["ff_mult"],
                                           ff_dropout=c["dropout"], memorizing_layers=(c["knn_layer"],),
                                           max_knn_memories=c["max_knn_memories"],
                                           num_retrieved_memories=c["topk"],
                                           knn_memories_directory=os.path.join(self.tmp.name, "unused"),
                                           xl_max_memories=c["xl_max_memories"], knn_memory_multiprocessing=False)
        self.name = "memorizing-transformers-pytorch"
        self.created = 0

    def new_state(self, batch):
        """Fresh (empty) kNN memories for `batch` rows, in their own memmap directory, no XL memory."""
        from memorizing_transformers_pytorch.knn_memory import KNNMemoryList
        self.created += 1
        d = os.path.join(self.tmp.name, f"mem-{self.created}")
        knn = KNNMemoryList.create_memories(batch_size=batch, num_memory_layers=self.model.num_memory_layers,
                                            memories_directory=d)(**self.model.knn_mem_kwargs)
        return (knn, None)

    def logprobs(self, x, state):
        knn, xl = state
        logits, new_xl = self.model(x, knn_memories=knn, xl_memories=xl)
        return torch.log_softmax(logits, dim=-1), (knn, [m.detach() for m in new_xl])


class CompressivePeer:
    """compressive-transformer-pytorch with its XL and compressed memories; the training loss
    adds its reconstruction loss (`self.aux`)."""

    @staticmethod
    def patch():
        """The reconstruction loss through a detached copy of `to_kv.weight` instead of the
        package's in-place `detach_()` of the parameter (which stops the LM loss training it)."""
        import inspect
        import textwrap
        from compressive_transformer_pytorch import compressive_transformer_pytorch as ct
        src = textwrap.dedent(inspect.getsource(ct.SelfAttention.forward))
        old = ("self.to_kv.weight.detach_()\n\n"
               "    cmem_k, cmem_v = self.to_kv(compressed_mem).chunk(2, dim=-1)")
        new = "cmem_k, cmem_v = F.linear(compressed_mem, self.to_kv.weight.detach()).chunk(2, dim=-1)"
        if old not in src:
            sys.exit("compressive-transformer-pytorch: SelfAttention.forward is not the 0.4.0 one "
                     "this script patches (the in-place detach of to_kv.weight)")
        scope = dict(vars(ct))
        exec(src.replace(old, new), scope)
        ct.SelfAttention.forward = scope["forward"]

    def __init__(self, c):
        import compressive_transformer_pytorch
        from compressive_transformer_pytorch import CompressiveTransformer
        self.patch()
        self.args = dict(
            num_tokens=c["num_tokens"], dim=c["dim"], seq_len=c["seq_len"], depth=c["depth"], heads=c["heads"],
            mem_len=c["mem_len"], cmem_len=c["cmem_len"], cmem_ratio=c["cmem_ratio"], enhanced_recurrence=False,
            gru_gated_residual=False, attn_dropout=c["dropatt"], ff_dropout=c["dropout"],
            attn_layer_dropout=c["dropout"], reconstruction_attn_dropout=0.0,
            reconstruction_loss_weight=c["reconstruction_loss_weight"])
        self.model = CompressiveTransformer(**self.args)
        version = getattr(compressive_transformer_pytorch, "__version__", "0.4.0")
        self.name = f"compressive-transformer-pytorch {version}"
        self.aux = None

    def new_state(self, batch):
        return None

    def logprobs(self, x, state):
        logits, mem, aux = self.model(x, memories=state)
        self.aux = aux.sum()
        return torch.log_softmax(logits, dim=-1), mem


class RmtPeer:
    """recurrent-memory-transformer-pytorch: a step's segments read by the package's wrapper, the
    written memory of one read by the next; the memory leaves the step detached."""

    ARGS = ("num_tokens", "dim", "depth", "heads", "dim_head", "num_memory_tokens", "seq_len", "ff_mult",
            "ff_dropout", "attn_dropout", "use_xl_memories", "num_residual_streams")

    def __init__(self, c):
        from importlib.metadata import version
        from recurrent_memory_transformer_pytorch import (RecurrentMemoryTransformer,
                                                          RecurrentMemoryTransformerWrapper)
        self.model = RecurrentMemoryTransformer(**{k: c[k] for k in self.ARGS})
        self.wrapper = RecurrentMemoryTransformerWrapper(self.model, truncate_at_step=c["truncate_at_step"])
        self.args = {k: c[k] for k in (*self.ARGS, "truncate_at_step")}
        self.name = f"recurrent-memory-transformer-pytorch {version('recurrent-memory-transformer-pytorch')}"

    def new_state(self, batch):
        return None

    def logprobs(self, x, state):
        logits, memories = self.wrapper(x, state)
        return torch.log_softmax(logits, dim=-1), memories.detach()


class BlockRecurrentPeer:
    """block-recurrent-transformer-pytorch: a step is one forward over `max_seq_len` tokens, its
    blocks of `block_width` (memzoo's segments) read in turn with the states and XL memories in the
    graph; the detached ones it returns are carried to the next step (RecurrentTrainerWrapper's
    carry). Evaluation reads one block per forward, carrying the same way."""

    ARGS = ("num_tokens", "dim", "depth", "dim_head", "heads", "ff_mult", "max_seq_len", "block_width",
            "recurrent_layers", "read_recurrent_layers", "num_state_vectors", "all_layers_qk_rmsnorm")

    def __init__(self, c):
        from importlib.metadata import version
        from block_recurrent_transformer_pytorch import BlockRecurrentTransformer
        self.args = {k: c[k] for k in self.ARGS if k in c}
        args = dict(self.args)
        for k in ("recurrent_layers", "read_recurrent_layers"):
            if k in args:
                args[k] = tuple(args[k])
        self.model = BlockRecurrentTransformer(**args)
        self.name = f"block-recurrent-transformer-pytorch {version('block-recurrent-transformer-pytorch')}"

    def new_state(self, batch):
        return ([], [])

    def logprobs(self, x, state):
        memories, states = state
        logits, memories, states = self.model(x, xl_memories=memories, states=states,
                                              return_memories_and_states=True)
        return torch.log_softmax(logits, dim=-1), (memories, states)


PEERS = {"xl": XlPeer, "reformer": ReformerPeer, "memorizing": MemorizingPeer,
         "compressive": CompressivePeer, "rmt": RmtPeer, "block-recurrent": BlockRecurrentPeer}


def splits(raw, r):
    """train | test | valid, as memzoo's SplitRule::Fractions."""
    n = len(raw)
    nv, nt = math.floor(n * r["valid_fraction"]), math.floor(n * r["test_fraction"])
    return raw[: n - nv - nt], raw[n - nv:]


def evaluate(peer, valid, tgt_len, rows):
    """bpc over the whole split in `rows` contiguous rows, full segments of tgt_len, memory carried."""
    model = peer.model
    model.eval()
    t = torch.tensor(list(valid), dtype=torch.long)
    v = t[: (len(t) // rows) * rows].view(rows, -1)
    state = peer.new_state(rows)
    tot, cnt, p = 0.0, 0, 0
    with torch.no_grad():
        while p + tgt_len + 1 <= v.size(1):
            x, y = v[:, p: p + tgt_len], v[:, p + 1: p + tgt_len + 1]
            logp, state = peer.logprobs(x, state)
            tot += -logp.gather(-1, y.unsqueeze(-1)).sum().item()
            cnt += y.numel()
            p += tgt_len
    model.train()
    return tot / cnt / math.log(2), cnt


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("family", choices=sorted(PEERS))
    ap.add_argument("steps", type=int)
    ap.add_argument("eval_at")
    ap.add_argument("data")
    ap.add_argument("--config", default=None)
    ap.add_argument("--init-out", default=None,
                    help="write the seeded initial model (model.safetensors, and config.json of its "
                         "constructor's arguments, as `memzoo import` reads them) into this directory "
                         "and stop: memzoo's side then starts from the same weights")
    a = ap.parse_args()
    c, r = dict(DEFAULTS[a.family]), dict(RECIPE)
    if a.config:
        given = json.loads(a.config)
        c.update(given.get("model", {}))
        r.update(given.get("recipe", {}))
    eval_at = sorted({int(s) for s in a.eval_at.split(",") if s.strip()})
    if a.steps <= 0 or not eval_at or eval_at[0] <= 0 or eval_at[-1] > a.steps:
        sys.exit(f"STEPS must be positive and EVAL_AT within 1..STEPS, got {a.steps} and {a.eval_at}")
    window = reduce(math.gcd, eval_at, 10)

    torch.manual_seed(r["seed"])
    torch.set_num_threads(r["threads"])
    train, valid = splits(open(a.data, "rb").read(), r)
    B, T, steps = c["batch"], c["tgt_len"], a.steps
    S = T * c.get("segments_per_step", 1)  # tokens of a row read per step
    peer = PEERS[a.family](c)
    model = peer.model
    if a.init_out:
        if not hasattr(peer, "args"):
            sys.exit(f"--init-out: memzoo imports no {a.family} peer's checkpoint")
        from safetensors.torch import save_file
        os.makedirs(a.init_out, exist_ok=True)
        state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
        save_file(state, os.path.join(a.init_out, "model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(a.init_out, "config.json"), "w") as f:
            json.dump(peer.args, f, indent=1)
        log(f"[{a.family} peer] initial weights written to {a.init_out}")
        return
    params = sum(p.numel() for p in model.parameters())
    print(json.dumps({"kind": "quality-peer", "family": a.family, "impl": peer.name, "params": params,
                      "model": c, "recipe": r}), flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=r["lr"], weight_decay=r["weight_decay"],
                            betas=(r["beta_1"], r["beta_2"]), eps=r["eps"])

    def lr_at(s):
        if s < r["warmup"]:
            return r["lr"] * (s + 1) / r["warmup"]
        p = (s - r["warmup"]) / max(1, steps - r["warmup"])
        return r["lr"] * 0.5 * (1 + math.cos(math.pi * min(p, 1.0)))

    t = torch.tensor(list(train), dtype=torch.long)
    rows = t[: (len(t) // B) * B].view(B, -1)
    state, pos, losses, train_s = peer.new_state(B), 0, [], 0.0
    model.train()
    for s in range(steps):
        t0 = time.perf_counter()
        if pos + S + 1 > rows.size(1):
            pos, state = 0, peer.new_state(B)
        x, y = rows[:, pos: pos + S], rows[:, pos + 1: pos + S + 1]
        pos += S
        for g in opt.param_groups:
            g["lr"] = lr_at(s)
        logp, state = peer.logprobs(x, state)
        loss = -logp.gather(-1, y.unsqueeze(-1)).mean()
        aux = getattr(peer, "aux", None)
        opt.zero_grad(set_to_none=True)
        (loss if aux is None else loss + aux).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), r["clip"])
        opt.step()
        losses.append(loss.item())
        train_s += time.perf_counter() - t0
        if (s + 1) % window == 0:
            log(f"[{a.family} peer] step {s + 1}: loss {sum(losses[-window:]) / window:.4f}  "
                f"{train_s / (s + 1):.3f} s/step")
        if s + 1 in eval_at:
            t1 = time.perf_counter()
            bpc, cnt = evaluate(peer, valid, T, c.get("eval_rows", B))
            print(json.dumps({"kind": "quality", "family": a.family, "impl": peer.name, "step": s + 1,
                              "valid_bpc": bpc, "train_loss": sum(losses[-window:]) / window,
                              "wall_s": round(train_s, 2), "valid_tokens": cnt,
                              "eval_s": round(time.perf_counter() - t1, 2)}), flush=True)


if __name__ == "__main__":
    main()
