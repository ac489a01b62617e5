import torch
from augury.kernels import requantize, reference
from augury.models.gguf import open_gguf
r = open_gguf("/root/.cache/augury/models/qwen2.5-coder-0.5b-instruct.gguf")
D = tuple(-10.0 + 0.5 * i for i in range(8))
counts = torch.zeros(len(D))
gain_loss = {}
for t in r.tensors:
    if not (t.name.startswith("blk.3.") or t.name.startswith("blk.17.")) or t.tensor_type.name not in reference.BLOCK_SHAPES: continue
    raw = torch.from_numpy(t.data.copy()).reshape(int(t.shape[1]), -1)
    x = reference.dequantize(t.tensor_type.name, raw).reshape(-1, 32)
    m = requantize._signed_max(x); x64 = x.double()
    gains = []
    for c in D:
        scale = torch.full_like(m, c) / m
        l = (x*scale).round().clamp(-8,7).double()
        xq=(x64*l).sum(1); qq=(l*l).sum(1)
        gains.append(torch.where(qq>0, xq*xq/qq.clamp(min=1), torch.zeros_like(qq)))
    g = torch.stack(gains, 1)
    best = g.argmax(1)
    counts += torch.bincount(best, minlength=len(D)).float()
    e = (x64*x64).sum(1)
    for name, idx in (("rtn(-8)", [D.index(-8.0)]), ("neg only", [i for i,c in enumerate(D) if c<0]), ("to -9", [i for i,c in enumerate(D) if c >= -9.01]), ("to -10", [i for i,c in enumerate(D) if c >= -10.01]), ("step .5 to -10", [i for i,c in enumerate(D) if c >= -10.01 and c*2==int(c*2)]), ("all", list(range(len(D))))):
        err = (e - g[:, idx].max(1).values).sum().item()
        gain_loss[name] = gain_loss.get(name, 0) + err
for c, n in zip(D, counts.tolist()): print(f"{c:7.3f} {n/counts.sum().item():.3f}")
for k,v in gain_loss.items(): print(k, v/gain_loss["rtn(-8)"])
