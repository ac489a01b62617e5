"""Teacher-forced logits of one GGUF model on stdlib text: against an fp32 reference (dequantized weights).

python accuracy.py ref OUT.pt   |   python accuracy.py gguf REF.pt   (the augury on PYTHONPATH is measured)
"""
import sys, glob, torch
from augury.models.loader import load_model

def texts():
    code = open(glob.glob("/usr/lib/python3*/json/decoder.py")[0]).read()
    prose = open(glob.glob("/usr/lib/python3*/pydoc_data/topics.py")[0]).read()
    return [code[:6000], prose[20000:26000]]

mode, path = sys.argv[1], sys.argv[2]
model = load_model("qwen2.5-coder-1.5b-instruct", offline=True, progress=False,
                   **({"weights": "bf16", "dtype": "fp32"} if mode == "ref" else {"weights": "gguf"}))
torch.set_grad_enabled(False)
outs = []
for t in texts():
    ids = model.tokenizer.encode(t)[:384]
    dec = model.decoder
    logits = dec.forward(torch.tensor([ids]), dec.new_cache(1, 512)).float()[0]
    outs.append((ids, torch.log_softmax(logits, -1)))
if mode == "ref":
    torch.save(outs, path)
    sys.exit(0)
ref = torch.load(path)
for (ids, lp), (_, rp) in zip(outs, ref):
    kl = (rp.exp() * (rp - lp)).sum(-1)
    nxt = torch.tensor(ids[1:])
    nll = -lp[:-1].gather(1, nxt[:, None]).mean()
    rnll = -rp[:-1].gather(1, nxt[:, None]).mean()
    top = (lp.argmax(-1) == rp.argmax(-1)).float().mean()
    print(f"tokens {len(ids)}  KL mean {kl.mean():.5f} p99 {kl.quantile(0.99):.4f} max {kl.max():.4f}  "
          f"top1 agree {top:.4f}  nll {nll:.4f} (fp32 ref {rnll:.4f})")
    worst = kl.topk(5)
    print("   worst positions", worst.indices.tolist(), [round(v, 3) for v in worst.values.tolist()])
    top2 = rp.topk(2, -1).values
    clear = (top2[:, 0] - top2[:, 1]) > 0.5
    agree = (lp.argmax(-1) == rp.argmax(-1))
    print(f"   from position 1: KL mean {kl[1:].mean():.5f}  top1 agree {agree[1:].float().mean():.4f}; "
          f"where fp32's top-2 margin > 0.5 nats ({int(clear.sum())}): agree {agree[clear].float().mean():.4f}")
