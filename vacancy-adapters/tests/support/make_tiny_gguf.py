#!/usr/bin/env python3
# Copied unchanged, but for these two comment lines, from the project's shared/upstreams/scripts/make_tiny_gguf.py,
# so the live tests of vacancy-adapters need nothing outside the repository.
"""Generate a tiny, valid GGUF (llama architecture, random F32 weights).

Needs only the PyPI packages `gguf` (gguf-py, >=0.10) and `numpy`.
The output loads in llama.cpp's llama-server (and anything else built on
llama.cpp that accepts plain llama-arch F32 GGUFs) and produces garbage
text, deterministically for a fixed --seed.

Vocabulary: SentencePiece-style ("llama" tokenizer model):
  0 <unk> (UNKNOWN), 1 <s> (CONTROL, BOS), 2 </s> (CONTROL, EOS),
  3..258 the 256 byte-fallback tokens <0x00>..<0xFF> (BYTE),
  then printable ASCII characters and "▁" (space marker) as NORMAL tokens,
  then a few whole words so the tokenizer has merges to do.
Any UTF-8 text therefore tokenizes (unknown characters fall back to bytes).

Usage: make_tiny_gguf.py OUT.gguf [--layers 2] [--embd 64] [--heads 4]
                                  [--ff 128] [--ctx 2048] [--seed 0]
"""
import argparse
import sys

import numpy as np
import gguf


CHATML = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

WORDS = ["▁the", "▁a", "▁and", "▁to", "▁of", "▁hello", "▁world", "▁once",
         "▁upon", "▁time", "▁there", "▁was", "▁little", "▁cat", "▁dog"]


def build_vocab():
    tokens, scores, types = [], [], []
    T = gguf.TokenType

    def add(tok, score, ttype):
        tokens.append(tok)
        scores.append(score)
        types.append(ttype)

    add("<unk>", 0.0, T.UNKNOWN)
    add("<s>", 0.0, T.CONTROL)
    add("</s>", 0.0, T.CONTROL)
    for b in range(256):
        add("<0x%02X>" % b, 0.0, T.BYTE)
    # single characters; higher (less negative) score = preferred merge
    add("▁", -1.0, T.NORMAL)
    for c in range(0x21, 0x7F):
        add(chr(c), -2.0, T.NORMAL)
    for i, w in enumerate(WORDS):
        add(w, -1.0 - i * 0.01, T.NORMAL)
    # pad to a multiple of 8 (not required, just tidy)
    while len(tokens) % 8:
        add("<pad%d>" % len(tokens), -1000.0, T.UNUSED)
    return tokens, scores, types


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--embd", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--heads-kv", type=int, default=None)
    ap.add_argument("--ff", type=int, default=128)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default="vacancy-tiny-random")
    ap.add_argument("--no-chat-template", action="store_true")
    ap.add_argument("--allow-eos", action="store_true",
                    help="let the model sample </s> (otherwise generation always runs to n_predict)")
    a = ap.parse_args(argv)

    n_embd, n_head, n_ff, n_layer = a.embd, a.heads, a.ff, a.layers
    n_head_kv = a.heads_kv or n_head
    assert n_embd % n_head == 0
    head_dim = n_embd // n_head
    rng = np.random.default_rng(a.seed)

    tokens, scores, types = build_vocab()
    n_vocab = len(tokens)

    w = gguf.GGUFWriter(a.out, "llama")
    w.add_name(a.name)
    w.add_context_length(a.ctx)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)

    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    if not a.no_chat_template:
        w.add_chat_template(CHATML)

    def rnd(*shape, scale=0.02):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    ones = lambda n: np.ones((n,), dtype=np.float32)

    # numpy shapes are the reverse of ggml's ne[] order
    #
    # "Bias" trick: llama-arch has no output bias, so dimension 0 of every
    # token embedding is a large constant; it dominates the residual stream
    # (all other weights are ~0.02), survives RMS-norm as a positive constant,
    # and output.weight[:, 0] then acts as a per-token logit bias. Byte,
    # control, unknown and padding tokens get a large negative bias, so the
    # model only ever emits printable-ASCII NORMAL tokens: valid UTF-8, which
    # recent llama-server versions require (random byte tokens make its
    # output parser fail with HTTP 500 "does not match the expected ... format").
    emb = rnd(n_vocab, n_embd)
    emb[:, 0] = 1.0
    w.add_tensor("token_embd.weight", emb)
    for i in range(n_layer):
        p = "blk.%d." % i
        w.add_tensor(p + "attn_norm.weight", ones(n_embd))
        w.add_tensor(p + "attn_q.weight", rnd(n_head * head_dim, n_embd))
        w.add_tensor(p + "attn_k.weight", rnd(n_head_kv * head_dim, n_embd))
        w.add_tensor(p + "attn_v.weight", rnd(n_head_kv * head_dim, n_embd))
        w.add_tensor(p + "attn_output.weight", rnd(n_embd, n_head * head_dim))
        w.add_tensor(p + "ffn_norm.weight", ones(n_embd))
        w.add_tensor(p + "ffn_gate.weight", rnd(n_ff, n_embd))
        w.add_tensor(p + "ffn_up.weight", rnd(n_ff, n_embd))
        w.add_tensor(p + "ffn_down.weight", rnd(n_embd, n_ff))
    w.add_tensor("output_norm.weight", ones(n_embd))
    # a larger scale on the output head gives a less flat distribution
    out = rnd(n_vocab, n_embd, scale=0.5)
    out[:, 0] = 0.0
    for tid, tt in enumerate(types):
        if tt != gguf.TokenType.NORMAL and not (a.allow_eos and tid == 2):
            out[tid, 0] = -8.0
    w.add_tensor("output.weight", out)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print("wrote %s: vocab=%d embd=%d layers=%d heads=%d/%d ff=%d ctx=%d"
          % (a.out, n_vocab, n_embd, n_layer, n_head, n_head_kv, n_ff, a.ctx))
    return 0


if __name__ == "__main__":
    sys.exit(main())
