"""The draft model of ``spec_decode.method: draft_model`` (vLLM's draft-model proposer's model).

Three sources, exactly one given (``SpecDecodeConfig``): ``draft_preset`` (a preset with random
weights by the run's seed, or a shipped real model), ``draft_path`` (a local checkpoint directory
or GGUF file, read by the target's loader) or ``draft_target_layers: N`` (self-speculation: the
target's first N decoder layers with its embedding, final norm and LM head; the modules are the
target's own, so no weight is copied). ``draft_args_for`` gives the draft's architecture without
loading weights (preflight); ``draft_problem`` is the check between the two models: the same
vocabulary, and N in ``[1, num_layers - 1]``.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from mrv2_prof.runner.config import ConfigError, ModelSpec, SpecDecodeConfig, invalid
from mrv2_prof.runner.model.args import CheckpointError, ModelArgs
from mrv2_prof.runner.model.checkpoint_args import model_args_for, preset_names
from mrv2_prof.runner.model.decoder import LlamaForCausalLM
from mrv2_prof.runner.model.loader import load_model
from mrv2_prof.runner.model.model_kernels import ModelKernels
from mrv2_prof.runner.model.presets import PRESETS


def draft_args_for(spec: SpecDecodeConfig, target: ModelArgs) -> ModelArgs:
    """The draft model's architecture (no weights read)."""
    if spec.draft_target_layers is not None:
        return replace(target, num_hidden_layers=spec.draft_target_layers)
    if spec.draft_preset is not None:
        if spec.draft_preset in PRESETS:
            return PRESETS[spec.draft_preset]
        if spec.draft_preset not in preset_names():
            name = repr(spec.draft_preset)[:60]
            raise invalid("spec_decode.draft.preset", f"{name} is not one of {preset_names()}")
    field = "preset" if spec.draft_preset is not None else "path"
    try:  # a shipped model's GGUF or a checkpoint path, read as model.preset / model.path are
        return model_args_for(ModelSpec(preset=spec.draft_preset, path=spec.draft_path))
    except (ConfigError, CheckpointError) as exc:
        raise invalid(f"spec_decode.draft.{field}", str(exc)) from None


def draft_problem(
    spec: SpecDecodeConfig, target: ModelArgs, draft: ModelArgs
) -> tuple[str, str] | None:
    """``(field under runner.spec_decode, problem)`` when the draft cannot draft for the target."""
    n = spec.draft_target_layers
    if n is not None and not 1 <= n <= target.num_hidden_layers - 1:
        return (
            "draft.target_layers",
            f"must be in [1, {target.num_hidden_layers - 1}] (the target has "
            f"{target.num_hidden_layers} layers), got {n}",
        )
    if draft.vocab_size != target.vocab_size:
        name = "draft.preset" if spec.draft_preset is not None else "draft.path"
        return (
            name,
            f"the draft model's vocabulary ({draft.vocab_size:,}) is not the target's "
            f"({target.vocab_size:,})",
        )
    return None


def check_draft(spec: SpecDecodeConfig, target: ModelArgs, draft: ModelArgs) -> None:
    """``draft_problem`` as a ``ConfigError`` naming the field."""
    problem = draft_problem(spec, target, draft)
    if problem is not None:
        raise invalid(f"spec_decode.{problem[0]}", problem[1])


def self_draft(target: LlamaForCausalLM, num_layers: int) -> LlamaForCausalLM:
    """The target's first ``num_layers`` layers, embedding, final norm and LM head as a model of
    its own: the same module objects (the same weights), no copy."""
    with torch.device("meta"):
        draft = LlamaForCausalLM(replace(target.args, num_hidden_layers=0), target.kernels)
    draft.args = replace(target.args, num_hidden_layers=num_layers)
    inner = draft.model
    inner.embed_tokens = target.model.embed_tokens
    inner.layers = nn.ModuleList(target.model.layers[:num_layers])
    inner.norm = target.model.norm
    inner.rotary_emb = target.model.rotary_emb
    if not target.args.tie_word_embeddings:
        draft.lm_head = target.lm_head
    return draft


def build_draft(
    spec: SpecDecodeConfig,
    target: LlamaForCausalLM,
    model_spec: ModelSpec,
    device: torch.device,
    dtype: torch.dtype,
    kernels: ModelKernels,
) -> LlamaForCausalLM:
    """The draft model on ``device`` in ``dtype``, checked against the target."""
    if spec.draft_target_layers is not None:
        check_draft(spec, target.args, replace(target.args, num_hidden_layers=1))
        return self_draft(target, spec.draft_target_layers)
    if spec.draft_preset is not None:
        source = ModelSpec(preset=spec.draft_preset, seed=model_spec.seed)
    else:
        source = ModelSpec(preset=None, path=spec.draft_path)
    check_draft(spec, target.args, draft_args_for(spec, target.args))
    draft, _ = load_model(source, device, dtype, kernels=kernels)
    return draft
