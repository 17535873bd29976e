#!/usr/bin/env python3
"""Benchmarks of the litert backend against the LiteRT-LM engine driven directly, same run.

Run with ``.venv/bin/python benchmarks/bench_litert.py`` (``--quick`` for a smoke run).
The model is ``--model PATH``, else ``$AGENTIK_GOOGLE_MODEL_PATH``, else the committed
test fixture ``tests/fixtures/tiny-random.litertlm`` (a 2-layer random model: it decodes
thousands of tokens a second, so agentik's per-token cost weighs far more on it than on a
real model; it is the worst case).  Measurements:

1. decode throughput: tokens/s of a whole agentik turn (``conv.send`` to ``turn_ended``:
   SQLite writes, events, the worker-thread hand-off) vs the engine's own
   ``send_message_async`` iterated directly, both from a fresh engine conversation with
   the same prompt and the same number of answer tokens; goal >= 0.95;
2. turn-2 latency: a turn in a conversation with history when its engine conversation is
   reused (only the new message is prefilled) vs rebuilt from the history (as after a
   restart, compaction or idle release); informational, the ratio is the speed-up.

Ratios are agentik / baseline.  Exit status 0 unless ``--strict`` and a goal is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import litert_lm

from agentik.core import Agent, SQLiteStore
from agentik.core.llm.litert_backend import LiteRTBackend

from _common import Row, finish, ms, per_s, say, say_environment, version

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "tiny-random.litertlm"
PROMPT = "the cat sat on the mat and the dog ran under the big red tree"
SYSTEM = "You are a helpful assistant. Answer briefly."


def _model_path(arg: str | None) -> str:
    return arg or os.environ.get("AGENTIK_GOOGLE_MODEL_PATH") or str(FIXTURE)


def _backend(model: str, tmp: str, *, max_tokens: int) -> LiteRTBackend:
    """Greedy and seeded, so the agentik side and the direct side generate alike."""
    return LiteRTBackend(
        model_path=model,
        cache_dir=os.path.join(tmp, "cache"),
        top_k=1,
        seed=1,
        max_tokens=max_tokens,
    )


# -- 1. throughput ----------------------------------------------------------------------------
def _direct_round(engine: litert_lm.Engine, tokens: int) -> tuple[float, int]:
    """One answer straight from the engine: (seconds, decoded tokens)."""
    sampler = litert_lm.SamplerConfig(top_k=1, seed=1)
    conv = engine.create_conversation(sampler_config=sampler, max_output_tokens=tokens)
    try:
        t0 = time.perf_counter()
        for _ in conv.send_message_async({"role": "user", "content": f"{SYSTEM}\n\n{PROMPT}"}):
            pass
        elapsed = time.perf_counter() - t0
        return elapsed, conv.get_benchmark_info().last_decode_token_count
    finally:
        conv.close()


async def _agent_round(agent: Agent, backend: LiteRTBackend) -> tuple[float, int]:
    """One agentik turn in a new conversation: (seconds, decoded tokens)."""
    conv = await agent.create_conversation()
    sub = conv.events(profile="metrics")
    t0 = time.perf_counter()
    await conv.send(PROMPT)
    async for event in sub:
        if event.kind == "turn_ended":
            break
    elapsed = time.perf_counter() - t0
    await sub.aclose()
    if event.stop_reason not in ("stop", "length"):
        raise RuntimeError(f"the agentik turn failed: {event.stop_reason}")
    backend.release(conv.id)
    await conv.aclose()
    return elapsed, event.usage.completion_tokens


async def bench_throughput(model: str, tokens: int, rounds: int, tmp: str) -> list[Row]:
    say(f"== 1. decode throughput ({rounds} rounds of {tokens} answer tokens, interleaved)")
    backend = _backend(model, tmp, max_tokens=tokens)
    direct: list[float] = []
    through: list[float] = []
    async with Agent(
        llm=backend, store=SQLiteStore(os.path.join(tmp, "t.db")), system_prompt=SYSTEM
    ) as agent:
        await _agent_round(agent, backend)  # loads the engine (shared with the direct runs)
        engine = backend.engine
        _direct_round(engine, tokens)  # warm-up
        for i in range(rounds):
            # Alternate the order so drift on a shared machine hits both sides alike.
            order = ("direct", "agentik") if i % 2 == 0 else ("agentik", "direct")
            for side in order:
                if side == "direct":
                    seconds, n = _direct_round(engine, tokens)
                    direct.append(n / seconds)
                else:
                    seconds, n = await _agent_round(agent, backend)
                    through.append(n / seconds)
    d, a = statistics.median(direct), statistics.median(through)
    say(f"   engine directly : {per_s(d, 'tokens/s')} (median; min {min(direct):,.0f})")
    say(f"   agentik turn    : {per_s(a, 'tokens/s')} (median; min {min(through):,.0f})")
    say()
    return [
        Row(
            "decode tokens/s: agentik turn vs engine directly",
            per_s(a, "tok/s"),
            per_s(d, "tok/s"),
            a / d,
            ">= 0.95x",
            a / d >= 0.95,
            section="1",
        )
    ]


# -- 2. turn-2 latency --------------------------------------------------------------------------
async def bench_reuse(model: str, history_turns: int, rounds: int, tmp: str) -> list[Row]:
    say(f"== 2. latency of a turn after {history_turns} turns of history: reused vs rebuilt")
    backend = _backend(model, tmp, max_tokens=8)
    reused: list[float] = []
    rebuilt: list[float] = []
    async with Agent(
        llm=backend, store=SQLiteStore(os.path.join(tmp, "r.db")), system_prompt=SYSTEM
    ) as agent:

        async def one_turn(conv, text: str) -> float:
            t0 = time.perf_counter()
            await conv.send(text)
            await conv.wait_idle()
            return time.perf_counter() - t0

        for i in range(rounds + 1):
            conv = await agent.create_conversation()
            for t in range(history_turns):
                await one_turn(conv, f"message {t}: {PROMPT}")
            builds = backend.stats.builds
            reuse = await one_turn(conv, "and now?")
            assert backend.stats.builds == builds, "expected the engine conversation reused"
            backend.release(conv.id)
            rebuild = await one_turn(conv, "and then?")
            assert backend.stats.builds == builds + 1, "expected a rebuild"
            if i:  # the first round warms up
                reused.append(reuse)
                rebuilt.append(rebuild)
            backend.release(conv.id)
            await conv.aclose()
    r, b = statistics.median(reused), statistics.median(rebuilt)
    say(f"   reused engine conversation : {ms(r)} (median)")
    say(f"   rebuilt from history       : {ms(b)} (median)")
    say()
    return [
        Row(
            f"turn latency after {history_turns} turns: reused vs rebuilt",
            ms(r),
            ms(b),
            r / b,
            "< 1x (info)",
            None,
            section="2",
        )
    ]


async def run(args: argparse.Namespace, model: str, size: int) -> list[Row]:
    with tempfile.TemporaryDirectory(prefix="agentik-bench-litert-") as tmp:
        say_environment(
            [
                ("litert-lm", version("litert-lm-api")),
                ("agentik", version("agentik")),
                ("model", f"{model} ({size:,} bytes)"),
                ("mode", "quick" if args.quick else "full"),
            ]
        )
        tokens = 128 if args.quick else args.tokens
        rows = await bench_throughput(model, tokens, 3 if args.quick else args.rounds, tmp)
        rows += await bench_reuse(model, 3 if args.quick else 10, 2 if args.quick else 5, tmp)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--model", help="a .litertlm file (default: see the module docstring)")
    parser.add_argument("--tokens", type=int, default=512, help="answer tokens per round")
    parser.add_argument("--rounds", type=int, default=10, help="measured rounds per side")
    parser.add_argument("--quick", action="store_true", help="a small smoke run")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a goal is missed")
    args = parser.parse_args(argv)
    model = _model_path(args.model)
    rows = asyncio.run(run(args, model, os.path.getsize(model)))
    return finish(rows, strict=args.strict, sections=True)


if __name__ == "__main__":
    sys.exit(main())
