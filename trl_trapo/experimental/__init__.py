# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Optional extensions of the source document, off by default (TRL's convention for add-ons).

- `fewshot.py`: few-shot mode (`fewshot_mode=True`): more reuse of memory samples, annealed exploration,
  prototype-guided sampling of RL prompts and SFT rows.
"""

from .fewshot import FewShotController, PrototypeMemory


__all__ = ["FewShotController", "PrototypeMemory"]
