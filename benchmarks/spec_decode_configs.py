"""The configurations ``spec_decode.py`` compares: speculative decoding off, n-gram drafts (on
the device, and on the host), a self-draft (the target's first layers as the draft model) and
dynamic k under FULL and PIECEWISE graphs; the ``--quick`` subset; and what each one's k is,
for the markdown's header."""

from __future__ import annotations

from mrv2_prof.runner.config import SpecDecodeConfig

DYNAMIC_K = ((1, 4), (8, 2), (64, 1))
FULL = "full_and_piecewise"


def ngram(k: int, **kw) -> SpecDecodeConfig:
    return SpecDecodeConfig(method="ngram", num_speculative_tokens=k, **kw)


def self_draft(k: int) -> SpecDecodeConfig:  # its layers: --self-draft-layers
    return SpecDecodeConfig(method="draft_model", num_speculative_tokens=k, draft_target_layers=1)


CONFIGS = {  # name -> (spec decode, cudagraph_mode)
    "off": (SpecDecodeConfig(), FULL),
    "ngram k=2": (ngram(2), FULL),
    "ngram k=4": (ngram(4), FULL),
    "ngram k=4, host drafts": (ngram(4, draft_on="host"), FULL),
    "self-draft k=2": (self_draft(2), FULL),
    "self-draft k=4": (self_draft(4), FULL),
    "dynamic k": (ngram(4, dynamic_k=DYNAMIC_K), FULL),
    "dynamic k, piecewise": (ngram(4, dynamic_k=DYNAMIC_K), "piecewise"),
}
QUICK = ("off", "ngram k=4", "ngram k=4, host drafts", "dynamic k")


def k_values(names: list[str], self_draft_layers: int) -> str:
    """What the k of each configuration run is, for the markdown's header."""
    out = []
    for name in names:
        spec, _ = CONFIGS[name]
        if not spec.enabled:
            continue
        if spec.dynamic_k is not None:
            table = ", ".join(f"<= {b}: {k}" for b, k in spec.dynamic_k)
            adaptive = ", adaptive" if spec.is_adaptive else ""
            out.append(f"{name}: by running requests ({table}; more: 0{adaptive})")
        elif spec.method == "draft_model":
            out.append(
                f"{name}: {spec.num_speculative_tokens} (the first {self_draft_layers} layers)"
            )
        else:
            out.append(f"{name}: {spec.num_speculative_tokens}")
    return "; ".join(out) or "none"
