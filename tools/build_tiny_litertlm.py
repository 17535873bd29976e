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

The toolchain is heavy (~6 GB: torch, tensorflow-cpu, jax, litert-torch) and is
NOT needed to run the tests: the artifact is committed.  To rebuild it, in a
separate virtual environment (Python 3.11, PyPI only)::

    python3 -m venv /tmp/litert-build && . /tmp/litert-build/bin/activate
    pip install 'litert-torch==0.10.*' 'litert-lm-builder==0.18.*' \
        tensorflow-cpu sentencepiece
    python tools/build_tiny_litertlm.py            # writes the fixture
    python tools/build_tiny_litertlm.py --out /tmp/x.litertlm --layers 8 --width 256

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


def train_tokenizer(work: Path, vocab: int, seed: int) -> Path:
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
        user_defined_symbols=["<start_of_turn>", "<end_of_turn>"],
        byte_fallback=True,
        character_coverage=1.0,
        num_threads=1,
        minloglevel=2,
    )
    return work / "tokenizer.model"


def build(out: Path, *, layers: int, width: int, context: int, seed: int) -> None:
    import torch
    from litert_torch.generative.layers import kv_cache
    from litert_torch.generative.layers import model_config as cfg
    from litert_torch.generative.utilities import converter, export_config, model_builder

    vocab = 448
    work = Path(tempfile.mkdtemp(prefix="tiny-litertlm-"))
    try:
        tokenizer = train_tokenizer(work, vocab, seed)
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
            lm_head_share_weight_with_embedding=True,
        )
        model = model_builder.DecoderOnlyModel(config, mask_cache_size=0).eval()
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
        )
        (built,) = work.glob("*.litertlm")
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {out} ({out.stat().st_size:,} bytes)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output .litertlm file")
    p.add_argument("--layers", type=int, default=2, help="decoder layers (default 2)")
    p.add_argument("--width", type=int, default=64, help="embedding width (default 64)")
    p.add_argument("--context", type=int, default=1024, help="KV cache tokens (default 1024)")
    p.add_argument("--seed", type=int, default=20261129, help="random seed")
    a = p.parse_args()
    build(a.out, layers=a.layers, width=a.width, context=a.context, seed=a.seed)


if __name__ == "__main__":
    main()
