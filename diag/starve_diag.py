"""Diagnostic: dump marks, spans and raw trace events of the measurement cross-check runs."""
import json, os, sys
import numpy as np
import torch
from mrv2_prof.probes import gpu_timeline as gt
from mrv2_prof.probes.recording import RecordingProbe
from mrv2_prof.probes.session import ProbeSession
from mrv2_prof.runner.config import ModelSpec, RunnerConfig
from mrv2_prof.runner.core.request import SamplingParams
from mrv2_prof.runner.engine import Engine

OUT = os.environ.get("OUT", "/tmp")
marks = []
orig = gt.GpuTimeline._resolve
def _resolve(self, slot):
    orig(self, slot)
    marks.append((slot.step, list(slot.host_ns), list(slot.times)))
gt.GpuTimeline._resolve = _resolve

for mode in ["full_and_piecewise", "none"]:
    marks.clear()
    probe = RecordingProbe()
    config = RunnerConfig(device="cuda", kernels="triton", max_model_len=512, async_scheduling=True,
        cudagraph_mode=mode, cudagraph_capture_sizes=(64,), num_kv_blocks=2048)
    engine = Engine(config, ModelSpec(preset="llama-1b"), probe)
    session = ProbeSession({"cuda_events": True, "kernel_trace": True, "kernel_trace_steps": (12, 8)},
        probe, "cuda", [], trace_dir=OUT + "/kt_" + mode)
    for i in range(64):
        engine.add_request(f"r{i}", list(range(1 + i, 33 + i)), SamplingParams(max_tokens=40, ignore_eos=True))
    with session.running():
        while engine.has_unfinished_requests():
            engine.step()
            session.after_step(engine.step_index - 1)
    session.finish({})
    out = probe.drain()
    kt = session.kernel_trace
    with open(kt.raw_path) as f:
        ev = json.load(f)["traceEvents"]
    keep = [e for e in ev if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "kernel", "gpu_memcpy", "gpu_memset", "cuda_driver", "user_annotation")]
    anchor = [e for e in ev if "anchor" in str(e.get("name", "")).lower()][:3]
    sp = out["spans"]
    spans = [dict(step=int(a), track=str(b), name=str(c), start=int(d), end=int(e), starved=int(f))
             for a, b, c, d, e, f in zip(sp["step"], sp["track"], sp["name"], sp["start_ns"], sp["end_ns"], sp["starved_ns"])]
    kc = {k: v.tolist() for k, v in kt.columns.items() if hasattr(v, "tolist")}
    json.dump(dict(marks=[m for m in marks if 10 <= m[0] <= 21], spans=[s for s in spans if 10 <= s["step"] <= 21],
                   kernels=kc, launch=kt.launch_ns.tolist(), steps=list(kt.traced_steps), anchor=anchor,
                   anchor_ns=session.kernel_trace._anchor_ns, trace=keep),
              open(f"{OUT}/diag_{mode}.json", "w"))
    os.remove(kt.raw_path)
    print(mode, "done", len(keep))
