"""Golden values for tests/train/optim/test_optim.cpp and test_schedule.cpp from PyTorch 1.13.

Run with /usr/bin/python3 (the python with torch) from anywhere:
    /usr/bin/python3 tests/train/optim/golden_optim.py
Writes tests/data/train/optim.golden and tests/data/train/schedule.golden.
"""
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
from golden import write_golden  # noqa: E402

import torch  # noqa: E402

DATA = os.path.join(os.path.dirname(os.path.dirname(HERE)), "data", "train")
STEPS = 5
SCALES = [1.0, 0.3, 2.0, 0.1, 0.5]  # per-step gradient scales, so that AMSGrad's running max matters

# Optimizer configurations: name -> (class, kwargs, steps at which parameter 1 has no grad, StepLR args)
CONFIGS = {
    "sgd_plain": (torch.optim.SGD, dict(lr=0.1), [], None),
    "sgd_weight_decay_only": (torch.optim.SGD, dict(lr=0.1, weight_decay=0.1), [], None),
    "sgd_momentum": (torch.optim.SGD, dict(lr=0.1, momentum=0.9), [], None),
    "sgd_dampening": (torch.optim.SGD, dict(lr=0.1, momentum=0.9, dampening=0.3), [], None),
    "sgd_nesterov": (torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True), [], None),
    "sgd_weight_decay": (torch.optim.SGD, dict(lr=0.1, momentum=0.5, weight_decay=0.05), [], None),
    "sgd_nesterov_wd_skip": (torch.optim.SGD, dict(lr=0.05, momentum=0.8, weight_decay=0.1, nesterov=True), [0, 2],
                             None),
    "adam_plain": (torch.optim.Adam, dict(lr=0.01), [], None),
    "adam_seed": (torch.optim.Adam, dict(lr=0.01, betas=(0.9, 0.98), eps=1e-9), [], None),
    "adam_weight_decay": (torch.optim.Adam, dict(lr=0.01, weight_decay=0.1), [], None),
    "adam_amsgrad": (torch.optim.Adam, dict(lr=0.01, amsgrad=True), [], None),
    "adam_amsgrad_wd": (torch.optim.Adam, dict(lr=0.02, weight_decay=0.05, amsgrad=True), [], None),
    "adam_skip": (torch.optim.Adam, dict(lr=0.01), [1, 2], None),
    "adam_steplr": (torch.optim.Adam, dict(lr=0.1), [], (2, 0.5)),
    "adamw": (torch.optim.AdamW, dict(lr=0.01), [], None),
    "adamw_wd_amsgrad": (torch.optim.AdamW, dict(lr=0.01, weight_decay=0.1, amsgrad=True), [], None),
}


def optim_goldens():
    g = torch.Generator().manual_seed(1234)
    init = [torch.randn(3, 4, generator=g, dtype=torch.float64), torch.randn(4, generator=g, dtype=torch.float64)]
    grads = [torch.randn(STEPS, 3, 4, generator=g, dtype=torch.float64),
             torch.randn(STEPS, 4, generator=g, dtype=torch.float64)]
    for k, s in enumerate(SCALES):
        grads[0][k] *= s
        grads[1][k] *= s
    out = {}
    for tag, dt in (("f64", torch.float64), ("f32", torch.float32)):
        for i in range(2):
            out["init.%s.p%d" % (tag, i)] = init[i].to(dt)
            out["grads.%s.p%d" % (tag, i)] = grads[i].to(dt)
    for name, (cls, kw, skip, steplr) in CONFIGS.items():
        for tag, dt in (("f64", torch.float64), ("f32", torch.float32)):
            params = [p.to(dt).clone().requires_grad_(True) for p in init]
            opt = cls(params, foreach=False, **kw)
            sched = torch.optim.lr_scheduler.StepLR(opt, *steplr) if steplr else None
            traj = [[], []]
            for k in range(STEPS):
                for i, p in enumerate(params):
                    p.grad = None if (i == 1 and k in skip) else grads[i][k].to(dt).clone()
                opt.step()
                if sched:
                    sched.step()
                for i, p in enumerate(params):
                    traj[i].append(p.detach().clone())
            for i in range(2):
                out["%s.%s.p%d" % (name, tag, i)] = torch.stack(traj[i])
            # final state, keyed like attograd's state_tensors() for parameters named "0", "1"
            for i, p in enumerate(params):
                for key, v in opt.state[p].items():
                    if v is None:  # SGD without momentum keeps momentum_buffer = None
                        continue
                    out["%s.%s.state.%d.%s" % (name, tag, i, key)] = (
                        v.to(torch.float64).reshape(()) if key == "step" else v)
    # clip_grad_norm_
    cg = [torch.randn(3, 4, generator=g, dtype=torch.float64), torch.randn(4, generator=g, dtype=torch.float64),
          torch.randn(2, 2, 3, generator=g, dtype=torch.float64)]
    for i in range(3):
        out["clip.grads.p%d" % i] = cg[i]
    cases = {"l2_clipped": (1.0, 2.0), "l2_unclipped": (100.0, 2.0), "l1": (0.5, 1.0), "inf": (0.5, math.inf),
             "l3": (0.7, 3.0)}
    for cname, (max_norm, norm_type) in cases.items():
        for tag, dt in (("f64", torch.float64), ("f32", torch.float32)):
            params = [torch.zeros(c.shape, dtype=dt, requires_grad=True) for c in cg]
            for p, c in zip(params, cg):
                p.grad = c.to(dt).clone()
            total = torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type)
            out["clip.%s.%s.total" % (cname, tag)] = total.to(torch.float64).reshape(())
            for i, p in enumerate(params):
                out["clip.%s.%s.p%d" % (cname, tag, i)] = p.grad
    write_golden(os.path.join(DATA, "optim.golden"), out)


def lrs(make_sched, n, base_lr=0.1):
    """The lr PyTorch sets after construction and after each of n scheduler steps (n + 1 values)."""
    p = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([p], lr=base_lr)
    sched = make_sched(opt)
    vals = [opt.param_groups[0]["lr"]]
    for _ in range(n):
        opt.step()
        sched.step()
        vals.append(opt.param_groups[0]["lr"])
    return torch.tensor(vals, dtype=torch.float64)


def schedule_goldens():
    S = torch.optim.lr_scheduler
    out = {}
    out["steplr"] = lrs(lambda o: S.StepLR(o, step_size=3, gamma=0.5), 12)
    out["constantlr"] = lrs(lambda o: S.ConstantLR(o, factor=0.25, total_iters=4), 8)
    out["cosine"] = lrs(lambda o: S.CosineAnnealingLR(o, T_max=10, eta_min=0.01), 10)

    # Warm-up + cosine (warmup 4, total 12, min_lr 0.01, base 0.1) as a LambdaLR multiplier.
    def warm_cos(s, base=0.1, warmup=4, total=12, min_lr=0.01):
        if s < warmup:
            return s / warmup
        if s >= total:
            return min_lr / base
        progress = (s - warmup) / (total - warmup)
        return (min_lr + (base - min_lr) * 0.5 * (1 + math.cos(math.pi * progress))) / base
    out["warmup_cosine"] = lrs(lambda o: S.LambdaLR(o, warm_cos), 15)

    # The seed's ScheduledOptim: before each optimizer step, n_steps += 1 and lr = lr_mul * scale(n_steps).
    def seed_lrs(lr_mul, d_model, warmup, n):
        vals, n_steps = [], 0
        for _ in range(n):
            n_steps += 1
            vals.append(lr_mul * (d_model ** -0.5) * min(n_steps ** (-0.5), n_steps * warmup ** (-1.5)))
        return torch.tensor(vals, dtype=torch.float64)
    out["noam_seed_small"] = seed_lrs(0.5, 16, 3, 8)
    out["noam_seed_big"] = seed_lrs(2.0, 512, 4000, 10)
    write_golden(os.path.join(DATA, "schedule.golden"), out)


if __name__ == "__main__":
    os.makedirs(DATA, exist_ok=True)
    optim_goldens()
    schedule_goldens()
