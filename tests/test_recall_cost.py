"""What recall costs: the memory-mapped builtin model gives wordllama's own
vectors without a private copy of its weights."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from agentik.core.memory.embeddings import BuiltinEmbedder, builtin_files, normalize

TOKYO = "Heidi speaks fluent Japanese and handles the Tokyo customers."
QUESTION = "who talks to our clients in Japan?"
TEXTS = [
    QUESTION,
    TOKYO,
    "",
    "   ",
    "a",
    "Bob is allergic to peanuts; no satay at team lunches.",
    "Ünïcödé, emoji 🚀 and 漢字 mixed with ASCII words",
    "x" * 5000,
    *(f"note {i}: the {i}th deploy went to box {i % 7}" for i in range(140)),
]


@pytest.mark.parametrize("dim", [64, 128, 256])
def test_the_memory_mapped_model_gives_wordllamas_own_vectors(dim):
    """Vectors stored before (computed by wordllama's inference over its float32
    copy of the weights) stay comparable with the ones computed now."""
    from safetensors import safe_open
    from tokenizers import Tokenizer
    from wordllama.inference import WordLlamaInference

    weights, tokenizer = builtin_files()
    with safe_open(str(weights), framework="np", device="cpu") as f:
        matrix = f.get_tensor("embedding.weight")[:, :dim]
    theirs = normalize(
        WordLlamaInference(matrix, Tokenizer.from_file(str(tokenizer))).embed(TEXTS, norm=False)
    )
    embedder = BuiltinEmbedder(dim)
    ours = embedder.embed_sync(TEXTS)
    assert embedder.model == f"wordllama:l2_supercat:{dim}"
    assert ours.shape == (len(TEXTS), dim) and ours.dtype == np.float32
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-6)
    # One at a time (the query path) gives the same rows as a batch.
    np.testing.assert_allclose(embedder.embed_sync([TOKYO])[0], ours[1], rtol=0, atol=1e-6)


@pytest.mark.skipif(not Path("/proc/self/smaps_rollup").exists(), reason="needs Linux /proc")
def test_the_builtin_weights_are_mapped_from_the_package_file_not_copied(tmp_path):
    """The weights stay in the file's pages (shared by every process using them):
    loading the model maps the safetensors file, and the process's private memory
    grows by far less than the 32 MB a float32 copy of the weights alone took."""
    script = textwrap.dedent(
        """
        import json
        import numpy, tokenizers  # their own cost is not the model's
        from agentik.core.memory.embeddings import BuiltinEmbedder, builtin_files

        def private_kb():
            with open("/proc/self/smaps_rollup") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            return sum(int(fields[k].split()[0]) for k in ("Private_Dirty", "Private_Clean"))

        before = private_kb()
        e = BuiltinEmbedder()
        e.embed_sync(["Heidi speaks fluent Japanese and handles the Tokyo customers."] * 64)
        maps = open("/proc/self/maps").read()
        print(json.dumps({"mapped": str(builtin_files()[0]) in maps,
                          "grew_kb": private_kb() - before}))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["mapped"]
    # The tokenizer's tables are most of what remains (about 12 MB); reading the
    # weights and converting them cost 50 MB.
    assert out["grew_kb"] < 24 * 1024, out
