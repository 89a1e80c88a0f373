"""One calibration run: score every item (cached, resumable), split, choose and fit a calibrator on
the calibration part, measure both parts, pick the threshold, write plots, report and profile."""

from __future__ import annotations

import datetime
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from llamadecide.calibration import metrics
from llamadecide.calibration.backends import Backend
from llamadecide.calibration.cache import ScoreCache
from llamadecide.calibration.data import LabelledItem, Task
from llamadecide.calibration.fitting import (Calibrator, Candidate, HeadCalibrator, candidates, content_free_prior_for,
                                             cross_validated, fit_candidate, splitter)
from llamadecide.calibration.plots import reliability_diagram, risk_coverage_plot
from llamadecide.calibration.profile import CalibrationProfile, DemonstrationParams, HeadParams
from llamadecide.calibration.report import write_html
from llamadecide.calibration.thresholds import (conformal_quantile, conformal_report, evaluate_threshold, reachable,
                                                select_threshold)
from llamadecide.decisions.maths import confidence
from llamadecide.decisions.prompt import PROMPT_FORMAT_VERSION, PROMPT_FORMATS, QUESTION_FIRST_FORMATS
from llamadecide.decisions.rules import Demonstration
from llamadecide.errors import InvalidRequestError


@dataclass(frozen=True)
class RunConfig:
    out_dir: Path
    calibration_size: int | None = None
    test_size: int | None = None
    seed: int = 0
    target_precision: float = 0.95
    confidence_level: float = 0.95
    conformal_alpha: float = 0.1
    compare_modes: bool = False
    rotations: int = 1  # also score with this many option-order rotations (chosen only if better)
    prior_correction: bool = True  # also try content-free prior correction
    head: bool = True  # also try a head on the hidden state (local backend)
    lexical: bool = True  # also try each head fused with a lexical expert on the input text
    only_mode: str | None = None  # score in this mode instead of the task's default
    shots: int = 0  # also score with this many labelled demonstrations before each item (local backend)
    # Prompt formats to measure (besides the state-first default, local backend only): each
    # question-first one zero-shot, and with this many demonstrations per class for each number given
    # (many-shot: they live in the shared prefix).
    layouts: tuple[str, ...] = PROMPT_FORMATS
    shots_per_class: tuple[int, ...] = (1,)
    bins: int = 15
    bootstrap_rounds: int = 200
    profile_name: str | None = None
    dataset_fingerprint: str = ""
    show_progress: bool = True


def split(n: int, calibration_size: int | None, test_size: int | None, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded disjoint calibration and test indices."""
    cal = calibration_size if calibration_size is not None else max(2, n // 3)
    test = test_size if test_size is not None else n - cal
    if cal < 2 or test < 1 or cal + test > n:
        raise InvalidRequestError(f"cannot split {n} items into {cal} calibration and {test} test items")
    order = np.random.default_rng(seed).permutation(n)
    return np.sort(order[:cal]), np.sort(order[cal:cal + test])


@dataclass(frozen=True)
class Variant:
    """How items are put to the model: scoring mode and number of option-order rotations."""

    mode: str
    rotations: int = 1
    shots: int = 0  # demonstrations from the labelled part put before each item
    layout: str = PROMPT_FORMAT_VERSION

    @property
    def label(self) -> str:
        return (f"{self.mode} mode" + (f", {self.layout}" if self.layout != PROMPT_FORMAT_VERSION else "")
                + (f", {self.rotations} rotations" if self.rotations > 1 else "")
                + (f", {self.shots}-shot" if self.shots else ""))


@dataclass
class VariantScores:
    L: np.ndarray  # items x options: log-likelihoods
    lengths: np.ndarray | None  # token counts (local backend)
    hidden: np.ndarray | None  # items x hidden size, at the answer position (local backend)
    content_free: tuple[np.ndarray, np.ndarray | None] | None  # rows on content-free inputs, their lengths
    demonstrations: tuple[Demonstration, ...] = ()  # shown before every item (k-shot variants)
    texts: list[str] | None = None  # every item's input as the model sees it (for a head's lexical expert)
    shown: tuple[int, ...] = ()  # the items shown as demonstrations (question-first: never scored)


def _cache_mode(variant: Variant, hidden: bool, demonstrations: tuple[Demonstration, ...] = ()) -> str:
    mode = variant.mode if variant.rotations == 1 else f"{variant.mode}|rotations={variant.rotations}"
    if variant.layout != PROMPT_FORMAT_VERSION:
        mode += f"|layout={variant.layout}"
    if demonstrations:
        shown = json.dumps([[d.input, d.option] for d in demonstrations])
        mode += f"|demonstrations={hashlib.sha256(shown.encode()).hexdigest()[:16]}"
    return mode + ("|hidden" if hidden else "")


def variants_for(task: Task, config: "RunConfig", *, demonstrations: bool = True) -> list[Variant]:
    """The default mode first; the other mode with --compare-modes; labels mode with rotations;
    the default mode with demonstrations (k-shot) where the backend can show them."""
    default_mode = config.only_mode or task.question().mode
    modes = [default_mode] + ([m for m in ("text", "labels") if m != default_mode] if config.compare_modes else [])
    found = [Variant(m) for m in modes]
    if config.rotations > 1 and task.type != "score" and "labels" in modes:
        found.append(Variant("labels", min(config.rotations, len(task.options))))
    if config.shots > 0 and demonstrations:
        found.append(Variant(default_mode, shots=config.shots))
    for layout in (config.layouts if demonstrations else ()):
        if layout in QUESTION_FIRST_FORMATS:
            found.append(Variant(default_mode, layout=layout))
            found.extend(Variant(default_mode, shots=n * len(task.options), layout=layout)
                         for n in sorted(set(config.shots_per_class)) if n > 0)
    return found


def demonstration_items(scored: dict[Variant, "VariantScores"]) -> np.ndarray:
    """Items shown as demonstrations in a question-first variant's shared prefix: no variant is
    fitted or measured on them (that variant could not be: they are part of its prompt)."""
    return np.array(sorted({i for variant, data in scored.items() if variant.layout in QUESTION_FIRST_FORMATS
                            for i in data.shown}), dtype=int)


def choose_demonstrations(items: list[LabelledItem], y: np.ndarray, pool: np.ndarray, shots: int,
                          seed: int = 0) -> list[int]:
    """`shots` labelled items to show before every question: the classes taken in turn (a seeded
    order), each time a random item of that class, from its shorter half while it lasts (a short
    prefix keeps the prompt cheap), so the answers shown are balanced and interleaved."""
    rng = np.random.default_rng(seed)
    by_class: dict[int, list[int]] = {}
    for i in pool:
        by_class.setdefault(int(y[i]), []).append(int(i))
    for c, members in by_class.items():
        members.sort(key=lambda i: (len(items[i].text), i))
        half = (len(members) + 1) // 2
        by_class[c] = list(rng.permutation(members[:half])) + list(rng.permutation(members[half:]))
    classes = list(rng.permutation(sorted(by_class)))
    chosen: list[int] = []
    while len(chosen) < shots and any(by_class.values()):
        for c in classes:
            if by_class[c] and len(chosen) < shots:
                chosen.append(int(by_class[c].pop(0)))
    return chosen


def score_variants(backend: Backend, task: Task, items: list[LabelledItem], used: np.ndarray, config: "RunConfig",
                   cache: ScoreCache, *, pool: np.ndarray | None = None) -> dict[Variant, VariantScores]:
    """Every variant's scores for the used items (rows of the unused items stay zero). Item by item,
    all variants in a row, so each variant reuses the state the previous one left in the cache;
    hidden states are read once per prompt (mode and demonstrations), right after that prompt's
    scoring (one token's work). k-shot demonstrations come from `pool` (the labelled part); an item
    that is itself a demonstration is scored with the others only."""
    variants = variants_for(task, config, demonstrations=backend.supports_demonstrations and pool is not None)
    want_hidden = config.head and backend.supports_hidden
    hidden_variant: dict[Variant, bool] = {}
    prompts_with_hidden: set[tuple[str, int, str]] = set()
    for variant in variants:
        prompt = (variant.mode, variant.shots, variant.layout)
        hidden_variant[variant] = want_hidden and prompt not in prompts_with_hidden
        if hidden_variant[variant]:
            prompts_with_hidden.add(prompt)
    shown: dict[Variant, list[int]] = {v: [] for v in variants}  # item indices of each variant's demonstrations
    demonstrations: dict[Variant, tuple[Demonstration, ...]] = {v: () for v in variants}
    if any(v.shots for v in variants):
        y = np.array([task.gold_index(item.label) for item in items])
        for variant in (v for v in variants if v.shots):
            shown[variant] = choose_demonstrations(items, y, pool, variant.shots, config.seed)
            demonstrations[variant] = tuple(Demonstration(items[i].text, int(y[i])) for i in shown[variant])
    questions = {v: task.question(v.mode) for v in variants}
    identity = backend.identity()
    k = len(task.options)
    L = {v: np.zeros((len(items), k)) for v in variants}
    lengths: dict[Variant, np.ndarray | None] = {v: np.ones((len(items), k)) for v in variants}
    hidden: dict[tuple[str, int, str], np.ndarray] = {}
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  disable=not config.show_progress) as progress:
        bar = progress.add_task("scoring (" + "; ".join(v.label for v in variants) + ")", total=len(used))
        for n, i in enumerate(used):
            for variant in variants:
                if variant.layout in QUESTION_FIRST_FORMATS and i in shown[variant]:
                    continue  # part of this variant's prompt: never scored (see demonstration_items)
                own = tuple(d for j, d in zip(shown[variant], demonstrations[variant]) if j != i)
                key = cache.key(identity, PROMPT_FORMAT_VERSION, _cache_mode(variant, hidden_variant[variant], own),
                                task.fingerprint(), items[i].text)
                scores = cache.get(key)
                if scores is None:
                    scores = backend.score(items[i].text, questions[variant], rotations=variant.rotations,
                                           hidden=hidden_variant[variant], demonstrations=own, layout=variant.layout)
                    cache.put(key, scores)
                L[variant][i] = scores.logprobs
                if scores.n_tokens is None:
                    lengths[variant] = None
                elif lengths[variant] is not None:
                    lengths[variant][i] = scores.n_tokens
                if scores.hidden is not None:
                    hidden.setdefault((variant.mode, variant.shots, variant.layout),
                                      np.zeros((len(items), len(scores.hidden))))[i] = scores.hidden
            if n % 20 == 0:
                cache.commit()
            progress.advance(bar)
    cache.commit()
    scored: dict[Variant, VariantScores] = {}
    texts = [item.text for item in items]  # strings: the model sees them verbatim (prompt.render_state)
    for variant in variants:
        content_free = (backend.content_free(questions[variant], rotations=variant.rotations,
                                             demonstrations=demonstrations[variant], layout=variant.layout)
                        if config.prior_correction else None)
        variant_hidden = hidden.get((variant.mode, variant.shots, variant.layout))
        scored[variant] = VariantScores(L[variant], lengths[variant], variant_hidden, content_free, demonstrations[variant],
                                        texts if variant_hidden is not None and config.lexical else None,
                                        tuple(shown[variant]))
    return scored


def calibrate(backend: Backend, task: Task, items: list[LabelledItem], config: RunConfig) -> dict:
    if config.shots and not backend.supports_demonstrations:
        raise InvalidRequestError(f"--shots needs the local backend: {backend.description} cannot be shown "
                                  "demonstrations", param="shots")
    out = Path(config.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    y_all = np.array([task.gold_index(item.label) for item in items])
    cal_idx, test_idx = split(len(items), config.calibration_size, config.test_size, config.seed)
    used = np.concatenate([cal_idx, test_idx])
    cache = ScoreCache(out / "cache.sqlite")
    try:
        scored = score_variants(backend, task, items, used, config, cache, pool=cal_idx)
    finally:
        cache.close()
    shown = demonstration_items(scored)
    cal_idx = np.setdiff1d(cal_idx, shown)
    y_cal, y_test = y_all[cal_idx], y_all[test_idx]

    # Choose variant, method and calibrator on the calibration part only.
    results, fitted = select(scored, cal_idx, y_cal, seed=config.seed)
    best = min(results, key=lambda r: r["cv_nll"])
    variant, candidate = fitted[best["label"]]
    data = scored[variant]
    chosen = fit_variant(candidate, data, cal_idx, y_cal)
    default = next(iter(scored))
    raw = Calibrator()
    P_raw_test = raw.apply(scored[default].L[test_idx], None)
    P_cal_test = apply_variant(chosen, data, test_idx)
    P_cal_cal = apply_variant(chosen, data, cal_idx)
    # The threshold and conformal sets are chosen on held-out probabilities: a head (or any fitted
    # calibrator) is over-confident on the very items it was fitted on.
    P_cal_oof = out_of_fold(candidate, data, cal_idx, y_cal, seed=config.seed)
    raw_L = scored[default].L

    threshold = select_threshold(confidence(P_cal_oof), P_cal_oof.argmax(1) == y_cal,
                                 target=config.target_precision, confidence_level=config.confidence_level)
    test_threshold = (evaluate_threshold(confidence(P_cal_test), P_cal_test.argmax(1) == y_test, threshold.threshold)
                      if threshold else None)
    qhat = conformal_quantile(P_cal_oof, y_cal, config.conformal_alpha)
    conformal = {"alpha": config.conformal_alpha, **conformal_report(P_cal_test, y_test, qhat)}

    reliability_diagram({"raw": P_raw_test, "calibrated": P_cal_test}, y_test, out / "reliability.png", bins=config.bins,
                        title=f"Reliability: {task.name}")
    risk_coverage_plot({"raw": P_raw_test, "calibrated": P_cal_test}, y_test, out / "risk_coverage.png",
                       threshold_coverage=test_threshold["coverage"] if test_threshold else None)

    identity = backend.identity()
    summary = {
        "task": {"name": task.name, "type": task.type, "instructions": task.instructions,
                 "options": [o for o in task.options], "fingerprint": task.fingerprint()},
        "backend": backend.description,
        "model_sha256": identity,
        "prompt_format": variant.layout,
        "dataset_fingerprint": config.dataset_fingerprint,
        "split": {"seed": config.seed, "calibration": int(len(cal_idx)), "test": int(len(test_idx)),
                  "shown_as_demonstrations": int(len(shown))},
        "candidates": results,
        "chosen": {**best, "temperature": getattr(chosen, "temperature", None),
                   "bias": list(chosen.bias) if getattr(chosen, "bias", None) else None,
                   "prior": list(chosen.prior) if chosen.prior else None},
        "calibration_part": {"raw": metrics.summary(raw.apply(raw_L[cal_idx], None), y_cal, bins=config.bins, rounds=0),
                             "calibrated": metrics.summary(P_cal_cal, y_cal, bins=config.bins, rounds=0)},
        "test": {"raw": metrics.summary(P_raw_test, y_test, bins=config.bins, seed=config.seed, rounds=config.bootstrap_rounds),
                 "calibrated": metrics.summary(P_cal_test, y_test, bins=config.bins, seed=config.seed, rounds=config.bootstrap_rounds)},
        "threshold": {"target": config.target_precision, "confidence_level": config.confidence_level,
                      "calibration": threshold.as_dict() if threshold else None, "test": test_threshold,
                      "reachable": reachable(confidence(P_cal_oof), P_cal_oof.argmax(1) == y_cal,
                                             target=config.target_precision, confidence_level=config.confidence_level)},
        "conformal": conformal,
    }

    profile = CalibrationProfile(
        name=config.profile_name or task.name,
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        model_sha256=identity, prompt_format=variant.layout,
        task=summary["task"], mode=variant.mode, calibrator=chosen.kind, length_normalize=chosen.length_normalize,
        temperature=getattr(chosen, "temperature", 1.0), bias=list(chosen.bias) if getattr(chosen, "bias", None) else None,
        method=candidate.method, prior_correction=candidate.prior_correction,
        prior=summary["chosen"]["prior"], rotations=variant.rotations,
        demonstrations=[DemonstrationParams(input=d.input, option=d.option) for d in data.demonstrations] or None,
        head=HeadParams.from_calibrator(chosen) if isinstance(chosen, HeadCalibrator) else None,
        threshold=threshold.threshold if threshold else None, target_precision=config.target_precision,
        confidence_level=config.confidence_level, dataset_fingerprint=config.dataset_fingerprint,
        metrics={"test_raw": _headline(summary["test"]["raw"]), "test_calibrated": _headline(summary["test"]["calibrated"]),
                 "threshold_test": test_threshold},
    )
    profile.save(out / "profile.json")
    with (out / "predictions.jsonl").open("w", encoding="utf-8") as handle:
        for row, i in enumerate(test_idx):
            handle.write(json.dumps({"id": items[i].id, "label": int(y_all[i]), "options": [str(o) for o in task.options],
                                     "probabilities": P_cal_test[row].tolist(), "raw_probabilities": P_raw_test[row].tolist()}) + "\n")
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=float), encoding="utf-8")
    write_html(summary, out)
    return summary


def select(scored: dict[Variant, VariantScores], cal_idx: np.ndarray, y_cal: np.ndarray, *,
           seed: int = 0) -> tuple[list[dict], dict[str, tuple[Variant, Candidate]]]:
    """Cross-validated NLL and accuracy of every (variant, candidate) on the calibration part."""
    results: list[dict] = []
    fitted: dict[str, tuple[Variant, Candidate]] = {}
    for variant, data in scored.items():
        lengths = None if data.lengths is None else data.lengths[cal_idx]
        hidden = None if data.hidden is None else data.hidden[cal_idx]
        texts = _texts(data, cal_idx)
        for candidate in candidates(data.lengths is not None, has_prior=data.content_free is not None,
                                    has_hidden=data.hidden is not None, has_texts=texts is not None):
            prior = content_free_prior_for(candidate, *(data.content_free or (None, None)))
            cv = cross_validated(data.L[cal_idx], lengths, y_cal, candidate, prior=prior, hidden=hidden, texts=texts,
                                 seed=seed)
            label = f"{variant.label}, {candidate.label}"
            fitted[label] = (variant, candidate)
            results.append({"mode": variant.mode, "rotations": variant.rotations, "shots": variant.shots,
                            "layout": variant.layout,
                            "method": candidate.method,
                            "kind": candidate.kind, "lexical": candidate.lexical, "features": candidate.features,
                            "length_normalize": candidate.length_normalize,
                            "prior_correction": candidate.prior_correction, "label": label,
                            "cv_nll": cv["nll"], "cv_accuracy": cv["accuracy"]})
    return results, fitted


def fit_variant(candidate: Candidate, data: VariantScores, idx: np.ndarray, y: np.ndarray) -> Calibrator | HeadCalibrator:
    prior = content_free_prior_for(candidate, *(data.content_free or (None, None)))
    return fit_candidate(candidate, data.L[idx], None if data.lengths is None else data.lengths[idx], y, prior=prior,
                         hidden=None if data.hidden is None else data.hidden[idx], texts=_texts(data, idx))


def out_of_fold(candidate: Candidate, data: VariantScores, cal_idx: np.ndarray, y_cal: np.ndarray, *,
                folds: int = 5, seed: int = 0) -> np.ndarray:
    """Each calibration item's probabilities from a calibrator fitted on the other folds."""
    P = np.zeros((len(cal_idx), data.L.shape[1]))
    for train, held in splitter(data.L[cal_idx], y_cal, folds, seed):
        calibrator = fit_variant(candidate, data, cal_idx[train], y_cal[train])
        P[held] = apply_variant(calibrator, data, cal_idx[held])
    return P


def apply_variant(calibrator: Calibrator | HeadCalibrator, data: VariantScores, idx: np.ndarray) -> np.ndarray:
    return calibrator.apply(data.L[idx], None if data.lengths is None else data.lengths[idx],
                            None if data.hidden is None else data.hidden[idx], _texts(data, idx))


def _texts(data: VariantScores, idx: np.ndarray) -> list[str] | None:
    return None if data.texts is None else [data.texts[i] for i in idx]


def _headline(m: dict) -> dict:
    return {k: m[k] for k in ("accuracy", "nll", "brier", "ece_width", "ece_mass", "aurc")}
