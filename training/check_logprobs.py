"""Recompute every trained token's logprob with transformers and compare with `inference_logprobs`.

    python -m training.check_logprobs GROUPS.jsonl [--model embedded|HF_DIR] [--max_mean_delta 0.05]

GROUPS is an env's `process` JSONL or saved run-api `/batch` responses. The weights must be the
ones that sampled the groups (`embedded`: the embedded llama.cpp model's GGUF, dequantized).
Each group's sampling record decides which distribution is recomputed (see training.groups).

Reported: mean / max |delta| in nats, the share within `--tolerance`, the worst turns, trained
positions without a logprob, and a positional-shift check (the inference logprobs compared with
the recomputed ones one position earlier and later). Exit status 1 when the mean is above
`--max_mean_delta`, the share within tolerance is below `--min_within`, the logprobs line up
better shifted than aligned, or trained positions carry the 1.0 marker that no record declares.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from training.cli import parse_config, run_or_report
from training.groups import NOT_SAMPLED, Group, read_groups, turns

__all__ = ["CheckConfig", "TurnDelta", "Report", "compare", "check", "main"]


class CheckConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    groups: Path = Field(description="process JSONL or saved run-api /batch responses")
    model: str = Field("embedded", description="'embedded' (the bundled GGUF, dequantized) or an HF checkpoint dir")
    max_mean_delta: float = Field(
        0.05,
        gt=0,
        description="fail above this mean |delta| (nats); llama.cpp serving a Q4 GGUF adds ~0.05 (docs/training.md)",
    )
    tolerance: float = Field(0.1, gt=0, description="a token 'matches' within this |delta| (nats)")
    min_within: float = Field(0.0, ge=0, le=1, description="fail when fewer tokens than this share match (0: off)")
    worst_turns: int = Field(5, ge=0, description="how many of the worst turns to print")
    report: Path | None = Field(None, description="also write the report as JSON here")


@dataclass
class TurnDelta:
    group: int
    sequence: int
    start: int
    end: int
    mean: float
    max: float


@dataclass
class Report:
    groups: int = 0
    sequences: int = 0
    tokens: int = 0  # trained tokens compared
    gaps: int = 0  # trained tokens without a logprob
    undeclared_gaps: int = 0
    mean_delta: float = 0.0
    max_delta: float = 0.0
    within: float = 0.0
    shift: dict[str, float] = field(default_factory=dict)  # "-1" / "0" / "+1" -> mean |delta|
    worst_turns: list[TurnDelta] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


def compare(groups: list[Group], recomputed: list[list[list[float]]], config: CheckConfig) -> Report:
    """The report for `groups` given the recomputed logprobs (same nesting as inference_logprobs)."""
    report = Report(groups=len(groups))
    deltas: list[float] = []
    shifted: dict[int, list[float]] = {-1: [], 0: [], 1: []}
    all_turns: list[TurnDelta] = []
    for g, (group, group_lp) in enumerate(zip(groups, recomputed)):
        if group.inference_logprobs is None:
            raise ValueError(
                f"{group.source}: the group has no inference_logprobs (made in chat mode?); nothing to check"
            )
        declared = group.semantics.declared_gaps
        group_gaps = 0
        for s, (masks, inference, mine) in enumerate(zip(group.masks, group.inference_logprobs, group_lp)):
            report.sequences += 1
            for start, end in turns(masks):
                turn = []
                for t in range(max(start, 1), end):
                    if inference[t] is None or inference[t] >= NOT_SAMPLED:
                        group_gaps += 1
                        continue
                    turn.append(abs(inference[t] - mine[t]))
                    for k in shifted:
                        if 1 <= t + k < len(mine):
                            shifted[k].append(abs(inference[t] - mine[t + k]))
                if turn:
                    deltas.extend(turn)
                    all_turns.append(TurnDelta(g, s, start, end, sum(turn) / len(turn), max(turn)))
        report.gaps += group_gaps
        if declared is None or group_gaps > declared:
            report.undeclared_gaps += group_gaps - (declared or 0)
    report.tokens = len(deltas)
    if not deltas:
        report.failures.append("no trained token has an inference logprob: nothing was compared")
        return report
    report.mean_delta = sum(deltas) / len(deltas)
    report.max_delta = max(deltas)
    report.within = sum(d <= config.tolerance for d in deltas) / len(deltas)
    report.shift = {f"{k:+d}" if k else "0": sum(v) / len(v) for k, v in shifted.items() if v}
    report.worst_turns = sorted(all_turns, key=lambda t: -t.mean)[: config.worst_turns]
    if report.mean_delta > config.max_mean_delta:
        report.failures.append(
            f"mean |delta| {report.mean_delta:.4f} nats is above {config.max_mean_delta}: the "
            "logprobs do not come from these weights, or describe another distribution"
        )
    if report.within < config.min_within:
        report.failures.append(
            f"only {report.within:.1%} of tokens within {config.tolerance} nats (need {config.min_within:.0%})"
        )
    best = min(report.shift, key=report.shift.__getitem__)
    if best != "0":
        report.failures.append(
            f"the logprobs line up best shifted by {best} position(s) "
            f"({report.shift[best]:.3f} vs {report.shift['0']:.3f} nats aligned): an off-by-one "
            "between tokens and inference_logprobs"
        )
    if report.undeclared_gaps:
        report.failures.append(
            f"{report.undeclared_gaps} trained token(s) carry the 1.0 'no logprob' marker and no "
            "sampling record declares them: a trainer would use 1.0 as a logprob "
            "(mask or drop them: --env.missing_logprobs)"
        )
    return report


def recompute(groups: list[Group], model_name: str) -> list[list[list[float]]]:
    import torch

    from training.models import load_causal_lm
    from training.policy import sequence_logprobs

    model, _ = load_causal_lm(model_name)
    model.eval()
    out = []
    with torch.inference_mode():
        for group in groups:
            out.append([sequence_logprobs(model, tokens, group.semantics).tolist() for tokens in group.tokens])
    return out


def check(config: CheckConfig) -> Report:
    groups = read_groups(config.groups)
    if not groups:
        raise ValueError(f"{config.groups} holds no scored groups")
    return compare(groups, recompute(groups, config.model), config)


def format_report(report: Report, config: CheckConfig) -> str:
    lines = [
        f"groups {report.groups}, sequences {report.sequences}, trained tokens compared {report.tokens}, "
        f"without a logprob {report.gaps} ({report.undeclared_gaps} undeclared)",
        f"mean |delta| {report.mean_delta:.4f} nats, max {report.max_delta:.3f}, "
        f"{report.within:.1%} within {config.tolerance}",
        "positional shift (mean |delta| vs recomputed shifted by): "
        + ", ".join(f"{k}: {v:.3f}" for k, v in report.shift.items()),
    ]
    for t in report.worst_turns:
        lines.append(f"  turn group {t.group} seq {t.sequence} [{t.start}:{t.end}): mean {t.mean:.4f} max {t.max:.3f}")
    lines += [f"FAIL: {f}" for f in report.failures] or ["OK"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    config = parse_config(CheckConfig, argv, "python -m training.check_logprobs", positional=("groups",))
    report = run_or_report("check_logprobs", lambda: check(config))
    if report is None:
        return 2
    if config.report is not None:
        config.report.write_text(json.dumps({**asdict(report), "ok": report.ok}, indent=2))
    print(format_report(report, config), file=sys.stdout if report.ok else sys.stderr)
    return 0 if report.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
