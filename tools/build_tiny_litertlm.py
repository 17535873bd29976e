#!/usr/bin/env python3
"""Build ``tests/fixtures/tiny-random.litertlm``: a tiny random-weight LiteRT-LM model.

The LiteRT backend's tests need a real ``.litertlm`` file that the real engine
(``litert-lm-api``) loads and runs, but no model can be downloaded here and a
real one is far too large to commit.  This script makes one from nothing:

1. a SentencePiece tokenizer (BPE, 448 pieces, byte fallback) trained on
   synthetic sentences drawn from a small word list, with ``<start_of_turn>``
   and ``<end_of_turn>`` as single pieces;
2. a Llama-style decoder (2 layers, width 64, 4 query / 2 KV heads, gated SiLU
   MLP, RMSNorm, RoPE, tied embeddings) with seeded random weights, built with
   ``litert_torch``'s generative layers;
3. converted by ``litert_torch`` to a TFLite model with ``prefill_32``,
   ``prefill_128`` and ``decode`` signatures over a 1,024-token KV cache
   (dynamic int8 weights, attention mask as an input, transposed KV layout —
   the layout the LiteRT-LM runtime reads its context size from);
4. bundled with ``litert_lm_builder`` into a ``.litertlm`` file together with
   the tokenizer and LLM metadata: ``<bos>`` start token, ``<eos>`` and
   ``<end_of_turn>`` stop tokens, and a Gemma-style Jinja chat template that,
   like Gemma's, has no system role and requires strictly alternating
   user/model turns (so the backend's ``fold_system_prompt`` is exercised).

The output (about 0.6 MB) says gibberish; the tests assert behaviour only.

``--toolcall`` builds ``tests/fixtures/tiny-toolcall.litertlm`` instead: a model
that declares function calling and, under greedy sampling, always answers with
one call of a tool ``add``::

    <tool_call>{"name":"add","arguments":{"a":2,"b":3}}</tool_call>

How: its LLM metadata says ``supports_function_calling: true`` (what the
engine's ``ModelInfo.llm.supports_function_calling()`` reports) and
``llm_model_type { qwen3 {} }``, whose output parser turns the JSON between
``<tool_call>`` and ``</tool_call>`` into a tool call (only when the
conversation was given tools).  The weights make a *bigram* model: every
transformer block is scaled to almost nothing, so the logits at a position
depend only on the current token's embedding.  Each of the call's pieces —
``<tool_call>``, the JSON, ``</tool_call>`` — is a single token of its own
(SentencePiece ``user_defined_symbols``), and the embeddings and the untied
LM head are one-hot "next token" tables: any token outside the chain (so the
end of every prompt) leads to ``<tool_call>``, each chain token to the next,
and the last to ``<end_of_turn>``, a stop token.  The chain never repeats a
token, so greedy decoding spells the call and stops.  The chat template
(shared by both models) lists the tools as JSON in the first user turn, so
offering tools makes the prompt longer.  About 0.7 MB.

The toolchain is heavy (~6 GB: torch, tensorflow-cpu, jax, litert-torch) and is
NOT needed to run the tests: the artifact is committed.  To rebuild it, in a
separate virtual environment (Python 3.11, PyPI only)::

    python3 -m venv /tmp/litert-build && . /tmp/litert-build/bin/activate
    pip install 'litert-torch==0.10.*' 'litert-lm-builder==0.18.*' \
        tensorflow-cpu sentencepiece
    python tools/build_tiny_litertlm.py            # writes the fixture
    python tools/build_tiny_litertlm.py --out /tmp/x.litertlm --layers 8 --width 256
    python tools/build_tiny_litertlm.py --toolcall  # writes tests/fixtures/tiny-toolcall.litertlm

Versions last used: litert-torch 0.10.0, litert-lm-builder 0.18.1,
litert-converter 0.5.0, ai-edge-litert 2.3.0, torch 2.14.1,
tensorflow-cpu 2.21.0, sentencepiece 0.2.3 (CPython 3.11, Linux x86_64).
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "tests" / "fixtures" / "tiny-random.litertlm"
TOOLCALL_OUT = ROOT / "tests" / "fixtures" / "tiny-toolcall.litertlm"

# What the --toolcall model always says, one token per piece, then <end_of_turn>.
TOOLCALL_CHAIN = ("<tool_call>", '{"name":"add","arguments":{"a":2,"b":3}}', "</tool_call>")
# Qwen3's output parser (JSON between <tool_call> fences) and function calling declared.
TOOLCALL_METADATA = "llm_model_type { qwen3 {} }\nsupports_function_calling: true\n"

WORDS = (
    "the a an cat dog bird fish sat ran flew swam on under over mat tree house river "
    "hello world good morning evening night red blue green yellow fast slow big small "
    "what when where who why how time weather city paris london tokyo answer question "
    "tool call result please thanks yes no maybe one two three four five six seven"
).split()

# Gemma-style turns.  No system role and strict alternation, as in Gemma's own
# templates: a client must fold the system prompt into the first user turn.
# Tool results are shown to the model as a user-side turn.
CHAT_TEMPLATE = """\
{%- for message in messages -%}
{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
{%- if role == 'system' -%}
{{ raise_exception("System role not supported") }}
{%- endif -%}
{%- set side = 'model' if role == 'model' else 'user' -%}
{%- if (side == 'user') != (loop.index0 % 2 == 0) -%}
{{ raise_exception("Conversation roles must alternate user/model/user/model/...") }}
{%- endif -%}
{{ '<start_of_turn>' + ('model' if side == 'model' else 'user') + '\\n' }}
{%- if loop.first and tools -%}
{{ 'tools: ' }}{{ tools | tojson }}{{ '\\n' }}
{%- endif -%}
{%- if message['content'] is string -%}
{{ message['content'] }}
{%- else -%}
{%- for item in message['content'] -%}
{%- if item['type'] == 'text' -%}{{ item['text'] }}
{%- elif item['type'] == 'tool_response' -%}
{{ 'result of ' + item['name'] + ': ' }}{{ item['response'] | tojson }}
{%- endif -%}
{%- endfor -%}
{%- endif -%}
{%- if 'tool_calls' in message -%}
{%- for call in message['tool_calls'] -%}
{{ '\\ncall ' + call['function']['name'] + ' ' }}{{ call['function']['arguments'] | tojson }}
{%- endfor -%}
{%- endif -%}
{{ '<end_of_turn>\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{ '<start_of_turn>model\\n' }}
{%- endif -%}
"""


def train_tokenizer(work: Path, vocab: int, seed: int, extra_symbols: tuple[str, ...] = ()) -> Path:
    import sentencepiece as spm

    rng = random.Random(seed)
    corpus = work / "corpus.txt"
    with corpus.open("w", encoding="utf-8") as f:
        for _ in range(4000):
            f.write(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 14))) + "\n")
    spm.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(work / "tokenizer"),
        vocab_size=vocab,
        model_type="bpe",
        pad_id=0,
        unk_id=1,
        bos_id=2,
        eos_id=3,
        bos_piece="<bos>",
        eos_piece="<eos>",
        user_defined_symbols=["<start_of_turn>", "<end_of_turn>", *extra_symbols],
        byte_fallback=True,
        character_coverage=1.0,
        num_threads=1,
        minloglevel=2,
    )
    return work / "tokenizer.model"


def make_bigram(model, tokenizer: Path) -> None:
    """Weights that make greedy decoding spell TOOLCALL_CHAIN, then <end_of_turn>.

    Each token's embedding is a one-hot "class" vector naming the token that
    must follow it; the LM head maps each class back to that token.  The
    transformer blocks are scaled down so they barely touch the residual
    stream (not zeroed, so the int8 quantizer never meets an all-zero tensor).
    """
    import sentencepiece as spm
    import torch

    sp = spm.SentencePieceProcessor(model_file=str(tokenizer))
    chain = [sp.piece_to_id(piece) for piece in (*TOOLCALL_CHAIN, "<end_of_turn>")]
    assert len(set(chain)) == len(chain) and sp.unk_id() not in chain, chain
    # follows[t]: the token after t.  Off the chain: the chain's first token.
    # Class k (one-hot dimension k) predicts chain[k].
    follows = {t: chain[i + 1] for i, t in enumerate(chain[:-1])}
    assert len(chain) <= model.config.embedding_dim
    with torch.no_grad():
        for p in model.transformer_blocks.parameters():
            p.mul_(1e-4)
        emb = torch.zeros_like(model.tok_embedding.weight)
        for token in range(emb.shape[0]):
            emb[token, chain.index(follows.get(token, chain[0]))] = 1.0
        model.tok_embedding.weight.copy_(emb)
        head = torch.randn_like(model.lm_head.weight) * 1e-3
        for k, token in enumerate(chain):
            head[token] = 0.0
            head[token, k] = 10.0
        model.lm_head.weight.copy_(head)


def build(
    out: Path, *, layers: int, width: int, context: int, seed: int, toolcall: bool = False
) -> None:
    import torch
    from litert_torch.generative.layers import kv_cache
    from litert_torch.generative.layers import model_config as cfg
    from litert_torch.generative.utilities import converter, export_config, model_builder

    vocab = 448
    work = Path(tempfile.mkdtemp(prefix="tiny-litertlm-"))
    try:
        tokenizer = train_tokenizer(work, vocab, seed, TOOLCALL_CHAIN if toolcall else ())
        torch.manual_seed(seed)
        heads = max(2, width // 16)
        norm = cfg.NormalizationConfig(type=cfg.NormalizationType.RMS_NORM)
        block = cfg.TransformerBlockConfig(
            attn_config=cfg.AttentionConfig(
                num_heads=heads,
                head_dim=width // heads,
                num_query_groups=max(1, heads // 2),
                rotary_base=10000,
                rotary_percentage=1.0,
            ),
            ff_config=cfg.FeedForwardConfig(
                type=cfg.FeedForwardType.GATED,
                activation=cfg.ActivationConfig(cfg.ActivationType.SILU),
                intermediate_size=width * 2,
            ),
            pre_attention_norm_config=norm,
            post_attention_norm_config=norm,
        )
        config = cfg.ModelConfig(
            vocab_size=vocab,
            num_layers=layers,
            max_seq_len=context,
            embedding_dim=width,
            block_configs=block,
            final_norm_config=norm,
            lm_head_share_weight_with_embedding=not toolcall,
        )
        model = model_builder.DecoderOnlyModel(config, mask_cache_size=0).eval()
        extra = {}
        if toolcall:
            make_bigram(model, tokenizer)
            metadata = work / "base_metadata.textproto"
            metadata.write_text(TOOLCALL_METADATA)
            extra["base_llm_metadata_path"] = str(metadata)
        converter.convert_to_litert(
            model,
            output_path=str(work),
            output_name_prefix="tiny",
            prefill_seq_len=[32, 128],
            kv_cache_max_len=context,
            quantize="dynamic_int8",
            config=config,
            export_config=export_config.ExportConfig(
                mask_as_input=True, kvcache_layout=kv_cache.KV_LAYOUT_TRANSPOSED
            ),
            output_format="litertlm",
            tokenizer_model_path=str(tokenizer),
            start_token="<bos>",
            stop_tokens=["<eos>", "<end_of_turn>"],
            jinja_prompt_template=CHAT_TEMPLATE,
            **extra,
        )
        (built,) = work.glob("*.litertlm")
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {out} ({out.stat().st_size:,} bytes)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, help="output .litertlm file (default: the fixture)")
    p.add_argument(
        "--toolcall",
        action="store_true",
        help="build the function-calling fixture that always calls add (see above)",
    )
    p.add_argument("--layers", type=int, default=2, help="decoder layers (default 2)")
    p.add_argument("--width", type=int, default=64, help="embedding width (default 64)")
    p.add_argument("--context", type=int, default=1024, help="KV cache tokens (default 1024)")
    p.add_argument("--seed", type=int, default=20261129, help="random seed")
    a = p.parse_args()
    out = a.out or (TOOLCALL_OUT if a.toolcall else DEFAULT_OUT)
    build(out, layers=a.layers, width=a.width, context=a.context, seed=a.seed, toolcall=a.toolcall)


if __name__ == "__main__":
    main()
