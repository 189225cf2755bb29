#!/usr/bin/python3
"""Every layer's forward pass on the emulated core against numpy.

layer_oracle_dump runs small models on the core (float32, the portable
matrix unit) and prints their layers, inputs, weights and outputs; this
recomputes each output from Keras' definitions in float64 numpy, written
here independently of the core's C (padding from TensorFlow's rule, the
pooling windows, the kernel layout (kh, kw, in, out), the normalizations'
statistics), and compares; and the cross-entropies from logits against a
float64 log-softmax."""
import json
import math
import subprocess
import sys

import numpy as np

(DENSE, FLATTEN, CONV2D, MAXPOOL, AVGPOOL, GAP, DROPOUT, RESHAPE, EMBEDDING, GAP1D, MHA,
 ADD) = range(12)
LAYERNORM, BATCHNORM = 12, 13


def act(v, name):
    if name == "linear":
        return v
    if name == "relu":
        return np.maximum(v, 0)
    if name == "tanh":
        return np.tanh(v)
    if name == "sigmoid":
        return 1 / (1 + np.exp(-v))
    if name == "gelu":  # Keras' approximate=False
        return 0.5 * v * (1 + np.vectorize(math.erf)(v / math.sqrt(2)))
    if name == "softplus":
        return np.logaddexp(0, v)
    if name == "swish":
        return v / (1 + np.exp(-v))
    if name == "softmax":
        e = np.exp(v - v.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)
    raise ValueError(name)


def tf_pad(n, k, s, same):
    """TensorFlow's output size and (before, after) padding along one axis."""
    if not same:
        return (n - k) // s + 1, 0, 0
    out = -(-n // s)
    total = max((out - 1) * s + k - n, 0)
    return out, total // 2, total - total // 2


def conv2d(x, kernel, bias, strides, same):
    r, h, w, c = x.shape
    kh, kw, _, f = kernel.shape
    oh, pt, pb = tf_pad(h, kh, strides[0], same)
    ow, pl, pr = tf_pad(w, kw, strides[1], same)
    xp = np.pad(x, ((0, 0), (pt, pb), (pl, pr), (0, 0)))
    y = np.zeros((r, oh, ow, f))
    for i in range(oh):
        for j in range(ow):
            patch = xp[:, i * strides[0]:i * strides[0] + kh, j * strides[1]:j * strides[1] + kw, :]
            y[:, i, j, :] = np.einsum("rabc,abcf->rf", patch, kernel)
    return y + bias


def pool(x, k, strides, same, kind):
    r, h, w, c = x.shape
    oh, pt, pb = tf_pad(h, k[0], strides[0], same)
    ow, pl, pr = tf_pad(w, k[1], strides[1], same)
    y = np.zeros((r, oh, ow, c))
    for i in range(oh):
        for j in range(ow):
            y0, x0 = i * strides[0] - pt, j * strides[1] - pl
            win = x[:, max(y0, 0):min(y0 + k[0], h), max(x0, 0):min(x0 + k[1], w), :]
            y[:, i, j, :] = win.max(axis=(1, 2)) if kind == MAXPOOL else win.mean(axis=(1, 2))
    return y


def mha(x, p, w, heads, key_dim, value_dim):
    """Keras' MultiHeadAttention(heads, key_dim, value_dim)(x, x): its weights
    in Keras' order, the einsums as keras.layers.MultiHeadAttention writes them."""
    f = x.shape[-1]
    vd = value_dim or key_dim

    def take(*shape):
        nonlocal w
        n = int(np.prod(shape))
        v = p[w:w + n].reshape(shape)
        w += n
        return v
    qk, qb = take(f, heads, key_dim), take(heads, key_dim)
    kk, kb = take(f, heads, key_dim), take(heads, key_dim)
    vk, vb = take(f, heads, vd), take(heads, vd)
    ok, ob = take(heads, vd, f), take(f)
    q = np.einsum("abc,cde->abde", x, qk) + qb
    k = np.einsum("abc,cde->abde", x, kk) + kb
    v = np.einsum("abc,cde->abde", x, vk) + vb
    q = q / np.sqrt(key_dim)
    scores = np.einsum("aecd,abcd->acbe", k, q)
    scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
    scores /= scores.sum(axis=-1, keepdims=True)
    o = np.einsum("acbe,aecd->abcd", scores, v)
    return np.einsum("abcd,cde->abe", o, ok) + ob


def forward(case):
    rows = case["rows"]
    x = np.array(case["x"], dtype=np.float64).reshape([rows] + case["input_shape"])
    p = np.array(case["params"], dtype=np.float64)
    inputs = []
    for L in case["layers"]:
        inputs.append(x)
        kind = L["kind"]
        if kind == DENSE:
            n_in = x.shape[-1]
            kernel = p[L["w"]:L["w"] + n_in * L["units"]].reshape(n_in, L["units"])
            bias = p[L["b"]:L["b"] + L["units"]]
            x = act(x @ kernel + bias, L["act"])
        elif kind == CONV2D:
            kh, kw = L["k"]
            c = x.shape[-1]
            kernel = p[L["w"]:L["w"] + kh * kw * c * L["units"]].reshape(kh, kw, c, L["units"])
            bias = p[L["b"]:L["b"] + L["units"]]
            strides = [s if s else 1 for s in L["s"]]
            x = act(conv2d(x, kernel, bias, strides, L["same"]), L["act"])
        elif kind in (MAXPOOL, AVGPOOL):
            strides = [s if s else k for s, k in zip(L["s"], L["k"])]
            x = pool(x, L["k"], strides, L["same"], kind)
        elif kind == GAP:
            x = x.mean(axis=(1, 2))
        elif kind == FLATTEN:
            x = x.reshape(rows, -1)
        elif kind == RESHAPE:
            x = x.reshape([rows] + L["target"][:L["target_rank"]])
        elif kind == DROPOUT:
            pass  # inference: the identity
        elif kind == EMBEDDING:
            ids = x.astype(np.int64)
            assert (ids == x).all()
            d = L["units"]
            table = p[L["w"]:L["w"] + L["vocab"] * d].reshape(L["vocab"], d)
            x = table[ids]
            if L["positions"]:
                seq = ids.shape[1]
                base = L["w"] + L["vocab"] * d
                x = x + p[base:base + seq * d].reshape(seq, d)
        elif kind == GAP1D:
            x = x.mean(axis=1)
        elif kind == MHA:
            x = mha(x, p, L["w"], L["heads"], L["key_dim"], L["value_dim"])
        elif kind == ADD:
            x = x + inputs[L["from"]]
        elif kind == LAYERNORM:  # Keras: axis=-1, biased variance, gamma then beta
            c = x.shape[-1]
            gamma, beta = p[L["w"]:L["w"] + c], p[L["b"]:L["b"] + c]
            mean = x.mean(axis=-1, keepdims=True)
            var = x.var(axis=-1, keepdims=True)
            x = (x - mean) / np.sqrt(var + L["epsilon"]) * gamma + beta
        elif kind == BATCHNORM:  # training: the batch's statistics; else the moving ones
            c = x.shape[-1]
            gamma, beta = p[L["w"]:L["w"] + c], p[L["b"]:L["b"] + c]
            if case["training"]:
                axes = tuple(range(x.ndim - 1))
                mean, var = x.mean(axis=axes), x.var(axis=axes)
            else:
                mean, var = p[L["stats"]:L["stats"] + c], p[L["stats"] + c:L["stats"] + 2 * c]
            x = (x - mean) / np.sqrt(var + L["epsilon"]) * gamma + beta
        else:
            raise ValueError(kind)
    return x


def loss_from_logits(case):
    """The summed cross-entropy of logits, from log-softmax in float64."""
    z = np.array(case["logits"], dtype=np.float64).reshape(-1, case["n"])
    logp = z - z.max(axis=1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(axis=1, keepdims=True))
    if case["loss"] == "sparse_categorical_crossentropy":
        return -logp[np.arange(len(z)), np.array(case["labels"])].sum()
    return -(np.array(case["labels"]).reshape(z.shape) * logp).sum()


def main():
    dump = subprocess.run([sys.argv[1]], check=True, capture_output=True, text=True).stdout
    lines = [json.loads(line) for line in dump.splitlines() if line.strip()]
    cases = [c for c in lines if "loss" not in c]
    losses = [c for c in lines if "loss" in c]
    assert len(cases) >= 17, f"only {len(cases)} cases dumped"
    assert len(losses) >= 2, f"only {len(losses)} loss cases dumped"
    bad = 0
    for case in losses:
        want = loss_from_logits(case)
        spread = np.abs(np.array(case["logits"])).max()
        err = abs(case["loss_sum"] - want)
        tol = 1e-5 * max(1.0, abs(want)) + 2e-6 * spread
        ok = err <= tol and spread > 88  # beyond float32 exp's range without the max shift
        bad += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {case['loss']} from logits (|logit| up to {spread:.0f}): "
              f"core {case['loss_sum']:.9g}, numpy {want:.9g} (tolerance {tol:.3g})")
    for case in cases:
        want = forward(case).reshape(-1)
        got = np.array(case["out"])
        err = np.abs(got - want).max()
        tol = 1e-5 * max(1.0, np.abs(want).max())
        ok = err <= tol
        bad += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {case['name']}: max |core - numpy| = {err:.3g} (tolerance {tol:.3g})")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
