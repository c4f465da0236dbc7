# Copyright 2026 The trl-trapo developers. Licensed under the Apache License, Version 2.0.
"""A GRPO script on TRAPO keeps GRPO's semantics: `GRPOConfig` (TRL GRPOConfig's defaults), and the start-up notice
that says which of GRPO's defaults a run does not have.

`from trl_trapo import GRPOConfig` takes TRL 1.16 `GRPOConfig`'s names (`beta`, `num_iterations`, `epsilon`,
`max_completion_length`, aliases of TRAPO's `kl_coef`, `num_ppo_epochs`, `cliprange`, `response_length`) and its
defaults where `TRAPOConfig`'s differ: no KL term (beta 0.0), one update per generated batch (num_iterations 1, so a
new generation round every optimizer step and no replay reuse), learning rate 1e-6, 512 completion tokens, dropout
left as the model has it, unbounded tool-calling rounds, and none of TRAPO's additions to RL sampling (targeted
exploration and self-imitation off). A GRPO script with only its import changed then trains as under TRL.

A `TRAPOConfig` given GRPO's names (a script whose config class was renamed, `TRAPOConfig as GRPOConfig`) keeps
TRAPO's defaults, and [`grpo_notice`] lists, at trainer construction, each one in effect that differs from GRPO's
with the value that gives GRPO's. With either class the notice also names what remains different by design (the KL
estimator in the loss).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .config import TRAPOConfig


# TRAPOConfig field -> (TRL GRPOConfig's name of it, what a different value means for the run); the defaults compared
# are TRL's own (`trl.GRPOConfig`, read when a notice is built), so the notice follows the installed TRL
DEFAULTS_COMPARED = {
    "kl_coef": ("beta", "a KL term to a frozen reference"),
    "num_ppo_epochs": ("num_iterations", "each generated batch trained this many steps: a new round only that often"),
    "response_length": ("max_completion_length", "completion tokens"),
    "learning_rate": ("learning_rate", ""),
    "disable_dropout": ("disable_dropout", ""),
    "max_tool_calling_iterations": ("max_tool_calling_iterations", "tool-call rounds per rollout"),
}


@dataclass
class GRPOConfig(TRAPOConfig):
    r"""
    Configuration of a GRPO run on [`TRAPOTrainer`]: TRL 1.16 `GRPOConfig`'s defaults on top of [`TRAPOConfig`].

    `from trl import GRPOConfig` becomes `from trl_trapo import GRPOConfig`. Every `TRAPOConfig` field whose TRL
    GRPOConfig counterpart (same name, or the GRPO name of `GRPO_ALIASES`) has another default takes GRPO's here, and
    the GRPO names hold the value after construction as in TRL (`GRPOConfig().beta == 0.0`). TRAPO's additions to
    RL sampling that GRPO does not have are off: `exploration=False`, `self_imitation=False`. What stays different
    is said once when the trainer is built ([`grpo_notice`]) and in docs/agents.md, "Moving a GRPOTrainer script over".

    Raises:
        TypeError: for a field of TRL GRPOConfig, SFTConfig or 0.x PPOConfig TRAPO has no equivalent of, naming it,
            its value and the fix (as `TRAPOConfig`; `config.foreign_fields`).
        ValueError: as `TRAPOConfig`, e.g. when a GRPO name and TRAPO's name of one setting disagree.
    """

    learning_rate: float = field(default=1e-6, metadata={"help": "Initial AdamW learning rate (TRL GRPO's default)."})
    kl_coef: float = field(
        default=0.0,
        metadata={"help": "KL coefficient of the penalty towards the reference (GRPO's `beta`; 0.0: no reference)."},
    )
    num_ppo_epochs: int = field(
        default=1,
        metadata={
            "help": "Optimizer steps each generated batch is trained for (GRPO's `num_iterations`; 1: a new "
            "generation round every optimizer step)."
        },
    )
    response_length: int = field(
        default=512, metadata={"help": "Maximum completion tokens (GRPO's `max_completion_length`, TRL's default)."}
    )
    disable_dropout: bool = field(
        default=False, metadata={"help": "Disable dropout in the policy and reference (TRL GRPO's default: False)."}
    )
    max_tool_calling_iterations: int | None = field(
        default=None,
        metadata={"help": "Rounds of tool calls a rollout may make; None: unbounded (TRL's default)."},
    )
    exploration: bool | None = field(
        default=False,
        metadata={"help": "TRL's GRPO samples every prompt at `temperature`: targeted exploration off (TRAPO: auto)."},
    )
    self_imitation: bool | None = field(
        default=False, metadata={"help": "TRL's GRPO has no self-imitation: off (TRAPO: auto with SFT data)."}
    )


def grpo_notice(args: TRAPOConfig, exploration: bool, tools: bool, kl_estimator: str, kl_penalty: str) -> str | None:
    """The one-line notice of a GRPO-style run whose settings differ from TRL GRPOConfig's defaults, or None.

    A run is GRPO-style when its config is a [`GRPOConfig`], or a `TRAPOConfig` given any of GRPO's names of its
    fields (`GRPO_ALIASES`: a GRPO script whose config class was renamed). Listed are the settings left at the config
    class's own default that differ from TRL `GRPOConfig`'s default (a value the user gave, under either name, is
    their choice and is not listed), targeted exploration when it runs by default, and the KL estimator when a KL term
    is in the loss and the estimator is left to `auto` (TRAPO's takes k2, whose gradient is that of KL(pi || pi_ref);
    GRPO's is k3). Each item names the value that gives GRPO's.

    Args:
        args: the run's configuration.
        exploration (`bool`): whether targeted exploration runs (resolved by the trainer).
        tools (`bool`): whether rollouts call tools (`tools` / `environment_factory`).
        kl_estimator (`str`): the resolved per-token estimator ("k1", "k2" or "k3").
        kl_penalty (`str`): where the KL sits, resolved ("loss" or "reward").

    Returns:
        `str` or None: the notice, None when the run is not GRPO-style or nothing differs.
    """
    grpo_config = isinstance(args, GRPOConfig)
    grpo_names = list(args.grpo_names_given or [])  # recorded at construction (the names read values in effect)
    if not grpo_config and not grpo_names:
        return None
    from trl import GRPOConfig as TRLGRPOConfig

    theirs = TRLGRPOConfig.__dataclass_fields__
    ours = type(args).__dataclass_fields__
    items = []
    for name, (grpo_name, meaning) in DEFAULTS_COMPARED.items():
        value, grpo_default = getattr(args, name), theirs[grpo_name].default
        given = grpo_name != name and grpo_name in grpo_names  # set through GRPO's name
        if given or value != ours[name].default or value == grpo_default:
            continue
        if name == "max_tool_calling_iterations" and not tools:
            continue
        items.append(f"{name}={value!r} ({meaning + '; ' if meaning else ''}GRPO: {grpo_name}={grpo_default!r})")
    if exploration and args.exploration is None:
        items.append(
            "targeted exploration on (families stuck at the lowest score are sampled hotter; GRPO: none, "
            "exploration=False)"
        )
    if args.kl_coef > 0 and kl_penalty == "loss" and args.kl_estimator == "auto" and kl_estimator != "k3":
        items.append(
            f"KL estimator {kl_estimator} in the loss (GRPO: k3, whose gradient is biased; kl_estimator='k3')"
        )
    if not items:
        return None
    source = f"{type(args).__name__} with GRPO's names ({', '.join(grpo_names)})" if not grpo_config else "GRPOConfig"
    fix = (
        "Pass the values named for GRPO's"
        if grpo_config
        else "Pass the values named, or build the config with `from trl_trapo import GRPOConfig` for GRPO's defaults"
    )
    return (
        f"GRPO-style run: {source} differs from TRL GRPOConfig's defaults in {'; '.join(items)}. {fix} "
        "(docs/agents.md, 'Moving a GRPOTrainer script over')."
    )


__all__ = ["GRPOConfig", "grpo_notice"]
