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


def nanogpt_factor(it, warmup_iters=2, lr_decay_iters=5):
    """nanoGPT's get_lr with learning_rate 1 and min_lr 0: a LambdaLR multiplier of each group's initial lr."""
    if it < warmup_iters:
        return (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return 0.0
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    return 0.5 * (1.0 + math.cos(math.pi * decay_ratio))


# Two parameter groups: parameter 0 (the 3x4 matrix) alone in group 0, parameter 1 (the vector) in group 1.
# name -> (class, defaults, group 0's own options, group 1's own options, scheduler factory or None)
GROUP_CONFIGS = {
    # nanoGPT's split: decay on the matrix only, with its warm-up and cosine as a LambdaLR of each group's lr
    "adamw_groups": (torch.optim.AdamW, dict(lr=0.01, betas=(0.9, 0.95), weight_decay=0.1), {},
                     dict(lr=0.02, weight_decay=0.0),
                     lambda o: torch.optim.lr_scheduler.LambdaLR(o, nanogpt_factor)),
    # group 1 overrides betas and amsgrad too; CosineAnnealingLR's eta_min is shared by the groups
    "adam_groups": (torch.optim.Adam, dict(lr=0.01, weight_decay=0.05), {},
                    dict(lr=0.003, weight_decay=0.0, betas=(0.8, 0.99), amsgrad=True),
                    lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=4, eta_min=0.001)),
    # SGD with momentum; group 1 sets its own momentum and Nesterov; StepLR halves each group's lr
    "sgd_groups": (torch.optim.SGD, dict(lr=0.1, momentum=0.9, weight_decay=0.1), dict(lr=0.2),
                   dict(lr=0.05, weight_decay=0.0, momentum=0.5, nesterov=True),
                   lambda o: torch.optim.lr_scheduler.StepLR(o, 2, 0.5)),
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
    for name, (cls, defaults, g0, g1, make_sched) in GROUP_CONFIGS.items():
        for tag, dt in (("f64", torch.float64), ("f32", torch.float32)):
            params = [p.to(dt).clone().requires_grad_(True) for p in init]
            opt = cls([dict(params=[params[0]], **g0), dict(params=[params[1]], **g1)], foreach=False, **defaults)
            sched = make_sched(opt) if make_sched else None
            traj, lrs = [[], []], []
            for k in range(STEPS):
                lrs.append([group["lr"] for group in opt.param_groups])
                for i, p in enumerate(params):
                    p.grad = grads[i][k].to(dt).clone()
                opt.step()
                if sched:
                    sched.step()
                for i, p in enumerate(params):
                    traj[i].append(p.detach().clone())
            for i in range(2):
                out["%s.%s.p%d" % (name, tag, i)] = torch.stack(traj[i])
            out["%s.%s.lr" % (name, tag)] = torch.tensor(lrs, dtype=torch.float64)  # (STEPS, 2): each update's lrs
            for i, p in enumerate(params):
                for key, v in opt.state[p].items():
                    if v is None:
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

    # nanoGPT's get_lr (train.py), written out as there; value `it` is the lr of iteration it (the update it + 1).
    def nanogpt_lrs(learning_rate, warmup_iters, lr_decay_iters, min_lr, n):
        def get_lr(it):
            # 1) linear warmup for warmup_iters steps
            if it < warmup_iters:
                return learning_rate * (it + 1) / (warmup_iters + 1)
            # 2) if it > lr_decay_iters, return min learning rate
            if it > lr_decay_iters:
                return min_lr
            # 3) in between, use cosine decay down to min learning rate
            decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
            assert 0 <= decay_ratio <= 1
            coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
            return min_lr + coeff * (learning_rate - min_lr)
        return torch.tensor([get_lr(it) for it in range(n)], dtype=torch.float64)
    # shakespeare_char's recipe (lr 1e-3, warm-up 100, decay to 1e-4 at 2000), past the end of the decay
    out["nanogpt_shakespeare"] = nanogpt_lrs(1e-3, 100, 2000, 1e-4, 2050)
    # a short run: warm-up 10, the cosine ends at 40 (before the 50 steps), floor 1e-4; also the Trainer's test
    out["nanogpt_short"] = nanogpt_lrs(1e-3, 10, 40, 1e-4, 50)
    out["nanogpt_no_warmup"] = nanogpt_lrs(6e-4, 0, 20, 6e-5, 25)
    write_golden(os.path.join(DATA, "schedule.golden"), out)


if __name__ == "__main__":
    os.makedirs(DATA, exist_ok=True)
    optim_goldens()
    schedule_goldens()
