"""Per-rank parameter + optimiser-state memory of the FSDP2 learner (issue 15, item 4): 2 ranks vs 1 process.

A ~58M-parameter Llama (vocab 32000, hidden 512, 8 layers, MLP 1408, untied head) trains one AdamW step on
random tokens, either in one process or sharded over 2 gloo processes on this machine with the learner's
own :func:`tandem.train.fsdp.shard_module` and :func:`tandem.train.optim.build_optimizer`. After the step
each process reports the bytes it holds of parameters (the local shard of each DTensor) and of optimiser
state (AdamW's ``exp_avg``/``exp_avg_sq`` local shards and ``step``): :func:`tandem.train.fsdp.local_bytes`.
The issue's target: each rank's parameters + optimiser state <= 60% of one process's. Gradients (fp32,
measured before ``zero_grad``; FSDP2 keeps only the local shard after the reduce-scatter) are reported
beside them, and in a second share that includes them.

The decoupled learner's rank 0 shards its policy in place like every rank and keeps no plain copy; after
the step each rank therefore also runs rank 0's weight publish, streamed from the shards
(:func:`tandem.train.fsdp.stream_full`: one ``full_tensor`` per state-dict entry, a collective) into a real
shared-memory weight channel (:meth:`SharedMemoryWeights.publish_stream`), and the transient plain copy
that its held-out evaluation and the run checkpoint's ``model/`` folder gather
(:func:`tandem.train.fsdp.unsharded_copy`). Reported for rank 0: the bytes it holds (shards + AdamW shard,
plus the storage of any plain parameter still alive, found by a scan of the live objects), the largest
gathered tensor alive at once while publishing, and the size of the transient copy. The colocated
learner's rank 0 keeps a plain copy (the HF rollout engine's weights): reported as the shards plus one
parameter copy.

``--lora R`` wraps the model with LoRA adapters of rank R on every linear layer but the head (PEFT, as
``model.lora`` does): the frozen base is sharded with its layer, only the adapters have gradients and
AdamW state, and rank 0's publish merges each adapted layer from the streamed entries
(:func:`tandem.models.lora.publishable_entries`) under the base model's names. A colocated learner keeps the
frozen base whole on every rank instead and shards only the adapters (rank 0's sharded module shares the
base with its rollout copy): measured in a second step with ``replicate_frozen``, reported per rank.

``--critic`` measures PPO's separate value model instead (``critic`` in a config with ``trainer.strategy:
fsdp2``): the same Llama's decoder with a scalar head (:class:`tandem.models.value.ValueModel`), sharded in
place on every rank with ``values`` as its FSDP forward, one AdamW step on a value loss. No rank keeps a
plain copy of it (it is never published or generated from), so the per-rank share is the whole story.

``--reference`` measures the KL reference (β > 0, a model of its own): frozen, no optimiser, sharded in
place on every rank (:func:`tandem.orchestration.dp_learner.shard_reference`) and read by no-grad forwards.
Reported per rank after such a forward: its shard's bytes and the storage of plain parameters still alive;
also without ``set_reshard_after_forward(True)``, to show what FSDP2 would keep gathered (the root's
embeddings and head: a frozen model runs no backward to reshard them).

    OMP_NUM_THREADS=1 .venv/bin/python bench/fsdp2_memory.py [--world 2] [--param-dtype bfloat16] [--cpu-offload]
        [--lora 8 | --critic | --reference]
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing as mp
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from transformers import LlamaConfig, LlamaForCausalLM

from tandem.channels.weights import SharedMemoryWeights
from tandem.config.trainer import TrainerConfig
from tandem.models.lora import apply_lora, is_lora, publishable_entries
from tandem.models.value import ValueModel
from tandem.train.distributed import host_store, init_group, join_store
from tandem.train.fsdp import local_bytes, shard_module, stream_full, unsharded_copy
from tandem.train.optim import build_optimizer

SIZES = {"vocab_size": 32000, "hidden_size": 512, "num_hidden_layers": 8, "intermediate_size": 1408}


def _model(lora: int = 0) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = LlamaConfig(**SIZES, num_attention_heads=8, num_key_value_heads=8, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    if lora:
        model = apply_lora(model, r=lora, alpha=2.0 * lora, dropout=0.0, target_modules="all-linear")
    return model


def _critic() -> ValueModel:
    """PPO's separate value model on the same Llama: its decoder (no LM head) and a scalar head."""
    return ValueModel(_model().model, SIZES["hidden_size"])


def _measure(
    sharded: bool,
    fsdp: dict | None = None,
    rank: int = 0,
    lora: int = 0,
    critic: bool = False,
    replicate: bool = False,
) -> dict[str, int]:
    model = _critic() if critic else _model(lora)
    if sharded:
        shard_module(
            model,
            **(fsdp or {}),
            forward_methods=("values",) if critic else (),
            replicate_frozen=replicate,
        )
    optimizer = build_optimizer(model, TrainerConfig(lr=1e-4))
    ids = torch.randint(0, SIZES["vocab_size"], (2, 32), generator=torch.Generator().manual_seed(1))
    if critic:  # a value loss over 16 prompt and 16 response tokens per row
        mask = torch.ones(2, 16, dtype=torch.bool)
        model.values(ids[:, :16], mask, ids[:, 16:], mask).pow(2).mean().backward()
    else:
        model(input_ids=ids, labels=ids).loss.backward()
    grads = sum(_local(p.grad).numel() * 4 for p in model.parameters() if p.grad is not None)
    trainable = sum(_local(p).numel() * 4 for p in model.parameters() if p.requires_grad)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    params = local_bytes(model)
    out = {
        "params": params,
        "optim": local_bytes(model, optimizer) - params,
        "grads": grads,
        "trainable": trainable,
    }
    if sharded and not critic and not replicate:
        out.update(_decoupled_reads(model, rank))
    return out


def _measure_reference(sharded: bool, fsdp: dict | None = None, reshard: bool = True) -> dict[str, int]:
    """A frozen reference after one no-grad forward: its local bytes and the plain parameter storage alive
    (0 when every unit is resharded)."""
    model = _model()
    model.eval()
    model.requires_grad_(False)
    if sharded:
        shard_module(model, **(fsdp or {}))
        if reshard:
            model.set_reshard_after_forward(True)  # as shard_reference does
    ids = torch.randint(0, SIZES["vocab_size"], (2, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        model(input_ids=ids)
    return {"params": local_bytes(model), "plain_alive": _plain_param_bytes()}


def _plain_param_bytes() -> int:
    """Storage bytes of every plain (not DTensor) parameter alive in this process (FSDP2's unsharded
    placeholders have their storage freed between forwards: 0)."""
    gc.collect()
    return sum(
        {
            o.untyped_storage().data_ptr(): o.untyped_storage().nbytes()
            for o in gc.get_objects()
            if type(o) is torch.nn.Parameter
        }.values()
    )


def _decoupled_reads(model: torch.nn.Module, rank: int) -> dict[str, int]:
    """Rank 0's streamed publish into a shared-memory weight channel and its transient plain copy (the
    other ranks join each gather); what rank 0 holds before and during them."""
    if rank != 0:
        for _ in stream_full(model):  # the publish
            pass
        for _ in stream_full(model):  # the transient copy
            pass
        return {}
    held_plain = _plain_param_bytes()
    names = _model().state_dict() if is_lora(model) else model.state_dict()  # published: the base's names
    meta = {n: torch.empty(t.shape, dtype=t.dtype, device="meta") for n, t in names.items()}
    del names
    sink = SharedMemoryWeights(meta)
    peak = 0

    def watched():
        nonlocal peak
        for name, t in stream_full(model):
            peak = max(peak, t.numel() * t.element_size())  # one gathered tensor alive at a time
            yield name, t

    try:
        published = sink.publish_stream(publishable_entries(model, watched()), 1)
    finally:
        sink.unlink()
    copy = unsharded_copy(model, stream_full(model))
    copy_bytes = sum(p.numel() * p.element_size() for p in copy.parameters())
    del copy
    return {
        "held_plain": held_plain,
        "publish_peak": peak,
        "published": published,
        "copy": copy_bytes,
        "after_plain": _plain_param_bytes(),
    }


def _print_reference(one: dict, ranks: list[dict], world: int, fsdp: dict) -> None:
    mb = 2**20
    print(
        f"KL reference: {one['params'] / 4 / 1e6:.1f}M parameters (fp32, frozen), world size {world} "
        f"(gloo, CPU), {fsdp}; after one no-grad forward"
    )
    print(f"1 process: {one['params'] / mb:.1f} MB of parameters")
    for r, m in enumerate(ranks):
        held = m["resharded"]["params"] + m["resharded"]["plain_alive"]
        kept = m["root_kept"]["params"] + m["root_kept"]["plain_alive"]
        print(
            f"rank {r}: {held / mb:.1f} MB = {held / one['params']:.1%} of one process (shard "
            f"{m['resharded']['params'] / mb:.1f} MB, plain storage alive {m['resharded']['plain_alive']} B); "
            f"without resharding the root after the forward: {kept / mb:.1f} MB = {kept / one['params']:.1%}"
        )


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def _rank(
    rank: int, world: int, port: int, out: str, fsdp: dict, lora: int, critic: bool, reference: bool
) -> None:
    torch.set_num_threads(1)
    init_group(join_store(port, world, 120.0), rank, world, "gloo")
    try:
        if reference:
            measured = {
                "resharded": _measure_reference(True, fsdp),
                "root_kept": _measure_reference(True, fsdp, reshard=False),
            }
            Path(out, f"rank{rank}.json").write_text(json.dumps(measured))
            return
        measured = _measure(sharded=True, fsdp=fsdp, rank=rank, lora=lora, critic=critic)
        if lora:  # the colocated arrangement: the frozen base whole on every rank, only adapters sharded
            measured["colocated"] = _measure(sharded=True, fsdp=fsdp, rank=rank, lora=lora, replicate=True)
        Path(out, f"rank{rank}.json").write_text(json.dumps(measured))
    finally:
        dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--param-dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--cpu-offload", action="store_true")
    ap.add_argument("--lora", type=int, default=0, metavar="R", help="LoRA adapters of rank R (0: none)")
    ap.add_argument("--critic", action="store_true", help="PPO's separate value model instead of the policy")
    ap.add_argument("--reference", action="store_true", help="the frozen KL reference instead of the policy")
    args = ap.parse_args()
    if sum([args.critic, bool(args.lora), args.reference]) > 1:
        ap.error("choose one of --lora, --critic and --reference")
    torch.set_num_threads(1)
    fsdp = {"param_dtype": args.param_dtype, "cpu_offload": args.cpu_offload}
    if args.reference:
        one = _measure_reference(False)
    else:
        one = _measure(sharded=False, lora=args.lora, critic=args.critic)
    with tempfile.TemporaryDirectory() as out:
        store = host_store(args.world, 120.0)
        ctx = mp.get_context("spawn")
        procs = [
            ctx.Process(
                target=_rank,
                args=(r, args.world, store.port, out, fsdp, args.lora, args.critic, args.reference),
            )
            for r in range(args.world)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=600)
        if any(p.exitcode != 0 for p in procs):
            raise SystemExit(f"a rank failed: exit codes {[p.exitcode for p in procs]}")
        ranks = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(args.world)]
    if args.reference:
        _print_reference(one, ranks, args.world, fsdp)
        return
    n_params = one["params"] // 4
    total_one = one["params"] + one["optim"]
    what = "value model (decoder + scalar head)" if args.critic else "model"
    print(
        f"{what}: {n_params / 1e6:.1f}M parameters (fp32), AdamW, world size {args.world} (gloo, CPU), {fsdp}"
    )
    if args.lora:
        print(f"LoRA r={args.lora}: {one['trainable'] / 4 / 1e6:.2f}M trainable parameters (the base frozen)")

    def mb(b: int) -> str:
        return f"{b / 2**20:10.1f}"

    print(
        f"{'':>10} {'params MB':>10} {'optim MB':>10} {'p+o MB':>10} {'share':>7} {'grads MB':>10} {'share':>7}"
    )
    with_grads_one = total_one + one["grads"]
    print(
        f"{'1 process':>10} {mb(one['params'])} {mb(one['optim'])} {mb(total_one)} {'':>7} {mb(one['grads'])}"
    )
    worst = 0.0
    for r, m in enumerate(ranks):
        total = m["params"] + m["optim"]
        worst = max(worst, total / total_one)
        print(
            f"{f'rank {r}':>10} {mb(m['params'])} {mb(m['optim'])} {mb(total)} {total / total_one:7.1%} "
            f"{mb(m['grads'])} {(total + m['grads']) / with_grads_one:7.1%}"
        )
    if args.critic:
        print(f"largest rank, the value model's params + optimiser state: {worst:.1%} of one process")
        return
    r0 = ranks[0]
    held = r0["params"] + r0["optim"] + r0["held_plain"]
    print(f"largest rank, params + optimiser state: {worst:.1%} of one process (target <= 60%)")
    print(
        f"decoupled learner rank 0 (no plain copy): holds {mb(held).strip()} MB = {held / total_one:.1%} "
        f"of one process (plain parameter storage alive: {r0['held_plain']} B before the reads, "
        f"{r0['after_plain']} B after)"
    )
    print(
        f"  publish (streamed, {mb(r0['published']).strip()} MB into shared memory): peak transient "
        f"{mb(r0['publish_peak']).strip()} MB (largest single tensor) = "
        f"{(held + r0['publish_peak']) / total_one:.1%} of one process at the peak"
    )
    if args.lora:
        merge = 2 * SIZES["hidden_size"] * SIZES["intermediate_size"] * 4 + r0["trainable"]  # bound, whole
        print(
            f"  LoRA merge while publishing: one adapted layer's base weight, its adapter and the merged copy "
            f"at a time (<= {mb(merge).strip()} MB here, under the largest single tensor above)"
        )
    print(
        f"  evaluation / checkpoint model/: a transient plain copy of {mb(r0['copy']).strip()} MB = "
        f"{(held + r0['copy']) / total_one:.1%} of one process while it lives"
    )
    if args.lora:  # colocated LoRA: the base whole on every rank, shared by rank 0's module and rollout copy
        for r, m in enumerate(ranks):
            c = m["colocated"]
            copy = one["trainable"] if r == 0 else 0  # rank 0's rollout copy: its own whole adapters
            held = c["params"] + c["optim"] + copy
            print(
                f"colocated learner rank {r} (base whole, shared with the rollout copy"
                f"{'' if r == 0 else ': none here'}): {mb(held).strip()} MB = {held / total_one:.1%} (params + "
                f"optim), {(held + c['grads']) / with_grads_one:.1%} (with grads)"
            )
        return
    plain = one["params"]
    print(
        f"colocated learner rank 0 with its rollout copy (+{plain / 2**20:.1f} MB, the engine's weights): "
        f"{(r0['params'] + r0['optim'] + plain) / total_one:.1%} (params + optim), "
        f"{(r0['params'] + r0['optim'] + plain + r0['grads']) / with_grads_one:.1%} (with grads)"
    )


if __name__ == "__main__":
    main()
