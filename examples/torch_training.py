"""A PyTorch model whose layer is a reversible kernel: a pendulum integrated over 10^5
leapfrog steps (tools/bench/programs.py's `leapfrog`), its start and time step learned.

    python examples/torch_training.py [--steps N] [--epochs E] [--compare N1,N2]
                                      [--engine interp|python|native]

The model: a linear layer maps a feature vector to the pendulum's initial angle and
momentum; the rvm layer integrates N steps (`rvm.to_torch(leapfrog)`), with a learned
time step; the loss is the distance of the final state from an observed one. Adam trains
it. Then one forward and backward pass of the same model with the integrator written in
plain PyTorch (autograd records every step) is compared with the rvm layer's, at two step
counts (default 5,000 and 50,000: plain PyTorch needs about 4 KB and 0.5 ms per step):

- the memory held between the forward and the backward pass (the process's resident
  memory after the forward pass, over its value before; and the bytes of tensors autograd
  saved): plain PyTorch's grows with the step count, the rvm layer's stays flat (it
  saves its four inputs; its backward pass recomputes the states by running the
  integrator backwards);
- the gradients of every parameter, which agree to about 1e-13.
"""

import argparse
import pathlib
import sys
import time

import torch

import rvm

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tools" / "bench"))
from programs import leapfrog  # (the benchmarks' pendulum, reused)

F64 = torch.float64
LEAPFROG = rvm.to_torch(leapfrog)       # (main() may choose an engine)


def plain_leapfrog(q, p, n: int, dt):
    """The same integrator in plain PyTorch: autograd records each step."""
    for _ in range(n):
        p = p - dt * torch.sin(q)
        q = q + dt * p
    return q, p


class Pendulum(torch.nn.Module):
    def __init__(self, steps: int, rvm_layer: bool = True):
        super().__init__()
        self.steps, self.rvm_layer = steps, rvm_layer
        self.encoder = torch.nn.Linear(3, 2, dtype=F64)
        self.log_dt = torch.nn.Parameter(torch.tensor(-9.0, dtype=F64))

    def forward(self, features):
        q0, p0 = self.encoder(features)
        dt = torch.exp(self.log_dt)
        if self.rvm_layer:
            q, p, _, _ = LEAPFROG(q0, p0, self.steps, dt)
        else:
            q, p = plain_leapfrog(q0, p0, self.steps, dt)
        return torch.stack([q, p])


def kept_for_backward(model, features, target):
    """(loss, bytes of tensors autograd keeps for the backward pass, resident memory
    growth in bytes, seconds for forward and backward, the gradients)."""
    saved = []

    def pack(t):
        saved.append(t.numel() * t.element_size())
        return t

    model.zero_grad()
    rss = resident()
    start = time.perf_counter()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = torch.sum((model(features) - target) ** 2)
    grown = resident() - rss
    loss.backward()
    seconds = time.perf_counter() - start
    grads = [p.grad.clone() for p in model.parameters()]
    return float(loss), sum(saved), grown, seconds, grads


def flat(grads) -> str:
    return " ".join(f"{v:.12g}" for g in grads for v in g.reshape(-1).tolist())


def resident() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096
    except OSError:
        return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--epochs", type=int, default=150)
    parser.add_argument("--compare", default="5000,50000",
                        help="step counts of the comparison with plain PyTorch")
    parser.add_argument("--engine", default=None, help="rvm's engine (default: rvm's)")
    args = parser.parse_args(argv)
    global LEAPFROG
    LEAPFROG = rvm.to_torch(leapfrog, **({"engine": args.engine} if args.engine else {}))
    torch.manual_seed(0)
    features = torch.tensor([1.0, -0.5, 0.25], dtype=F64)
    with torch.no_grad():             # the observation: a pendulum from (1.0, 0.3), T = 1
        q, p, _, _ = LEAPFROG(torch.tensor(1.0, dtype=F64), torch.tensor(0.3, dtype=F64),
                              args.steps, torch.tensor(1.0 / args.steps, dtype=F64))
    target = torch.stack([q, p])

    model = Pendulum(args.steps)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    start = time.perf_counter()
    for epoch in range(args.epochs):
        opt.zero_grad()
        loss = torch.sum((model(features) - target) ** 2)
        loss.backward()
        opt.step()
        if epoch % 50 == 0 or epoch == args.epochs - 1:
            print(f"epoch {epoch:4d}  loss {loss.item():.3e}")
    print(f"{args.epochs} epochs of {args.steps} leapfrog steps through rvm: "
          f"{time.perf_counter() - start:.2f} s; learned dt = {model.log_dt.exp().item():.3e}")

    print("\nOne forward and backward pass, the rvm layer against plain PyTorch autograd:")
    plain = Pendulum(args.steps, rvm_layer=False)
    plain.load_state_dict(model.state_dict())
    print(f"{'steps':>8}  {'':8} {'memory held':>12} {'tensors saved':>14} {'seconds':>8}")
    for steps in (int(n) for n in args.compare.split(",")):
        model.steps = plain.steps = steps
        rows = [("rvm", kept_for_backward(model, features, target)),
                ("PyTorch", kept_for_backward(plain, features, target))]
        for who, (_, saved, grown, seconds, _) in rows:
            print(f"{steps:>8d}  {who:8} {max(grown, 0) / 2**20:>8.1f} MiB "
                  f"{saved:>12,d} B {seconds:>8.2f}")
        (_, _, _, _, grads_r), (_, _, _, _, grads_p) = rows[0][1], rows[1][1]
        worst = max(float(torch.max(torch.abs(a - b) / (torch.abs(b) + 1e-300)))
                  for a, b in zip(grads_r, grads_p))
        print(f"{'':10}gradients (rvm):     {flat(grads_r)}")
        print(f"{'':10}gradients (PyTorch): {flat(grads_p)}")
        print(f"{'':10}largest relative difference {worst:.1e}")


if __name__ == "__main__":
    main()
