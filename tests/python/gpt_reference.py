#!/usr/bin/env python3
"""The reference for tests/worker/gpt_test.cc: nanoGPT's GPT (karpathy/nanoGPT model.py), written
here after its formulas (the tests fetch nothing), on the pinned PyTorch, fp32 on the CPU.

Checked once against nanoGPT's own model.py (same weights: the same logits, loss, gradients, AdamW
steps and samples; the figures are in the change's note). Usage: gpt_reference.py DIR... (one
interpreter for all: importing torch takes seconds), where each DIR/request.json is
  {"config": {"n_layer", "n_head", "n_embd", "block_size", "vocab_size", "dropout", "bias"},
   "task": "parity" | "checkpoint",
   parity:     "lr", "betas", "weight_decay", "steps", "generate": {"max_new_tokens", "temperature",
               "top_k", "seed"}, "mfu": {"tokens_per_iter", "seconds", "peak_flops"}
   checkpoint: "seed"}
parity reads DIR/weights.pt (the C++ model's state dict, loaded with strict=True) and DIR/batch.pt
({"x", "y", "x0".."x<steps-1>", "y0"...}, int64 [B, T]) and writes DIR/out.pt:
  "logits", "loss" for (x, y); "grad.<name>" per parameter after loss.backward();
  "adamw.<name>" / "fused.<name>" after `steps` AdamW steps (nanoGPT's two groups: weight decay on
  dim >= 2 only) on (x<i>, y<i>), with torch.optim.AdamW's default (for-loop) and fused=True kernels;
  "generated": generate(x[:, :4]) with a torch.Generator seeded "seed" (torch.multinomial's draws);
and replies {"num_params", "num_params_all", "flops_per_token", "mfu"} (nanoGPT's get_num_params and
estimate_mfu, the latter with the given tokens, seconds and peak).
checkpoint writes DIR/ckpt.pt as nanoGPT's train.py does after torch.compile ({"model": state dict
with "_orig_mod." keys, "optimizer", "model_args", "iter_num", "best_val_loss", "config"}) for a
model initialised from "seed", moved by N(0, 0.2) and trained two steps, and DIR/out.pt {"x", "logits"} (its batch).
Prints the replies as one JSON list, in the order of the DIRs.
"""
import json
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


class Norm(nn.Module):
    """LayerNorm over the last dim, eps 1e-5, with a bias only when asked (GPT-2's has one)."""

    def __init__(self, width, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.bias = nn.Parameter(torch.zeros(width)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, (x.size(-1),), self.weight, self.bias, eps=1e-5)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.heads, self.p = cfg["n_head"], cfg["dropout"]
        width = cfg["n_embd"]
        self.c_attn = nn.Linear(width, 3 * width, bias=cfg["bias"])
        self.c_proj = nn.Linear(width, width, bias=cfg["bias"])

    def forward(self, x):
        b, t, c = x.shape
        split = [z.reshape(b, t, self.heads, c // self.heads).transpose(1, 2)
                 for z in self.c_attn(x).chunk(3, dim=-1)]
        p = self.p if self.training else 0.0
        y = F.scaled_dot_product_attention(*split, dropout_p=p, is_causal=True)
        y = y.transpose(1, 2).reshape(b, t, c)
        return F.dropout(self.c_proj(y), self.p, self.training)


class FeedForward(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.p = cfg["dropout"]
        self.c_fc = nn.Linear(cfg["n_embd"], 4 * cfg["n_embd"], bias=cfg["bias"])
        self.c_proj = nn.Linear(4 * cfg["n_embd"], cfg["n_embd"], bias=cfg["bias"])

    def forward(self, x):
        return F.dropout(self.c_proj(F.gelu(self.c_fc(x))), self.p, self.training)


class Layer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_1 = Norm(cfg["n_embd"], cfg["bias"])
        self.attn = Attention(cfg)
        self.ln_2 = Norm(cfg["n_embd"], cfg["bias"])
        self.mlp = FeedForward(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Gpt(nn.Module):
    """Token + position embeddings, pre-norm layers, final norm, head tied to the token embedding."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        width = cfg["n_embd"]
        self.transformer = nn.ModuleDict({
            "wte": nn.Embedding(cfg["vocab_size"], width),
            "wpe": nn.Embedding(cfg["block_size"], width),
            "h": nn.ModuleList(Layer(cfg) for _ in range(cfg["n_layer"])),
            "ln_f": Norm(width, cfg["bias"]),
        })
        self.lm_head = nn.Linear(width, cfg["vocab_size"], bias=False)
        self.lm_head.weight = self.transformer["wte"].weight
        self._init()

    def _init(self):
        residual_std = 0.02 / math.sqrt(2 * self.cfg["n_layer"])
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, (nn.Linear, nn.Embedding)):
                    module.weight.normal_(0.0, 0.02)
                if isinstance(module, nn.Linear) and module.bias is not None:
                    module.bias.zero_()
            for name, p in self.named_parameters():
                if name.endswith("c_proj.weight"):
                    p.normal_(0.0, residual_std)

    def forward(self, idx, targets=None):
        t = idx.size(1)
        assert t <= self.cfg["block_size"]
        tr = self.transformer
        x = F.dropout(tr["wte"](idx) + tr["wpe"](torch.arange(t)), self.cfg["dropout"], self.training)
        for layer in tr["h"]:
            x = layer(x)
        logits = self.lm_head(tr["ln_f"](x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-1)
        return logits, loss

    def num_params(self, non_embedding=True):
        n = sum(p.numel() for p in self.parameters())
        return n - self.transformer["wpe"].weight.numel() if non_embedding else n

    def flops_per_token(self):
        c = self.cfg
        return 6 * self.num_params() + 12 * c["n_layer"] * c["n_head"] * (c["n_embd"] // c["n_head"]) * c["block_size"]

    def optimizer_groups(self, weight_decay):
        params = [p for p in self.parameters() if p.requires_grad]
        return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature, top_k, generator):
        block = self.cfg["block_size"]
        for _ in range(max_new_tokens):
            logits, _ = self(idx[:, -block:])
            logits = logits[:, -1, :] / temperature
            if top_k is not None:
                kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            nxt = torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)
            idx = torch.cat([idx, nxt], dim=1)
        return idx


def adamw_weights(cfg, weights, batch, req, fused):
    model = Gpt(cfg)
    model.load_state_dict(weights, strict=True)
    opt = torch.optim.AdamW(model.optimizer_groups(req["weight_decay"]), lr=req["lr"], betas=tuple(req["betas"]),
                            **({"fused": True} if fused else {}))
    for i in range(req["steps"]):
        opt.zero_grad(set_to_none=True)
        _, loss = model(batch[f"x{i}"], batch[f"y{i}"])
        loss.backward()
        opt.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def parity(d, cfg, req):
    weights = torch.load(os.path.join(d, "weights.pt"))
    batch = torch.load(os.path.join(d, "batch.pt"))
    model = Gpt(cfg)
    model.load_state_dict(weights, strict=True)
    logits, loss = model(batch["x"], batch["y"])
    loss.backward()
    out = {"logits": logits.detach(), "loss": loss.detach()}
    out.update({"grad." + n: p.grad for n, p in model.named_parameters()})
    for kind, fused in (("adamw", False), ("fused", True)):
        out.update({f"{kind}.{n}": w for n, w in adamw_weights(cfg, weights, batch, req, fused).items()})
    g = req["generate"]
    model.eval()
    gen = torch.Generator().manual_seed(g["seed"])
    out["generated"] = model.generate(batch["x"][:, :4], g["max_new_tokens"], g["temperature"], g["top_k"], gen)
    torch.save(out, os.path.join(d, "out.pt"))
    m = req["mfu"]
    mfu = model.flops_per_token() * m["tokens_per_iter"] / m["seconds"] / m["peak_flops"]
    return {"num_params": model.num_params(), "num_params_all": model.num_params(False),
            "flops_per_token": model.flops_per_token(), "mfu": mfu}


def checkpoint(d, cfg, req):
    torch.manual_seed(req["seed"])
    model = Gpt(cfg)
    with torch.no_grad():  # logits of order 1, as trained (at init they are ~0.02)
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    opt = torch.optim.AdamW(model.optimizer_groups(0.1), lr=1e-3, betas=(0.9, 0.95))
    x = torch.randint(cfg["vocab_size"], (2, cfg["block_size"]))
    for _ in range(2):
        opt.zero_grad(set_to_none=True)
        model(x, torch.roll(x, -1, 1))[1].backward()
        opt.step()
    ckpt = {
        "model": {"_orig_mod." + k: v for k, v in model.state_dict().items()},
        "optimizer": opt.state_dict(),
        "model_args": dict(cfg),
        "iter_num": 2,
        "best_val_loss": torch.tensor(3.25),
        "config": {"out_dir": "out", "compile": True, "learning_rate": 1e-3, "betas": (0.9, 0.95),
                   "dtype": "bfloat16", "wandb_run_name": None, "eval_interval": 2000},
    }
    torch.save(ckpt, os.path.join(d, "ckpt.pt"))
    with torch.no_grad():
        logits, _ = model(x)
    torch.save({"x": x, "logits": logits}, os.path.join(d, "out.pt"))
    return {}


def main():
    torch.set_num_threads(1)
    replies = []
    for d in sys.argv[1:]:
        with open(os.path.join(d, "request.json")) as f:
            req = json.load(f)
        replies.append({"parity": parity, "checkpoint": checkpoint}[req["task"]](d, req["config"], req))
    print(json.dumps(replies))


if __name__ == "__main__":
    main()
