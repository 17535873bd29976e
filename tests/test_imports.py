"""How the package imports: what ``import agentik.core`` costs, and the layering.

The OpenAI SDK takes about half a second to import (more than everything else
``agentik.core`` needs together), so it is imported when an ``OpenAIBackend``
is built, not with the package: a bot on a local model, ``agentik check`` or a
library user who never builds one does not pay for it.
"""

from __future__ import annotations

import subprocess
import sys

import pytest


def _fresh(script: str) -> str:
    """What a fresh interpreter running ``script`` prints (it must succeed)."""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.strip()


def test_importing_core_does_not_import_the_openai_sdk():
    script = (
        "import sys, agentik.core\n"
        "assert agentik.core.OpenAIBackend.name == 'openai'\n"
        "print(sorted(m for m in sys.modules if m == 'openai' or m.startswith('openai.')))\n"
    )
    assert _fresh(script) == "[]"


def test_building_the_openai_backend_imports_the_sdk_then():
    script = (
        "import sys\n"
        "from agentik.core import OpenAIBackend\n"
        "before = 'openai' in sys.modules\n"
        "OpenAIBackend(model='m', base_url='http://127.0.0.1:9/v1')\n"
        "print(before, 'openai' in sys.modules)\n"
    )
    assert _fresh(script) == "False True"


def test_profiles_moved_to_streamprofiles_and_the_old_name_still_works():
    """``PROFILES`` is derived from the stream profiles, which build on the events."""
    import agentik.core
    from agentik.core import events, streamprofiles

    assert agentik.core.PROFILES is streamprofiles.PROFILES
    with pytest.warns(DeprecationWarning, match="import PROFILES from agentik.core.streamprofiles"):
        assert events.PROFILES is streamprofiles.PROFILES
    with pytest.raises(AttributeError, match="nonesuch"):
        _ = events.nonesuch
