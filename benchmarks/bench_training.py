"""Sanitizer overhead on a training loop: forward, backward and the
optimizer step on a model, with the next batch prefetched on a side stream
(copied there, the compute stream waits for it, ``record_stream`` hands it
over).  ``--model mlp``: an MLP and Adam; ``--model transformer``: a
GPT-style decoder (token and position embeddings, causal self-attention,
MLP, layer norms, tied output head) trained on next-token loss with AdamW.  Variants:
none, CSAN (torch.cuda._sanitizer), the lifetime sanitizer, the lifetime
sanitizer with the allocator shim; each in its own process, rounds
alternating.  The loop is race-free and every free is covered: no variant
may report anything that fails a check.

    python benchmarks/bench_training.py [--rounds 3] [--steps 30] [--repeats 5]
    python benchmarks/bench_training.py --model transformer [--layers 2] [--width 256] [--batch 8]
    python benchmarks/bench_training.py --device sim   # CPU: simulated streams
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from variants import alternate, run_child  # noqa: E402


VOCAB, CONTEXT = 1024, 64


def _mlp(nn, width: int):
    return nn.Sequential(
        nn.Linear(width, 4 * width), nn.ReLU(), nn.Linear(4 * width, 4 * width), nn.ReLU(),
        nn.Linear(4 * width, width),
    )


def _decoder(torch, width: int, layers: int):
    """A GPT-style decoder: embeddings, pre-norm blocks of causal
    self-attention (scaled_dot_product_attention) and an MLP, a tied head;
    called on token ids, it returns the next-token loss."""
    nn, F = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
            self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
            self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, 4, c // 4).permute(2, 0, 3, 1, 4)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
            return x + self.mlp(self.norm2(x))

    class Decoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tokens, self.positions = nn.Embedding(VOCAB, width), nn.Embedding(CONTEXT, width)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.norm = nn.LayerNorm(width)

        def forward(self, ids):
            x = self.tokens(ids[:, :-1]) + self.positions.weight[: ids.shape[1] - 1]
            for block in self.blocks:
                x = block(x)
            logits = self.norm(x) @ self.tokens.weight.t()
            return F.cross_entropy(logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1))

    return Decoder()


class Loop:
    def __init__(self, device: str, width: int, batch: int, model: str = "mlp", layers: int = 2) -> None:
        import torch

        self.torch = torch
        self.transformer = model == "transformer"
        if self.transformer:
            make = lambda: torch.randint(0, VOCAB, (batch, CONTEXT + 1))  # noqa: E731
        else:
            make = lambda: torch.randn(batch, width)  # noqa: E731
        if device == "cuda":
            self.target = "cuda"
            self.side, self.main = torch.cuda.Stream(), torch.cuda.current_stream()
            self.stream = torch.cuda.stream
            host = [make().pin_memory() for _ in range(4)]
        else:
            from npu_lifetime import simdevice as sd

            self.target = "cpu"
            self.side, self.main = sd.Stream(), sd.default_stream()
            self.stream = sd.stream
            host = [make() for _ in range(4)]
        torch.manual_seed(0)
        if self.transformer:
            self.model = _decoder(torch, width, layers).to(self.target)
            self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        else:
            self.model = _mlp(torch.nn, width).to(self.target)
            self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-4)
        self.host = host
        self.side.wait_stream(self.main)  # the host batches (device memory on sim) exist before the loop
        self.x = self._fetch(0)
        self.main.wait_stream(self.side)
        self.x.record_stream(self.main) if device == "cuda" else self._record(self.x)

    def _record(self, t) -> None:
        import npu_lifetime

        npu_lifetime.record_stream(t, self.main)

    def _fetch(self, i: int):
        with self.stream(self.side):
            return self.host[i % len(self.host)].to(self.target, non_blocking=True, copy=True)

    def step(self, i: int) -> None:
        nxt = self._fetch(i + 1)  # prefetch on the side stream, overlapping the step
        loss = self.model(self.x) if self.transformer else self.model(self.x).pow(2).mean()
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.main.wait_stream(self.side)  # the compute stream waits for the prefetch
        if self.target == "cuda":
            nxt.record_stream(self.main)  # allocated on side, used on main: the free waits for main
        else:
            self._record(nxt)
        self.x = nxt

    def run(self, steps: int) -> None:
        for i in range(steps):
            self.step(i)
        first = next(self.model.parameters())
        float(first.reshape(-1)[0])  # a host read-back: synchronises like a real loop's logging


def count_ops(fn) -> int:
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return Count.n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child")
    parser.add_argument("--device", default="cuda", choices=["cuda", "sim"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch", type=int, default=None, help="default: 64 (mlp), 8 (transformer)")
    parser.add_argument("--model", choices=["mlp", "transformer"], default="mlp")
    parser.add_argument("--layers", type=int, default=2, help="transformer blocks")
    parser.add_argument("--floor", action="store_true",
                        help="also time an empty TorchDispatchMode: torch's dispatch floor under any such sanitizer")
    args = parser.parse_args()
    if args.batch is None:
        args.batch = 8 if args.model == "transformer" else 64
    if args.child:
        import torch

        torch.set_num_threads(1)
        state: dict = {}

        def warm_up():
            state["loop"] = Loop(args.device, args.width, args.batch, args.model, args.layers)
            state["loop"].run(3)
            state["ops"] = count_ops(lambda: state["loop"].step(0)) * args.steps

        def timed():
            state["loop"].run(args.steps)
            if args.device == "cuda":
                torch.cuda.synchronize()
            return state["ops"]

        run_child(args.child, args.device, warm_up, timed, args.repeats)
        return
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("bench_training: no CUDA device here; run with --device sim on CPU")
    alternate(__file__, args.device, args.rounds,
              ["--steps", str(args.steps), "--repeats", str(args.repeats), "--width", str(args.width),
               "--batch", str(args.batch), "--model", args.model, "--layers", str(args.layers)],
              _describe(args), floor=args.floor)


def _describe(args) -> str:
    if args.model == "transformer":
        model = (f"GPT-style decoder ({args.layers} blocks, width {args.width}, context {CONTEXT}, "
                 f"vocabulary {VOCAB}), batch {args.batch}, AdamW")
    else:
        model = f"MLP {args.width}, batch {args.batch}, Adam"
    return f"training loop ({model}, prefetch side stream), {args.steps} steps"


if __name__ == "__main__":
    main()
