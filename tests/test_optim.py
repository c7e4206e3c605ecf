"""The optimiser every stage steps (mem1_core.training.optim): fused where torch can, and the
update AdamW's formula (Loshchilov & Hutter; torch's bias-corrected form) gives, computed here
by a slow loop over the elements' tensors."""

from __future__ import annotations

import math

import torch

from mem1_core.training.optim import adamw, can_fuse


def reference_adamw(p, grads, lr, wd, betas=(0.9, 0.999), eps=1e-8):
    """AdamW step by step in float64: decoupled decay, moments, bias correction."""
    p = p.double().clone()
    m = torch.zeros_like(p)
    v = torch.zeros_like(p)
    for t, g in enumerate(grads, 1):
        g = g.double()
        p = p * (1 - lr * wd)
        m = betas[0] * m + (1 - betas[0]) * g
        v = betas[1] * v + (1 - betas[1]) * g * g
        m_hat = m / (1 - betas[0] ** t)
        denom = (v / (1 - betas[1] ** t)).sqrt() + eps
        p = p - lr * m_hat / denom
    return p


def test_adamw_is_fused_on_the_cpu_and_steps_as_the_formula():
    torch.manual_seed(0)
    start = torch.randn(4096)
    grads = [torch.randn(4096) for _ in range(4)]
    param = torch.nn.Parameter(start.clone())
    opt = adamw([param], lr=1e-2, weight_decay=0.1)
    assert opt.defaults["fused"] is True
    for g in grads:
        param.grad = g.clone()
        opt.step()
    want = reference_adamw(start, grads, 1e-2, 0.1)
    got = param.detach().double()
    assert torch.allclose(got, want, rtol=0, atol=1e-6)
    assert not math.isclose(float((got - start.double()).abs().max()), 0.0)


def test_parameters_the_fused_kernel_does_not_take_keep_the_default_path():
    ints = torch.nn.Parameter(torch.zeros(3, dtype=torch.int64), requires_grad=False)
    assert not can_fuse([ints]) and not can_fuse([])
    assert adamw([torch.nn.Parameter(torch.zeros(2))], 1e-3, 0.0).defaults["fused"] is True
