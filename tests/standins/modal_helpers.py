"""How tests run the stand-in `modal` CLI (modal_cli.py): the command `--modal-cli` takes."""

from __future__ import annotations

import sys
from pathlib import Path

STANDIN = Path(__file__).with_name("modal_cli.py")
COMMAND = f"{sys.executable} {STANDIN}"
