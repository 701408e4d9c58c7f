"""HTML and tables the UI shows: the inspect card, the alpha/scale readout, the match report, verdicts.

Pure functions of JSON values. Everything that comes from a file or a user (keys, metadata, warnings, names) is
HTML-escaped: an adapter header is untrusted input. The three fears of someone tuning an adapter get the loudest
colours: keys that match nothing (red), an alpha that is a guess (amber, with the factor at stake), and a result
identical to no LoRA at all (red).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import PurePath
from typing import Any

from ...adapters.resolved import GroupScale, ResolvedAdapter, resolve_adapter
from ...adapters.summary import AdapterSummary, applied_words, not_applied_lines, values_text
from ...lora.profile_rescale import targets_by_group
from ...rules.alpha_source import AlphaSource
from ...rules.choices import NO_CACHE
from ...rules.steps import evaluations
from ...rules.units import format_bytes
from .file_facts import recipe_html, training_html
from .html_text import esc

GROUP_NAMES = {"attention": "attention", "feed_forward": "feed-forward", "adaln": "AdaLN", "refiner": "refiner",
               "input_output": "input/output"}


def source_label(source: Any) -> str:
    """What a person reads for an alpha source (``AlphaSource.label``); '?' for a value that names none."""
    try:
        return AlphaSource.of(source).label
    except ValueError:
        return "?"

MAX_LISTED_KEYS = 12
HEURISTIC_MARK = "no alpha stored"  # the start of the engine's alpha-size heuristic (rules/strength.suggest_alpha)


def card(kind: str, body: str, *, testid: str | None = None) -> str:
    """A coloured box: ``kind`` is ok | warn | bad | info | plain."""
    data = f' data-testid="{esc(testid)}"' if testid else ""
    return f'<div class="h3-card h3-{kind}"{data}>{body}</div>'


def chip(text: str, kind: str = "") -> str:
    return f'<span class="h3-chip {kind}">{esc(text)}</span>'


def refusal(message: str) -> str:
    """A refused input: the server's one-line message in a red box."""
    return card("bad", f"✖ {esc(message)}", testid="refusal")


def placeholder(text: str) -> str:
    return f'<div class="h3-placeholder">{esc(text)}</div>'


def _bullets(items: Iterable[str]) -> str:
    items = [f"<li>{esc(item)}</li>" for item in items]
    return f"<ul>{''.join(items)}</ul>" if items else ""


def _count_list(counts: Mapping[Any, int]) -> str:
    return ", ".join(f"{key} (×{count})" for key, count in counts.items())


# ------------------------------------------------------------------------------------------------------- inspect
def inspect_card(info: Mapping[str, Any], name: str = "") -> str:
    """Format, prefix, rank(s), targets by group, dtype, size, match against this model, warnings."""
    ranks = info.get("ranks") or {}
    rank_counts: dict[int, int] = {}
    for rank in ranks.values():
        rank_counts[rank] = rank_counts.get(rank, 0) + 1
    rank_text = (str(info["rank"]) if info.get("rank") is not None
                 else "mixed: " + _count_list(dict(sorted(rank_counts.items()))))
    grouped = targets_by_group(list(info.get("targets") or ()))
    group_text = " · ".join(f"{GROUP_NAMES.get(g, g)} {len(t)}" for g, t in grouped.items()) or "none"
    prefix = info.get("prefix") or ""
    chips = "".join([
        chip(f"format {info.get('format')}", "h3-chip-strong"),
        chip(str(info.get("suffix_style"))),
        chip(f'prefix "{prefix}"' if prefix else "no prefix"),
        chip(str(info.get("dtype"))),
        chip(format_bytes(info.get("file_bytes"))),
    ] + ([chip("rsLoRA (alpha / √rank)", "h3-chip-strong")] if info.get("use_rslora") else []))
    title = f'<div class="h3-title">{esc(name)}</div>' if name else ""
    hints = ""
    if info.get("hints"):
        hints = ("<div class='h3-small'>trainer hints (shown, never applied): "
                 + esc(", ".join(f"{k} = {v}" for k, v in dict(info["hints"]).items())) + "</div>")
    body = (f"{title}<div>{chips}</div>"
            f"<div class='h3-row'><b>rank</b> {esc(rank_text)} &nbsp;·&nbsp; "
            f"<b>{info.get('num_targets', 0)} targets</b>: {esc(group_text)}</div>{training_html(info)}"
            f"{recipe_html(info)}{hints}")
    parts = [card("info", body, testid="inspect-summary")]
    parts.append(match_preview(info))
    # the alpha guess and unmatched keys have their own boxes; the rest is listed here
    warnings = [w for w in info.get("warnings") or () if "no alpha in the file" not in w and "match no H3" not in w]
    if warnings:
        parts.append(card("warn", "<b>Warnings</b>" + _bullets(warnings)))
    return "".join(parts)


def match_preview(info: Mapping[str, Any]) -> str:
    """Before anything is downloaded: will the adapter's keys land on this model's layers?"""
    unmatched = list(info.get("unmatched_keys") or ())
    count = int(info.get("num_targets") or 0)
    if count == 0:
        return card("bad", f"<div class='h3-big'>✖ Matches no layer of this model</div>"
                           f"{len(unmatched)} keys matched nothing (e.g. {esc(', '.join(unmatched[:3]) or '—')}). "
                           "Loading it would change nothing, so Load refuses it. Is it an H3 LoRA for this partition?",
                    testid="match-preview")
    if unmatched:
        return card("warn", f"<div class='h3-big'>⚠ {len(unmatched)} keys match nothing in this model</div>"
                            f"{count} targets will be bound; these keys will be ignored{_why_left_out(info)}:"
                            + _key_list(unmatched), testid="match-preview")
    return card("ok", f"✔ All {count} targets name layers of this model (checked from the header, before download).",
                testid="match-preview")


def _why_left_out(info: Mapping[str, Any]) -> str:
    """`` (24 text-encoder keys (…); 2 keys that name no H3 module)``: why, by reason (``adapters/not_applied``)."""
    reasons = (info.get("not_applied") or {}).get("reasons") or []
    words = "; ".join(f"{reason.get('count')} {reason.get('why')}" for reason in reasons)
    return f" ({esc(words)})" if words else ""


def _key_list(keys: Sequence[str]) -> str:
    shown = "".join(f"<code>{esc(k)}</code><br>" for k in keys[:MAX_LISTED_KEYS])
    more = f"… and {len(keys) - MAX_LISTED_KEYS} more" if len(keys) > MAX_LISTED_KEYS else ""
    return f"<details><summary>show keys</summary>{shown}{esc(more)}</details>"


def targets_table(info: Mapping[str, Any]) -> list[list[Any]]:
    """Rows ``[group, targets, rank(s), alpha(s), alpha source(s)]`` for a ``gr.Dataframe``."""
    ranks, alphas, sources = info.get("ranks") or {}, info.get("alphas") or {}, info.get("alpha_sources") or {}
    rows = []
    for group, targets in targets_by_group(list(info.get("targets") or ())).items():
        rows.append([
            GROUP_NAMES.get(group, group), len(targets),
            ", ".join(str(r) for r in sorted({ranks[t] for t in targets if t in ranks})),
            ", ".join(f"{a:g}" for a in sorted({float(alphas[t]) for t in targets if t in alphas})),
            ", ".join(sorted({source_label(sources[t]) for t in targets if t in sources})),
        ])
    return rows


TARGET_COLUMNS = ["group", "targets", "rank", "alpha", "alpha source"]


def alpha_card(info: Mapping[str, Any], alpha: float | None) -> str:
    """Alpha and where it came from — amber with the factor at stake when it is only the "alpha = rank" guess;
    an override also names what the file would have given."""
    resolved = resolve_adapter(info, alpha)
    if resolved.relies_on_rank_fallback:
        ranks = sorted(set((info.get("ranks") or {}).values()))
        value = f"{float(info['alpha']):g}" if info.get("alpha") is not None else "= rank"
        return card("warn", f"<div class='h3-big'>⚠ alpha {esc(value)} — a guess</div>"
                            f"No alpha is stored in the file, beside it or in the registry, so alpha = rank "
                            f"({esc(', '.join(map(str, ranks)))}) is assumed. {esc(fallback_risk(ranks))} Check the "
                            f"model card and set <b>Override alpha</b> if it gives one.", testid="alpha-card")
    text = chain_text(info)
    if alpha is not None:
        return card("ok", f"<div class='h3-big'>alpha {alpha:g}</div>from your override · the file gives "
                          f"{esc(text)}", testid="alpha-card")
    if info.get("alpha") is not None and info.get("alpha_source") != AlphaSource.MIXED:
        return card("ok", f"<div class='h3-big'>alpha {float(info['alpha']):g}</div>from "
                          f"{esc(source_label(info['alpha_source']))}", testid="alpha-card")
    return card("ok", f"<div class='h3-big'>alpha per module</div>{esc(text.removeprefix('per module: '))}",
                testid="alpha-card")


def refused_card(problem: str) -> str:
    """The alpha card while the alpha box or the scale holds a value that is refused."""
    return card("bad", f"<div class='h3-big'>✖ not applied</div>{esc(problem)}", testid="alpha-card")


def fallback_risk(ranks: Sequence[int]) -> str:
    """How far off "alpha = rank" may be, said for these ranks (LightX2V's case named only where it applies)."""
    top = max(ranks) if ranks else 0
    if top <= 1:
        return "Trained with another alpha, the scale is off by rank/alpha."
    examples = ", ".join(f"alpha {a:g}: {top / a:g}× too strong" for a in (top / 2, 1.0) if 1 <= a < top)
    text = f"Trained with a smaller alpha, its rank-{top} modules are rank/alpha times too strong ({examples})."
    if 128 in ranks:
        text += " LightX2V's rank-128 Turbo expects alpha 8: at alpha = rank it is 16× too strong."
    return text


def chain_text(info: Mapping[str, Any]) -> str:
    """The alpha chain in words: ``1 (the known-adapter registry)``, or per module ``2 from the file's header
    metadata (×33) · 16 from …`` with each value's source and count."""
    if info.get("alpha") is not None and info.get("alpha_source") != AlphaSource.MIXED:
        return f"{float(info['alpha']):g} ({source_label(info['alpha_source'])})"
    counts: dict[str, int] = {}
    sources = info.get("alpha_sources") or {}
    for target, value in (info.get("alphas") or {}).items():
        key = f"{float(value):g} from {source_label(sources.get(target))}"
        counts[key] = counts.get(key, 0) + 1
    return "per module: " + _count_list(counts)


def known_card(known: Mapping[str, Any] | None) -> str:
    """The registry's card for a known public adapter: what its authors recommend."""
    if not known:
        return ""
    facts = []
    for key, label in (("trigger", "trigger word"), ("steps", "steps"), ("shift", "shift"),
                       ("audio_shift", "audio shift"), ("scale", "scale"), ("alpha", "alpha"),
                       ("workflow", "workflow"), ("resolution", "resolution")):
        if known.get(key) is not None:
            facts.append(chip(f"{label} {known[key]}", "h3-chip-strong" if key in ("trigger", "steps") else ""))
    if known.get("alpha_equals_rank"):
        facts.append(chip("alpha = rank (author's statement)"))
    steps_note = ""
    if known.get("steps"):
        steps_note = (f"<br><small>{int(known['steps'])} steps = {evaluations(known['steps'])} transformer evaluations."
                      "</small>")
    notes = f"<div>{esc(known['notes'])}</div>" if known.get("notes") else ""
    return card("info", f"<div class='h3-title'>Known adapter: {esc(known.get('title', ''))}</div>"
                        f"<div>{''.join(facts)}</div>{notes}{steps_note}", testid="known-card")


# ------------------------------------------------------------------------------------------------------ readout
def readout_html(info: Mapping[str, Any] | None, alpha: float | None, strength: float, problem: str | None = None,
                 group_strengths: Mapping[str, float] | None = None) -> str:
    """The live effective scale of the resolved adapter (``adapters.resolved``, the object every job carries):
    strength × alpha / rank per group, amber with its warning when far from what the adapter's facts imply."""
    if problem:
        return card("bad", f"✖ {esc(problem)}", testid="scale-readout")
    if not info:
        return placeholder("Inspect an adapter to see its effective scale.")
    return resolved_html(resolve_adapter(info, alpha, strength, group_strengths))


def resolved_html(resolved: ResolvedAdapter) -> str:
    """The readout card of one resolved adapter."""
    groups = resolved.groups
    if not groups:
        return placeholder("This adapter has no targets for this model.")
    guess = resolved.relies_on_rank_fallback
    kind = "warn" if guess or resolved.warnings else "ok"
    scales = sorted({round(g.scale, 12) for g in groups})
    headline = f"{scales[0]:.6g}" if len(scales) == 1 else f"{scales[0]:.4g} … {scales[-1]:.4g}"
    rows = "".join(_readout_row(g) for g in groups)
    note = "".join(f"<div data-testid='scale-warning'><b>⚠ {esc(w)}</b></div>" for w in resolved.warnings)
    if resolved.strength == 0:
        note += "<div><b>scale 0: the adapter is switched off.</b></div>"
    elif guess:
        note += "<div><b>alpha is a guess (alpha = rank)</b> — see the alpha box above.</div>"
    formula = "strength × alpha / √rank (rsLoRA)" if resolved.use_rslora else "strength × alpha / rank"
    return card(kind, f"<div class='h3-label'>effective scale = {formula}</div>"
                      f"<div class='h3-big' data-testid='effective-scale'>{esc(headline)}</div>"
                      f"<table class='h3-table'><tr><th>group</th><th>rank</th><th>targets</th><th>alpha (source)</th>"
                      f"<th>scale</th></tr>{rows}</table>{note}", testid="scale-readout")


def _readout_row(group: GroupScale) -> str:
    stronger = ""
    if group.alpha_source != AlphaSource.RANK_FALLBACK and group.rank_fallback_ratio > 1.0001:
        stronger = f" <small>(alpha = rank would be {group.rank_fallback_ratio:.3g}× stronger)</small>"
    return (f"<tr><td>{esc(GROUP_NAMES.get(group.group, group.group))}</td><td>{group.rank}</td><td>{group.count}</td>"
            f"<td>{group.alpha:g} <small>({esc(source_label(group.alpha_source))})</small></td>"
            f"<td><b>{group.scale:.6g}</b> = {esc(group.formula)}{stronger}</td></tr>")


# ------------------------------------------------------------------------------------------------------- reports
def report_card(report: Mapping[str, Any], provenance: Mapping[str, Any] | None = None) -> str:
    """The match report after Load: matched / unmatched / not covered, loudly when something is off."""
    matched = report.get("matched") or []
    unmatched = list(report.get("unmatched_keys") or ())
    uncovered = list(report.get("uncovered_targets") or ())
    groups: dict[str, int] = {}
    for m in matched:
        groups[GROUP_NAMES.get(m["group"], m["group"])] = groups.get(GROUP_NAMES.get(m["group"], m["group"]), 0) + 1
    group_text = " · ".join(f"{g} {n}" for g, n in groups.items())
    details = (f"<div>{len(uncovered)} layers of the model are not touched by this adapter (normal: it was not "
               f"trained on them).</div><div class='h3-small'>mode {esc(report.get('mode'))}"
               f"{' · fused QKV' if report.get('fused_qkv') else ''}</div>")
    if provenance:
        commit = (f" · commit <code>{esc(str(provenance['commit'])[:12])}</code>" if provenance.get("commit") else "")
        details += (f"<div class='h3-small'>file sha256 <code>{esc(str(provenance.get('sha256', ''))[:16])}…</code>"
                    f"{commit}</div>")
    if unmatched:
        body = (f"<div class='h3-big'>⚠ Partial match: {len(matched)} targets bound, {len(unmatched)} keys matched "
                f"NOTHING</div>Those parts of the adapter are ignored ({esc(group_text)} bound)."
                + _key_list(unmatched) + details)
        kind = "warn"
    else:
        body = (f"<div class='h3-big'>✔ Loaded: all {len(matched)} targets bound, 0 keys unmatched</div>"
                f"{esc(group_text)}{details}")
        kind = "ok"
    # unmatched keys have the card above; the alpha-size heuristic is redrawn live under the strength profile,
    # with the alpha and scale it talks about (here it would keep describing the settings of the Load)
    warnings = [w for w in report.get("warnings") or () if "matched nothing" not in w and HEURISTIC_MARK not in w]
    extra = card("warn", "<b>Warnings</b>" + _bullets(warnings)) if warnings else ""
    return card(kind, body, testid="match-report") + extra


def result_html(output: Mapping[str, Any]) -> str:
    """One line per generation: seed, steps → evaluations, size, time, the step cache, hash, and everything each
    adapter applied (``summary.applied_words``: the settings JSON's ``applied`` line)."""
    lines = [f"<b>seed {output.get('seed')}</b> · {output.get('steps')} steps → {output.get('evaluations')} "
             f"evaluations · {output.get('frames')} frames {output.get('width')}×{output.get('height')} @ "
             f"{output.get('fps')} fps · stereo audio at {output.get('sample_rate')} Hz · generated in "
             f"{_seconds(output.get('seconds'))}{_predicted(output.get('time'))}{_cache_words(output.get('cache'))}",
             f"hash <code>{esc(str(output.get('hash', ''))[:23])}…</code>"]
    adapters = output.get("adapters") or []
    if not adapters:
        lines.append("no adapter (base model)")
    warned = False
    for a in adapters:
        applied = AdapterSummary.from_json(a)
        resolved = a.get("resolved") or {}
        lines.append(f"<span data-testid='applied'>{esc(PurePath(str(a.get('source'))).name or a.get('source'))}: "
                     f"{esc(applied_words(a))}</span>")
        lines.extend(f"⚠ {esc(w)}" for w in resolved.get("warnings") or ())
        left_out = not_applied_lines([a])  # keys of the file this run did not apply: named, never dropped quietly
        lines.extend(f"<span data-testid='not-applied'>⚠ not applied: {esc(line)}</span>" for line in left_out)
        warned = warned or bool(resolved.get("warnings") or left_out) or applied.relies_on_rank_fallback
    kind = "warn" if warned else "ok"
    return card(kind, "<br>".join(lines), testid="result")


def verdict_html(result: Mapping[str, Any]) -> str:
    """The equivalence verdict: identical (bitwise) or not, with the control and the fallback's distance."""
    a, b = result["a"], result["b"]
    control = ("✔ control: A run twice gave the same hash, so this device is deterministic."
               if result["control_identical"] else
               "✖ control: A run twice differed — this device is not deterministic, so a difference below proves "
               "nothing.")

    fallback = (f"The old fallback (alpha = rank, scale 1) differs from A by up to "
                f"{float(result['fallback_max_abs_diff']):.3g}: effective scale "
                f"{scale_text(result['effective_scale_fallback'])} vs {scale_text(result['effective_scale_a'])}"
                f"{_ratio_text(result['effective_scale_fallback'], result['effective_scale_a'])}.")
    left_out = "".join(f"<br><span data-testid='not-applied'>⚠ not applied: {esc(line)}</span>"
                       for line in result.get("not_applied") or ())  # keys of the file no column applied
    left_out += _calls_words(result.get("zerogpu"))
    if result["identical"]:
        head = "<div class='h3-big h3-verdict' data-testid='verdict'>IDENTICAL ✔ bit for bit</div>"
        body = (f"{head}A ({esc(setting_text(a))}) and B ({esc(setting_text(b))}) give the same output: "
                f"<code>{esc(a['hash'][:23])}…</code>, max |A−B| = 0.<br>{esc(control)}<br>{esc(fallback)}{left_out}")
        return card("ok" if result["control_identical"] else "warn", body, testid="verdict-card")
    head = "<div class='h3-big h3-verdict' data-testid='verdict'>DIFFERENT ✖</div>"
    body = (f"{head}A ({esc(setting_text(a))}) <code>{esc(a['hash'][:23])}…</code> vs B ({esc(setting_text(b))}) "
            f"<code>{esc(b['hash'][:23])}…</code>: max |A−B| = {float(result['max_abs_diff']):.3g}. "
            f"Effective scales {scale_text(result['effective_scale_a'])} vs "
            f"{scale_text(result['effective_scale_b'])}.<br>"
            f"{esc(control)}<br>{esc(fallback)}{left_out}")
    return card("bad", body, testid="verdict-card")


def _calls_words(zerogpu: Mapping[str, Any] | None) -> str:
    """``<br>Ran as 4 ZeroGPU calls, one per run (quota asked: 340 s).`` for a check split over calls, else ""."""
    if not zerogpu or int(zerogpu.get("calls") or 1) < 2:
        return ""
    return (f"<br><span data-testid='zerogpu-calls'>Ran as {int(zerogpu['calls'])} ZeroGPU calls, one per run "
            f"(quota asked: {int(zerogpu['quota_s'])} s).</span>")


def setting_text(column: Mapping[str, Any]) -> str:
    """One column of the equivalence check as a person reads it: ``alpha 8 × scale 1`` (the fallback: alpha = rank)."""
    if column.get("label") == "fallback":
        alpha = "= rank"
    else:
        alpha = "auto" if column["alpha"] is None else f"{float(column['alpha']):g}"
    return f"alpha {alpha} × scale {float(column['strength']):g}"


def _predicted(time: Mapping[str, Any] | None) -> str:
    """`` (predicted 0.6 s on this CPU)``: the prediction shown before the click, beside the run's seconds."""
    if not time or time.get("predicted_s") is None:
        return ""
    return f" (predicted {_seconds(time['predicted_s'])} on {esc(str(time.get('box')))})"


def _cache_words(cache: Mapping[str, Any] | None) -> str:
    """`` · step cache fbc: 1 of 4 evaluations skipped`` (a run without the step cache: "")."""
    if not cache or cache.get("kind") in (None, NO_CACHE):
        return ""
    return (f" · step cache {esc(str(cache['kind']))}: {int(cache.get('skipped') or 0)} of "
            f"{int(cache.get('evaluations') or 0)} evaluations skipped")


def _seconds(value: Any) -> str:
    try:
        return f"{float(value):.1f} s"
    except (TypeError, ValueError):
        return "? s"


def _ratio_text(fallback: Any, a: Any) -> str:
    if isinstance(fallback, Mapping) or isinstance(a, Mapping) or not float(a):
        return ""
    ratio = float(fallback) / float(a)
    return f" — {ratio:.3g}× as strong" if abs(ratio - 1.0) > 1e-9 else ""


def scale_text(value: Any) -> str:
    """An effective scale as JSON carries it (one number, or per group / rank / target, values possibly lists of
    distinct values) in words: the number, or the distinct set (``1 / 2``, ``adapters.summary.values_text``)."""
    if value is None:
        return "—"
    if isinstance(value, Mapping):
        return values_text(float(v) for item in value.values() for v in (item if isinstance(item, list) else [item]))
    return values_text([float(value)])


def distance_text(psnr: float) -> str:
    """A grid cell's distance to the no-LoRA baseline, flagged when it did not move at all."""
    if not math.isfinite(psnr):
        return "⚠ identical to no LoRA"
    return f"PSNR {psnr:.1f} dB to no-LoRA (higher = closer)"
