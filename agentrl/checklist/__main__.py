"""``python -m agentrl.checklist OUT [key=value ...]``: the GPU checklist (agentrl.checklist.runner)."""

import sys

from agentrl.checklist.runner import main

sys.exit(main())
