"""Offline knowledge distillation: the forward KL from a teacher's stored top-k logits to a student.

Hinton et al. 2015 (*Distilling the Knowledge in a Neural Network*, arXiv 1503.02531) soften both
distributions with a temperature ``tau`` and scale the KL by ``tau**2`` so that its gradients keep their
size as ``tau`` changes. Storing only the teacher's ``k`` largest logits per token keeps the targets small;
the teacher distribution is then renormalised over those ``k`` tokens (exact when ``k`` is the vocabulary).
"""

from __future__ import annotations

import torch


def topk_forward_kl(
    student_logits: torch.Tensor,  # [B, T, V] float, the student's logits at each target position
    teacher_values: torch.Tensor,  # [B, T, k] float, the teacher's k largest logits there
    teacher_indices: torch.Tensor,  # [B, T, k] long, their token ids
    mask: torch.Tensor,  # [B, T] bool, positions that count
    temperature: float = 1.0,
) -> torch.Tensor:
    """Per-token ``tau**2 * KL(p_teacher || p_student)`` ``[B, T]`` (0 where ``mask`` is False), with
    ``p_teacher = softmax(teacher_values / tau)`` over its ``k`` tokens and ``p_student`` the student's
    full ``softmax(student_logits / tau)`` read at those tokens:
    ``sum_k p_k * (log p_k - log p_student(token_k))``. Differentiable in ``student_logits``.

    Naive equivalent (``k = V``): ``tau**2 * F.kl_div(log_softmax(s / tau), softmax(t / tau), "none").sum(-1)``.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if teacher_values.shape != teacher_indices.shape or teacher_values.shape[:2] != mask.shape:
        raise ValueError(
            f"topk_forward_kl: teacher values {tuple(teacher_values.shape)}, indices "
            f"{tuple(teacher_indices.shape)} and mask {tuple(mask.shape)} do not match"
        )
    log_q = torch.log_softmax(student_logits.float() / temperature, dim=-1)  # [B, T, V]
    log_q_k = log_q.gather(-1, teacher_indices.long())  # [B, T, k]
    log_p = torch.log_softmax(teacher_values.float() / temperature, dim=-1)  # [B, T, k]
    kl = (log_p.exp() * (log_p - log_q_k)).sum(-1) * temperature**2  # [B, T]
    return torch.where(mask.to(torch.bool), kl, torch.zeros_like(kl))
