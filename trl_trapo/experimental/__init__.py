# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""Optional extensions of the source document, off by default (TRL's convention for add-ons).

- `fewshot.py`: few-shot mode (`FewShotTRAPOTrainer`, with `fewshot_mode=True`): more reuse of memory samples,
  annealed exploration, prototype-guided sampling of RL prompts and SFT rows.

The core package never imports this one: an extension subclasses the trainer and overrides its construction hooks
(`TRAPOTrainer.replay_max_uses`, `TRAPOTrainer.build_sample_selector`).
"""

from .fewshot import FewShotController, FewShotTRAPOTrainer, PrototypeMemory


__all__ = ["FewShotController", "FewShotTRAPOTrainer", "PrototypeMemory"]
