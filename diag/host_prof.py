import cProfile, pstats, io, sys, time
import torch
from mrv2_prof.runner.config import ModelSpec, RunnerConfig
from mrv2_prof.runner.core.request import SamplingParams
from mrv2_prof.runner.engine import Engine
from mrv2_prof.probes.api import Probe
for bs in (1, 64):
    config = RunnerConfig(device="cuda", kernels="triton", max_model_len=512, async_scheduling=True,
        cudagraph_mode="full_and_piecewise", cudagraph_capture_sizes=(bs,), num_kv_blocks=4096, max_num_seqs=max(bs, 1))
    eng = Engine(config, ModelSpec(preset="llama-1b"), Probe())
    for i in range(bs):
        eng.add_request(f"r{i}", list(range(1 + i, 17 + i)), SamplingParams(max_tokens=400, ignore_eos=True))
    for _ in range(50): eng.step()
    torch.cuda.synchronize()
    t0 = time.perf_counter(); n = 0
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(200): eng.step(); n += 1
    pr.disable()
    dt = (time.perf_counter() - t0) / n
    print(f"=== batch {bs}: {dt*1e6:.0f} us per step (under cProfile)")
    s = io.StringIO(); ps = pstats.Stats(pr, stream=s).sort_stats("tottime"); ps.print_stats(35); print(s.getvalue()[-9000:])
    s = io.StringIO(); ps = pstats.Stats(pr, stream=s).sort_stats("cumulative"); ps.print_stats("mrv2_prof", 45); print(s.getvalue()[-9000:])
    del eng; torch.cuda.empty_cache()
