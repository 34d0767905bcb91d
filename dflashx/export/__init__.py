"""Engine contracts at export: the drafter's serving layouts, their checkers, the serve commands.

Pure functions on config dicts and the target's facts (no torch, no files), one job per module:

- `contract` — `Violation(key, message, fix)`, `report(engine, violations)` and the rules both
  engines share (integer ids, layer stacks, sliding windows, weight names and the `fc` width).
- `sglang` — `check_sglang(config, facts, shapes=None)`: the DFlash / z-lab config.json against
  SGLang's `--speculative-algorithm DFLASH` loader and the z-lab reference.
- `speculators` — `to_speculators(config, verifier)` / `from_speculators(spec, num_target_layers)`
  (the speculators layout vLLM serves, and back) and `check_speculators(spec, facts, shapes=None)`.
- `serve` — `Serving.of(...)`, the SGLang and vLLM command lines and the export README.

The export stage (`dflashx.stages.export`) writes both folders, runs both checkers on what it
wrote and stops with the key and the fix of every broken rule. docs/export.md lists the rules
and the engine sources they come from.
"""

from dflashx.export.contract import Violation, report
from dflashx.export.serve import Serving, commands, readme
from dflashx.export.sglang import check_sglang
from dflashx.export.speculators import check_speculators, from_speculators, to_speculators

__all__ = ["Serving", "Violation", "check_sglang", "check_speculators", "commands", "from_speculators", "readme",
           "report", "to_speculators"]
