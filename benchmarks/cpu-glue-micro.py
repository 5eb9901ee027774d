"""Issue 33: each elementwise op of a decoder layer, torch (as models/llama.py computed it) against the C glue
(kernels/cpu_glue.c), random-qwen2-100m shapes at 64 and 2,048 rows, two threads, median of 20.

    THP_MEM_ALLOC_ENABLE=1 .venv/bin/python benchmarks/cpu-glue-micro.py
"""
import torch, time, torch.nn.functional as F
torch.set_num_threads(2)
from rill.kernels import cpu_glue
from rill.models.rope import apply_rotary
from rill.kernels import reference
def bench(f, n=20):
    f(); ts=[]
    for _ in range(n):
        t=time.perf_counter(); f(); ts.append(time.perf_counter()-t)
    ts.sort(); return ts[len(ts)//2]*1000
for T in (64, 2048):
    x = torch.randn(T, 768); w = torch.randn(768); d = torch.randn(T,768)
    def tnorm():
        y = x.float(); y = y*torch.rsqrt(y.pow(2).mean(-1, keepdim=True)+1e-6); return w*y
    print(T, "rmsnorm torch %.3f C %.3f" % (bench(tnorm), bench(lambda: cpu_glue.rms_norm(x, w, 1e-6))))
    print(T, "add+rmsnorm torch %.3f C %.3f" % (bench(lambda: (x+d, tnorm())), bench(lambda: cpu_glue.rms_norm(x, w, 1e-6, delta=d))))
    gu = torch.randn(T, 4096)
    def tsilu():
        g,u = gu.split(2048,-1); return F.silu(g)*u
    print(T, "silu_mul torch %.3f C %.3f" % (bench(tsilu), bench(lambda: cpu_glue.silu_mul(gu))))
    H,Hkv,D=12,4,64
    qkv = torch.randn(T,(H+2*Hkv)*D); pos=torch.arange(T)
    inv = 1.0/(10000**(torch.arange(0,D,2).float()/D)); fr = pos.float()[:,None]*inv[None]; emb=torch.cat((fr,fr),-1)
    cos, sin = emb.cos()[:,None,:], emb.sin()[:,None,:]
    kc = torch.zeros(4096,16,Hkv,D); vc = torch.zeros_like(kc); slots = torch.arange(T)*3
    def trot():
        q,k,v = qkv.split([H*D,Hkv*D,Hkv*D],-1)
        q=apply_rotary(q.view(T,H,D),cos,sin); k=apply_rotary(k.reshape(T,Hkv,D),cos,sin)
        reference.write_kv(k, v.reshape(T,Hkv,D), kc, vc, slots)
    print(T, "rotary+kv torch %.3f C %.3f" % (bench(trot), bench(lambda: cpu_glue.rotary_write_kv(qkv, cos, sin, H, Hkv, kc, vc, slots))))
