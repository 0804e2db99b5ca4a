#!/usr/bin/env python3
"""Throughput report of a training run: ``python scripts/smoke_report.py RUN_DIR [--expect-iterations N]
[--json]``. The report is :mod:`agentrl.runs.smoke_report` (standard library only); this script runs it
from a checkout without installing agentrl."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentrl.runs.smoke_report import *  # noqa: E402,F401,F403  (tests load this file as the module)
from agentrl.runs.smoke_report import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
