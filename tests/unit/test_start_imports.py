"""What `forge serve` imports before it can answer: libraries only some configurations use are imported when used.

The start's budget is seconds (a warm start answers its first chat turn within 3 s), and the MCP SDK alone takes
~0.7 s to import. This checks what the server module pulls in, in a fresh interpreter, not the time it takes.
"""

from __future__ import annotations

import json
import subprocess
import sys

# Each is imported on first use: MCP servers configured in a session or by a flag; the GPU backend when chosen.
ON_USE = ("mcp", "cupy")


def test_the_server_module_leaves_libraries_of_other_configurations_unimported() -> None:
    code = "import json, sys, app.server; print(json.dumps(sorted(m for m in sys.modules if '.' not in m)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    loaded = set(json.loads(out.stdout.splitlines()[-1]))
    assert "litestar" in loaded and "sqlalchemy" in loaded  # the check sees what the server does import
    assert not loaded & set(ON_USE), f"imported by `import app.server`: {sorted(loaded & set(ON_USE))}"
