"""The Triton bundle's projection ops against their torch references (``projections_triton.py``,
``model_kernels.py``): one row takes the decode GEMV with its prologue/epilogue, three rows the
cuBLAS GEMMs beside the fused elementwise kernels. Both paths must give the reference's values
and update the residual stream in place.

Without CUDA the kernels run in Triton's interpreter (float32 and bfloat16 held as the kernels'
own tests hold them).
"""

from __future__ import annotations

import pytest
import torch

from mrv2_prof.runner.model import gemv_triton as gemv_triton_module
from mrv2_prof.runner.model import projections_triton
from mrv2_prof.runner.model.gemv_triton import prefers_gemv
from mrv2_prof.runner.model.model_kernels import (
    add_norm_linear_ref,
    mlp_down_ref,
    norm_linear_ref,
)
from mrv2_prof.runner.model.projections_triton import (
    add_norm_linear_triton,
    mlp_down_triton,
    norm_linear_triton,
)

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
TOL = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (3e-2, 2e-2)}
H, INTER, QKV = 64, 96, 96  # hidden, intermediate, q+k+v features


def tensors(m: int, dtype: torch.dtype, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator(DEVICE).manual_seed(seed)

    def randn(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=gen, device=DEVICE)).to(dtype)

    return {
        "x": randn(m, H, scale=3.0),
        "attn": randn(m, H),
        "norm": (1 + 0.3 * torch.randn(H, generator=gen, device=DEVICE)).to(dtype),
        "w_qkv": randn(QKV, H, scale=H**-0.5),
        "b_qkv": randn(QKV),
        "w_o": randn(H, H, scale=H**-0.5),
        "w_gate_up": randn(2 * INTER, H, scale=H**-0.5),
        "gate_up": randn(m, 2 * INTER),
        "w_down": randn(H, INTER, scale=INTER**-0.5),
    }


CASES = [(1, torch.float32), (1, torch.bfloat16), (3, torch.float32), (3, torch.bfloat16)]


@pytest.mark.parametrize("gemv_rows", [1, 4])
@pytest.mark.parametrize("mode", projections_triton.DECODE_GEMV_MODES)
@pytest.mark.parametrize(("m", "dtype"), CASES, ids=lambda c: str(c))
def test_projection_ops_match_their_references(m, dtype, mode, gemv_rows, monkeypatch):
    """Every batch-1 path (fused GEMV, plain GEMV, cuBLAS) gives the references' values, and so
    does each at three rows where the decode path gives the GEMV up to four
    (``gemv_triton.GEMV_ROWS``)."""
    monkeypatch.setattr(projections_triton, "DECODE_GEMV", mode)
    monkeypatch.setattr(gemv_triton_module, "GEMV_ROWS", gemv_rows)
    assert prefers_gemv(m, QKV) == (m <= gemv_rows)  # both paths are covered
    t = tensors(m, dtype, seed=m)
    atol, rtol = TOL[dtype]

    want = norm_linear_ref(t["x"], t["norm"], 1e-5, t["w_qkv"], t["b_qkv"])
    got = norm_linear_triton(t["x"], t["norm"], 1e-5, t["w_qkv"], t["b_qkv"])
    torch.testing.assert_close(got, want, atol=atol, rtol=rtol)

    args = (t["attn"], t["w_o"], None, t["norm"], 1e-5, t["w_gate_up"])
    want_gu, want_x = add_norm_linear_ref(t["x"], *args)
    x = t["x"].clone()
    got_gu, got_x = add_norm_linear_triton(x, *args)
    assert got_x is x  # the residual stream is updated in place
    torch.testing.assert_close(got_x, want_x, atol=atol, rtol=rtol)
    torch.testing.assert_close(got_gu, want_gu, atol=atol, rtol=rtol)

    want = mlp_down_ref(t["x"], t["gate_up"], t["w_down"])
    x = t["x"].clone()
    got = mlp_down_triton(x, t["gate_up"], t["w_down"])
    assert got is x
    torch.testing.assert_close(got, want, atol=atol, rtol=rtol)


def test_the_references_are_the_unfused_decoder_arithmetic():
    """Hand-composed: norm_linear = linear(rmsnorm(x)); mlp_down = x + linear(silu(g) * u)."""
    t = tensors(2, torch.float32, seed=9)
    x = t["x"]
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * t["norm"]
    want = normed @ t["w_qkv"].T + t["b_qkv"]
    torch.testing.assert_close(norm_linear_ref(x, t["norm"], 1e-5, t["w_qkv"], t["b_qkv"]), want)
    gate, up = t["gate_up"].chunk(2, dim=-1)
    want = x + (gate * torch.sigmoid(gate) * up) @ t["w_down"].T
    torch.testing.assert_close(mlp_down_ref(x, t["gate_up"], t["w_down"]), want)


def test_hybrid_folds_the_narrow_projections_and_leaves_a_wide_gate_up_to_cublas(monkeypatch):
    """``hybrid`` at batch 1 with gate/up wider than ``PLAIN_MAX_FEATURES``: QKV is the GEMV with
    the input norm folded in, o the GEMV alone, then the residual add + norm kernel and cuBLAS
    for gate/up, and down the GEMV with SiLU-and-mul folded in; the values are the references'.
    With gate/up narrow enough, the o GEMV adds into the residual and gate/up takes the norm."""
    monkeypatch.setattr(projections_triton, "DECODE_GEMV", "hybrid")
    monkeypatch.setattr(projections_triton, "PLAIN_MAX_FEATURES", QKV)  # gate/up (192) is wide
    calls = []
    gemv, add_norm = projections_triton.gemv_triton, projections_triton.fused_add_rmsnorm_triton

    def spy_gemv(x, weight, bias=None, residual=None, **kw):
        prologue = "norm" if kw.get("norm") else "silu_mul" if kw.get("silu_mul") else "-"
        calls.append(
            ("gemv", weight.shape[0], prologue, residual is not None, bool(kw.get("one_pass")))
        )
        return gemv(x, weight, bias, residual, **kw)

    def spy_add_norm(*args):
        calls.append(("add_norm",))
        return add_norm(*args)

    monkeypatch.setattr(projections_triton, "gemv_triton", spy_gemv)
    monkeypatch.setattr(projections_triton, "fused_add_rmsnorm_triton", spy_add_norm)
    t = tensors(1, torch.float32, seed=5)
    atol, rtol = TOL[torch.float32]
    got = norm_linear_triton(t["x"], t["norm"], 1e-5, t["w_qkv"], t["b_qkv"])
    want = norm_linear_ref(t["x"], t["norm"], 1e-5, t["w_qkv"], t["b_qkv"])
    torch.testing.assert_close(got, want, atol=atol, rtol=rtol)
    args = (t["attn"], t["w_o"], None, t["norm"], 1e-5, t["w_gate_up"])
    got_gu, got_x = add_norm_linear_triton(t["x"].clone(), *args)
    want_gu, want_x = add_norm_linear_ref(t["x"], *args)
    torch.testing.assert_close(got_x, want_x, atol=atol, rtol=rtol)
    torch.testing.assert_close(got_gu, want_gu, atol=atol, rtol=rtol)
    got = mlp_down_triton(t["x"].clone(), t["gate_up"], t["w_down"])
    torch.testing.assert_close(got, mlp_down_ref(t["x"], t["gate_up"], t["w_down"]), atol=atol,
                               rtol=rtol)  # fmt: skip
    assert calls == [
        ("gemv", QKV, "norm", False, True),  # the input norm in the QKV GEMV, one pass
        ("gemv", H, "-", False, False),  # o alone: cuBLAS's gate/up needs the normed row
        ("add_norm",),
        ("gemv", H, "silu_mul", True, False),  # SiLU-and-mul folded in, adding into x
    ]
    calls.clear()
    monkeypatch.setattr(projections_triton, "PLAIN_MAX_FEATURES", 2 * INTER)  # now narrow
    add_norm_linear_triton(t["x"].clone(), *args)
    assert calls == [("gemv", H, "-", True, False), ("gemv", 2 * INTER, "norm", False, True)]


@pytest.mark.parametrize("fused_mlp", [False, True])
@pytest.mark.parametrize(("m", "dtype"), CASES, ids=lambda c: str(c))
def test_add_norm_mlp_is_add_norm_linear_then_mlp_down(m, dtype, fused_mlp, monkeypatch):
    """The layer after attention in one op: with ``FUSED_MLP`` a batch of one row runs the o
    GEMV into the residual and the MLP kernel (one launch), any other batch the two ops; every
    way gives the references' composition, in place."""
    monkeypatch.setattr(projections_triton, "DECODE_GEMV", "plain")
    monkeypatch.setattr(projections_triton, "FUSED_MLP", fused_mlp)
    launched = []
    mlp = projections_triton.mlp_decode_triton
    monkeypatch.setattr(projections_triton, "mlp_decode_triton",
                        lambda *a, **k: launched.append(1) or mlp(*a, **k))  # fmt: skip
    t = tensors(m, dtype, seed=11 + m)
    args = (t["attn"], t["w_o"], None, t["norm"], 1e-5, t["w_gate_up"])
    gate_up, x = add_norm_linear_ref(t["x"], *args)
    want = mlp_down_ref(x, gate_up, t["w_down"])
    x = t["x"].clone()
    got = projections_triton.add_norm_mlp_triton(x, *args, t["w_down"])
    assert got is x
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(got, want, atol=2 * atol, rtol=rtol)
    assert len(launched) == (1 if fused_mlp and m == 1 else 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_down_silu_mul_on_the_decode_gemm_is_one_launch_with_the_same_bits(monkeypatch, dtype):
    """``DOWN_SILU_MUL`` with the decode GEMM serving three rows: the down projection is the
    GEMM alone with SiLU-and-mul as its prologue (``silu_and_mul_triton`` never runs), adding
    into the residual stream in place, with the bits of the two launches it replaces."""
    monkeypatch.setattr(projections_triton, "DECODE_GEMM", "triton")
    t = tensors(3, dtype, seed=21)
    two = mlp_down_triton(t["x"].clone(), t["gate_up"], t["w_down"])
    silu_mul = projections_triton.silu_and_mul_triton
    launched = []

    def refused(x):
        launched.append(x.shape)
        return silu_mul(x)

    monkeypatch.setattr(projections_triton, "silu_and_mul_triton", refused)
    mlp_down_triton(t["x"].clone(), t["gate_up"], t["w_down"])
    assert launched == [(3, 2 * INTER)]  # off: the SiLU-and-mul launch, then the GEMM
    launched.clear()
    monkeypatch.setattr(projections_triton, "DOWN_SILU_MUL", True)
    x = t["x"].clone()
    one = mlp_down_triton(x, t["gate_up"], t["w_down"])
    assert one is x and launched == []
    torch.testing.assert_close(one, two, atol=0, rtol=0)
    atol, rtol = TOL[dtype]
    want = mlp_down_ref(t["x"], t["gate_up"], t["w_down"])
    torch.testing.assert_close(one, want, atol=atol, rtol=rtol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_o_add_norm_on_the_decode_gemm_replaces_the_add_norm_launch(monkeypatch, dtype):
    """``O_ADD_NORM`` with the decode GEMM serving three rows: the o projection, the residual
    add and the norm are the GEMM's partials and one kernel (``fused_add_rmsnorm_triton`` never
    runs); the residual stream and gate/up have the bits of the launches they replace."""
    monkeypatch.setattr(projections_triton, "DECODE_GEMM", "triton")
    monkeypatch.setattr(projections_triton, "O_ADD_NORM", False)  # the two launches it replaces
    t = tensors(3, dtype, seed=22)
    args = (t["attn"], t["w_o"], None, t["norm"], 1e-5, t["w_gate_up"])
    two_x = t["x"].clone()
    two_gu, _ = add_norm_linear_triton(two_x, *args)
    add_norm = projections_triton.fused_add_rmsnorm_triton
    launched = []

    def counted(*a):
        launched.append(a[0].shape)
        return add_norm(*a)

    monkeypatch.setattr(projections_triton, "fused_add_rmsnorm_triton", counted)
    monkeypatch.setattr(projections_triton, "O_ADD_NORM", True)
    x = t["x"].clone()
    got_gu, got_x = add_norm_linear_triton(x, *args)
    assert got_x is x and launched == []
    torch.testing.assert_close(got_x, two_x, atol=0, rtol=0)
    torch.testing.assert_close(got_gu, two_gu, atol=0, rtol=0)
    want_gu, want_x = add_norm_linear_ref(t["x"], *args)
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(got_x, want_x, atol=atol, rtol=rtol)
    torch.testing.assert_close(got_gu, want_gu, atol=atol, rtol=rtol)


@pytest.mark.parametrize("gemm", ["cublas", "triton"])
@pytest.mark.parametrize("mode", ["plain", "fused_onepass"])
def test_gemv_rows_put_three_rows_on_the_gemv_with_its_prologues(mode, gemm, monkeypatch):
    """With ``GEMV_ROWS`` 4 a layer's projections of three rows take the GEMV as one row's do:
    (fused_onepass) QKV with the input norm, o into the residual stream, gate/up with the norm,
    down with SiLU-and-mul into the residual: no norm, add + norm or SiLU-and-mul launch; (plain)
    the GEMV for every projection, those launches between. The decode GEMM's switches for o and
    down (on) do not take rows the GEMV takes. Five rows stay off it, and the batch-1 MLP kernel
    (one row) is never taken at three."""
    monkeypatch.setattr(projections_triton, "DECODE_GEMV", mode)
    monkeypatch.setattr(projections_triton, "DECODE_GEMM", gemm)
    monkeypatch.setattr(projections_triton, "O_ADD_NORM", True)
    monkeypatch.setattr(projections_triton, "DOWN_ADD_NORM", True)
    monkeypatch.setattr(gemv_triton_module, "GEMV_ROWS", 4)
    monkeypatch.setattr(projections_triton, "FUSED_MLP", True)
    launches = []
    for name in ("gemv_triton", "rmsnorm_triton", "fused_add_rmsnorm_triton",
                 "silu_and_mul_triton"):  # fmt: skip
        kernel = getattr(projections_triton, name)
        counted = lambda *a, _k=kernel, _n=name, **kw: launches.append(_n) or _k(*a, **kw)  # noqa: E731
        monkeypatch.setattr(projections_triton, name, counted)
    t = tensors(3, torch.float32, seed=5)
    assert not projections_triton.fuses_mlp(t["attn"], t["w_o"])
    norm_linear_triton(t["x"], t["norm"], 1e-5, t["w_qkv"], t["b_qkv"])
    x = t["x"].clone()
    add_norm_linear_triton(x, t["attn"], t["w_o"], None, t["norm"], 1e-5, t["w_gate_up"])
    mlp_down_triton(x, t["gate_up"], t["w_down"])
    fused = ["gemv_triton"] * 4
    plain = ["rmsnorm_triton", "gemv_triton", "gemv_triton", "fused_add_rmsnorm_triton",
             "gemv_triton", "silu_and_mul_triton", "gemv_triton"]  # fmt: skip
    assert launches == (fused if mode == "fused_onepass" else plain)
    assert not projections_triton.fuses_down_norm(x, t["w_down"])
    assert not prefers_gemv(5, QKV) and prefers_gemv(4, QKV)
