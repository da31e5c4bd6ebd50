"""The reference for our MiniLM embedder: the same weights run by ONNX Runtime.

Reads the model directory (config.json, tokenizer.json, model.safetensors),
writes the BERT encoder as an ONNX graph of standard operators (no export
tool, so no PyTorch is needed), and embeds the given texts the way
sentence-transformers does: word pieces truncated at 256, mean pooling over
the real tokens, unit length. Batches are sorted by length and padded only
to the longest input of each batch; the attention mask hides the padding.

    python embed_reference.py MODEL_DIR IN.json OUT.json

IN.json: {"texts": [...], "threads": 2, "batch": 32, "sample": [indices],
"int8": also time the runtime's dynamic int8 quantization}.
OUT.json: {"tokens": real word pieces, "seconds": timed embedding,
"tokens_per_second", "runtime", "vectors": {index: vector} for the sample,
"int8": {"tokens_per_second", "lowest_cosine_vs_f32"} when asked}.
"""

import json
import math
import sys
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from safetensors.numpy import load_file
from tokenizers import Tokenizer

MAX_TOKENS = 256


def build_graph(weights, config):
    hidden = config["hidden_size"]
    heads = config["num_attention_heads"]
    head_dim = hidden // heads
    eps = config["layer_norm_eps"]
    nodes, inits = [], []

    def const(name, array):
        inits.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def node(op, inputs, output, **attrs):
        nodes.append(helper.make_node(op, inputs, [output], **attrs))
        return output

    def linear(x, prefix, out):
        w = const(prefix + ".wt", weights[prefix + ".weight"].T)
        b = const(prefix + ".b", weights[prefix + ".bias"])
        return node("Add", [node("MatMul", [x, w], out + "_mm"), b], out)

    def layer_norm(x, prefix, out):
        g = const(prefix + ".g", weights[prefix + ".weight"])
        b = const(prefix + ".beta", weights[prefix + ".bias"])
        return node("LayerNormalization", [x, g, b], out, axis=-1, epsilon=eps)

    e = "embeddings."
    words = node("Gather", [const("word_emb", weights[e + "word_embeddings.weight"]), "input_ids"], "words")
    positions = node(
        "Gather", [const("pos_emb", weights[e + "position_embeddings.weight"]), "position_ids"], "positions"
    )
    token_type = const("type0", weights[e + "token_type_embeddings.weight"][0])
    summed = node("Add", [node("Add", [words, positions], "wp"), token_type], "emb")
    x = layer_norm(summed, e + "LayerNorm", "x0")

    split_heads = const("split_heads", np.array([0, 0, heads, head_dim], dtype=np.int64))
    merge_heads = const("merge_heads", np.array([0, 0, hidden], dtype=np.int64))
    scale = const("scale", np.array(1.0 / math.sqrt(head_dim), dtype=np.float32))
    half = const("half", np.array(0.5, dtype=np.float32))
    one = const("one", np.array(1.0, dtype=np.float32))
    root2 = const("root2", np.array(math.sqrt(2.0), dtype=np.float32))

    for i in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        t = f"l{i}_"

        def heads_of(name, perm):
            projected = linear(x, p + "attention.self." + name, t + name)
            shaped = node("Reshape", [projected, split_heads], t + name + "_r")
            return node("Transpose", [shaped], t + name + "_t", perm=perm)

        q = heads_of("query", [0, 2, 1, 3])
        k = heads_of("key", [0, 2, 3, 1])
        v = heads_of("value", [0, 2, 1, 3])
        scores = node("Mul", [node("MatMul", [q, k], t + "qk"), scale], t + "scaled")
        scores = node("Add", [scores, "mask_bias"], t + "masked")
        probs = node("Softmax", [scores], t + "probs", axis=-1)
        context = node("MatMul", [probs, v], t + "ctx")
        context = node("Transpose", [context], t + "ctx_t", perm=[0, 2, 1, 3])
        context = node("Reshape", [context, merge_heads], t + "ctx_r")
        attended = linear(context, p + "attention.output.dense", t + "att")
        x = layer_norm(node("Add", [attended, x], t + "res1"), p + "attention.output.LayerNorm", t + "x1")
        h = linear(x, p + "intermediate.dense", t + "inter")
        # Exact GELU, as the model was trained: x/2 * (1 + erf(x/sqrt 2)).
        erf = node("Erf", [node("Div", [h, root2], t + "div")], t + "erf")
        gelu = node("Mul", [node("Mul", [h, half], t + "halfh"), node("Add", [erf, one], t + "erf1")], t + "gelu")
        out = linear(gelu, p + "output.dense", t + "out")
        x = layer_norm(node("Add", [out, x], t + "res2"), p + "output.LayerNorm", t + "x2")

    nodes.append(helper.make_node("Identity", [x], ["last_hidden"]))
    graph = helper.make_graph(
        nodes,
        "minilm",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info("position_ids", TensorProto.INT64, [1, "seq"]),
            helper.make_tensor_value_info("mask_bias", TensorProto.FLOAT, ["batch", 1, 1, "seq"]),
        ],
        [helper.make_tensor_value_info("last_hidden", TensorProto.FLOAT, ["batch", "seq", hidden])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def main():
    model_dir, in_path, out_path = sys.argv[1:4]
    request = json.load(open(in_path))
    texts = request["texts"]
    threads = int(request.get("threads", 2))
    batch = int(request.get("batch", 32))
    config = json.load(open(f"{model_dir}/config.json"))
    weights = load_file(f"{model_dir}/model.safetensors")
    model = build_graph(weights, config)

    def session_of(serialized):
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        return ort.InferenceSession(serialized, options, providers=["CPUExecutionProvider"])

    session = session_of(model.SerializeToString())

    tokenizer = Tokenizer.from_file(f"{model_dir}/tokenizer.json")
    tokenizer.no_padding()
    tokenizer.enable_truncation(MAX_TOKENS)
    encodings = tokenizer.encode_batch(texts)
    ids = [np.array(enc.ids, dtype=np.int64) for enc in encodings]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    batches = [order[i : i + batch] for i in range(0, len(order), batch)]

    def run(members, session=session):
        longest = max(len(ids[i]) for i in members)
        input_ids = np.zeros((len(members), longest), dtype=np.int64)
        mask = np.zeros((len(members), longest), dtype=np.float32)
        for row, i in enumerate(members):
            input_ids[row, : len(ids[i])] = ids[i]
            mask[row, : len(ids[i])] = 1.0
        hidden = session.run(
            None,
            {
                "input_ids": input_ids,
                "position_ids": np.arange(longest, dtype=np.int64)[None, :],
                "mask_bias": ((1.0 - mask) * -10000.0)[:, None, None, :],
            },
        )[0]
        pooled = (hidden * mask[:, :, None]).sum(axis=1) / mask.sum(axis=1, keepdims=True)
        return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)

    def timed(session):
        run(batches[0], session)  # warm-up: first-run allocations are not the runtime's speed
        vectors = [None] * len(texts)
        started = time.perf_counter()
        for members in batches:
            for i, vector in zip(members, run(members, session)):
                vectors[i] = vector
        return vectors, time.perf_counter() - started

    vectors, seconds = timed(session)
    tokens = int(sum(len(x) for x in ids))
    answer = {
        "runtime": f"onnxruntime {ort.__version__}, {threads} threads, batches of {batch} sorted by length",
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_second": tokens / seconds,
        "vectors": {str(i): vectors[i].tolist() for i in request.get("sample", [])},
    }
    if request.get("int8"):
        # The int8 figure is extra: its failure must not lose the f32 reference.
        try:
            answer["int8"] = int8_run(model, session_of, timed, vectors, tokens)
        except Exception as error:  # noqa: BLE001
            answer["int8_error"] = f"{type(error).__name__}: {error}"
    json.dump(answer, open(out_path, "w"))


def int8_run(model, session_of, timed, f32_vectors, tokens):
    """The runtime's own int8 path: every MatMul's weights quantized per
    output channel, activations per tensor at run time (ONNX Runtime's
    dynamic quantization, with its VNNI kernels). Measures how fast a mature
    runtime gets by giving up exactness, and how far its vectors move."""
    import os
    import tempfile

    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory() as scratch:
        plain = os.path.join(scratch, "f32.onnx")
        quantized = os.path.join(scratch, "int8.onnx")
        onnx.save(model, plain)
        quantize_dynamic(plain, quantized, weight_type=QuantType.QInt8, per_channel=True)
        with open(quantized, "rb") as f:
            session = session_of(f.read())
    vectors, seconds = timed(session)
    lowest = min(float(np.dot(a, b)) for a, b in zip(vectors, f32_vectors))
    return {"seconds": seconds, "tokens_per_second": tokens / seconds, "lowest_cosine_vs_f32": lowest}


if __name__ == "__main__":
    main()
