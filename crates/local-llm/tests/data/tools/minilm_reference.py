import json, math, sys
import numpy as np
from safetensors.numpy import load_file
from tokenizers import Tokenizer
from math import erf
d = sys.argv[1]
W = load_file(f"{d}/model.safetensors")
pre = "bert." if any(k.startswith("bert.") for k in W) else ""
g = lambda k: W[pre + k].astype(np.float64)
tok = Tokenizer.from_file(f"{d}/tokenizer.json")
tok.enable_truncation(256)
tok.no_padding()
verf = np.vectorize(erf)
def ln(x, p):
    m = x.mean(-1, keepdims=True); v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + 1e-12) * g(p + ".weight") + g(p + ".bias")
def lin(x, p): return x @ g(p + ".weight").T + g(p + ".bias")
def embed(text):
    ids = tok.encode(text).ids
    L = len(ids)
    x = g("embeddings.word_embeddings.weight")[ids] + g("embeddings.position_embeddings.weight")[:L] + g("embeddings.token_type_embeddings.weight")[0]
    x = ln(x, "embeddings.LayerNorm")
    for i in range(6):
        p = f"encoder.layer.{i}."
        q = lin(x, p + "attention.self.query").reshape(L, 12, 32).transpose(1, 0, 2)
        k = lin(x, p + "attention.self.key").reshape(L, 12, 32).transpose(1, 0, 2)
        v = lin(x, p + "attention.self.value").reshape(L, 12, 32).transpose(1, 0, 2)
        s = q @ k.transpose(0, 2, 1) / math.sqrt(32)
        s = np.exp(s - s.max(-1, keepdims=True)); s /= s.sum(-1, keepdims=True)
        c = (s @ v).transpose(1, 0, 2).reshape(L, 384)
        x = ln(x + lin(c, p + "attention.output.dense"), p + "attention.output.LayerNorm")
        h = lin(x, p + "intermediate.dense"); h = 0.5 * h * (1 + verf(h / math.sqrt(2)))
        x = ln(x + lin(h, p + "output.dense"), p + "output.LayerNorm")
    m = x.mean(0)
    return ids, m / np.linalg.norm(m)
sentences = ["The cat sits on the mat.", "A merge request needs two approvals before it can be merged.", "Rust guarantees memory safety without a garbage collector."]
out = []
for s in sentences:
    ids, v = embed(s)
    out.append({"text": s, "token_ids": ids, "first_values": [round(float(t), 6) for t in v[:8]], "norm_check": float(np.linalg.norm(v)), "values_sum": float(v.sum())})
print(json.dumps({"model": "all-MiniLM-L6-v2", "method": "numpy float64 BERT forward, mean pooling over tokens, L2 normalised; computed once from the safetensors weights", "sentences": out}, indent=2))
